//! What Fireblocks' transaction statuses ([`TxStatus`]) mean to Keel: the
//! provider-neutral [`StatusPhase`], the order along a transaction's life, how a
//! rejected transaction ended ([`Ending`]), and the statuses that wait for an approval.
//! [`FireblocksProvider`](super::FireblocksProvider) answers the
//! [`CustodyProvider`](crate::CustodyProvider) status methods from here.

use crate::types::{Ending, StatusPhase, TxStatus};

/// The statuses that wait for an approval at Fireblocks (phase
/// [`StatusPhase::AwaitingApproval`]), as Fireblocks spells them.
pub const APPROVAL_STATUSES: &[&str] =
    &["PENDING_AUTHORIZATION", "PENDING_3RD_PARTY_MANUAL_APPROVAL"];

/// The phase of a Fireblocks status; an unknown status is [`StatusPhase::Unknown`]
/// (in flight, never final).
pub fn phase(status: &TxStatus) -> StatusPhase {
    use TxStatus::*;
    match status {
        Submitted | PendingAmlScreening | PendingEnrichment | Queued | PendingSignature
        | Pending3rdParty => StatusPhase::PreBroadcast,
        PendingAuthorization | Pending3rdPartyManualApproval => StatusPhase::AwaitingApproval,
        Broadcasting | Confirming => StatusPhase::Broadcast,
        Cancelling => StatusPhase::Cancelling,
        Completed => StatusPhase::Completed,
        Cancelled | Blocked | Rejected | Failed => StatusPhase::Rejected,
        Unknown(_) => StatusPhase::Unknown,
    }
}

/// The order of Fireblocks statuses along a transaction's life, for ordering webhook
/// events and reads (a late lower rank after a higher one changes nothing). Terminal
/// statuses share the top rank (12); an unknown status ranks 0 (it never overrides a
/// known one).
pub fn rank(status: &TxStatus) -> u8 {
    use TxStatus::*;
    match status {
        Unknown(_) => 0,
        Submitted => 1,
        PendingAmlScreening => 2,
        PendingEnrichment => 3,
        PendingAuthorization => 4,
        Queued => 5,
        PendingSignature => 6,
        Pending3rdPartyManualApproval => 7,
        Pending3rdParty => 8,
        Broadcasting => 9,
        Confirming => 10,
        Cancelling => 11,
        Completed | Cancelled | Blocked | Rejected | Failed => 12,
    }
}

/// How a transaction in phase [`StatusPhase::Rejected`] ended: `CANCELLED`,
/// `REJECTED` (an approver or signer), `BLOCKED` (a policy rule), `FAILED`; `None` for
/// any other status.
pub fn ending(status: &TxStatus) -> Option<Ending> {
    match status {
        TxStatus::Cancelled => Some(Ending::Cancelled),
        TxStatus::Rejected => Some(Ending::Rejected),
        TxStatus::Blocked => Some(Ending::Blocked),
        TxStatus::Failed => Some(Ending::Failed),
        _ => None,
    }
}
