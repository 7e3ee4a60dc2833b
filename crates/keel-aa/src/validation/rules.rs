//! The ERC-7562 rules applied to a [`Trace`] of one user operation's validation
//! (pure: every input is in [`RuleContext`]).
//!
//! | rule | what is refused | code |
//! |---|---|---|
//! | OP-011 | `ORIGIN`, `GASPRICE`, `BLOCKHASH`, `COINBASE`, `TIMESTAMP`, `NUMBER`, `PREVRANDAO`, `GASLIMIT`, `BASEFEE`, `BLOBHASH`, `BLOBBASEFEE`, `CREATE`, `INVALID`, `SELFDESTRUCT` in any entity | -32502 |
//! | OP-012 | `GAS` not immediately followed by a `*CALL` | -32502 |
//! | OP-020 | a validation frame out of gas | -32502 |
//! | OP-031 | `CREATE2` outside the factory, or more than once | -32502 |
//! | OP-041 | `*CALL`/`EXTCODE*` of an address without code (not a precompile 0x01–0x09, 0x100; OP-042: the sender from the factory) | -32502 |
//! | OP-054 | a call of the EntryPoint other than `depositTo` or its fallback | -32502 |
//! | OP-061 | a `CALL` with value to anything but the EntryPoint | -32502 |
//! | OP-080 | `BALANCE`/`SELFBALANCE` from an unstaked entity | -32505 |
//! | STO-010..033 (and OP-070 for transient storage) | storage outside the sender's, its associated slots and, for a staked entity, its own and its associated slots (write) or any slot (read) | -32502, or -32505 when a stake would allow it |

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
    /// Whether staking the entity would allow it (answered with -32505).
    pub needs_stake: bool,
}

impl Violation {
    /// The ERC-7769 code: -32505 when a stake would allow it, else -32502.
    pub fn code(&self) -> Erc7769Code {
        if self.needs_stake {
            Erc7769Code::StakeTooLow
        } else {
            Erc7769Code::BannedOpcode
        }
    }

    /// `<rule> <entity> <what>`, e.g. `OP-011 account TIMESTAMP`.
    pub fn reason(&self) -> String {
        format!("{} {} {}", self.rule, self.entity.as_str(), self.what)
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
    "CREATE",
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
        });
    }
    // The SenderCreator is the EntryPoint's: its own frame is not the factory's.
    let sender_creators: HashSet<Address> = trace
        .phases
        .iter()
        .filter(|p| selector(&p.sel) == Some(CREATE_SENDER))
        .map(|p| p.to)
        .collect();
    for p in &trace.phases {
        let Some(entity) = phase_entity(p, ctx) else {
            continue;
        };
        let staked = ctx.staked(entity);
        let v = |rule: &'static str, what: &str, needs_stake: bool| Violation {
            rule,
            entity,
            what: what.to_owned(),
            needs_stake,
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
            } else if BANNED.contains(&name) {
                push(v("OP-011", name, false));
            }
        }
        if p.oog {
            push(v("OP-020", "out of gas", false));
        }
        let creates = p
            .create2
            .iter()
            .filter(|a| !sender_creators.contains(*a))
            .count();
        if (entity != Entity::Factory && creates > 0) || creates > 1 {
            push(v("OP-031", "CREATE2", false));
        }
        for c in &p.calls {
            if c.to == ctx.entry_point {
                if c.op.starts_with("EXTCODE") {
                    continue; // OP-051
                }
                let allowed = match selector(&c.sel) {
                    Some(s) => s == DEPOSIT_TO && entity != Entity::Paymaster,
                    None => c.sel.is_empty() && entity == Entity::Account,
                };
                if !allowed {
                    push(v("OP-054", "EntryPoint call", false));
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
                push(v(rule, "access to an address without code", false));
            }
        }
        for a in p.accesses() {
            if let Some(viol) = storage_rule(p, ctx, entity, staked, &a) {
                push(viol);
            }
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
