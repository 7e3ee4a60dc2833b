//! Admission of user operations (issue 33 §1 and §3): what `eth_sendUserOperation`
//! checks before anything is simulated or recorded, the bundle gas budget the bundler
//! packs against, and the `preVerificationGas` Keel requires (and estimates).
//!
//! Each refusal is a [`Refusal`]: an ERC-7769 code, the operation's field it names
//! (JSON-RPC `error.data.field`, and in the message) and a stable reason code
//! (`error.data.reason`). The checks, in order:
//!
//! | rule | field | reason | code |
//! |---|---|---|---|
//! | `maxPriorityFeePerGas ≤ maxFeePerGas` | `maxPriorityFeePerGas` | `PRIORITY_FEE_ABOVE_MAX_FEE` | -32602 |
//! | `maxFeePerGas ≥ base fee × baseFeePercent / 100` (latest block) | `maxFeePerGas` | `MAX_FEE_BELOW_BASE_FEE` | -32602 |
//! | `maxPriorityFeePerGas ≥ minPriorityFeePerGas` | `maxPriorityFeePerGas` | `PRIORITY_FEE_TOO_LOW` | -32602 |
//! | the operation alone fits a bundle: its gas + the bundle overhead ≤ [`bundle_gas_budget`] | the largest gas field | `GAS_LIMIT_EXCEEDS_BUNDLE_MAX` | -32602 |
//! | `preVerificationGas ≥` [`required_pre_verification_gas`] (+ [`crate::eip7702::PER_AUTHORIZATION_GAS`] with an `eip7702Auth`) | `preVerificationGas` | `PRE_VERIFICATION_GAS_TOO_LOW` | -32602 |
//! | at most [`AdmissionConfig::same_sender_mempool_count`] (4) open operations (`accepted`, `ready`, `bundled`) per unstaked sender (ERC-7562 UREP-010); a staked sender is not bounded | `sender` | `SENDER_OPERATION_PENDING` | -32505 |
//! | a replacement (same sender and nonce) raises both fees by the replacement percentage | `maxFeePerGas` / `maxPriorityFeePerGas` | `REPLACEMENT_UNDERPRICED` | -32602 |
//! | a replacement's earlier operation is not bundled yet | `nonce` | `REPLACEMENT_IN_FLIGHT` | -32602 |
//! | the paymaster's EntryPoint deposit covers the maximum cost of all its open operations and this one (ERC-7562 EREP-010; [`max_cost`]) | `paymaster` | `PAYMASTER_DEPOSIT_TOO_LOW` | -32508 |
//! | `eip7702Auth`: `yParity` 0/1, low `s`, nonce < 2^64 ([`crate::eip7702::check`]) | `eip7702Auth` | `EIP7702_AUTH_MALFORMED` | -32602 |
//! | `eip7702Auth.chainId` is 0 or the chain's | `eip7702Auth.chainId` | `EIP7702_AUTH_CHAIN_ID` | -32602 |
//! | `eip7702Auth` is signed by the sender | `eip7702Auth` | `EIP7702_AUTH_NOT_SENDER` | -32602 |
//!
//! The operation's gas is `verificationGasLimit + callGasLimit +
//! paymasterVerificationGasLimit + paymasterPostOpGasLimit + preVerificationGas` (gas
//! units, [`crate::policy::total_gas`]).

use crate::policy::total_gas;
use crate::rejection::Erc7769Code;
use crate::user_op::{PackedUserOperation, UserOperation};
use alloy::primitives::{Bytes, U256};
use alloy::sol_types::SolValue;
use keel_units::Wei;

/// Gas of a transaction before its calldata (EIP-2028 intrinsic base), gas units.
pub const TX_BASE_GAS: u128 = 21_000;
/// The EntryPoint's fixed work per operation not measured in its gas limits (loop,
/// event, accounting), gas units.
pub const PER_OPERATION_OVERHEAD: u128 = 18_300;
/// Gas per 32-byte word of the operation's encoding (memory, copying), gas units.
pub const PER_WORD_GAS: u128 = 4;
/// EIP-7623 floor price per calldata token (a zero byte is 1 token, a non-zero byte
/// 4), gas units.
pub const FLOOR_GAS_PER_TOKEN: u128 = 10;

/// The admission settings of one chain (`[aa]` in the binary; see docs/aa.md).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdmissionConfig {
    /// Most gas one bundle may carry (the sum of its operations' gas plus
    /// [`AdmissionConfig::bundle_gas_overhead`]), gas units; the bundle budget is the
    /// smaller of this and the latest block's gas limit minus
    /// [`AdmissionConfig::block_gas_margin`].
    pub max_bundle_gas: u64,
    /// Gas kept free below the latest block's gas limit, gas units.
    pub block_gas_margin: u64,
    /// Gas a bundle transaction adds to its operations' gas (the EntryPoint's own
    /// work), gas units; also the margin of the bundle transaction's gas limit.
    pub bundle_gas_overhead: u64,
    /// `maxFeePerGas` must be at least the latest base fee × this / 100 (percent).
    pub base_fee_percent: u32,
    /// The least `maxPriorityFeePerGas` accepted, wei per gas.
    pub min_priority_fee_per_gas: Wei,
    /// A replacement (same sender and nonce) must raise both fees by at least this
    /// percentage (ERC-7562: 10).
    pub replacement_increase_percent: u32,
    /// Ceiling of an operation's gas that `pm_getPaymasterData` signs when no
    /// sponsorship policy applies, gas units.
    pub sponsorship_max_gas: u64,
    /// Most open (`accepted`, `ready`, `bundled`) operations of one unstaked sender
    /// (ERC-7562 UREP-010 `SAME_SENDER_MEMPOOL_COUNT`: 4); a staked sender is not
    /// bounded by it.
    pub same_sender_mempool_count: usize,
}

impl Default for AdmissionConfig {
    fn default() -> Self {
        Self {
            max_bundle_gas: 25_000_000,
            block_gas_margin: 1_000_000,
            bundle_gas_overhead: 200_000,
            base_fee_percent: 100,
            min_priority_fee_per_gas: Wei::ZERO,
            replacement_increase_percent: 10,
            sponsorship_max_gas: 5_000_000,
            same_sender_mempool_count: 4,
        }
    }
}

/// A refusal at admission: the ERC-7769 code, the field it names and a stable reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.message())]
pub struct Refusal {
    /// The ERC-7769 JSON-RPC code.
    pub code: Erc7769Code,
    /// The operation's field (ERC-7769 JSON name, e.g. `preVerificationGas`).
    pub field: &'static str,
    /// The stable reason code (see the module table).
    pub reason: &'static str,
}

impl Refusal {
    pub(crate) fn invalid(field: &'static str, reason: &'static str) -> Self {
        Self {
            code: Erc7769Code::InvalidParams,
            field,
            reason,
        }
    }

    /// A value-free message naming the field.
    pub fn message(&self) -> &'static str {
        match (self.reason, self.field) {
            ("PRIORITY_FEE_ABOVE_MAX_FEE", _) => "maxPriorityFeePerGas is above maxFeePerGas",
            ("MAX_FEE_BELOW_BASE_FEE", _) => {
                "maxFeePerGas is below the required share of the current base fee"
            }
            ("PRIORITY_FEE_TOO_LOW", _) => "maxPriorityFeePerGas is below the bundler's minimum",
            ("PRE_VERIFICATION_GAS_TOO_LOW", _) => {
                "preVerificationGas is below the required minimum (calldata cost, bundle overhead, EIP-7623 floor)"
            }
            ("GAS_LIMIT_EXCEEDS_BUNDLE_MAX", "callGasLimit") => {
                "callGasLimit: the operation's gas can never fit in a bundle (block gas limit or the bundler's maximum)"
            }
            ("GAS_LIMIT_EXCEEDS_BUNDLE_MAX", "verificationGasLimit") => {
                "verificationGasLimit: the operation's gas can never fit in a bundle (block gas limit or the bundler's maximum)"
            }
            ("GAS_LIMIT_EXCEEDS_BUNDLE_MAX", "preVerificationGas") => {
                "preVerificationGas: the operation's gas can never fit in a bundle (block gas limit or the bundler's maximum)"
            }
            ("GAS_LIMIT_EXCEEDS_BUNDLE_MAX", "paymasterVerificationGasLimit") => {
                "paymasterVerificationGasLimit: the operation's gas can never fit in a bundle (block gas limit or the bundler's maximum)"
            }
            ("GAS_LIMIT_EXCEEDS_BUNDLE_MAX", _) => {
                "paymasterPostOpGasLimit: the operation's gas can never fit in a bundle (block gas limit or the bundler's maximum)"
            }
            ("SENDER_OPERATION_PENDING", _) => {
                "sender: an unstaked sender has the most user operations pending (ERC-7562 SAME_SENDER_MEMPOOL_COUNT); replace one (same nonce, higher fees) or wait for an outcome"
            }
            ("REPLACEMENT_UNDERPRICED", "maxPriorityFeePerGas") => {
                "maxPriorityFeePerGas: a replacement must raise both fees by the replacement percentage"
            }
            ("REPLACEMENT_UNDERPRICED", _) => {
                "maxFeePerGas: a replacement must raise both fees by the replacement percentage"
            }
            ("REPLACEMENT_IN_FLIGHT", _) => {
                "nonce: the user operation with this sender and nonce is already bundled and cannot be replaced"
            }
            ("PAYMASTER_DEPOSIT_TOO_LOW", _) => {
                "paymaster: its EntryPoint deposit is too low for the maximum cost of all its pending user operations and this one (ERC-7562 EREP-010)"
            }
            ("EIP7702_AUTH_MALFORMED", _) => {
                "eip7702Auth: yParity, r, s or nonce is out of range (EIP-7702; s in the lower half of the curve order, EIP-2)"
            }
            ("EIP7702_AUTH_CHAIN_ID", _) => {
                "eip7702Auth.chainId: the authorization's chainId is neither 0 nor this chain's"
            }
            ("EIP7702_AUTH_NOT_SENDER", _) => {
                "eip7702Auth: the authorization is not signed by the sender (its authority must be the sender)"
            }
            _ => "the user operation was refused",
        }
    }
}

/// What admission reads from the chain: the latest block's base fee (wei per gas; 0
/// without EIP-1559) and gas limit (gas units; `None` when the node does not say).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChainView {
    /// The latest block's base fee, wei per gas.
    pub base_fee_per_gas: u128,
    /// The latest block's gas limit, gas units.
    pub block_gas_limit: Option<u64>,
}

/// The most gas one bundle may carry now: min([`AdmissionConfig::max_bundle_gas`],
/// block gas limit − [`AdmissionConfig::block_gas_margin`]), gas units.
pub fn bundle_gas_budget(config: &AdmissionConfig, block_gas_limit: Option<u64>) -> u64 {
    let by_block = block_gas_limit.map_or(u64::MAX, |l| l.saturating_sub(config.block_gas_margin));
    config.max_bundle_gas.min(by_block)
}

/// The operation's gas in a bundle (its five gas fields), saturating at `u64::MAX`.
pub fn operation_gas(op: &UserOperation) -> u64 {
    u64::try_from(total_gas(op)).unwrap_or(u64::MAX)
}

/// The `preVerificationGas` Keel requires of `op`, gas units: the larger of
///
/// - the operation's share of a bundle of one: [`TX_BASE_GAS`] + its calldata (16 gas
///   per non-zero, 4 per zero byte of its ABI encoding in `handleOps`) +
///   [`PER_OPERATION_OVERHEAD`] + [`PER_WORD_GAS`] per 32-byte word;
/// - the EIP-7623 floor of a bundle of one: [`TX_BASE_GAS`] + [`FLOOR_GAS_PER_TOKEN`] ×
///   (zero bytes + 4 × non-zero bytes), which is what the bundle transaction is charged
///   when its calldata outweighs its execution.
pub fn required_pre_verification_gas(op: &PackedUserOperation) -> u128 {
    let encoded = (op.to_sol(),).abi_encode_params();
    let zero = encoded.iter().filter(|b| **b == 0).count() as u128;
    let nonzero = encoded.len() as u128 - zero;
    let words = encoded.len().div_ceil(32) as u128;
    let standard =
        TX_BASE_GAS + 4 * zero + 16 * nonzero + PER_OPERATION_OVERHEAD + PER_WORD_GAS * words;
    let floor = TX_BASE_GAS + FLOOR_GAS_PER_TOKEN * (zero + 4 * nonzero);
    standard.max(floor)
}

fn no_zero_bytes(b: &Bytes) -> Bytes {
    b.iter()
        .map(|x| if *x == 0 { 0xff } else { *x })
        .collect::<Vec<u8>>()
        .into()
}

/// The `preVerificationGas` estimation answers for `op`: [`required_pre_verification_gas`]
/// of `op` with every field a client fills in after estimation at its worst — gas
/// limits, `preVerificationGas` and fees at their widest values, the signature and
/// `paymasterData` of the same lengths without zero bytes — so the operation a client
/// completes from the estimate (same `callData`, `factoryData`, signature and
/// paymaster data lengths) passes the admission check.
pub fn estimated_pre_verification_gas(op: &UserOperation) -> Result<u128, crate::UserOpError> {
    let mut worst = op.clone();
    worst.call_gas_limit = u128::MAX;
    worst.verification_gas_limit = u128::MAX;
    worst.pre_verification_gas = U256::from(u128::MAX);
    worst.max_fee_per_gas = Wei::new(U256::from(u128::MAX));
    worst.max_priority_fee_per_gas = Wei::new(U256::from(u128::MAX));
    if worst.paymaster.is_some() {
        worst.paymaster_verification_gas_limit = u128::MAX;
        worst.paymaster_post_op_gas_limit = u128::MAX;
        worst.paymaster_data = no_zero_bytes(&worst.paymaster_data);
    }
    worst.signature = no_zero_bytes(&worst.signature);
    Ok(required_pre_verification_gas(&worst.pack()?)
        .saturating_add(crate::eip7702::authorization_gas(op)))
}

/// The name of the largest of the operation's gas fields (ERC-7769 JSON name; what an
/// operation too large for any bundle, or for the sponsorship ceiling, is refused for).
pub fn largest_gas_field(op: &UserOperation) -> &'static str {
    let pvg = u128::try_from(op.pre_verification_gas).unwrap_or(u128::MAX);
    [
        ("callGasLimit", op.call_gas_limit),
        ("verificationGasLimit", op.verification_gas_limit),
        ("preVerificationGas", pvg),
        (
            "paymasterVerificationGasLimit",
            op.paymaster_verification_gas_limit,
        ),
        ("paymasterPostOpGasLimit", op.paymaster_post_op_gas_limit),
    ]
    .into_iter()
    .fold(("callGasLimit", 0u128), |best, (name, v)| {
        if v > best.1 { (name, v) } else { best }
    })
    .0
}

/// True when `op` alone (its gas + the bundle overhead) fits `budget` gas.
pub fn fits_alone(op: &UserOperation, config: &AdmissionConfig, budget: u64) -> bool {
    operation_gas(op).saturating_add(config.bundle_gas_overhead) <= budget
}

/// The field checks of `op` (packed as `packed`) against the chain as `view` saw it
/// (see the module table, first five rows).
///
/// # Errors
/// The first [`Refusal`] that applies.
pub fn check_fields(
    op: &UserOperation,
    packed: &PackedUserOperation,
    view: ChainView,
    config: &AdmissionConfig,
) -> Result<(), Refusal> {
    let max_fee = op.max_fee_per_gas.get();
    let priority = op.max_priority_fee_per_gas.get();
    if priority > max_fee {
        return Err(Refusal::invalid(
            "maxPriorityFeePerGas",
            "PRIORITY_FEE_ABOVE_MAX_FEE",
        ));
    }
    let floor = U256::from(view.base_fee_per_gas)
        .saturating_mul(U256::from(config.base_fee_percent))
        / U256::from(100u8);
    if max_fee < floor {
        return Err(Refusal::invalid("maxFeePerGas", "MAX_FEE_BELOW_BASE_FEE"));
    }
    if priority < config.min_priority_fee_per_gas.get() {
        return Err(Refusal::invalid(
            "maxPriorityFeePerGas",
            "PRIORITY_FEE_TOO_LOW",
        ));
    }
    if !fits_alone(op, config, bundle_gas_budget(config, view.block_gas_limit)) {
        return Err(Refusal::invalid(
            largest_gas_field(op),
            "GAS_LIMIT_EXCEEDS_BUNDLE_MAX",
        ));
    }
    let required =
        required_pre_verification_gas(packed).saturating_add(crate::eip7702::authorization_gas(op));
    if op.pre_verification_gas < U256::from(required) {
        return Err(Refusal::invalid(
            "preVerificationGas",
            "PRE_VERIFICATION_GAS_TOO_LOW",
        ));
    }
    Ok(())
}

/// The ERC-7562 replacement rule: `new` replaces `old` (same sender and nonce) only
/// when both of its fees are at least `percent` % above `old`'s.
///
/// # Errors
/// [`Refusal`] `REPLACEMENT_UNDERPRICED` naming the first fee that is not.
pub fn check_replacement(
    old: &UserOperation,
    new: &UserOperation,
    percent: u32,
) -> Result<(), Refusal> {
    let raised = |new: Wei, old: Wei| {
        new.get().saturating_mul(U256::from(100u8))
            >= old
                .get()
                .saturating_mul(U256::from(100u64 + u64::from(percent)))
    };
    if !raised(new.max_fee_per_gas, old.max_fee_per_gas) {
        return Err(Refusal::invalid("maxFeePerGas", "REPLACEMENT_UNDERPRICED"));
    }
    if !raised(new.max_priority_fee_per_gas, old.max_priority_fee_per_gas) {
        return Err(Refusal::invalid(
            "maxPriorityFeePerGas",
            "REPLACEMENT_UNDERPRICED",
        ));
    }
    Ok(())
}

/// The refusal of an operation whose unstaked sender already has
/// [`AdmissionConfig::same_sender_mempool_count`] operations open (ERC-7562 UREP-010).
pub fn sender_pending() -> Refusal {
    Refusal {
        code: Erc7769Code::StakeTooLow,
        field: "sender",
        reason: "SENDER_OPERATION_PENDING",
    }
}

/// The most `op` can cost its payer, wei: its five gas fields × `maxFeePerGas`
/// (saturating), what the EntryPoint's prefund takes.
pub fn max_cost(op: &UserOperation) -> U256 {
    U256::from(total_gas(op)).saturating_mul(op.max_fee_per_gas.get())
}

/// ERC-7562 EREP-010: the refusal when `deposit` (the paymaster's EntryPoint deposit,
/// wei) is below the maximum cost of `op` plus that of the paymaster's `open`
/// operations (a replaced one left out by the caller).
///
/// # Errors
/// A -32508 [`Refusal`] naming `paymaster` (`PAYMASTER_DEPOSIT_TOO_LOW`).
pub fn check_paymaster_deposit<'a>(
    op: &UserOperation,
    open: impl IntoIterator<Item = &'a UserOperation>,
    deposit: U256,
) -> Result<(), Refusal> {
    let need = open
        .into_iter()
        .map(max_cost)
        .fold(max_cost(op), U256::saturating_add);
    if need > deposit {
        return Err(Refusal {
            code: Erc7769Code::PaymasterBalance,
            field: "paymaster",
            reason: "PAYMASTER_DEPOSIT_TOO_LOW",
        });
    }
    Ok(())
}

/// The refusal of a replacement whose earlier operation is already bundled.
pub fn replacement_in_flight() -> Refusal {
    Refusal::invalid("nonce", "REPLACEMENT_IN_FLIGHT")
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloy::primitives::{Address, address};

    fn op() -> UserOperation {
        UserOperation {
            sender: address!("0x00000000000000000000000000000000000000cc"),
            nonce: U256::from(7u8),
            factory: None,
            factory_data: Bytes::new(),
            call_data: vec![0xb6, 0x1d, 0x27, 0xf6, 0, 0, 0, 1].into(),
            call_gas_limit: 100_000,
            verification_gas_limit: 200_000,
            pre_verification_gas: U256::from(60_000u64),
            max_fee_per_gas: Wei::from(10_000u64),
            max_priority_fee_per_gas: Wei::from(1_000u64),
            paymaster: Some(Address::repeat_byte(0x22)),
            paymaster_verification_gas_limit: 100_000,
            paymaster_post_op_gas_limit: 0,
            paymaster_data: vec![0u8; 77].into(),
            signature: vec![0x11u8; 65].into(),
            eip7702_auth: None,
        }
    }

    fn view(base_fee: u128) -> ChainView {
        ChainView {
            base_fee_per_gas: base_fee,
            block_gas_limit: Some(30_000_000),
        }
    }

    fn check(o: &UserOperation, base_fee: u128) -> Result<(), Refusal> {
        check_fields(
            o,
            &o.pack().unwrap(),
            view(base_fee),
            &AdmissionConfig::default(),
        )
    }

    #[test]
    fn fees_at_the_boundaries() {
        let o = op();
        // maxFeePerGas against the base fee: equal passes, one wei below is refused.
        for (base, ok) in [
            (9_999u128, true),
            (10_000, true),
            (10_001, false),
            (u128::MAX, false),
        ] {
            let r = check(&o, base);
            assert_eq!(r.is_ok(), ok, "base fee {base}");
            if let Err(e) = r {
                assert_eq!(
                    (e.field, e.reason),
                    ("maxFeePerGas", "MAX_FEE_BELOW_BASE_FEE")
                );
            }
        }
        // Priority above max: one wei above refused, equal accepted.
        for (prio, ok) in [(10_000u64, true), (10_001, false), (u64::MAX, false)] {
            let mut p = op();
            p.max_priority_fee_per_gas = Wei::from(prio);
            let r = check(&p, 1);
            assert_eq!(r.is_ok(), ok, "priority {prio}");
            if let Err(e) = r {
                assert_eq!(e.field, "maxPriorityFeePerGas");
                assert_eq!(e.code.code(), -32602);
            }
        }
    }

    #[test]
    fn pre_verification_gas_at_the_boundary() {
        let o = op();
        let required = required_pre_verification_gas(&o.pack().unwrap());
        assert!(required > 21_000 + 18_300, "{required}");
        for pvg in [0u128, 1, required - 1, required, required + 1] {
            let mut p = o.clone();
            p.pre_verification_gas = U256::from(pvg);
            // Changing the value changes its bytes: compare with that op's requirement.
            let need = required_pre_verification_gas(&p.pack().unwrap());
            let r = check(&p, 1);
            assert_eq!(r.is_ok(), pvg >= need, "pvg {pvg} need {need}");
            assert!(pvg >= required - 1 || r.is_err());
            if let Err(e) = r {
                assert_eq!(
                    (e.field, e.reason),
                    ("preVerificationGas", "PRE_VERIFICATION_GAS_TOO_LOW")
                );
            }
        }
    }

    #[test]
    fn the_eip_7623_floor_binds_for_large_calldata() {
        let mut o = op();
        o.call_data = vec![0xabu8; 20_000].into();
        let packed = o.pack().unwrap();
        let encoded = (packed.to_sol(),).abi_encode_params();
        let zero = encoded.iter().filter(|b| **b == 0).count() as u128;
        let nonzero = encoded.len() as u128 - zero;
        assert_eq!(
            required_pre_verification_gas(&packed),
            21_000 + 10 * (zero + 4 * nonzero)
        );
    }

    #[test]
    fn the_estimate_passes_the_check_whatever_the_client_fills_in() {
        let mut o = op();
        o.pre_verification_gas = U256::ZERO;
        let estimate = estimated_pre_verification_gas(&o).unwrap();
        for fill in [0u128, 1, 0xff, 30_000_000, u64::MAX as u128, u128::MAX] {
            let mut p = o.clone();
            p.pre_verification_gas = U256::from(estimate);
            p.call_gas_limit = fill;
            p.verification_gas_limit = fill;
            p.max_fee_per_gas = Wei::new(U256::from(fill.max(1)));
            p.max_priority_fee_per_gas = Wei::from(0u64);
            p.signature = vec![0u8; 65].into();
            p.paymaster_data = vec![0x5au8; 77].into();
            let need = required_pre_verification_gas(&p.pack().unwrap());
            assert!(
                need <= estimate,
                "fill {fill}: need {need} > estimate {estimate}"
            );
        }
    }

    #[test]
    fn an_operation_that_can_never_fit_names_its_largest_field() {
        let cases = [
            (30_000_000u128, 0u128, "callGasLimit"),
            (15_000_000, 15_000_000, "callGasLimit"),
            (1, 29_000_000, "verificationGasLimit"),
            (u128::MAX, 0, "callGasLimit"),
        ];
        for (call, verification, field) in cases {
            let mut o = op();
            o.call_gas_limit = call;
            o.verification_gas_limit = verification;
            let e = check(&o, 1).unwrap_err();
            assert_eq!((e.field, e.reason), (field, "GAS_LIMIT_EXCEEDS_BUNDLE_MAX"));
            assert!(e.message().starts_with(field), "{}", e.message());
        }
        // At the budget: min(25M, 30M - 1M) = 25M including the 200k overhead.
        let mut o = op();
        let rest = operation_gas(&o) - o.call_gas_limit as u64;
        o.call_gas_limit = u128::from(25_000_000 - 200_000 - rest);
        assert!(check(&o, 1).is_ok());
        o.call_gas_limit += 1;
        assert_eq!(check(&o, 1).unwrap_err().field, "callGasLimit");
        assert_eq!(
            bundle_gas_budget(&AdmissionConfig::default(), Some(20_000_000)),
            19_000_000
        );
        assert_eq!(
            bundle_gas_budget(&AdmissionConfig::default(), None),
            25_000_000
        );
    }

    #[test]
    fn replacement_needs_ten_percent_on_both_fees() {
        let old = op(); // 10_000 / 1_000
        let cases = [
            (10_000u64, 1_000u64, Some("maxFeePerGas")),
            (10_500, 1_050, Some("maxFeePerGas")),
            (10_999, 1_100, Some("maxFeePerGas")),
            (11_000, 1_099, Some("maxPriorityFeePerGas")),
            (11_000, 1_100, None),
            (20_000, 5_000, None),
        ];
        for (max, prio, refused) in cases {
            let mut new = op();
            new.max_fee_per_gas = Wei::from(max);
            new.max_priority_fee_per_gas = Wei::from(prio);
            let r = check_replacement(&old, &new, 10);
            assert_eq!(r.err().map(|e| e.field), refused, "{max}/{prio}");
        }
    }
}
