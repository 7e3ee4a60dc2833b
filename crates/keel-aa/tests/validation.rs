//! ERC-7562 validation (issue 33 §4) against real Anvil (EntryPoint v0.8) and real
//! PostgreSQL: purpose-built accounts, paymasters and factories (`abi/src/test/
//! RuleBreakers.sol`) that each break one rule are refused with the rule and its
//! ERC-7769 code; compliant ones and Keel's SimpleAccount + SponsorPaymaster flow are
//! accepted; unsafe mode accepts what tracing refuses; the reputation throttles, bans
//! and decays.

mod common;

use alloy::primitives::{Address, Bytes, U256};
use alloy::providers::ext::AnvilApi;
use alloy::signers::local::PrivateKeySigner;
use alloy::sol_types::SolCall;
use anvil_tests::confirm;
use common::{AaChain, ETHER};
use keel_aa::UserOperation;
use keel_aa::flow::AaChain as FlowChain;
use keel_aa::rejection::Erc7769Code;
use keel_aa::store;
use keel_aa::validation::{
    self, Admission, Refusal, ValidationMode, ValidationSettings, reputation::ReputationParams,
};
use keel_store::testing::TestDatabase;
use keel_txq::{TxQueue, TxQueueConfig};
use std::sync::Arc;
use std::time::Instant;

alloy::sol!(
    #[sol(rpc)]
    RuleHelper,
    "../../abi/out/RuleHelper.json"
);
alloy::sol!(
    #[sol(rpc)]
    RuleAccount,
    "../../abi/out/RuleAccount.json"
);
alloy::sol!(
    #[sol(rpc)]
    RuleFactory,
    "../../abi/out/RuleFactory.json"
);
alloy::sol!(
    #[sol(rpc)]
    RulePaymaster,
    "../../abi/out/RulePaymaster.json"
);

/// Where the rule breaker sits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Account,
    Paymaster,
    Factory,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Account => "account",
            Kind::Paymaster => "paymaster",
            Kind::Factory => "factory",
        }
    }
}

const ALL: [Kind; 3] = [Kind::Account, Kind::Paymaster, Kind::Factory];

struct Rig {
    aa: AaChain,
    db: TestDatabase,
    chain: FlowChain,
    helper: Address,
    /// A compliant, funded RuleAccount (rule 0) for the paymaster cases.
    account0: Address,
    salt: std::sync::atomic::AtomicU64,
}

impl Rig {
    async fn start() -> anyhow::Result<Self> {
        let aa = AaChain::start().await?;
        let db = TestDatabase::create().await?;
        keel_store::migrate(db.pool()).await?;
        let pool = Arc::new(common::pool(&aa.chain, aa.chain.endpoint().as_str()));
        let queue = Arc::new(TxQueue::new(
            db.pool().clone(),
            pool.clone(),
            TxQueueConfig::default(),
        )?);
        let chain = FlowChain {
            pool,
            queue,
            directory: aa.deployed.directory,
            bundler: aa.chain.account(1)?,
            policy: None,
            organization_policies: Default::default(),
            beneficiary: None,
            sponsor: None,
            admission: Default::default(),
        };
        let helper = RuleHelper::deploy(aa.provider().clone()).await?;
        let mut rig = Self {
            aa,
            db,
            chain,
            helper: *helper.address(),
            account0: Address::ZERO,
            salt: std::sync::atomic::AtomicU64::new(1),
        };
        rig.account0 = rig.account(0).await?;
        Ok(rig)
    }

    fn ep(&self) -> Address {
        self.aa.ep().address()
    }

    /// A deployed RuleAccount breaking `rule`, holding 1 ETH.
    async fn account(&self, rule: u64) -> anyhow::Result<Address> {
        let a = RuleAccount::deploy(
            self.aa.provider().clone(),
            self.ep(),
            self.helper,
            U256::from(rule),
        )
        .await?;
        self.aa
            .provider()
            .anvil_set_balance(*a.address(), U256::from(ETHER))
            .await?;
        Ok(*a.address())
    }

    /// A deployed RulePaymaster breaking `rule` with 1 ETH of deposit.
    async fn paymaster(&self, rule: u64) -> anyhow::Result<Address> {
        let p = RulePaymaster::deploy(
            self.aa.provider().clone(),
            self.ep(),
            self.helper,
            U256::from(rule),
        )
        .await?;
        confirm(&p.deposit().value(U256::from(ETHER))).await?;
        Ok(*p.address())
    }

    /// A deployed RuleFactory breaking `rule`; the counterfactual RuleAccount (rule
    /// `account_rule`) it creates for a fresh salt, funded with 1 ETH; its factoryData.
    async fn factory(
        &self,
        rule: u64,
        account_rule: u64,
    ) -> anyhow::Result<(Address, Address, Bytes)> {
        let f = RuleFactory::deploy(
            self.aa.provider().clone(),
            self.ep(),
            self.helper,
            U256::from(rule),
        )
        .await?;
        let salt = U256::from(self.salt.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
        let sender = f.getAddress(salt, U256::from(account_rule)).call().await?;
        self.aa
            .provider()
            .anvil_set_balance(sender, U256::from(ETHER))
            .await?;
        let data = RuleFactory::createAccountCall {
            salt,
            accountRule: U256::from(account_rule),
        }
        .abi_encode();
        Ok((*f.address(), sender, data.into()))
    }

    /// An operation whose `kind` entity breaks `rule` (the others comply).
    async fn op(&self, kind: Kind, rule: u64) -> anyhow::Result<UserOperation> {
        Ok(match kind {
            Kind::Account => base_op(self.account(rule).await?),
            Kind::Paymaster => {
                let mut op = base_op(self.account0);
                op.paymaster = Some(self.paymaster(rule).await?);
                op
            }
            Kind::Factory => {
                let (factory, sender, data) = self.factory(rule, 0).await?;
                let mut op = base_op(sender);
                op.factory = Some(factory);
                op.factory_data = data;
                op
            }
        })
    }

    async fn validate_as(
        &self,
        op: &UserOperation,
        admission: Admission,
    ) -> anyhow::Result<Option<Refusal>> {
        let packed = op.pack()?;
        Ok(validation::validate(
            self.db.pool(),
            &self.chain,
            self.aa.ep(),
            op,
            &packed,
            admission,
        )
        .await?)
    }

    async fn validate(&self, op: &UserOperation) -> anyhow::Result<Option<Refusal>> {
        self.validate_as(op, Admission::Check).await
    }

    fn chain_id(&self) -> u64 {
        self.aa.chain.chain_id()
    }

    fn configure(&self, f: impl FnOnce(&mut ValidationSettings)) {
        let mut s = ValidationSettings::default();
        f(&mut s);
        validation::configure(self.chain_id(), s);
    }
}

/// An operation of `sender` without factory or paymaster (no signature: the
/// RuleAccounts check none).
fn base_op(sender: Address) -> UserOperation {
    UserOperation {
        sender,
        nonce: U256::ZERO,
        factory: None,
        factory_data: Bytes::new(),
        call_data: Bytes::new(),
        call_gas_limit: 50_000,
        verification_gas_limit: 2_000_000,
        pre_verification_gas: U256::from(50_000u64),
        max_fee_per_gas: keel_units::Wei::from(10_000_000_000u64),
        max_priority_fee_per_gas: keel_units::Wei::from(1_000_000_000u64),
        paymaster: None,
        paymaster_verification_gas_limit: 300_000,
        paymaster_post_op_gas_limit: 0,
        paymaster_data: Bytes::new(),
        signature: Bytes::new(),
        eip7702_auth: None,
    }
}

#[track_caller]
fn assert_refused(r: &Option<Refusal>, code: Erc7769Code, prefix: &str, case: &str) {
    match r {
        Some(r) => {
            assert_eq!(r.code, code, "{case}: {r:?}");
            assert!(
                r.reason.starts_with(prefix),
                "{case}: reason {:?} does not start with {prefix:?}",
                r.reason
            );
        }
        None => panic!("{case}: accepted, expected {prefix}"),
    }
}

/// OP-011/OP-012: every banned opcode in every entity's validation is refused with
/// -32502 and the opcode named; the compliant entities (rule 0) are accepted.
#[tokio::test]
async fn banned_opcodes_are_refused_in_every_entity() -> anyhow::Result<()> {
    let rig = Rig::start().await?;
    let banned: &[(u64, &str, &[&str])] = &[
        (1, "OP-011", &["TIMESTAMP"]),
        (2, "OP-011", &["NUMBER"]),
        (3, "OP-011", &["ORIGIN"]),
        (4, "OP-011", &["GASPRICE"]),
        (5, "OP-011", &["BLOCKHASH"]),
        (6, "OP-011", &["COINBASE"]),
        (7, "OP-011", &["PREVRANDAO", "DIFFICULTY"]),
        (8, "OP-011", &["GASLIMIT"]),
        (9, "OP-011", &["BASEFEE"]),
        (10, "OP-012", &["GAS"]),
        (11, "OP-011", &["CREATE"]),
        (12, "OP-011", &["SELFDESTRUCT"]),
        (15, "OP-011", &["INVALID"]),
        (24, "OP-011", &["BLOBHASH"]),
        (25, "OP-011", &["BLOBBASEFEE"]),
    ];
    for kind in ALL {
        let ok = rig.validate(&rig.op(kind, 0).await?).await?;
        assert_eq!(ok, None, "compliant {}", kind.name());
        for (rule, id, names) in banned {
            let r = rig.validate(&rig.op(kind, *rule).await?).await?;
            let case = format!("{} rule {rule}", kind.name());
            let r = r.unwrap_or_else(|| panic!("{case}: accepted"));
            assert_eq!(r.code, Erc7769Code::BannedOpcode, "{case}: {r:?}");
            assert!(
                names
                    .iter()
                    .any(|n| r.reason == format!("{id} {} {n}", kind.name())),
                "{case}: reason {:?}",
                r.reason
            );
            // The client-facing message: the reference bundler's phrasing and the rule.
            let message = r.breach.as_ref().map(|b| b.message.clone());
            assert!(
                names
                    .iter()
                    .any(|n| message
                        == Some(format!("{} uses banned opcode: {n} ({id})", kind.name()))),
                "{case}: message {message:?}"
            );
        }
    }
    Ok(())
}

/// One rule broken per case, each refused with its rule and code; the cases a stake
/// (or an existing account) allows are accepted.
#[tokio::test]
async fn each_rule_breaker_is_refused_with_its_rule() -> anyhow::Result<()> {
    let rig = Rig::start().await?;
    // Unstaked entities get -32502 like any other rule violation (-32505 is for a
    // stake below the minimum: `a_staked_paymaster_may_use_more_storage`).
    use Erc7769Code::BannedOpcode as OPC;
    let cases: &[(Kind, u64, Erc7769Code, &str)] = &[
        (Kind::Account, 13, OPC, "OP-080 account BALANCE"),
        (Kind::Paymaster, 14, OPC, "OP-080 paymaster SELFBALANCE"),
        (Kind::Account, 16, OPC, "OP-031 account CREATE2"),
        (Kind::Paymaster, 16, OPC, "OP-031 paymaster CREATE2"),
        (Kind::Factory, 16, OPC, "OP-031 factory CREATE2"),
        (Kind::Account, 17, OPC, "OP-054 account"),
        (Kind::Paymaster, 17, OPC, "OP-054 paymaster"),
        (Kind::Factory, 17, OPC, "OP-054 factory"),
        (Kind::Account, 18, OPC, "OP-061 account"),
        (Kind::Paymaster, 18, OPC, "OP-061 paymaster"),
        (Kind::Account, 19, OPC, "OP-041 account"),
        (Kind::Paymaster, 19, OPC, "OP-041 paymaster"),
        (Kind::Factory, 19, OPC, "OP-041 factory"),
        (Kind::Account, 22, OPC, "OP-020 account"),
        (Kind::Paymaster, 22, OPC, "OP-020 paymaster"),
        (Kind::Paymaster, 20, OPC, "STO-033 paymaster storage read"),
        (Kind::Account, 20, OPC, "STO-033 account storage read"),
        (Kind::Factory, 20, OPC, "STO-033 factory storage read"),
        (Kind::Paymaster, 21, OPC, "STO-033 paymaster storage write"),
        (Kind::Account, 21, OPC, "STO-033 account storage write"),
        (
            Kind::Paymaster,
            23,
            OPC,
            "STO-033 paymaster transient storage read",
        ),
        (Kind::Paymaster, 26, OPC, "STO-032 paymaster storage write"),
        (Kind::Factory, 26, OPC, "STO-032 factory storage write"),
        (Kind::Paymaster, 27, OPC, "STO-031 paymaster storage read"),
        (Kind::Factory, 27, OPC, "STO-031 factory storage read"),
    ];
    for (kind, rule, code, prefix) in cases {
        let r = rig.validate(&rig.op(*kind, *rule).await?).await?;
        assert_refused(&r, *code, prefix, &format!("{} rule {rule}", kind.name()));
    }

    // STO-010 / STO-021: an existing account may read its own storage and write its
    // associated slot in a foreign contract.
    for rule in [26, 27] {
        let r = rig.validate(&rig.op(Kind::Account, rule).await?).await?;
        assert_eq!(r, None, "account rule {rule}");
    }
    // STO-022: a new account's associated slot needs a staked factory.
    let (factory, sender, data) = rig.factory(0, 26).await?;
    let mut op = base_op(sender);
    op.factory = Some(factory);
    op.factory_data = data;
    let r = rig.validate(&op).await?;
    assert_refused(
        &r,
        OPC,
        "STO-022 account storage write",
        "new account rule 26",
    );
    Ok(())
}

/// A staked paymaster may read its own storage, its associated slots and any foreign
/// slot (STO-031/032/033), but still not write an unassociated foreign slot; with a
/// minimum stake above its stake it is unstaked again.
#[tokio::test]
async fn a_staked_paymaster_may_use_more_storage() -> anyhow::Result<()> {
    let rig = Rig::start().await?;
    let rig = &rig;
    let stake = |rule: u64| async move {
        let pm = rig.paymaster(rule).await?;
        let p = RulePaymaster::new(pm, rig.aa.provider().clone());
        confirm(&p.stake(86_400).value(U256::from(ETHER))).await?;
        let mut op = base_op(rig.account0);
        op.paymaster = Some(pm);
        anyhow::Ok(op)
    };
    for rule in [14, 20, 23, 26, 27] {
        let op = stake(rule).await?;
        assert_eq!(
            rig.validate(&op).await?,
            None,
            "staked paymaster rule {rule}"
        );
    }
    let op = stake(21).await?;
    assert_refused(
        &rig.validate(&op).await?,
        Erc7769Code::BannedOpcode,
        "STO-033 paymaster storage write",
        "staked paymaster rule 21",
    );
    let op = stake(27).await?;
    rig.configure(|s| s.min_stake_wei = U256::from(2 * ETHER));
    assert_refused(
        &rig.validate(&op).await?,
        Erc7769Code::StakeTooLow,
        "STO-031 paymaster",
        "paymaster under the minimum stake",
    );
    rig.configure(|s| s.min_unstake_delay_secs = 86_401);
    assert_refused(
        &rig.validate(&op).await?,
        Erc7769Code::StakeTooLow,
        "STO-031 paymaster",
        "paymaster under the minimum unstake delay",
    );
    Ok(())
}

/// ERC-7562 OP-052/053/054: the sender may call the EntryPoint's fallback (also from
/// its constructor, in the factory phase) and `depositTo(sender)`; the factory may call
/// `depositTo(sender)`; any other EntryPoint call is refused (OP-054, -32502).
#[tokio::test]
async fn the_sender_may_call_the_entry_point_fallback_and_deposit() -> anyhow::Result<()> {
    let rig = Rig::start().await?;
    // The account's constructor calls the fallback while its factory deploys it.
    let (factory, sender, data) = rig.factory(0, 33).await?;
    let mut op = base_op(sender);
    op.factory = Some(factory);
    op.factory_data = data;
    assert_eq!(rig.validate(&op).await?, None, "constructor fallback call");
    // The account calls the fallback with a value, and depositTo(itself).
    for rule in [32, 33] {
        let r = rig.validate(&rig.op(Kind::Account, rule).await?).await?;
        assert_eq!(r, None, "account rule {rule}");
    }
    // The factory deposits for the sender it creates.
    let (factory, sender, data) = rig.factory(32, 0).await?;
    let mut op = base_op(sender);
    op.factory = Some(factory);
    op.factory_data = data;
    assert_eq!(rig.validate(&op).await?, None, "factory depositTo(sender)");
    // Not from the sender: the paymaster's depositTo(itself) and fallback call, the
    // factory's fallback call; the account's other EntryPoint call.
    let refused = [
        (Kind::Paymaster, 32, "OP-054 paymaster depositTo"),
        (Kind::Paymaster, 33, "OP-054 paymaster fallback call"),
        (Kind::Factory, 33, "OP-054 factory fallback call"),
        (Kind::Account, 17, "OP-054 account method call"),
    ];
    for (kind, rule, reason) in refused {
        let r = rig.validate(&rig.op(kind, rule).await?).await?;
        assert_refused(
            &r,
            Erc7769Code::BannedOpcode,
            reason,
            &format!("{} rule {rule}", kind.name()),
        );
    }
    Ok(())
}

/// ERC-7562 OP-031/032, EREP-060: with a factory (even unstaked) the sender's own code
/// may use CREATE (in its constructor and its validation); with a staked factory the
/// factory and the sender may also use CREATE2 (and the factory CREATE); a CREATE by a
/// contract the sender calls, and CREATE2 by the sender of an unstaked factory, stay
/// refused; without a factory CREATE and CREATE2 are refused (`each_rule_breaker...`).
#[tokio::test]
async fn create_is_allowed_to_the_sender_of_a_factory() -> anyhow::Result<()> {
    let rig = Rig::start().await?;
    let rig = &rig;
    let created = |factory_rule: u64, account_rule: u64, staked: bool| async move {
        let (factory, sender, data) = rig.factory(factory_rule, account_rule).await?;
        if staked {
            let f = RuleFactory::new(factory, rig.aa.provider().clone());
            confirm(&f.stake(86_400).value(U256::from(ETHER))).await?;
        }
        let mut op = base_op(sender);
        op.factory = Some(factory);
        op.factory_data = data;
        anyhow::Ok(op)
    };
    // OP-032: CREATE by the sender (constructor and validateUserOp), unstaked factory.
    let op = created(0, 11, false).await?;
    assert_eq!(
        rig.validate(&op).await?,
        None,
        "unstaked factory, sender CREATE"
    );
    let refused = [
        (
            0,
            16,
            false,
            "OP-031 factory CREATE2",
            "unstaked factory, sender CREATE2",
        ),
        (
            0,
            34,
            false,
            "OP-011 account CREATE",
            "unstaked factory, nested CREATE",
        ),
        (
            11,
            0,
            false,
            "OP-011 factory CREATE",
            "unstaked factory's CREATE",
        ),
        (
            16,
            0,
            false,
            "OP-031 factory CREATE2",
            "unstaked factory's second CREATE2",
        ),
        (
            0,
            34,
            true,
            "OP-011 account CREATE",
            "staked factory, nested CREATE",
        ),
    ];
    for (factory_rule, account_rule, staked, reason, case) in refused {
        let op = created(factory_rule, account_rule, staked).await?;
        assert_refused(
            &rig.validate(&op).await?,
            Erc7769Code::BannedOpcode,
            reason,
            case,
        );
    }
    // EREP-060: a staked factory's sender may use CREATE2 and CREATE, and the factory
    // itself CREATE and more CREATE2.
    for (factory_rule, account_rule) in [(0, 16), (0, 11), (11, 0), (16, 0)] {
        let op = created(factory_rule, account_rule, true).await?;
        assert_eq!(
            rig.validate(&op).await?,
            None,
            "staked factory rule {factory_rule}, account rule {account_rule}"
        );
    }
    // The message names the entity and the opcode as the reference bundler does.
    let op = created(0, 34, false).await?;
    let r = rig.validate(&op).await?;
    assert_eq!(
        r.and_then(|r| r.breach).map(|b| b.message),
        Some("account uses banned opcode: CREATE (OP-011)".to_owned())
    );
    Ok(())
}

/// ERC-7562 OP-051/054: of the EntryPoint's code only `EXTCODESIZE` followed by
/// `ISZERO` (a code-exists check) is allowed; `EXTCODEHASH`, `EXTCODECOPY` and a bare
/// `EXTCODESIZE` are refused in every entity.
#[tokio::test]
async fn only_a_code_exists_check_of_the_entry_point_is_allowed() -> anyhow::Result<()> {
    let rig = Rig::start().await?;
    for kind in ALL {
        for (rule, what) in [
            (28, "EXTCODEHASH"),
            (29, "EXTCODECOPY"),
            (30, "EXTCODESIZE"),
        ] {
            let r = rig.validate(&rig.op(kind, rule).await?).await?;
            let case = format!("{} rule {rule}", kind.name());
            assert_refused(
                &r,
                Erc7769Code::BannedOpcode,
                &format!("OP-054 {} {what}", kind.name()),
                &case,
            );
        }
        let r = rig.validate(&rig.op(kind, 31).await?).await?;
        assert_eq!(r, None, "{} EXTCODESIZE ISZERO", kind.name());
    }
    Ok(())
}

/// ERC-7562 EREP-050: an unstaked paymaster may not return a context (-32502); a
/// staked one may.
#[tokio::test]
async fn an_unstaked_paymaster_may_not_return_a_context() -> anyhow::Result<()> {
    let rig = Rig::start().await?;
    let r = rig.validate(&rig.op(Kind::Paymaster, 35).await?).await?;
    assert_refused(
        &r,
        Erc7769Code::BannedOpcode,
        "EREP-050 paymaster context",
        "unstaked paymaster with a context",
    );
    assert_eq!(
        r.and_then(|r| r.breach).map(|b| b.message),
        Some("unstaked paymaster returned a context (EREP-050)".to_owned())
    );
    let pm = rig.paymaster(35).await?;
    let p = RulePaymaster::new(pm, rig.aa.provider().clone());
    confirm(&p.stake(86_400).value(U256::from(ETHER))).await?;
    let mut op = base_op(rig.account0);
    op.paymaster = Some(pm);
    op.paymaster_post_op_gas_limit = 50_000;
    assert_eq!(
        rig.validate(&op).await?,
        None,
        "staked paymaster with a context"
    );
    Ok(())
}

/// Keel's own flow (a SimpleAccount created by its initCode, sponsored by Keel's
/// SponsorPaymaster) passes the tracer; a bad paymaster signature is still the
/// EntryPoint's refusal (AA34, -32507).
#[tokio::test]
async fn simple_account_with_sponsor_paymaster_passes_the_tracer() -> anyhow::Result<()> {
    let rig = Rig::start().await?;
    let aa = &rig.aa;
    let owner = PrivateKeySigner::random();
    let sender = aa.account_of(owner.address()).await?;
    aa.mint(sender, U256::from(1000u64)).await?;
    let op = aa.transfer_op(
        owner.address(),
        sender,
        0,
        true,
        Address::repeat_byte(7),
        U256::from(1u64),
    );
    let (packed, _) = aa.sponsor_and_sign(op.clone(), &aa.sponsor, &owner).await?;
    let signed = signed_from(&op, &packed);
    assert_eq!(rig.validate(&signed).await?, None);

    let wrong = PrivateKeySigner::random();
    let (packed, _) = aa.sponsor_and_sign(op.clone(), &wrong, &owner).await?;
    let signed = signed_from(&op, &packed);
    assert_refused(
        &rig.validate(&signed).await?,
        Erc7769Code::InvalidSignature,
        "AA34",
        "wrong sponsor",
    );
    Ok(())
}

/// The ERC-7769 form of `op` with the paymaster data and signature of `packed`.
fn signed_from(op: &UserOperation, packed: &keel_aa::PackedUserOperation) -> UserOperation {
    let mut out = op.clone();
    let pnd = &packed.paymaster_and_data;
    if pnd.len() >= 52 {
        out.paymaster = Some(Address::from_slice(&pnd[..20]));
        out.paymaster_data = Bytes::copy_from_slice(&pnd[52..]);
    }
    out.signature = packed.signature.clone();
    out
}

/// Unsafe mode validates with a plain `eth_call`: the rule breakers are accepted.
#[tokio::test]
async fn unsafe_mode_accepts_what_tracing_refuses() -> anyhow::Result<()> {
    let rig = Rig::start().await?;
    let cases = [
        (Kind::Account, 1),
        (Kind::Paymaster, 10),
        (Kind::Factory, 16),
        (Kind::Paymaster, 27),
    ];
    let mut ops = Vec::new();
    for (kind, rule) in cases {
        let op = rig.op(kind, rule).await?;
        assert!(
            rig.validate(&op).await?.is_some(),
            "tracing {kind:?} {rule}"
        );
        ops.push(op);
    }
    rig.configure(|s| s.mode = ValidationMode::Unsafe);
    for op in &ops {
        assert_eq!(rig.validate(op).await?, None);
    }
    // The EntryPoint's own refusals still apply: a nonce that is not the account's.
    let mut op = ops[0].clone();
    op.nonce = U256::from(5u64);
    assert_refused(
        &rig.validate(&op).await?,
        Erc7769Code::RejectedByEntryPoint,
        "AA25",
        "unsafe, bad nonce",
    );
    Ok(())
}

/// Reputation: admissions count in opsSeen; a paymaster whose opsSeen outgrows its
/// inclusions is throttled (refused once it has enough open operations), then banned
/// (-32504); inclusions restore it; the counters decay by 23/24 per hour; a failure in
/// a bundle after validation bans the accountable entity.
#[tokio::test]
async fn reputation_throttles_bans_and_decays() -> anyhow::Result<()> {
    let rig = Rig::start().await?;
    let id = i64::try_from(rig.chain_id())?;
    let pool = rig.db.pool();
    let pm = rig.paymaster(0).await?;
    let mut op = base_op(rig.account0);
    op.paymaster = Some(pm);

    // Admissions count; checks do not.
    assert_eq!(rig.validate_as(&op, Admission::Check).await?, None);
    assert_eq!(
        store::reputation_get(pool, id, pm.as_slice())
            .await?
            .ops_seen,
        0
    );
    assert_eq!(rig.validate_as(&op, Admission::Admit).await?, None);
    assert_eq!(rig.validate_as(&op, Admission::Admit).await?, None);
    let row = store::reputation_get(pool, id, pm.as_slice()).await?;
    assert_eq!((row.ops_seen, row.ops_included), (2, 0));

    // Throttled (maxSeen 12 > 0 + 10): accepted while under the open-operation limit,
    // refused with a limit of 0.
    store::reputation_set(pool, id, pm.as_slice(), 120, 0).await?;
    assert_eq!(rig.validate(&op).await?, None);
    rig.configure(|s| {
        s.reputation = ReputationParams {
            throttled_mempool_count: 0,
            ..ReputationParams::default()
        }
    });
    assert_refused(
        &rig.validate(&op).await?,
        Erc7769Code::ThrottledOrBanned,
        "GREP-020 paymaster throttled",
        "throttled",
    );
    // Included operations restore it (maxSeen 12 ≤ 2 + 10).
    validation::record_included(pool, id, &op).await?;
    assert_refused(
        &rig.validate(&op).await?,
        Erc7769Code::ThrottledOrBanned,
        "GREP-020 paymaster throttled",
        "throttled, one inclusion",
    );
    validation::record_included(pool, id, &op).await?;
    assert_eq!(
        store::reputation_get(pool, id, pm.as_slice())
            .await?
            .ops_included,
        2
    );
    assert_eq!(rig.validate(&op).await?, None);

    // Banned, also in unsafe mode.
    store::reputation_set(pool, id, pm.as_slice(), 600, 0).await?;
    assert_refused(
        &rig.validate(&op).await?,
        Erc7769Code::ThrottledOrBanned,
        "GREP-010 paymaster banned",
        "banned",
    );
    rig.configure(|s| s.mode = ValidationMode::Unsafe);
    assert_refused(
        &rig.validate(&op).await?,
        Erc7769Code::ThrottledOrBanned,
        "GREP-010 paymaster banned",
        "banned, unsafe",
    );
    rig.configure(|_| {});

    // Hourly decay: 600 → floor(600 · (23/24)^24) = 216 after a day: maxSeen 21,
    // throttled, no longer banned; three days later about 5 %: ok.
    store::reputation_age(pool, id, pm.as_slice(), 24).await?;
    let row = store::reputation_get(pool, id, pm.as_slice()).await?;
    assert_eq!(row.ops_seen, 216);
    assert_eq!(
        ReputationParams::default().status(row),
        validation::reputation::Status::Throttled
    );
    // A write applies the decay and moves decayed_at by the whole hours applied.
    store::reputation_add(pool, id, &[pm.to_vec()], 1, 0).await?;
    assert_eq!(
        store::reputation_get(pool, id, pm.as_slice())
            .await?
            .ops_seen,
        217
    );
    store::reputation_age(pool, id, pm.as_slice(), 72).await?;
    let row = store::reputation_get(pool, id, pm.as_slice()).await?;
    // floor(217 · (23/24)^72) = 10.
    assert_eq!(row.ops_seen, 10, "{row:?}");
    assert_eq!(
        ReputationParams::default().status(row),
        validation::reputation::Status::Ok
    );
    assert_eq!(rig.validate(&op).await?, None);

    // A failure in a bundle after validation: AA33/34/36 ban the paymaster, AA13-15
    // and AA23/24/26 of a new account the factory; races (AA25 nonce, AA31 deposit,
    // AA32 window) and AA2x of an existing account ban nobody.
    let f = Address::repeat_byte(0xfa);
    let mut created = base_op(rig.account0);
    created.factory = Some(f);
    created.paymaster = Some(pm);
    let penalise = |op: UserOperation, code: u8| {
        let chain = rig.chain.clone();
        async move {
            validation::penalise_bundle_failure(pool, &chain, &op, Some(keel_aa::AaCode(code)))
                .await
        }
    };
    let before = store::reputation_get(pool, id, pm.as_slice()).await?;
    assert_ne!(
        ReputationParams::default().status(before),
        validation::reputation::Status::Banned
    );
    for code in [10, 21, 22, 25, 31, 32] {
        penalise(created.clone(), code).await?;
    }
    penalise(op.clone(), 23).await?;
    assert_eq!(
        store::reputation_get(pool, id, pm.as_slice()).await?,
        before
    );
    assert_eq!(
        store::reputation_get(pool, id, f.as_slice())
            .await?
            .ops_seen,
        0
    );
    penalise(created.clone(), 23).await?;
    let row = store::reputation_get(pool, id, f.as_slice()).await?;
    assert_eq!((row.ops_seen, row.ops_included), (10_000, 0));
    assert_eq!(
        store::reputation_get(pool, id, pm.as_slice()).await?,
        before
    );
    penalise(op.clone(), 33).await?;
    assert_refused(
        &rig.validate(&op).await?,
        Erc7769Code::ThrottledOrBanned,
        "GREP-010 paymaster banned",
        "banned after a bundle failure",
    );
    // Keel's own SponsorPaymaster is never banned.
    let mut keel = op.clone();
    keel.paymaster = Some(rig.aa.paymaster);
    penalise(keel, 34).await?;
    assert_eq!(
        store::reputation_get(pool, id, rig.aa.paymaster.as_slice())
            .await?
            .ops_seen,
        0
    );
    Ok(())
}

/// Anvil answers the tracing probe; a node without `debug_traceCall` fails it with the
/// error naming `aa.validation`, and tracing validation against it gives no verdict
/// while unsafe mode still validates.
#[tokio::test]
async fn the_tracing_probe_tells_nodes_without_debug_trace_call() -> anyhow::Result<()> {
    let rig = Rig::start().await?;
    validation::probe(&rig.aa.pool).await?;

    let proxy = anvil_tests::proxy::RpcProxy::start(rig.aa.chain.endpoint()).await?;
    proxy.add_rule(anvil_tests::proxy::Rule::error(
        "debug_traceCall",
        -32601,
        "the method debug_traceCall does not exist/is not available",
    ));
    let no_trace = Arc::new(common::pool(&rig.aa.chain, proxy.url().as_str()));
    let err = validation::probe(&no_trace)
        .await
        .err()
        .ok_or_else(|| anyhow::anyhow!("the probe passed without debug_traceCall"))?;
    assert!(matches!(err, validation::ProbeError::NoTracing), "{err:?}");
    assert!(err.to_string().contains("aa.validation"), "{err}");

    let mut chain = rig.chain.clone();
    chain.pool = no_trace;
    let op = base_op(rig.account(1).await?);
    let packed = op.pack()?;
    let r = validation::validate(
        rig.db.pool(),
        &chain,
        rig.aa.ep(),
        &op,
        &packed,
        Admission::Check,
    )
    .await;
    assert!(
        matches!(r, Err(validation::ValidationError::Chain(_))),
        "{r:?}"
    );
    rig.configure(|s| s.mode = ValidationMode::Unsafe);
    let r = validation::validate(
        rig.db.pool(),
        &chain,
        rig.aa.ep(),
        &op,
        &packed,
        Admission::Check,
    )
    .await?;
    assert_eq!(r, None);
    Ok(())
}

/// The cost of a traced validation against a plain `eth_call` (printed, not asserted):
/// `cargo nextest run -p keel-aa --run-ignored only -E 'test(tracing_cost)' --no-capture`.
#[tokio::test]
#[ignore = "measurement"]
async fn tracing_cost_per_operation() -> anyhow::Result<()> {
    let rig = Rig::start().await?;
    let aa = &rig.aa;
    let owner = PrivateKeySigner::random();
    let sender = aa.account_of(owner.address()).await?;
    let op = aa.transfer_op(
        owner.address(),
        sender,
        0,
        true,
        Address::repeat_byte(7),
        U256::from(0u64),
    );
    let (packed, _) = aa.sponsor_and_sign(op.clone(), &aa.sponsor, &owner).await?;
    let signed = signed_from(&op, &packed);
    const N: u32 = 50;
    for mode in [ValidationMode::Unsafe, ValidationMode::Tracing] {
        rig.configure(|s| s.mode = mode);
        assert_eq!(rig.validate(&signed).await?, None);
        let t = Instant::now();
        for _ in 0..N {
            assert_eq!(rig.validate(&signed).await?, None);
        }
        let per = t.elapsed() / N;
        println!("validation {}: {per:?} per operation", mode.as_str());
    }
    let t = Instant::now();
    for _ in 0..N {
        keel_aa::validation::tracer::trace_call(
            &rig.chain.pool,
            aa.ep().address(),
            rig.chain.bundler,
            keel_aa::flow::handle_ops_calldata(std::slice::from_ref(&packed), rig.chain.bundler),
            None,
        )
        .await?;
    }
    println!("debug_traceCall alone: {:?} per operation", t.elapsed() / N);
    // The floor for comparison: the struct logger (stack, no memory), parsed.
    let data = keel_aa::flow::handle_ops_calldata(std::slice::from_ref(&packed), rig.chain.bundler);
    let tx = serde_json::json!({
        "from": rig.chain.bundler, "to": aa.ep().address(), "data": data
    });
    let t = Instant::now();
    let mut steps = 0;
    for _ in 0..10 {
        let v: serde_json::Value = rig
            .chain
            .pool
            .request(
                "debug_traceCall",
                (
                    tx.clone(),
                    "latest",
                    serde_json::json!({ "enableMemory": false }),
                ),
            )
            .await?;
        steps = v["structLogs"].as_array().map_or(0, Vec::len);
    }
    println!(
        "struct logger: {:?} per operation, {steps} steps",
        t.elapsed() / 10
    );
    for (name, opts) in [
        ("callTracer", serde_json::json!({ "tracer": "callTracer" })),
        (
            "struct logger without stack and storage",
            serde_json::json!({ "disableStack": true, "disableStorage": true }),
        ),
        (
            "empty JavaScript tracer",
            serde_json::json!({ "tracer": "{step: function(log, db) {}, fault: function(log, db) {}, result: function(ctx, db) { return 0; }}" }),
        ),
    ] {
        let t = Instant::now();
        for _ in 0..10 {
            let _: serde_json::Value = rig
                .chain
                .pool
                .request("debug_traceCall", (tx.clone(), "latest", opts.clone()))
                .await?;
        }
        println!("{name}: {:?} per operation", t.elapsed() / 10);
    }
    Ok(())
}

/// The `debug_bundler_*` methods answer only when enabled: reputation dump, set and
/// clear, stake status.
#[tokio::test]
async fn debug_bundler_methods_answer_only_when_enabled() -> anyhow::Result<()> {
    use serde_json::{Value, json};
    let rig = Rig::start().await?;
    let id = rig.chain_id();
    let env = Arc::new(keel_aa::flow::AaEnv {
        db: rig.db.pool().clone(),
        chains: [(id, rig.chain.clone())].into_iter().collect(),
        later_chains: Default::default(),
    });
    let engine =
        keel_durable::Engine::new(rig.db.pool().clone(), keel_durable::EngineConfig::default())?;
    let service = keel_aa::service::AaService::new(env, engine);
    let call = |method: &str, params: Value| {
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
        let service = &service;
        async move { service.rpc(id, None, body.to_string().as_bytes()).await }
    };
    let ep = rig.ep().to_checksum(None);
    let pm = rig.paymaster(0).await?;

    let off = call("debug_bundler_dumpReputation", json!([ep])).await;
    assert_eq!(off["error"]["code"], -32601, "{off}");

    rig.configure(|s| s.debug_methods = true);
    let set = call(
        "debug_bundler_setReputation",
        json!([[{"address": pm, "opsSeen": "0x258", "opsIncluded": 0}], ep]),
    )
    .await;
    assert_eq!(set["result"], "ok", "{set}");
    let dump = call("debug_bundler_dumpReputation", json!([ep])).await;
    let entries = dump["result"].as_array().cloned().unwrap_or_default();
    assert_eq!(entries.len(), 1, "{dump}");
    assert_eq!(entries[0]["opsSeen"], "0x258");
    assert_eq!(entries[0]["status"], "banned");
    let refused = rig
        .validate(&{
            let mut op = base_op(rig.account0);
            op.paymaster = Some(pm);
            op
        })
        .await?;
    assert_refused(
        &refused,
        Erc7769Code::ThrottledOrBanned,
        "GREP-010",
        "set banned",
    );
    let clear = call("debug_bundler_clearReputation", json!([])).await;
    assert_eq!(clear["result"], "ok", "{clear}");
    let dump = call("debug_bundler_dumpReputation", json!([ep])).await;
    assert_eq!(dump["result"], json!([]), "{dump}");

    let unstaked = call("debug_bundler_getStakeStatus", json!([pm, ep])).await;
    assert_eq!(unstaked["result"]["isStaked"], false, "{unstaked}");
    let p = RulePaymaster::new(pm, rig.aa.provider().clone());
    confirm(&p.stake(86_400).value(U256::from(ETHER))).await?;
    let staked = call("debug_bundler_getStakeStatus", json!([pm, ep])).await;
    assert_eq!(staked["result"]["isStaked"], true, "{staked}");
    assert_eq!(
        staked["result"]["stakeInfo"]["stake"],
        format!("{:#x}", U256::from(ETHER))
    );
    let bad = call(
        "debug_bundler_setReputation",
        json!([[{"address": pm}], ep]),
    )
    .await;
    assert_eq!(bad["error"]["code"], -32602, "{bad}");
    Ok(())
}
