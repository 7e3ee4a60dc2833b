//! The closed sets stored as text in keel-aa's tables: [`UserOpState`]
//! (`aa_user_operation.state`) and [`BundleState`] (`aa_bundle.state`), decoded at the
//! row with the stored spelling.

/// Where a user operation is (`aa_user_operation.state`, the CHECK of
/// `migrations/0071_aa_admission.sql`), decoded at the row with the stored spelling:
/// a stored text that is none of these is a decode error ([`unreadable`]), never a
/// fallback.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum UserOpState {
    /// Recorded by the workflow's first step; not validated yet.
    Accepted,
    /// Validated and (when a policy applies) sponsored: waiting for a bundle.
    Ready,
    /// In a bundle whose queue request has no handled verdict yet.
    Bundled,
    /// Its `UserOperationEvent` is in a confirmed bundle (the call may have reverted:
    /// see `success`). Watched until the block is final (`finalized_at` set, then the
    /// workflow is told); a reorg meanwhile may move it (new transaction, block,
    /// receipt fields), put it back to `bundled` (its bundle out of the chain, may be
    /// re-included) or `ready` (out for good), or end it.
    Included,
    /// Refused (validation, policy, or alone in a bundle simulation); see `error_code`.
    Failed,
    /// Its nonce was used by an inclusion that is not ours.
    NonceUsedElsewhere,
    /// Superseded before it was bundled by another operation of the same sender and
    /// nonce with higher fees (the ERC-7562 replacement rule, migration 0071).
    Replaced,
}

impl UserOpState {
    /// Every state.
    pub const ALL: [UserOpState; 7] = [
        Self::Accepted,
        Self::Ready,
        Self::Bundled,
        Self::Included,
        Self::Failed,
        Self::NonceUsedElsewhere,
        Self::Replaced,
    ];

    /// The stored text (`accepted`, `ready`, `bundled`, `included`, `failed`,
    /// `nonce_used_elsewhere`, `replaced`).
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Accepted => "accepted",
            Self::Ready => "ready",
            Self::Bundled => "bundled",
            Self::Included => "included",
            Self::Failed => "failed",
            Self::NonceUsedElsewhere => "nonce_used_elsewhere",
            Self::Replaced => "replaced",
        }
    }
}

/// Where a bundle is (`aa_bundle.state`, the CHECK of
/// `migrations/0074_aa_reorg_watch.sql`), decoded at the row like [`UserOpState`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum BundleState {
    /// Enqueued on the transaction queue; no verdict handled yet.
    Submitted,
    /// Its verdict was `confirmed`: its operations are `included` (or `bundled` while a
    /// reorg has it out of the chain), watched until the queue finds the block final;
    /// then `final_at` is set and every operation's outcome was reported.
    Included,
    /// Included once, then taken out for good (`REORGED_OUT`) or re-mined without its
    /// operations: they went back to `ready`, ended, or were found in another
    /// transaction.
    Reorged,
    /// Reverted or never took effect: its operations went back to `ready` (or ended).
    Failed,
}

impl BundleState {
    /// Every state.
    pub const ALL: [BundleState; 4] =
        [Self::Submitted, Self::Included, Self::Reorged, Self::Failed];

    /// The stored text (`submitted`, `included`, `reorged`, `failed`).
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Submitted => "submitted",
            Self::Included => "included",
            Self::Reorged => "reorged",
            Self::Failed => "failed",
        }
    }
}

/// The sqlx text column type of a state enum (`ALL`, `as_str`), with the stored
/// spelling ([`keel_store::text_column!`]: an unknown text is a decode error,
/// [`keel_store::UnknownStoredValue`], naming `$column`, not the value), its `Display`
/// and comparisons with the stored text.
macro_rules! stored_state {
    ($ty:ty, $column:literal) => {
        keel_store::text_column!($ty, $column);

        impl std::fmt::Display for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        /// Compares with the stored spelling.
        impl PartialEq<&str> for $ty {
            fn eq(&self, other: &&str) -> bool {
                self.as_str() == *other
            }
        }

        /// Compares with the stored spelling.
        impl PartialEq<str> for $ty {
            fn eq(&self, other: &str) -> bool {
                self.as_str() == other
            }
        }
    };
}

stored_state!(UserOpState, "aa_user_operation.state");
stored_state!(BundleState, "aa_bundle.state");

/// The [`UserOpState`] values under their stored names.
pub mod state {
    use super::UserOpState;

    /// [`UserOpState::Accepted`].
    pub const ACCEPTED: UserOpState = UserOpState::Accepted;
    /// [`UserOpState::Ready`].
    pub const READY: UserOpState = UserOpState::Ready;
    /// [`UserOpState::Bundled`].
    pub const BUNDLED: UserOpState = UserOpState::Bundled;
    /// [`UserOpState::Included`].
    pub const INCLUDED: UserOpState = UserOpState::Included;
    /// [`UserOpState::Failed`].
    pub const FAILED: UserOpState = UserOpState::Failed;
    /// [`UserOpState::NonceUsedElsewhere`].
    pub const NONCE_USED_ELSEWHERE: UserOpState = UserOpState::NonceUsedElsewhere;
    /// [`UserOpState::Replaced`].
    pub const REPLACED: UserOpState = UserOpState::Replaced;
}

/// The [`BundleState`] values under their stored names.
pub mod bundle_state {
    use super::BundleState;

    /// [`BundleState::Submitted`].
    pub const SUBMITTED: BundleState = BundleState::Submitted;
    /// [`BundleState::Included`].
    pub const INCLUDED: BundleState = BundleState::Included;
    /// [`BundleState::Reorged`].
    pub const REORGED: BundleState = BundleState::Reorged;
    /// [`BundleState::Failed`].
    pub const FAILED: BundleState = BundleState::Failed;
}
