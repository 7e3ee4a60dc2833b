//! From the service's views (`keel_workflows`, `keel_aa`) to the wire types: the `From`
//! impls, and the address and URL helpers they use.

use keel_workflows as svc;
use serde_json::Value;
use uuid::Uuid;

use super::*;

impl From<svc::OperationState> for OperationState {
    fn from(s: svc::OperationState) -> Self {
        match s {
            svc::OperationState::Queued => Self::Queued,
            svc::OperationState::Running => Self::Running,
            svc::OperationState::Waiting => Self::Waiting,
            svc::OperationState::Suspended => Self::Suspended,
            svc::OperationState::Completed => Self::Completed,
            svc::OperationState::Failed => Self::Failed,
            svc::OperationState::Cancelled => Self::Cancelled,
        }
    }
}

impl From<svc::WaitFor> for WaitFor {
    fn from(w: svc::WaitFor) -> Self {
        match w {
            svc::WaitFor::Approval => Self::Approval,
            svc::WaitFor::Transaction => Self::Transaction,
            svc::WaitFor::Funding => Self::Funding,
            svc::WaitFor::Timer => Self::Timer,
            svc::WaitFor::CustodyApproval => Self::CustodyApproval,
            svc::WaitFor::Runner => Self::Runner,
            svc::WaitFor::Resume => Self::Resume,
        }
    }
}

impl From<svc::OperationView> for Operation {
    fn from(v: svc::OperationView) -> Self {
        let result = v
            .result
            .filter(|_| v.state == svc::OperationState::Completed)
            .and_then(|o| OperationResult::from_output(v.kind, o));
        Self {
            id: v.id,
            asset_id: v.asset_id,
            state: v.state.into(),
            queued_behind: v.queued_behind,
            wait: v.wait.map(Into::into),
            cancel_requested_at: v.cancel_requested_at,
            milestones: v.milestones.into(),
            progress: v.progress.map(checksum_addresses),
            result,
            error: v.error.map(Into::into),
            created_at: v.created_at,
            updated_at: v.updated_at,
            completed_at: v.completed_at,
            kind: v.kind.name().to_owned(),
            attribution: v.attribution.map(Into::into),
            workflow_version: v.workflow_version,
            awaiting_runner: v.awaiting_runner,
        }
    }
}

impl From<&svc::Actor> for Actor {
    fn from(a: &svc::Actor) -> Self {
        Self {
            kind: match a.kind() {
                svc::ActorKind::User => ActorKind::User,
                svc::ActorKind::Service => ActorKind::Service,
                svc::ActorKind::System => ActorKind::System,
                svc::ActorKind::None => ActorKind::None,
            },
            id: a.id().map(str::to_owned),
            reason: a.reason().map(str::to_owned),
            on_behalf_of: a.on_behalf_of_id().map(str::to_owned),
            status: match a.status() {
                svc::AttributionStatus::Verified => AttributionStatus::Verified,
                svc::AttributionStatus::Absent => AttributionStatus::Absent,
                svc::AttributionStatus::Degraded => AttributionStatus::Degraded,
            },
        }
    }
}

impl From<svc::RecordedBy> for RecordedBy {
    fn from(r: svc::RecordedBy) -> Self {
        Self {
            actor: (&r.actor).into(),
            at: r.at,
        }
    }
}

impl From<svc::OperationAttribution> for OperationAttribution {
    fn from(a: svc::OperationAttribution) -> Self {
        Self {
            started_by: a.started.map(Into::into),
            approval: a.approval.map(|d| ApprovalDecision {
                decision: if d.approved { "approved" } else { "rejected" }.to_owned(),
                by: d.by.into(),
            }),
            cancelled_by: a.cancelled.map(Into::into),
            retried_by: a.retried.into_iter().map(Into::into).collect(),
        }
    }
}

/// `v` with every string that is an address in lowercase hex (`0x` + 40 lowercase hex
/// digits, the form alloy's serde writes) in its EIP-55 checksummed form; the free-form
/// progress snapshot holds addresses that way.
pub(super) fn checksum_addresses(v: Value) -> Value {
    match v {
        Value::String(s) => {
            let lower_hex = s.len() == 42
                && s.starts_with("0x")
                && s[2..]
                    .bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
            match s.parse::<alloy_primitives::Address>() {
                Ok(a) if lower_hex => Value::String(address_text(a)),
                _ => Value::String(s),
            }
        }
        Value::Array(items) => Value::Array(items.into_iter().map(checksum_addresses).collect()),
        Value::Object(members) => Value::Object(
            members
                .into_iter()
                .map(|(k, v)| (k, checksum_addresses(v)))
                .collect(),
        ),
        other => other,
    }
}

impl From<svc::WaitView> for OperationWait {
    fn from(w: svc::WaitView) -> Self {
        Self {
            waits_for: w.waits_for.into(),
            until: w.until,
            step: w.link,
            last_broadcast_error: w.last_broadcast_error,
            custody: w.custody.map(|c| CustodyWaitDetail {
                provider: c.provider,
                provider_tx_id: c.provider_tx_id,
                status: c.status,
                sub_status: c.sub_status,
            }),
        }
    }
}

impl From<svc::Milestones> for Milestones {
    fn from(m: svc::Milestones) -> Self {
        Self {
            accepted: m.accepted,
            submitted: m.submitted.into_iter().map(Into::into).collect(),
            confirmed: m.confirmed.into_iter().map(Into::into).collect(),
            indexed: m.indexed.map(Into::into),
        }
    }
}

impl From<svc::TxMilestone> for TxMilestone {
    fn from(t: svc::TxMilestone) -> Self {
        Self {
            step: t.link,
            // `0x` + 64 lowercase hex digits.
            tx_hash: t.tx_hash.map(|h| h.to_string()),
            nonce: t.nonce,
            broadcast: t.broadcast,
            broadcast_at: t.broadcast_at,
            block: t.block,
            confirmed_at: t.confirmed_at,
        }
    }
}

impl From<svc::IndexedMilestone> for IndexedMilestone {
    fn from(i: svc::IndexedMilestone) -> Self {
        Self {
            block: i.block,
            at: i.at,
        }
    }
}

impl From<svc::ErrorView> for OperationError {
    fn from(e: svc::ErrorView) -> Self {
        Self {
            code: e.code,
            retryable: e.retryable,
            detail: e.detail,
            reason: e.reason,
        }
    }
}

/// The status URL of operation `id`: `/v1/operations/{id}`.
pub fn status_url(id: Uuid) -> String {
    format!("/v1/operations/{id}")
}

impl OperationAccepted {
    /// The answer to an accepted `POST`: the operation's status, whether this request
    /// created it, and its status URL.
    pub fn new(operation: svc::OperationView, created: bool) -> Self {
        let status_url = status_url(operation.id);
        Self {
            operation: operation.into(),
            created,
            status_url,
        }
    }
}

impl From<svc::AssetStatus> for AssetStatus {
    fn from(s: svc::AssetStatus) -> Self {
        match s {
            svc::AssetStatus::Creating => Self::Creating,
            svc::AssetStatus::Active => Self::Active,
            svc::AssetStatus::Failed => Self::Failed,
        }
    }
}

/// An address as served: EIP-55 checksummed (`0x` + 40 hex digits, mixed case; the
/// chain-agnostic checksum of EIP-55, not EIP-1191's chain-specific one).
pub fn address_text(a: alloy_primitives::Address) -> String {
    a.to_checksum(None)
}

impl From<svc::AssetView> for Asset {
    fn from(a: svc::AssetView) -> Self {
        Self {
            id: a.id,
            name: a.name,
            symbol: a.symbol,
            decimals: a.decimals,
            template_id: a.template_id,
            chain_id: a.chain_id.get(),
            status: a.status.into(),
            create_operation_id: a.create_operation_id,
            token_address: a.token_address.map(address_text),
            feed_address: a.feed_address.map(address_text),
            supply: a.supply,
            paused: a.paused,
            staleness_bound_seconds: a.staleness_bound_seconds,
            latest_observation: a.latest_observation.map(Into::into),
            indexed_block: a.indexed_block,
            index_degraded: a.index_degraded,
            index_rebuilding: a.index_rebuilding,
            issuer_address: a.issuer_address.map(address_text),
            created_at: a.created_at,
            updated_at: a.updated_at,
        }
    }
}

impl From<svc::TemplateView> for Template {
    fn from(v: svc::TemplateView) -> Self {
        let t = v.template;
        Self {
            id: t.id,
            chain_id: t.chain_id,
            price_decimals: t.price_decimals,
            staleness_bound_seconds: t.staleness_bound_seconds,
            mint_approval_threshold: t.mint_approval_threshold,
            approval_ttl_seconds: t.approval_ttl_seconds,
            funding_pause: t.funding_pause,
            funding_deadline_seconds: t.funding_deadline_seconds,
            forced_transfer_skips_compliance: t.forced_transfer_skips_compliance,
            batch_max_recipients: t.batch_max_recipients,
            created_at: v.created_at,
            updated_at: v.updated_at,
        }
    }
}

/// Builds the list DTOs from a [`crate::page::Page`] of their items.
macro_rules! from_page {
    ($($list:ident of $item:ident),*) => {$(
        impl From<crate::page::Page<$item>> for $list {
            fn from(p: crate::page::Page<$item>) -> Self {
                Self {
                    data: p.data,
                    has_more: p.has_more,
                    next_cursor: p.next_cursor,
                }
            }
        }
    )*};
}

from_page!(
    AssetList of Asset,
    OperationList of Operation,
    TemplateList of Template,
    OperationHistory of OperationHistoryEntry
);

impl From<svc::ObservationView> for Observation {
    fn from(o: svc::ObservationView) -> Self {
        Self {
            answer: o.answer,
            round_id: o.round_id,
            updated_at: o.updated_at,
            block: o.block,
        }
    }
}

impl From<svc::BalanceView> for Balance {
    fn from(b: svc::BalanceView) -> Self {
        Self {
            asset_id: b.asset_id,
            address: address_text(b.address),
            balance: b.balance,
            balance_base_units: b.balance_base_units,
            indexed_block: b.indexed_block,
            block: b.block,
            finalized: b.finalized,
            index_degraded: b.index_degraded,
            index_rebuilding: b.index_rebuilding,
        }
    }
}

impl From<svc::FundingRequestView> for FundingRequest {
    fn from(f: svc::FundingRequestView) -> Self {
        let r = f.request;
        Self {
            operation_id: f.operation_id,
            step: f.link,
            request_id: r.request_id,
            chain_id: r.chain_id.to_string(),
            address: address_text(r.address),
            required_wei: r.required_wei.to_string(),
            deadline: r.deadline,
            gas_limit: r.gas_limit,
            max_fee_per_gas_wei: r.max_fee_per_gas_wei.to_string(),
            value_wei: r.value_wei.to_string(),
            created_at: r.created_at,
            updated_at: r.updated_at,
        }
    }
}

impl From<svc::QueuedBehindFundingView> for QueuedBehindFunding {
    fn from(f: svc::QueuedBehindFundingView) -> Self {
        let r = f.request;
        Self {
            operation_id: f.operation_id,
            step: f.link,
            request_id: r.request_id,
            chain_id: r.chain_id.to_string(),
            address: address_text(r.address),
            queued_behind: f.queued_behind,
            queued_behind_request_id: r.queued_behind,
            created_at: r.created_at,
        }
    }
}

impl From<keel_aa::service::DepositRequestView> for EntryPointDepositRequest {
    fn from(d: keel_aa::service::DepositRequestView) -> Self {
        Self {
            chain_id: d.chain_id.to_string(),
            entry_point: d.entry_point.to_checksum(None),
            paymaster: d.paymaster.to_checksum(None),
            deposit_wei: d.deposit_wei,
            minimum_wei: d.minimum_wei,
            required_wei: d.required_wei,
            opened_at: d.opened_at,
            updated_at: d.updated_at,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloy_primitives::{Address, B256};

    /// Hashes are served as `0x` + 64 lowercase hex digits and addresses EIP-55
    /// checksummed, also inside the free-form progress snapshot.
    #[test]
    fn hashes_and_addresses_have_their_documented_form() {
        let t = TxMilestone::from(svc::TxMilestone {
            link: "mint#2".into(),
            tx_hash: Some(B256::repeat_byte(0xab)),
            nonce: Some(7),
            broadcast: true,
            block: Some(9),
            broadcast_at: None,
            confirmed_at: None,
        });
        assert_eq!(t.step, "mint#2");
        assert_eq!(t.block, Some(9));
        assert_eq!(
            t.tx_hash.as_deref(),
            Some(&*format!("0x{}", "ab".repeat(32)))
        );
        let a: Address = "0x70997970c51812dc3a010c7d01b50e0d17dc79c8"
            .parse()
            .unwrap();
        assert_eq!(
            address_text(a),
            "0x70997970C51812dc3A010C7d01b50e0d17dc79C8"
        );
        // alloy's serde and `to_string` write an address in lowercase hex: what
        // `checksum_addresses` rewrites in progress snapshots.
        let progress = serde_json::json!({"phase": "x", "feed": a, "list": [a], "n": "0xabc"});
        let fixed = checksum_addresses(progress);
        assert_eq!(fixed["feed"], serde_json::json!(address_text(a)));
        assert_eq!(fixed["list"][0], serde_json::json!(address_text(a)));
        assert_eq!(fixed["n"], "0xabc");
    }
}
