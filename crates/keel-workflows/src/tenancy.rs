//! Organizations, API keys and asset templates (operator-side writes, the API's
//! authentication lookup and the key lifecycle). SQL for tables of
//! `migrations/0007_platform_api.sql` and `0029_api_key_lifecycle.sql`.
//!
//! ## API keys
//! A key is a bearer token `keel_sk_` + 64 hex digits (256 random bits), shown once —
//! at creation and at each rotation — and stored only as its SHA-256. It holds one or
//! more [`Scope`]s. Its lifecycle:
//! - **create** ([`create_api_key_with_scopes`]; [`create_api_key`] grants every
//!   scope, as keys had before scopes existed);
//! - **rotate** ([`rotate_api_key`]): a new secret for the same key (id, label and
//!   scopes stay, so approval rules that compare keys still see one key). By default
//!   the old secret stops at once; with an overlap (at most [`MAX_ROTATION_OVERLAP`])
//!   it keeps working until then, so a deployment can roll the new secret out first.
//!   Only one previous secret is kept: a rotation during an overlap ends the older
//!   secret at once;
//! - **revoke** ([`revoke_api_key`]): both secrets stop at once; repeating is harmless.
//!
//! [`authenticate`] reads the key on every request (no cache), so a revoke or an
//! immediate rotation answers `UNAUTHENTICATED` to the very next request.

use crate::error::{OpsError, Result};
use crate::store;
use chrono::{DateTime, Utc};
use keel_units::{Decimals, Rounding, parse_units};
use sha2::{Digest, Sha256};
use sqlx::PgPool;
use std::time::Duration;
use uuid::Uuid;

/// Prefix of every API key token (`keel_sk_` + 64 hex digits of randomness).
pub const API_KEY_PREFIX: &str = "keel_sk_";

/// The longest overlap a rotation may give the old secret: 7 days (Stripe's bound for
/// rolled keys).
pub const MAX_ROTATION_OVERLAP: Duration = Duration::from_secs(7 * 24 * 3600);

/// An authenticated caller: the organization and the key it used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caller {
    /// The caller's organization; every read and write is scoped to it.
    pub organization_id: Uuid,
    /// The API key used (approvals need a different key than the request's).
    pub api_key_id: Uuid,
}

impl Caller {
    /// Who this caller is to the engine's attribution: the API key it authenticated
    /// with, as a verified [`keel_durable::ActorKind::Service`] with the key's id.
    /// Taken from the authenticated context only, never from a request body or header.
    pub fn actor(&self) -> keel_durable::Actor {
        keel_durable::Actor::service(&self.api_key_id.to_string())
    }
}

impl From<store::CallerRow> for Caller {
    fn from(r: store::CallerRow) -> Self {
        Self {
            organization_id: r.organization_id,
            api_key_id: r.api_key_id,
        }
    }
}

/// What an API key may do. The Platform API requires one scope per route (the table
/// of `keel_api::scope`). Deliberately exhaustive: a new scope must be handled (and
/// added to the `api_key_scopes_known` CHECK) wherever scopes are matched.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scope {
    /// Reads: every `GET` route.
    Read,
    /// Operations: the operation-creating `POST`s, retry and cancel.
    Operate,
    /// Approval decisions: approve and reject.
    Approve,
    /// Key management: the `/v1/api-keys` routes.
    Admin,
}

impl Scope {
    /// Every scope, in [`Scopes`] bit order.
    pub const ALL: [Scope; 4] = [Scope::Read, Scope::Operate, Scope::Approve, Scope::Admin];

    /// The wire and column name: `read`, `operate`, `approve`, `admin`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Read => "read",
            Self::Operate => "operate",
            Self::Approve => "approve",
            Self::Admin => "admin",
        }
    }

    /// The scope named `name` (exact, lowercase), if any.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.as_str() == name)
    }

    fn bit(self) -> u8 {
        match self {
            Self::Read => 1,
            Self::Operate => 2,
            Self::Approve => 4,
            Self::Admin => 8,
        }
    }
}

impl std::fmt::Display for Scope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A set of [`Scope`]s (a bit set; iterates in [`Scope::ALL`] order).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Scopes(u8);

impl Scopes {
    /// No scope.
    pub const NONE: Scopes = Scopes(0);

    /// Every scope (what keys created before scopes existed hold).
    pub fn all() -> Self {
        Self::ALL_BITS
    }

    const ALL_BITS: Scopes = Scopes(15);

    /// Whether `scope` is in the set.
    pub fn contains(self, scope: Scope) -> bool {
        self.0 & scope.bit() != 0
    }

    /// The set with `scope` added.
    #[must_use]
    pub fn with(self, scope: Scope) -> Self {
        Self(self.0 | scope.bit())
    }

    /// The set without `scope`.
    #[must_use]
    pub fn without(self, scope: Scope) -> Self {
        Self(self.0 & !scope.bit())
    }

    /// Whether every scope of `self` is in `other`.
    pub fn is_subset(self, other: Scopes) -> bool {
        self.0 & !other.0 == 0
    }

    /// Whether the set is empty.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The scopes, in [`Scope::ALL`] order.
    pub fn iter(self) -> impl Iterator<Item = Scope> {
        Scope::ALL.into_iter().filter(move |s| self.contains(*s))
    }

    /// The scope names, in [`Scope::ALL`] order.
    pub fn names(self) -> Vec<&'static str> {
        self.iter().map(Scope::as_str).collect()
    }

    /// The set of `names`; `None` when one is not a scope's name.
    pub fn from_names<S: AsRef<str>>(names: &[S]) -> Option<Self> {
        names.iter().try_fold(Self::NONE, |set, n| {
            Scope::parse(n.as_ref()).map(|s| set.with(s))
        })
    }
}

impl FromIterator<Scope> for Scopes {
    fn from_iter<I: IntoIterator<Item = Scope>>(iter: I) -> Self {
        iter.into_iter().fold(Self::NONE, Self::with)
    }
}

/// An authenticated key: who calls ([`Caller`]) and what its key may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Credential {
    /// The organization and the key.
    pub caller: Caller,
    /// The key's scopes.
    pub scopes: Scopes,
}

/// A freshly created (or rotated) API key. `token` is shown once and never stored.
#[derive(Debug, Clone)]
pub struct NewApiKey {
    /// The key's id.
    pub id: Uuid,
    /// The bearer token: `keel_sk_` followed by 64 hex digits (256 random bits).
    pub token: String,
}

/// An API key as its organization sees it: never its secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiKeyView {
    /// Key id.
    pub id: Uuid,
    /// Who or what uses it (1 to 255 characters).
    pub label: String,
    /// What it may do.
    pub scopes: Scopes,
    /// When it was created.
    pub created_at: DateTime<Utc>,
    /// Its last rotation, if any.
    pub rotated_at: Option<DateTime<Utc>>,
    /// When it was revoked, if it was (it then authenticates nothing).
    pub revoked_at: Option<DateTime<Utc>>,
    /// Until when the secret its last rotation replaced keeps working; `None` when it
    /// does not (an immediate rotation, an overlap that ended, or a revoked key).
    pub previous_secret_expires_at: Option<DateTime<Utc>>,
    /// The named person the key is issued to: its commands are recorded as
    /// `USER` with this id; `None`: a service key (`SERVICE` with the key's id).
    pub issued_to: Option<String>,
}

impl TryFrom<store::ApiKeyRow> for ApiKeyView {
    type Error = OpsError;

    /// Decodes a stored row; an unknown scope name is [`keel_store::StoreError::Decode`]
    /// (the table CHECKs them).
    fn try_from(r: store::ApiKeyRow) -> Result<Self> {
        Ok(Self {
            id: r.id,
            label: r.label,
            scopes: Scopes::from_names(&r.scopes)
                .ok_or(OpsError::Store(keel_store::StoreError::Decode))?,
            created_at: r.created_at,
            rotated_at: r.rotated_at,
            revoked_at: r.revoked_at,
            previous_secret_expires_at: r.previous_secret_expires_at,
            issued_to: r.issued_to,
        })
    }
}

/// A rotated key: its view and the new token (shown once).
#[derive(Debug, Clone)]
pub struct RotatedApiKey {
    /// The key after the rotation.
    pub key: ApiKeyView,
    /// The new bearer token.
    pub token: String,
}

/// An asset template's settings (callers name a template; they never choose a chain,
/// resolver or staleness bound themselves).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    /// Template id (`^[a-z0-9][a-z0-9._-]{0,63}$`), unique per organization.
    pub id: String,
    /// EIP-155 chain id of the chain its assets live on.
    pub chain_id: u64,
    /// Decimals of the price feed's answers (0..=36).
    pub price_decimals: u8,
    /// Staleness bound installed on the `PriceResolver`, seconds (> 0).
    pub staleness_bound_seconds: u64,
    /// Mints and burns (forced ones included) above this amount (token units, decimal
    /// string) wait for an approval, and when it is set every role change waits for one;
    /// `None`: never.
    pub mint_approval_threshold: Option<String>,
    /// How long an approval may take, seconds; after it the operation fails
    /// `APPROVAL_EXPIRED`.
    pub approval_ttl_seconds: u64,
    /// Insufficient gas funds pause the operation (waiting for funding) instead of
    /// failing it `GAS_REQUIRED`.
    pub funding_pause: bool,
    /// How long a funding pause may last, seconds.
    pub funding_deadline_seconds: u64,
    /// The sender of the template's assets: a custody vault of its chain (issue 19);
    /// `None`: the local operator key. The workflows do not change, only who sends
    /// (and so becomes the asset's issuer).
    pub sender: Option<TemplateSender>,
    /// `asset.forced-transfer` of the template's assets does not ask the compliance
    /// contract about the receiver (issue 37 §3); false: it does, as every transfer.
    pub forced_transfer_skips_compliance: bool,
    /// The most recipients an `asset.batch-mint` or `asset.batch-transfer` may name
    /// (1..=500; [`DEFAULT_BATCH_MAX_RECIPIENTS`] unless set).
    pub batch_max_recipients: u16,
}

/// The batch limit of a template that does not set one: 100 recipients, about 5.5
/// million gas for a batch mint of new holders of a regulated token on this project's
/// contracts (well under a 30-million block gas limit).
pub const DEFAULT_BATCH_MAX_RECIPIENTS: u16 = 100;

/// A template's custody sender: the vault's name in the configuration
/// (`chains.<name>.custody.vaults.<vault>`) and its address there when the template
/// was set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateSender {
    /// The vault's name (`^[a-z0-9][a-z0-9._-]{0,63}$`).
    pub vault: String,
    /// The vault account's address on the template's chain.
    pub address: alloy::primitives::Address,
}

impl TryFrom<store::AssetTemplateRow> for Template {
    type Error = OpsError;

    /// Decodes a stored row; an out-of-range column is [`keel_store::StoreError::Decode`].
    fn try_from(r: store::AssetTemplateRow) -> Result<Self> {
        let decode = |_| OpsError::Store(keel_store::StoreError::Decode);
        Ok(Self {
            id: r.id,
            chain_id: u64::try_from(r.chain_id).map_err(decode)?,
            price_decimals: u8::try_from(r.price_decimals).map_err(decode)?,
            staleness_bound_seconds: u64::try_from(r.staleness_bound_seconds).map_err(decode)?,
            mint_approval_threshold: r.mint_approval_threshold,
            approval_ttl_seconds: u64::try_from(r.approval_ttl_seconds).map_err(decode)?,
            funding_pause: r.funding_pause,
            funding_deadline_seconds: u64::try_from(r.funding_deadline_seconds).map_err(decode)?,
            sender: match (r.sender_vault, r.sender_address) {
                (Some(vault), Some(a)) if a.len() == 20 => Some(TemplateSender {
                    vault,
                    address: alloy::primitives::Address::from_slice(&a),
                }),
                (None, None) => None,
                _ => return Err(OpsError::Store(keel_store::StoreError::Decode)),
            },
            forced_transfer_skips_compliance: r.forced_transfer_skips_compliance,
            batch_max_recipients: u16::try_from(r.batch_max_recipients).map_err(decode)?,
        })
    }
}

fn sha256(bytes: &[u8]) -> Vec<u8> {
    Sha256::digest(bytes).to_vec()
}

fn i64_of(v: u64, field: &'static str) -> Result<i64> {
    i64::try_from(v).map_err(|_| OpsError::InvalidField {
        field,
        reason: "exceeds the supported range",
    })
}

/// Creates an organization named `name` (1..=255 characters, unique) and returns its id.
///
/// # Errors
/// [`OpsError::InvalidField`] for a bad name; [`OpsError::Store`] (a duplicate name is
/// a constraint violation).
pub async fn create_organization(db: &PgPool, name: &str) -> Result<Uuid> {
    let len = name.chars().count();
    if len == 0 || len > 255 {
        return Err(OpsError::InvalidField {
            field: "name",
            reason: "must be 1 to 255 characters",
        });
    }
    let id = Uuid::new_v4();
    store::organization_insert(db, id, name).await?;
    Ok(id)
}

/// The id of the organization named `name`.
///
/// # Errors
/// [`OpsError::NotFound`]; [`OpsError::Store`].
pub async fn organization_by_name(db: &PgPool, name: &str) -> Result<Uuid> {
    store::organization_id_by_name(db, name)
        .await?
        .ok_or(OpsError::NotFound {
            what: "organization",
        })
}

/// Creates an API key for `organization_id` holding every scope (as keys created
/// before scopes existed; `keel api-key create` without `--scope`). The token is
/// returned once; only its SHA-256 is stored. The row takes the `scopes` column's
/// default, so this also works on a schema before migration 0029.
///
/// # Errors
/// [`OpsError::InvalidField`] for a bad label; [`OpsError::Store`] (unknown
/// organization is a constraint violation).
pub async fn create_api_key(db: &PgPool, organization_id: Uuid, label: &str) -> Result<NewApiKey> {
    valid_label(label)?;
    let (token, hash) = new_token();
    let id = Uuid::new_v4();
    store::api_key_insert(db, id, organization_id, label, &hash).await?;
    Ok(NewApiKey { id, token })
}

/// A fresh token and its SHA-256.
fn new_token() -> (String, Vec<u8>) {
    let secret: [u8; 32] = rand::random();
    let token = format!("{API_KEY_PREFIX}{}", hex::encode(secret));
    let hash = sha256(token.as_bytes());
    (token, hash)
}

/// Creates an API key for `organization_id` holding `scopes`. The token is returned
/// once; only its SHA-256 is stored.
///
/// # Errors
/// [`OpsError::InvalidField`] for a bad label or no scope; [`OpsError::Store`]
/// (unknown organization is a constraint violation).
pub async fn create_api_key_with_scopes(
    db: impl sqlx::PgExecutor<'_>,
    organization_id: Uuid,
    label: &str,
    scopes: Scopes,
) -> Result<NewApiKey> {
    valid_label(label)?;
    if scopes.is_empty() {
        return Err(OpsError::InvalidField {
            field: "scopes",
            reason: "must hold at least one scope",
        });
    }
    let (token, hash) = new_token();
    let id = Uuid::new_v4();
    store::api_key_insert_with_scopes(db, id, organization_id, label, &hash, &scopes.names())
        .await?;
    Ok(NewApiKey { id, token })
}

/// Checks an `issuedTo`: 1 to 255 characters that sanitizing leaves unchanged (no
/// control, separator or format characters: see [`keel_durable::sanitize_actor_text`]).
///
/// # Errors
/// [`OpsError::InvalidField`] (`issuedTo`).
pub fn valid_issued_to(issued_to: &str) -> Result<()> {
    let len = issued_to.chars().count();
    if len == 0 || len > 255 || keel_durable::sanitize_actor_text(issued_to) != issued_to {
        return Err(OpsError::InvalidField {
            field: "issuedTo",
            reason: "must be 1 to 255 printable characters",
        });
    }
    Ok(())
}

/// Creates an API key like [`create_api_key_with_scopes`], issued to the named person
/// `issued_to` when given (its commands are then recorded as `USER` with that id), in
/// one transaction.
///
/// # Errors
/// As [`create_api_key_with_scopes`]; [`OpsError::InvalidField`] (`issuedTo`).
pub async fn create_api_key_issued(
    db: &PgPool,
    organization_id: Uuid,
    label: &str,
    scopes: Scopes,
    issued_to: Option<&str>,
) -> Result<NewApiKey> {
    if let Some(p) = issued_to {
        valid_issued_to(p)?;
    }
    let mut tx = db.begin().await.map_err(keel_store::StoreError::from)?;
    let new = create_api_key_with_scopes(&mut *tx, organization_id, label, scopes).await?;
    if let Some(p) = issued_to {
        store::api_key_set_issued_to(&mut *tx, organization_id, new.id, p).await?;
    }
    tx.commit().await.map_err(keel_store::StoreError::from)?;
    Ok(new)
}

/// Who `caller` records commands as, read at recording time (issue 23): a key issued
/// to a person is `USER` with that person's id, any other key `SERVICE` with the key's
/// id, both `VERIFIED`. **DEGRADED** when the key's identity can no longer be fully
/// established when the command is recorded: the request authenticated, but by then
/// the key was revoked (or deleted), or its stored `issuedTo` does not survive
/// sanitizing unchanged (a row written outside the service). The kind and id are still
/// the best known (`SERVICE` with the key's id, or `USER` with the sanitized id).
///
/// # Errors
/// [`OpsError::Store`].
pub async fn caller_actor(
    db: impl sqlx::PgExecutor<'_>,
    caller: Caller,
) -> Result<keel_durable::Actor> {
    let key = caller.api_key_id.to_string();
    Ok(
        match store::api_key_identity(db, caller.api_key_id).await? {
            Some((true, None)) => keel_durable::Actor::service(&key),
            Some((live, Some(person))) => {
                let actor = keel_durable::Actor::user(&person);
                if live && actor.id() == Some(person.as_str()) {
                    actor
                } else {
                    actor.degraded()
                }
            }
            Some((false, None)) | None => keel_durable::Actor::service(&key).degraded(),
        },
    )
}

fn valid_label(label: &str) -> Result<()> {
    let len = label.chars().count();
    if len == 0 || len > 255 || label.chars().any(char::is_control) {
        return Err(OpsError::InvalidField {
            field: "label",
            reason: "must be 1 to 255 printable characters",
        });
    }
    Ok(())
}

/// Up to `limit` API keys of `organization_id` (revoked ones included, with
/// `revoked_at`), oldest first, after the `(created_at, id)` position `after`.
///
/// # Errors
/// [`OpsError::Store`].
pub async fn api_keys(
    db: impl sqlx::PgExecutor<'_>,
    organization_id: Uuid,
    after: Option<(DateTime<Utc>, Uuid)>,
    limit: u32,
) -> Result<Vec<ApiKeyView>> {
    store::api_key_list(db, organization_id, after, i64::from(limit))
        .await?
        .into_iter()
        .map(ApiKeyView::try_from)
        .collect()
}

/// API key `id` of `organization_id`.
///
/// # Errors
/// [`OpsError::NotFound`] (`api key`; also another organization's key);
/// [`OpsError::Store`].
pub async fn api_key(
    db: impl sqlx::PgExecutor<'_>,
    organization_id: Uuid,
    id: Uuid,
) -> Result<ApiKeyView> {
    store::api_key_get(db, organization_id, id)
        .await?
        .ok_or(OpsError::NotFound { what: "api key" })
        .and_then(ApiKeyView::try_from)
}

/// Revokes API key `id` of `organization_id`: both its secrets stop authenticating at
/// once. Repeating it is harmless (the first `revoked_at` stays).
///
/// # Errors
/// [`OpsError::NotFound`] (`api key`; also another organization's key);
/// [`OpsError::Store`].
pub async fn revoke_api_key(
    db: impl sqlx::PgExecutor<'_>,
    organization_id: Uuid,
    id: Uuid,
) -> Result<ApiKeyView> {
    store::api_key_revoke(db, organization_id, id)
        .await?
        .ok_or(OpsError::NotFound { what: "api key" })
        .and_then(ApiKeyView::try_from)
}

/// Rotates API key `id` of `organization_id`: a new token (returned once) replaces its
/// secret. With `overlap` zero the old secret stops at once; otherwise it keeps
/// working for `overlap` (whole seconds, at most [`MAX_ROTATION_OVERLAP`]). A secret
/// an earlier rotation kept working stops at once either way.
///
/// # Errors
/// [`OpsError::InvalidField`] (`expiresInSeconds`) for an overlap above the bound;
/// [`OpsError::NotFound`] (`api key`; also another organization's key);
/// [`OpsError::ApiKeyRevoked`]; [`OpsError::Store`].
pub async fn rotate_api_key(
    db: &PgPool,
    organization_id: Uuid,
    id: Uuid,
    overlap: Duration,
) -> Result<RotatedApiKey> {
    if overlap > MAX_ROTATION_OVERLAP {
        return Err(OpsError::InvalidField {
            field: "expiresInSeconds",
            reason: "must be at most 604800 (7 days)",
        });
    }
    let overlap_seconds = i64::try_from(overlap.as_secs()).map_err(|_| OpsError::InvalidField {
        field: "expiresInSeconds",
        reason: "must be at most 604800 (7 days)",
    })?;
    let (token, hash) = new_token();
    match store::api_key_rotate(db, organization_id, id, &hash, overlap_seconds).await? {
        Some(row) => Ok(RotatedApiKey {
            key: ApiKeyView::try_from(row)?,
            token,
        }),
        // No unrevoked key: tell a revoked one from none (another organization's
        // included).
        None => match store::api_key_get(db, organization_id, id).await? {
            Some(_) => Err(OpsError::ApiKeyRevoked),
            None => Err(OpsError::NotFound { what: "api key" }),
        },
    }
}

/// Whether `token` has the key shape (`keel_sk_` + 64 hex digits).
fn well_formed_token(token: &str) -> bool {
    token.len() == API_KEY_PREFIX.len() + 64
        && token.starts_with(API_KEY_PREFIX)
        && token[API_KEY_PREFIX.len()..]
            .bytes()
            .all(|b| b.is_ascii_hexdigit())
}

/// Resolves a bearer token to its caller and scopes: the unrevoked key whose current
/// secret it is, or whose previous secret it is while the rotation overlap lasts.
/// Read from the database on every call (no cache). Tokens that do not have the key
/// shape are refused before any query.
///
/// # Errors
/// [`OpsError::Unauthenticated`] for an unknown, revoked, rotated-away or malformed
/// token; [`OpsError::Store`].
pub async fn authenticate_credential(db: &PgPool, token: &str) -> Result<Credential> {
    if !well_formed_token(token) {
        return Err(OpsError::Unauthenticated);
    }
    let row = store::api_key_by_secret(db, &sha256(token.as_bytes()))
        .await?
        .ok_or(OpsError::Unauthenticated)?;
    Ok(Credential {
        caller: Caller {
            organization_id: row.organization_id,
            api_key_id: row.api_key_id,
        },
        scopes: Scopes::from_names(&row.scopes)
            .ok_or(OpsError::Store(keel_store::StoreError::Decode))?,
    })
}

/// Resolves a bearer token to its caller ([`authenticate_credential`] without the
/// scopes).
///
/// # Errors
/// As [`authenticate_credential`].
pub async fn authenticate(db: &PgPool, token: &str) -> Result<Caller> {
    authenticate_credential(db, token).await.map(|c| c.caller)
}

/// Whether `id` matches the template id pattern `^[a-z0-9][a-z0-9._-]{0,63}$`.
pub fn valid_template_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && id.bytes().enumerate().all(|(i, b)| {
            b.is_ascii_lowercase()
                || b.is_ascii_digit()
                || (i > 0 && matches!(b, b'.' | b'_' | b'-'))
        })
}

/// Creates or replaces the template `t.id` of `organization_id`.
///
/// # Errors
/// [`OpsError::InvalidField`] for an id that breaks the pattern, zero bound or TTLs,
/// decimals above 36, a malformed threshold or a batch limit outside 1..=500;
/// [`OpsError::Store`].
pub async fn upsert_template(db: &PgPool, organization_id: Uuid, t: &Template) -> Result<()> {
    if !valid_template_id(&t.id) {
        return Err(OpsError::InvalidField {
            field: "id",
            reason: "must match ^[a-z0-9][a-z0-9._-]{0,63}$",
        });
    }
    Decimals::new(t.price_decimals).map_err(|source| OpsError::Amount {
        field: "priceDecimals",
        source,
    })?;
    if t.staleness_bound_seconds == 0
        || t.approval_ttl_seconds == 0
        || t.funding_deadline_seconds == 0
    {
        return Err(OpsError::InvalidField {
            field: "seconds",
            reason: "bounds and deadlines must be positive",
        });
    }
    if !(1..=500).contains(&t.batch_max_recipients) {
        return Err(OpsError::InvalidField {
            field: "batchMaxRecipients",
            reason: "must be 1 to 500",
        });
    }
    if let Some(sender) = &t.sender
        && (!valid_template_id(&sender.vault) || sender.address.is_zero())
    {
        return Err(OpsError::InvalidField {
            field: "sender",
            reason: "a vault name must match ^[a-z0-9][a-z0-9._-]{0,63}$ and its address must not be zero",
        });
    }
    if let Some(th) = &t.mint_approval_threshold {
        parse_units(
            th,
            Decimals::new(36).map_err(|source| OpsError::Amount {
                field: "mintApprovalThreshold",
                source,
            })?,
            Rounding::Exact,
        )
        .map_err(|source| OpsError::Amount {
            field: "mintApprovalThreshold",
            source,
        })?;
    }
    let row = store::AssetTemplateRow {
        id: t.id.clone(),
        chain_id: i64_of(t.chain_id, "chainId")?,
        price_decimals: i16::from(t.price_decimals),
        staleness_bound_seconds: i64_of(t.staleness_bound_seconds, "stalenessBoundSeconds")?,
        mint_approval_threshold: t.mint_approval_threshold.clone(),
        approval_ttl_seconds: i64_of(t.approval_ttl_seconds, "approvalTtlSeconds")?,
        funding_pause: t.funding_pause,
        funding_deadline_seconds: i64_of(t.funding_deadline_seconds, "fundingDeadlineSeconds")?,
        sender_vault: t.sender.as_ref().map(|s| s.vault.clone()),
        sender_address: t.sender.as_ref().map(|s| s.address.to_vec()),
        forced_transfer_skips_compliance: t.forced_transfer_skips_compliance,
        batch_max_recipients: i32::from(t.batch_max_recipients),
    };
    store::asset_template_upsert(db, organization_id, &row).await?;
    Ok(())
}

/// The template `id` of `organization_id`.
///
/// # Errors
/// [`OpsError::NotFound`] (`template`, also for an id that breaks the pattern, which
/// is refused before any query); [`OpsError::Store`].
pub async fn template(
    db: impl sqlx::PgExecutor<'_>,
    organization_id: Uuid,
    id: &str,
) -> Result<Template> {
    if !valid_template_id(id) {
        return Err(OpsError::NotFound { what: "template" });
    }
    let row = store::asset_template_get(db, organization_id, id)
        .await?
        .ok_or(OpsError::NotFound { what: "template" })?;
    Template::try_from(row)
}
