//! The stored vocabulary of a custody submission (`txq_custody_attempt`, migrations
//! 0040 and 0070): its [`CustodyPhase`] and Keel's [`CancelReason`]. Both are decoded
//! at the row: a stored value outside the migration's `CHECK` list is an error
//! (`sqlx::Error::ColumnDecode`, the value not echoed), never a fallback.

use std::fmt;

/// Generates a closed text enum stored as `TEXT` in its exact spelling (the column type
/// from [`keel_store::text_column!`]: an unknown text is a decode error naming `$err`).
macro_rules! stored_text_enum {
    ($(#[$doc:meta])* $name:ident, $err:literal { $($(#[$vdoc:meta])* $variant:ident = $text:literal,)* }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$vdoc])* $variant,)*
        }

        impl $name {
            /// Every value, in the order of the migration's `CHECK` list.
            pub const ALL: &'static [$name] = &[$($name::$variant,)*];

            /// The stored spelling.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text,)*
                }
            }

            /// The value of a stored spelling; `None` for any other text.
            pub fn parse(text: &str) -> Option<Self> {
                match text {
                    $($text => Some($name::$variant),)*
                    _ => None,
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        keel_store::text_column!($name, $err);
    };
}

stored_text_enum!(
    /// Where a custody submission stands in the queue's custody pass (the table in
    /// `crate::custody`'s docs; `txq_custody_attempt.phase`, migration 0040).
    CustodyPhase, "txq_custody_attempt.phase" {
        /// Nothing was created with this external id.
        Ready = "ready",
        /// A create may be in flight (or its process died).
        Creating = "creating",
        /// The create's answer was lost: look it up by external id.
        InDoubt = "in_doubt",
        /// The provider has it: poll its status.
        Submitted = "submitted",
        /// A cancel Keel asked for was accepted: wait for the provider's cancelled status.
        Cancelling = "cancelling",
        /// Cancelled; resubmission n + 1 exists.
        Superseded = "superseded",
        /// The request settled from this submission.
        Done = "done",
    }
);

impl CustodyPhase {
    /// The phases a submission is followed in (every phase but `superseded` and `done`).
    pub const fn is_live(self) -> bool {
        !matches!(self, CustodyPhase::Superseded | CustodyPhase::Done)
    }
}

stored_text_enum!(
    /// Why Keel cancels (or cancelled) a submission at its provider
    /// (`txq_custody_attempt.cancel_reason`, migration 0070).
    CancelReason, "txq_custody_attempt.cancel_reason" {
        /// The approval wait at the provider passed the vault's deadline.
        ApprovalExpired = "approval_expired",
        /// The request was withdrawn (its operation was cancelled).
        Withdrawn = "withdrawn",
    }
);

#[cfg(test)]
mod tests {
    use super::{CancelReason, CustodyPhase};

    #[test]
    fn stored_spellings_round_trip_and_unknown_text_is_refused() {
        for p in CustodyPhase::ALL {
            assert_eq!(CustodyPhase::parse(p.as_str()), Some(*p));
        }
        for r in CancelReason::ALL {
            assert_eq!(CancelReason::parse(r.as_str()), Some(*r));
        }
        assert_eq!(CustodyPhase::parse("Done"), None);
        assert_eq!(CancelReason::parse("other"), None);
        assert!(CustodyPhase::InDoubt.is_live() && !CustodyPhase::Done.is_live());
    }
}
