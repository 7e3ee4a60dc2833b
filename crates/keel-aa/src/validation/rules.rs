//! The ERC-7562 rules applied to a [`Trace`] of one user operation's validation
//! (pure: every input is in [`RuleContext`]).
//!
//! | rule | what is refused | code |
//! |---|---|---|
//! | OP-011 | `ORIGIN`, `GASPRICE`, `BLOCKHASH`, `COINBASE`, `TIMESTAMP`, `NUMBER`, `PREVRANDAO`, `GASLIMIT`, `BASEFEE`, `BLOBHASH`, `BLOBBASEFEE`, `INVALID`, `SELFDESTRUCT` in any entity; `CREATE` except as OP-032/EREP-060 allow | -32502 |
//! | OP-012 | `GAS` not immediately followed by a `*CALL` | -32502 |
//! | OP-020 | a validation frame out of gas | -32502 |
//! | OP-031 | `CREATE2` other than once by the factory phase (deploying the sender), except as EREP-060 allows | -32502 |
//! | OP-032 | (allowed) `CREATE` by the sender's own code when the operation has a factory | |
//! | EREP-060 | (allowed) `CREATE`/`CREATE2` by the factory's or the sender's own code when the factory is staked | |
//! | OP-041 | `*CALL`/`EXTCODE*` of an address without code (not a precompile 0x01–0x09, 0x100; OP-042: the sender from the factory) | -32502 |
//! | OP-051/054 | EntryPoint code access other than `EXTCODESIZE` followed by `ISZERO` | -32502 |
//! | OP-052/053/054 | a call of the EntryPoint other than `depositTo(sender)` from the sender or the factory, or its fallback from the sender | -32502 |
//! | OP-061 | a `CALL` with value to anything but the EntryPoint | -32502 |
//! | OP-080 | `BALANCE`/`SELFBALANCE` from an unstaked entity | -32502 (-32505, see below) |
//! | STO-010..033 (and OP-070 for transient storage) | storage outside the sender's, its associated slots and, for a staked entity, its own and its associated slots (write) or any slot (read) | -32502 (-32505, see below) |
//! | EREP-050 | a non-empty `context` returned by an unstaked paymaster | -32502 (-32505, see below) |
//!
//! -32505 (ERC-7769 "stake or unstake delay too low") only for a factory or paymaster
//! that has a stake at the EntryPoint below the configured minimum (stake or unstake
//! delay) and breaks a rule its stake would allow if it met the minimum; an entity
//! without any stake (and an account, always) gets -32502 like any other rule
//! violation, as the reference bundler does.

use super::tracer::{Phase, SlotAccess, Trace};
use crate::rejection::Erc7769Code;
use alloy::primitives::{Address, B256, U256, keccak256};
use std::collections::HashSet;

/// The selector of `SenderCreator.createSender(bytes)`.
pub const CREATE_SENDER: [u8; 4] = [0x57, 0x0e, 0x1a, 0x36];
/// The selector of `IAccount.validateUserOp(PackedUserOperation,bytes32,uint256)`.
pub const VALIDATE_USER_OP: [u8; 4] = [0x19, 0x82, 0x2f, 0x7c];
/// The selector of `IPaymaster.validatePaymasterUserOp(PackedUserOperation,bytes32,uint256)`.
pub const VALIDATE_PAYMASTER_USER_OP: [u8; 4] = [0x52, 0xb7, 0x51, 0x2c];
/// The selector of `IStakeManager.depositTo(address)`.
pub const DEPOSIT_TO: [u8; 4] = [0xb7, 0x60, 0xfa, 0xf9];

/// An ERC-4337 entity whose validation phase is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Entity {
    /// The factory (`initCode`), run through the EntryPoint's SenderCreator.
    Factory,
    /// The account (`sender`).
    Account,
    /// The paymaster.
    Paymaster,
}

impl Entity {
    /// `factory`, `account`, `paymaster`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Factory => "factory",
            Self::Account => "account",
            Self::Paymaster => "paymaster",
        }
    }
}

/// What the rules need besides the trace.
#[derive(Debug, Clone, Copy)]
pub struct RuleContext {
    /// The EntryPoint.
    pub entry_point: Address,
    /// The operation's sender.
    pub sender: Address,
    /// The factory, when the operation creates its account.
    pub factory: Option<Address>,
    /// The paymaster, when one pays.
    pub paymaster: Option<Address>,
    /// Whether the factory is staked (ERC-7562 SREP-010).
    pub factory_staked: bool,
    /// Whether the account is staked.
    pub account_staked: bool,
    /// Whether the paymaster is staked (or is Keel's own, see the module docs of
    /// [`crate::validation`]).
    pub paymaster_staked: bool,
    /// Whether the factory has a stake at the EntryPoint that is below the minimum
    /// (stake or unstake delay).
    pub factory_stake_too_low: bool,
    /// Whether the paymaster has a stake at the EntryPoint that is below the minimum.
    pub paymaster_stake_too_low: bool,
}

impl RuleContext {
    fn address_of(&self, e: Entity) -> Option<Address> {
        match e {
            Entity::Factory => self.factory,
            Entity::Account => Some(self.sender),
            Entity::Paymaster => self.paymaster,
        }
    }

    fn staked(&self, e: Entity) -> bool {
        match e {
            Entity::Factory => self.factory_staked,
            Entity::Account => self.account_staked,
            Entity::Paymaster => self.paymaster_staked,
        }
    }

    fn stake_too_low(&self, e: Entity) -> bool {
        match e {
            Entity::Factory => self.factory_stake_too_low,
            Entity::Account => false,
            Entity::Paymaster => self.paymaster_stake_too_low,
        }
    }

    fn is_entity(&self, a: Address) -> bool {
        a == self.sender || Some(a) == self.factory || Some(a) == self.paymaster
    }
}

/// One broken rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// The ERC-7562 rule (`OP-011`, `STO-031`, ...).
    pub rule: &'static str,
    /// The entity whose validation phase broke it.
    pub entity: Entity,
    /// What was done (an opcode name, `storage read`, ...); never payload values.
    pub what: String,
    /// Whether a stake meeting the minimum would allow it.
    pub needs_stake: bool,
    /// Whether the accountable entity has a stake below the minimum (a factory or
    /// paymaster only; see the module docs).
    pub stake_too_low: bool,
}

impl Violation {
    /// The ERC-7769 code: -32505 when a stake would allow it and the entity's stake is
    /// below the minimum, else -32502.
    pub fn code(&self) -> Erc7769Code {
        if self.needs_stake && self.stake_too_low {
            Erc7769Code::StakeTooLow
        } else {
            Erc7769Code::BannedOpcode
        }
    }

    /// `<rule> <entity> <what>`, e.g. `OP-011 account TIMESTAMP` (Keel's reason, kept
    /// in the JSON-RPC error's `data.reason` and the operation's status).
    pub fn reason(&self) -> String {
        format!("{} {} {}", self.rule, self.entity.as_str(), self.what)
    }

    /// The client-facing message, in the phrasing of the reference bundler and the
    /// conformance suite (eth-infinitism), followed by the rule: `account uses banned
    /// opcode: TIMESTAMP (OP-011)`, `unstaked paymaster accessed storage: storage read
    /// (STO-033)`. Never values.
    pub fn message(&self) -> String {
        let e = self.entity.as_str();
        let w = &self.what;
        let text = match self.rule {
            "OP-011" | "OP-012" | "OP-031" => format!("{e} uses banned opcode: {w}"),
            "OP-080" => format!("unstaked {e} uses banned opcode: {w}"),
            "OP-020" => format!("{e} internally reverts on oog"),
            "OP-041" => format!("{e} accesses un-deployed contract address with opcode {w}"),
            "OP-062" => format!("{e} accesses a forbidden precompile with opcode {w}"),
            "OP-054" if w.starts_with("EXTCODE") => {
                format!("{e} accesses EntryPoint contract address with EXTCODE* opcode: {w}")
            }
            "OP-054" => format!("illegal call into EntryPoint during validation: {e} {w}"),
            "OP-061" => format!("{e} may not make a CALL with value"),
            "EREP-050" => format!("unstaked {e} returned a context"),
            "STO-022" => {
                format!(
                    "{e} accessed storage associated with the sender of an unstaked factory: {w}"
                )
            }
            r if r.starts_with("STO-") && self.needs_stake => {
                format!("unstaked {e} accessed storage: {w}")
            }
            r if r.starts_with("STO-") => format!("{e} has forbidden storage access: {w}"),
            _ => format!("{e}: {w}"),
        };
        format!("{text} ({})", self.rule)
    }
}

const BANNED: &[&str] = &[
    "ORIGIN",
    "GASPRICE",
    "BLOCKHASH",
    "COINBASE",
    "TIMESTAMP",
    "NUMBER",
    "DIFFICULTY",
    "PREVRANDAO",
    "GASLIMIT",
    "BASEFEE",
    "BLOBHASH",
    "BLOBBASEFEE",
    "INVALID",
    "SELFDESTRUCT",
];

fn selector(hex: &str) -> Option<[u8; 4]> {
    let digits = hex.strip_prefix("0x")?;
    let bytes = alloy::primitives::hex::decode(digits).ok()?;
    bytes.try_into().ok()
}

fn phase_entity(p: &Phase, ctx: &RuleContext) -> Option<Entity> {
    let sel = selector(&p.sel)?;
    if sel == CREATE_SENDER {
        Some(Entity::Factory)
    } else if sel == VALIDATE_USER_OP && p.to == ctx.sender {
        Some(Entity::Account)
    } else if sel == VALIDATE_PAYMASTER_USER_OP && Some(p.to) == ctx.paymaster {
        Some(Entity::Paymaster)
    } else {
        None
    }
}

fn is_precompile(a: Address) -> bool {
    let n = U256::from_be_slice(a.as_slice());
    (n >= U256::from(1) && n <= U256::from(9)) || n == U256::from(0x100)
}

/// The slots associated with `a` in a phase (ERC-7562 "associated storage"): the slot
/// equal to `a`, and `keccak(A‖x) + n` for `n` in 0..=128 where a preimage starts with
/// `a` as a 32-byte word.
fn associated(p: &Phase, a: Address, slot: B256) -> bool {
    if slot == a.into_word() {
        return true;
    }
    let word = a.into_word();
    let s = U256::from_be_bytes(slot.0);
    p.keccak.iter().any(|pre| {
        pre.len() >= 32 && pre[..32] == word[..] && {
            let base = U256::from_be_bytes(keccak256(pre).0);
            s >= base && s - base <= U256::from(128)
        }
    })
}

/// Whether the ABI-encoded `(bytes context, uint256 validationData)` return of
/// `validatePaymasterUserOp` (possibly cut at 4096 bytes) holds a non-empty context.
/// Return data too short to hold the two head words is the EntryPoint's to refuse.
fn has_context(out: &[u8]) -> bool {
    if out.len() < 64 {
        return false;
    }
    let offset = U256::from_be_slice(&out[..32]);
    let Ok(offset) = usize::try_from(offset) else {
        return true;
    };
    match offset.checked_add(32) {
        Some(end) if end <= out.len() => !U256::from_be_slice(&out[offset..end]).is_zero(),
        _ => true,
    }
}

/// The violations of `trace` (empty: the validation obeys the rules checked).
pub fn check(trace: &Trace, ctx: &RuleContext) -> Vec<Violation> {
    let mut out = Vec::new();
    let mut seen = HashSet::new();
    let mut push = |v: Violation| {
        if seen.insert((v.rule, v.entity, v.what.clone())) {
            out.push(v);
        }
    };
    if !trace.errors.is_empty() {
        push(Violation {
            rule: "TRACE",
            entity: Entity::Account,
            what: "the tracer could not read a step".to_owned(),
            needs_stake: false,
            stake_too_low: false,
        });
    }
    // The SenderCreator is the EntryPoint's: its own frame is not the factory's.
    let sender_creators: HashSet<Address> = trace
        .phases
        .iter()
        .filter(|p| selector(&p.sel) == Some(CREATE_SENDER))
        .map(|p| p.to)
        .collect();
    // EREP-060: with a staked factory, the factory's and the sender's own code may use
    // CREATE and CREATE2; OP-032: with any factory, the sender's own code may use CREATE.
    let erep060 = |a: Address| {
        ctx.factory.is_some() && ctx.factory_staked && (a == ctx.sender || Some(a) == ctx.factory)
    };
    let op032 = |a: Address| ctx.factory.is_some() && a == ctx.sender;
    for p in &trace.phases {
        let Some(entity) = phase_entity(p, ctx) else {
            continue;
        };
        let staked = ctx.staked(entity);
        let low = ctx.stake_too_low(entity);
        let v = |rule: &'static str, what: &str, needs_stake: bool| Violation {
            rule,
            entity,
            what: what.to_owned(),
            needs_stake,
            stake_too_low: low,
        };
        for o in &p.ops {
            if sender_creators.contains(&o.addr) {
                continue;
            }
            let name = o.op.as_str();
            if name == "GAS" {
                push(v("OP-012", "GAS", false));
            } else if name == "BALANCE" || name == "SELFBALANCE" {
                if !staked {
                    push(v("OP-080", name, true));
                }
            } else if name == "CREATE" {
                if !(op032(o.addr) || erep060(o.addr)) {
                    push(v("OP-011", name, false));
                }
            } else if BANNED.contains(&name) {
                push(v("OP-011", name, false));
            }
        }
        if p.oog {
            push(v("OP-020", "out of gas", false));
        }
        // OP-031: one CREATE2 in the factory phase (the sender's deployment; the
        // EntryPoint refuses an initCode that does not deploy the sender, AA15); those
        // EREP-060 allows do not count.
        let creates = p
            .create2
            .iter()
            .filter(|a| !sender_creators.contains(*a) && !erep060(**a))
            .count();
        let allowed = match entity {
            Entity::Factory => creates <= 1,
            _ => creates == 0,
        };
        if !allowed {
            push(v("OP-031", "CREATE2", false));
        }
        for c in &p.calls {
            if c.to == ctx.entry_point {
                if c.op.starts_with("EXTCODE") {
                    // OP-051: only `EXTCODESIZE ISZERO` (a code-exists check).
                    if !(c.op == "EXTCODESIZE" && c.iszero) {
                        push(v("OP-054", &c.op, false));
                    }
                    continue;
                }
                let allowed = match selector(&c.sel) {
                    // OP-052: depositTo(sender) from the sender or the factory.
                    Some(s) => {
                        s == DEPOSIT_TO
                            && (c.from == ctx.sender || Some(c.from) == ctx.factory)
                            && c.arg.parse::<Address>().ok() == Some(ctx.sender)
                    }
                    // OP-053: the fallback from the sender (any value).
                    None => c.sel.is_empty() && c.from == ctx.sender,
                };
                if !allowed {
                    let what = match selector(&c.sel) {
                        Some(s) if s == DEPOSIT_TO => "depositTo",
                        Some(_) => "method call",
                        None if c.sel.is_empty() => "fallback call",
                        None => "call",
                    };
                    push(v("OP-054", what, false));
                }
                continue;
            }
            if c.value && c.op == "CALL" {
                push(v("OP-061", "CALL with value", false));
            }
            let allowed = c.code
                || is_precompile(c.to)
                || (entity == Entity::Factory && c.to == ctx.sender)
                || sender_creators.contains(&c.from);
            if !allowed {
                let rule = if is_precompile_range(c.to) {
                    "OP-062"
                } else {
                    "OP-041"
                };
                push(v(rule, &c.op, false));
            }
        }
        for a in p.accesses() {
            if let Some(viol) = storage_rule(p, ctx, entity, staked, &a) {
                push(viol);
            }
        }
        // EREP-050: an unstaked paymaster may not return a context.
        if entity == Entity::Paymaster && !staked && has_context(&p.out) {
            push(v("EREP-050", "context", true));
        }
    }
    out
}

fn is_precompile_range(a: Address) -> bool {
    U256::from_be_slice(a.as_slice()) <= U256::from(0x1ff)
}

fn storage_rule(
    p: &Phase,
    ctx: &RuleContext,
    entity: Entity,
    staked: bool,
    a: &SlotAccess,
) -> Option<Violation> {
    if a.address == ctx.entry_point || a.address == ctx.sender {
        return None; // STO-010 (the EntryPoint's own frames are not traced).
    }
    let kind = match (a.transient, a.write) {
        (false, false) => "storage read",
        (false, true) => "storage write",
        (true, false) => "transient storage read",
        (true, true) => "transient storage write",
    };
    let v = |rule: &'static str, needs_stake: bool| {
        Some(Violation {
            rule,
            entity,
            what: kind.to_owned(),
            needs_stake,
            stake_too_low: if rule == "STO-022" {
                ctx.factory_stake_too_low
            } else {
                ctx.stake_too_low(entity)
            },
        })
    };
    if associated(p, ctx.sender, a.slot) && !ctx.is_entity(a.address) {
        // STO-021 (the account exists) / STO-022 (created by a staked factory).
        return match ctx.factory {
            None => None,
            Some(_) if ctx.factory_staked => None,
            Some(_) => v("STO-022", true),
        };
    }
    let own = ctx.address_of(entity);
    if Some(a.address) == own {
        return if staked { None } else { v("STO-031", true) };
    }
    if let Some(own) = own
        && associated(p, own, a.slot)
    {
        return if staked { None } else { v("STO-032", true) };
    }
    if !a.write {
        return if staked { None } else { v("STO-033", true) };
    }
    v("STO-033", false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloy::primitives::Bytes;
    use alloy::sol_types::SolCall;

    alloy::sol! {
        function createSender(bytes initCode) external returns (address sender);
        function depositTo(address account) external payable;
    }

    #[test]
    fn selectors_match_their_signatures() {
        assert_eq!(createSenderCall::SELECTOR, CREATE_SENDER);
        assert_eq!(depositToCall::SELECTOR, DEPOSIT_TO);
        assert_eq!(
            &keccak256(
                "validateUserOp((address,uint256,bytes,bytes,bytes32,uint256,bytes32,bytes,bytes),bytes32,uint256)"
            )[..4],
            &VALIDATE_USER_OP
        );
        assert_eq!(
            &keccak256(
                "validatePaymasterUserOp((address,uint256,bytes,bytes,bytes32,uint256,bytes32,bytes,bytes),bytes32,uint256)"
            )[..4],
            &VALIDATE_PAYMASTER_USER_OP
        );
    }

    #[test]
    fn associated_slots_are_keccak_of_the_address_plus_up_to_128() {
        let a = Address::repeat_byte(0x11);
        let mut pre = a.into_word().to_vec();
        pre.extend_from_slice(&[0u8; 32]);
        let base = U256::from_be_bytes(keccak256(&pre).0);
        let p = Phase {
            to: Address::ZERO,
            sel: String::new(),
            ops: vec![],
            acc: Default::default(),
            calls: vec![],
            keccak: vec![pre.into()],
            create2: vec![],
            oog: false,
            out: Bytes::new(),
        };
        assert!(associated(&p, a, B256::from(base)));
        assert!(associated(&p, a, B256::from(base + U256::from(128))));
        assert!(!associated(&p, a, B256::from(base + U256::from(129))));
        assert!(!associated(
            &p,
            Address::repeat_byte(0x22),
            B256::from(base)
        ));
        assert!(associated(&p, a, a.into_word()));
    }
}
