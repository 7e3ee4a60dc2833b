//! Custody senders: a sender whose key lives at a custody provider that signs **and
//! broadcasts** (`keel_custody::CustodyProvider`, e.g. Fireblocks), registered with
//! [`crate::TxQueue::add_custody_sender`] instead of a [`crate::TxSigner`].
//!
//! A custody request is enqueued like any other (same idempotency rules, same
//! settlement verdicts) but never takes a local nonce: its `txq_request` row stays
//! `queued` until it settles, and what happened at the provider is stored per
//! submission in `txq_custody_attempt` (migration 0040). The queue's custody pass
//! (`queue/custody.rs`, run by [`crate::TxQueue::run`] after each sender round and by
//! [`crate::TxQueue::custody_pass`]) moves each submission:
//!
//! | phase | meaning | next |
//! |---|---|---|
//! | `ready` | nothing was created with this external id | commit `creating`, then create |
//! | `creating` | a create may be in flight (or its process died) | in doubt |
//! | `in_doubt` | the create's answer was lost | look up by external id |
//! | `submitted` | the provider has it | poll the status |
//! | `cancelling` | a cancel Keel asked for was accepted | wait for `CANCELLED`, then resubmit (silent drop) or settle (approval deadline, withdrawal) |
//! | `superseded` | cancelled; resubmission n + 1 exists | — |
//! | `done` | the request settled from this submission | — |
//!
//! Rules (docs/custody.md, "Custody path in the queue"):
//! - The external id is `ExternalTxId::derive(request id, resubmission)` and its row is
//!   committed **before** the create call. After any lost or failed answer the next
//!   step is a lookup by external id, never a blind second create.
//! - A lookup's `None` proves the create never landed only after the provider can no
//!   longer accept it: the time the create call returned (or, after a crash, the time
//!   the next pass found the row `creating`) + the provider's in-doubt window
//!   (`CustodyProvider::in_doubt_window`; Fireblocks: the request JWT's lifetime,
//!   29 s) + the configured clock skew (`absent_after`). Before that, `None` means
//!   "look again".
//! - What a provider status means (its phase, rank and how a rejection ended) is the
//!   provider's to say (`CustodyProvider::status_phase`, `status_rank`,
//!   `status_ending`): this path names no provider's statuses. The submission phases
//!   and cancel reasons are closed enums decoded at the row ([`crate::CustodyPhase`],
//!   [`crate::CancelReason`]).
//! - The provider's status drives the request: `REJECTED`/`BLOCKED`/`CANCELLED`/`FAILED`
//!   without a hash settle `Failed` with `CUSTODY_*` codes carrying the sub-status
//!   (never via an approval wait); an approval wait at the provider is visible as
//!   [`CustodyView::awaiting_approval`]; once a hash is known the verdict comes from
//!   the chain only — a receipt at the queue's confirmation depth (`confirmed` or
//!   `reverted`); the provider's `COMPLETED` alone is never final, and a receipt lost
//!   in a reorg leaves the request in flight.
//! - Lost hash: `COMPLETED` without a hash is looked up again by external id; the hash
//!   is persisted before anything settles.
//! - Silent drop: an organization-scoped submission ([`organization_scoped`]: an
//!   operation's write) still pre-broadcast (no hash) past
//!   [`CustodySenderConfig::silent_drop_after_secs`] is cancelled at the provider; only
//!   once a read shows `CANCELLED` is it superseded by resubmission n + 1 (a new
//!   external id, the same calldata). With the setting off, the submission keeps
//!   polling and runs into the poll budget. A platform-scoped write is never
//!   resubmitted automatically: still pre-broadcast without a hash past the poll
//!   budget, it is cancelled, and once the cancel is confirmed it fails
//!   `CUSTODY_TIMED_OUT` (nothing reached the chain; a declined cancel keeps it
//!   followed).
//! - Poll budget: any other submission not settled after
//!   [`CustodySenderConfig::poll_budget_secs`] (an approval wait excepted) is flagged
//!   once: [`CustodyView::budget_exceeded`], a WARN and
//!   `keel_txq_custody_poll_budget_exceeded_total`; it keeps polling at the slowest
//!   interval (it may still land: failing it would be a lie).
//! - Approval deadline (issue 32 §5): a submission waiting for an approval at the
//!   provider (`PENDING_AUTHORIZATION`) longer than
//!   [`CustodySenderConfig::approval_deadline_secs`] is cancelled at the provider
//!   (`cancel_reason = 'approval_expired'`, migration 0070); once a read shows
//!   `CANCELLED` the request fails `CUSTODY_APPROVAL_EXPIRED`. A declined cancel (the
//!   provider signed meanwhile) keeps it followed to its chain verdict.
//! - Withdrawal (the cancel of an operation, [`crate::withdraw_by_key_prefix`]): a
//!   custody request already at its provider is reported in flight and marked
//!   (`cancel_reason = 'withdrawn'`); while it is not signed (pre-broadcast or awaiting
//!   approval, no hash) the pass cancels it at the provider, and once a read shows
//!   `CANCELLED` it settles `WITHDRAWN` (reason `CANCELLED_AT_PROVIDER`). A
//!   submission the provider signed anyway runs to its chain verdict, which says what
//!   landed.
//! - A provider error of one request defers that request only (backoff), never the
//!   others.
//! - Webhooks are only a wake-up: [`custody_wake`] makes the submission due now, and the
//!   pass then reads the provider.

use crate::store;
use crate::{Result, TxqError};
use alloy::primitives::{Address, B256};
use keel_custody::{AssetId, CustodyProvider, VaultAccountId};
use serde::{Deserialize, Serialize};
use sqlx::PgExecutor;
use std::sync::Arc;
use std::time::Duration;
use uuid::Uuid;

/// Settings of one custody sender (config: `chains.<name>.custody.senders[]`, see
/// docs/custody.md). Durations are in milliseconds or seconds as the names say.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CustodySenderConfig {
    /// The vault account at the provider that signs and pays (Fireblocks: decimal id).
    pub vault_account_id: String,
    /// The provider's asset id of the chain's native coin (`ETH`, `ETH_TEST5`, ...).
    pub asset_id: String,
    /// The vault account's address on this chain (the sender of its requests).
    pub address: Address,
    /// First delay between two reads of a submission's status, ms (default 1000);
    /// doubles per read up to `max_poll_interval_ms`.
    #[serde(default = "default_poll_ms")]
    pub poll_interval_ms: u64,
    /// Longest delay between two reads, ms (default 30000).
    #[serde(default = "default_max_poll_ms")]
    pub max_poll_interval_ms: u64,
    /// A submission unsettled this long (not counting an approval wait) is flagged
    /// (default 3600 s).
    #[serde(default = "default_budget_secs")]
    pub poll_budget_secs: u64,
    /// A submission still pre-broadcast without a hash this long after its create is
    /// treated as silently dropped: cancelled and resubmitted (default 600 s);
    /// `null`: never (it runs into the poll budget).
    #[serde(default = "default_silent_drop_secs")]
    pub silent_drop_after_secs: Option<u64>,
    /// Clock skew allowed between Keel and the provider, seconds (default 30), added to
    /// the provider's in-doubt window (Fireblocks: the create JWT's lifetime) before a
    /// lookup's `None` proves absence.
    #[serde(default = "default_skew_secs")]
    pub clock_skew_secs: u64,
    /// How long a submission may wait for an approval at the provider
    /// (`PENDING_AUTHORIZATION`), seconds (default 86400, one day; `null` or 0: no
    /// deadline). Past it the transaction is cancelled at the provider and, once the
    /// cancel is confirmed, the request fails `CUSTODY_APPROVAL_EXPIRED` (an approval
    /// given at the provider afterwards has nothing to approve). Issue 32 §5.
    #[serde(default = "default_approval_deadline_secs")]
    pub approval_deadline_secs: Option<u64>,
}

fn default_poll_ms() -> u64 {
    1000
}
fn default_max_poll_ms() -> u64 {
    30_000
}
fn default_budget_secs() -> u64 {
    3600
}
#[allow(clippy::unnecessary_wraps)]
fn default_silent_drop_secs() -> Option<u64> {
    Some(600)
}
fn default_skew_secs() -> u64 {
    30
}
#[allow(clippy::unnecessary_wraps)]
fn default_approval_deadline_secs() -> Option<u64> {
    Some(86_400)
}

impl CustodySenderConfig {
    /// Checks the settings; returns the typed vault account and asset ids.
    ///
    /// # Errors
    /// As [`CustodySender::new`].
    pub(crate) fn validate(&self) -> Result<(VaultAccountId, AssetId)> {
        let vault =
            VaultAccountId::new(self.vault_account_id.clone()).map_err(|_| TxqError::Config {
                key: "vaultAccountId",
                reason: "must be 1..255 characters of [A-Za-z0-9._:-]",
            })?;
        let asset = AssetId::new(self.asset_id.clone()).map_err(|_| TxqError::Config {
            key: "assetId",
            reason: "must be 1..255 characters of [A-Za-z0-9._:-]",
        })?;
        if self.poll_interval_ms == 0 {
            return Err(TxqError::Config {
                key: "pollIntervalMs",
                reason: "must be at least 1",
            });
        }
        if self.max_poll_interval_ms < self.poll_interval_ms {
            return Err(TxqError::Config {
                key: "maxPollIntervalMs",
                reason: "must be at least pollIntervalMs",
            });
        }
        Ok((vault, asset))
    }

    /// A configuration with the defaults (poll 1 s doubling to 30 s, budget 1 h,
    /// silent drop after 10 min, skew 30 s).
    pub fn new(
        vault_account_id: impl Into<String>,
        asset_id: impl Into<String>,
        address: Address,
    ) -> Self {
        Self {
            vault_account_id: vault_account_id.into(),
            asset_id: asset_id.into(),
            address,
            poll_interval_ms: default_poll_ms(),
            max_poll_interval_ms: default_max_poll_ms(),
            poll_budget_secs: default_budget_secs(),
            silent_drop_after_secs: default_silent_drop_secs(),
            clock_skew_secs: default_skew_secs(),
            approval_deadline_secs: default_approval_deadline_secs(),
        }
    }
}

/// The idempotency-key prefix of an operation's writes (`op/<operation id>/<write>`,
/// keel-workflows): every operation belongs to an organization, so these requests are
/// **organization-scoped**; any other key is a platform-scoped write.
pub const ORGANIZATION_SCOPED_KEY_PREFIX: &str = "op/";

/// Whether a request with this idempotency key is an organization-scoped write (see
/// [`ORGANIZATION_SCOPED_KEY_PREFIX`]). Only those get the automatic silent-drop
/// recovery (cancel, confirm, resubmit); a platform-scoped write that stays
/// pre-broadcast past the poll budget is cancelled and fails
/// [`crate::FailureCode::CustodyTimedOut`].
pub fn organization_scoped(idempotency_key: &str) -> bool {
    idempotency_key.starts_with(ORGANIZATION_SCOPED_KEY_PREFIX)
}

/// A registered custody sender: the provider and the checked settings.
#[derive(Clone)]
pub struct CustodySender {
    pub(crate) address: Address,
    pub(crate) provider: Arc<dyn CustodyProvider>,
    pub(crate) vault: VaultAccountId,
    pub(crate) asset: AssetId,
    pub(crate) poll: Duration,
    pub(crate) max_poll: Duration,
    pub(crate) budget: Duration,
    pub(crate) silent_drop_after: Option<Duration>,
    pub(crate) skew: Duration,
    /// The approval deadline at the provider (`None`: none).
    pub(crate) approval_deadline: Option<Duration>,
}

impl std::fmt::Debug for CustodySender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CustodySender")
            .field("address", &self.address)
            .field("provider", &self.provider.name())
            .field("vault", &self.vault)
            .finish()
    }
}

impl CustodySender {
    /// A custody sender for `config.address`, submitting through `provider`.
    ///
    /// # Errors
    /// [`TxqError::Config`] when the vault account id or asset id is not a valid
    /// provider id (1..255 of `[A-Za-z0-9._:-]`), a poll interval is 0 or the maximum
    /// is below the first.
    pub fn new(provider: Arc<dyn CustodyProvider>, config: &CustodySenderConfig) -> Result<Self> {
        let (vault, asset) = config.validate()?;
        Ok(Self {
            address: config.address,
            provider,
            vault,
            asset,
            poll: Duration::from_millis(config.poll_interval_ms),
            max_poll: Duration::from_millis(config.max_poll_interval_ms),
            budget: Duration::from_secs(config.poll_budget_secs),
            silent_drop_after: config.silent_drop_after_secs.map(Duration::from_secs),
            skew: Duration::from_secs(config.clock_skew_secs),
            approval_deadline: config
                .approval_deadline_secs
                .filter(|s| *s > 0)
                .map(Duration::from_secs),
        })
    }

    /// The sender address.
    pub fn address(&self) -> Address {
        self.address
    }

    /// The delay before read number `polls + 1`: the first interval doubled per read,
    /// capped at the maximum.
    pub(crate) fn backoff(&self, polls: i32) -> Duration {
        backoff(self.poll, self.max_poll, polls)
    }
}

/// `first` doubled `polls` times, capped at `max`.
fn backoff(first: Duration, max: Duration, polls: i32) -> Duration {
    let shift = u32::try_from(polls.clamp(0, 16)).unwrap_or(0);
    first.checked_mul(1u32 << shift).unwrap_or(max).min(max)
}

/// What an operator (and the operation view) sees of a custody request: its latest
/// submission at the provider ([`custody_views`], [`crate::RequestStatus::custody`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CustodyView {
    /// The request's id.
    pub request_id: Uuid,
    /// The provider's bounded name (`fireblocks`).
    pub provider: String,
    /// 0 for the first create; n + 1 after a silent drop was cancelled.
    pub resubmission: u32,
    /// Keel's idempotency key at the provider (`keel.<request id>.<resubmission>`).
    pub external_tx_id: String,
    /// The provider's id, once known.
    pub provider_tx_id: Option<String>,
    /// The submission phase (`ready`, `creating`, `in_doubt`, `submitted`,
    /// `cancelling`, `superseded`, `done`; see the module docs).
    pub phase: String,
    /// The provider's last status as read (Fireblocks name), once read.
    pub status: Option<String>,
    /// The provider's last sub-status, when it gave one.
    pub sub_status: Option<String>,
    /// The on-chain hash, once the provider reported it.
    pub tx_hash: Option<B256>,
    /// True while the provider waits for an approval (`PENDING_AUTHORIZATION`,
    /// `PENDING_3RD_PARTY_MANUAL_APPROVAL`): an operation wait of kind
    /// `custody_approval`.
    pub awaiting_approval: bool,
    /// True once the poll budget ran out (the submission is still followed).
    pub budget_exceeded: bool,
    /// Reads of the provider for this submission.
    pub polls: u32,
}

/// The latest submission of each custody request of `ids` (requests without one are
/// absent: not custody, or not submitted yet). One statement.
///
/// # Errors
/// [`TxqError::Store`] when the database fails.
pub async fn custody_views(db: impl PgExecutor<'_>, ids: &[Uuid]) -> Result<Vec<CustodyView>> {
    Ok(store::custody_views(db, ids)
        .await?
        .into_iter()
        .map(store::CustodyViewRow::into_view)
        .collect())
}

/// A wake-up hint for the custody pass (a verified provider webhook): makes the live
/// submission with this provider id or external id due for a read at once. The event's
/// body is never taken as the truth; the pass reads the provider. Returns whether a
/// live submission matched (an event for an unknown transaction matches none).
///
/// # Errors
/// [`TxqError::Store`] when the database fails.
pub async fn custody_wake(
    db: impl PgExecutor<'_>,
    provider_tx_id: Option<&str>,
    external_tx_id: Option<&str>,
) -> Result<bool> {
    if provider_tx_id.is_none() && external_tx_id.is_none() {
        return Ok(false);
    }
    Ok(store::custody_wake(db, provider_tx_id, external_tx_id).await? > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_reads_camel_case_with_defaults_and_refuses_bad_values() {
        let c: CustodySenderConfig = serde_json::from_value(serde_json::json!({
            "vaultAccountId": "7",
            "assetId": "ETH_TEST5",
            "address": "0x00000000000000000000000000000000000000aa",
        }))
        .unwrap();
        assert_eq!(
            c,
            CustodySenderConfig::new(
                "7",
                "ETH_TEST5",
                "0x00000000000000000000000000000000000000aa"
                    .parse()
                    .unwrap()
            )
        );
        assert_eq!(c.silent_drop_after_secs, Some(600));
        let off: CustodySenderConfig = serde_json::from_value(serde_json::json!({
            "vaultAccountId": "7", "assetId": "ETH", "address": "0x00000000000000000000000000000000000000aa",
            "silentDropAfterSecs": null,
        }))
        .unwrap();
        assert_eq!(off.silent_drop_after_secs, None);
        assert!(
            serde_json::from_value::<CustodySenderConfig>(serde_json::json!({
                "vaultAccountId": "7", "assetId": "ETH", "address": "0x00000000000000000000000000000000000000aa",
                "apiKey": "nope",
            }))
            .is_err(),
            "unknown keys are refused"
        );
    }

    #[test]
    fn backoff_doubles_from_the_first_interval_up_to_the_maximum() {
        let (first, max) = (Duration::from_millis(100), Duration::from_millis(1000));
        let ms: Vec<u128> = (0..6).map(|p| backoff(first, max, p).as_millis()).collect();
        assert_eq!(ms, [100, 200, 400, 800, 1000, 1000]);
        assert_eq!(backoff(first, max, i32::MAX), max);
    }

    #[test]
    fn invalid_ids_and_intervals_are_refused_naming_the_key() {
        let c = CustodySenderConfig {
            poll_interval_ms: 100,
            max_poll_interval_ms: 1000,
            ..CustodySenderConfig::new("7", "ETH", Address::ZERO)
        };
        assert!(c.validate().is_ok());
        let bad = CustodySenderConfig {
            vault_account_id: "7/../8".into(),
            ..c.clone()
        };
        assert!(matches!(
            bad.validate(),
            Err(TxqError::Config {
                key: "vaultAccountId",
                ..
            })
        ));
        let bad = CustodySenderConfig {
            asset_id: String::new(),
            ..c.clone()
        };
        assert!(matches!(
            bad.validate(),
            Err(TxqError::Config { key: "assetId", .. })
        ));
        let bad = CustodySenderConfig {
            max_poll_interval_ms: 10,
            ..c
        };
        assert!(matches!(
            bad.validate(),
            Err(TxqError::Config {
                key: "maxPollIntervalMs",
                ..
            })
        ));
    }
}
