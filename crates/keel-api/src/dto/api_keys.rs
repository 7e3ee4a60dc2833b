//! API keys (`/v1/api-keys`): scopes, create and rotate bodies, keys and lists.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

use super::*;

/// The most scopes a key can hold (there are four).
pub const MAX_SCOPES_PER_KEY: usize = 4;

/// What an API key may do. Every route requires one scope (`GET` routes `read`,
/// operation-creating `POST`s, retry and cancel `operate`, approve and reject
/// `approve`, the `/v1/api-keys` routes `admin`); a key may hold several.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ApiKeyScope {
    /// Every `GET` route.
    Read,
    /// The operation-creating `POST`s, retry and cancel.
    Operate,
    /// Approve and reject.
    Approve,
    /// The `/v1/api-keys` routes (key management).
    Admin,
}

impl From<keel_workflows::Scope> for ApiKeyScope {
    fn from(s: keel_workflows::Scope) -> Self {
        match s {
            keel_workflows::Scope::Read => Self::Read,
            keel_workflows::Scope::Operate => Self::Operate,
            keel_workflows::Scope::Approve => Self::Approve,
            keel_workflows::Scope::Admin => Self::Admin,
        }
    }
}

/// `POST /v1/api-keys`: create a key of the caller's organization.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(example = json!({"label": "ci-reader", "scopes": ["read"]}))]
pub struct CreateApiKeyRequest {
    /// Who or what uses the key: 1 to 255 printable (non-control) characters.
    #[schema(
        min_length = 1,
        max_length = 255,
        pattern = r"^[^\u0000-\u001F\u007F-\u009F]*$"
    )]
    pub label: String,
    /// Its scopes: one to four distinct names (`uniqueItems`), each one the calling key
    /// holds itself (else `403 INSUFFICIENT_SCOPE`).
    #[schema(value_type = Vec<ApiKeyScope>, min_items = 1, max_items = 4)]
    pub scopes: Vec<String>,
    /// The named person the key is issued to (an id in your directory: employee
    /// number, e-mail, ...): 1 to 255 characters with no control, separator or format
    /// characters (else `422 INVALID_FIELD`). The commands the key asks for are then
    /// recorded as actor `USER` with this id; without it, as `SERVICE` with the key's id.
    /// Set once, here.
    #[serde(default)]
    #[schema(min_length = 1, max_length = 255, example = "employee-4711")]
    pub issued_to: Option<String>,
}

/// `POST /v1/api-keys/{id}/rotate`: empty, `{}`, or the overlap of the old secret.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(example = json!({"expiresInSeconds": 3600}))]
pub struct RotateApiKeyRequest {
    /// How long the old secret keeps working, seconds (0 to 604800, i.e. 7 days).
    /// Absent, null or 0: it stops at once.
    #[schema(minimum = 0, maximum = 604_800)]
    #[serde(default, deserialize_with = "integral_u64_opt")]
    pub expires_in_seconds: Option<u64>,
}

/// Deserializes an optional `u64` from an integral JSON number ([`integral_u64`]).
pub(crate) fn integral_u64_opt<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<u64>, D::Error> {
    Option::<serde_json::Number>::deserialize(d)?
        .map(|n| {
            integral_u64(&n)
                .ok_or_else(|| serde::de::Error::custom("must be a non-negative integer"))
        })
        .transpose()
}

/// An API key as its organization sees it. Its secret is never shown again after
/// creation or rotation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ApiKey {
    /// Key id (stays the same across rotations).
    pub id: Uuid,
    /// Who or what uses it.
    pub label: String,
    /// What it may do.
    pub scopes: Vec<ApiKeyScope>,
    /// When it was created (RFC 3339, UTC).
    pub created_at: DateTime<Utc>,
    /// Its last rotation (RFC 3339, UTC), or null.
    pub rotated_at: Option<DateTime<Utc>>,
    /// When it was revoked (RFC 3339, UTC), or null. A revoked key authenticates
    /// nothing.
    pub revoked_at: Option<DateTime<Utc>>,
    /// Until when the secret its last rotation replaced keeps working (RFC 3339, UTC),
    /// or null when it does not.
    pub previous_secret_expires_at: Option<DateTime<Utc>>,
    /// The named person the key is issued to (its commands are recorded as actor `USER`
    /// with this id), or null for a service key.
    pub issued_to: Option<String>,
}

impl From<keel_workflows::ApiKeyView> for ApiKey {
    fn from(k: keel_workflows::ApiKeyView) -> Self {
        Self {
            id: k.id,
            label: k.label,
            scopes: k.scopes.iter().map(Into::into).collect(),
            created_at: k.created_at,
            rotated_at: k.rotated_at,
            revoked_at: k.revoked_at,
            previous_secret_expires_at: k.previous_secret_expires_at,
            issued_to: k.issued_to,
        }
    }
}

/// A key with its secret: the answer of create and rotate, the only time the token is
/// shown.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ApiKeyWithToken {
    /// The key.
    pub api_key: ApiKey,
    /// The bearer token, shown once: `keel_sk_` + 64 hex digits. Store it now; Keel
    /// keeps only its SHA-256.
    #[schema(pattern = "^keel_sk_[0-9a-f]{64}$")]
    pub token: String,
}

impl From<keel_workflows::RotatedApiKey> for ApiKeyWithToken {
    fn from(r: keel_workflows::RotatedApiKey) -> Self {
        Self {
            api_key: r.key.into(),
            token: r.token,
        }
    }
}

/// `GET /v1/api-keys`: one page of the organization's keys (revoked ones included),
/// oldest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ApiKeyList {
    /// The keys of this page.
    pub data: Vec<ApiKey>,
    /// True when more keys follow.
    pub has_more: bool,
    /// Pass as `cursor` for the next page; null exactly when `hasMore` is false.
    pub next_cursor: Option<String>,
}
