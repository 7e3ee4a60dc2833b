//! ERC-4337 in the binary (`[aa]`, `keel-aa`, docs/aa.md): the settings, the
//! [`AaEnv`] of a process (a slot per configured chain, filled when the chain is first
//! served) and the runner's account-abstraction tasks.
//!
//! | role | runs |
//! |---|---|
//! | `runner` | the workflow `aa.user-operation` ([`keel_aa::flow::register`]); per served chain the bundler ([`keel_aa::bundler::Bundler`]) as the cluster singleton `aa-bundler/<chainId>` (declined while the chain is not served) and the paymaster's deposit runway check as `aa-runway/<chainId>`; the bundler watchdog as the singleton `aa-watchdog` |
//! | `api` | [`keel_aa::service::AaService`] behind `POST /v1/chains/{chain}/bundler`, `POST /v1/user-operations`, `GET /v1/user-operations/{hash}`; it signs `pm_getPaymasterData` with the sponsor key (`aa.sponsorSigner`, or `aa.sponsorKeyEnv`; [`crate::signer`]) |
//!
//! A chain's slot is filled from its platform contracts (`directory`,
//! `sponsorPaymaster`): the EntryPoint itself is only ever read through
//! [`keel_aa::resolve_entry_point`].

use crate::config::ConfigError;
use alloy::primitives::{Address, FixedBytes};
use keel_aa::flow::{AaChain, AaEnv, Sponsor};
use keel_aa::policy::{AccountRule, SponsorshipPolicy, TargetRule};
use keel_chain::UpstreamPool;
use keel_txq::TxQueue;
use keel_units::Wei;
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use uuid::Uuid;

const TARGET: &str = "keel::aa";

/// `[aa]`: ERC-4337 user operations (every key has a default).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct AaSettings {
    /// Whether the runner bundles user operations and the api role accepts them
    /// (default true).
    pub enabled: bool,
    /// Name of the environment variable holding the sponsor key (hex private key) the
    /// api role signs `paymasterData` with; the key is never printed. Unset variable:
    /// the `pm_*` methods answer that no paymaster is configured. The shorthand of
    /// `sponsorSigner = { kind = "env", var = … }`, used when `sponsorSigner` is absent.
    pub sponsor_key_env: String,
    /// `[aa.sponsorSigner]`: the sponsor key of any kind
    /// ([`crate::signer::SignerConfig`]); absent: `sponsorKeyEnv`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sponsor_signer: Option<crate::signer::SignerConfig>,
    /// The `handleOps` beneficiary (hex address); empty: the operator's address.
    pub beneficiary: String,
    /// How long a signed sponsorship stays valid, seconds (60..=86400; default 600).
    pub sponsorship_validity_secs: u64,
    /// `paymasterVerificationGasLimit` Keel's paymaster data carries, gas units
    /// (10000..=1000000; default 100000).
    pub paymaster_verification_gas_limit: u64,
    /// Most operations in one bundle (1..=256; default 32).
    pub max_operations_per_bundle: u32,
    /// The bundler's idle delay between passes, milliseconds (20..=60000; default 200).
    pub bundler_poll_ms: u64,
    /// Operations still accepted, ready or bundled after this many seconds are
    /// reported by the watchdog (10..=86400; default 300).
    pub watchdog_threshold_secs: u64,
    /// Seconds between watchdog checks (1..=3600; default 30).
    pub watchdog_interval_secs: u64,
    /// Most open user operations of one unstaked sender (ERC-7562 UREP-010
    /// `SAME_SENDER_MEMPOOL_COUNT`; 1..=64; default 4); a staked sender is not bounded.
    pub same_sender_mempool_count: u32,
    /// How long a user operation may wait `ready` without being bundled (e.g. its
    /// `maxFeePerGas` below a base fee that does not come down) before it ends `failed`
    /// with reason `MEMPOOL_EXPIRED`, seconds (60..=604800; default 3600).
    pub ready_ttl_secs: u64,
    /// The paymaster's EntryPoint deposit below which a funding request is open, wei
    /// (decimal string, or an integer; default 0.1 ether).
    #[serde(deserialize_with = "decimal_string")]
    pub runway_minimum_wei: String,
    /// Seconds between deposit runway checks (1..=86400; default 60).
    pub runway_interval_secs: u64,
    /// Most gas one bundle carries (its operations' gas plus the bundle overhead), gas
    /// units (100000..=1000000000; default 25000000); the bundle budget is the smaller
    /// of this and the latest block's gas limit minus `blockGasMargin`. An operation
    /// that cannot fit alone is refused at `eth_sendUserOperation` (issue 33 §1).
    pub max_bundle_gas: u64,
    /// Gas kept free below the latest block's gas limit, gas units (0..=100000000;
    /// default 1000000).
    pub block_gas_margin: u64,
    /// `maxFeePerGas` must be at least the latest base fee × this / 100, percent
    /// (0..=1000; default 100).
    pub base_fee_percent: u32,
    /// The least `maxPriorityFeePerGas` accepted, wei per gas (decimal string, or an
    /// integer; default 0).
    #[serde(deserialize_with = "decimal_string")]
    pub min_priority_fee_per_gas_wei: String,
    /// A replacement (same sender and nonce) must raise both fees by at least this
    /// percentage (ERC-7562; 10..=1000; default 10).
    pub replacement_fee_increase_percent: u32,
    /// The gas ceiling (sum of the five gas fields) `pm_getPaymasterData` signs when no
    /// sponsorship policy applies, gas units (21000..=1000000000; default 5000000).
    pub sponsorship_max_gas_per_operation: u64,
    /// `aa.sponsorship`: the sponsorship policies.
    pub sponsorship: SponsorshipSettings,
    /// How user operations are validated (`"tracing"`, default: ERC-7562 rules through
    /// `debug_traceCall`, the chain is not served when its node cannot trace;
    /// `"unsafe"`: a plain `eth_call`, no ERC-7562 rule, logged at WARN). See
    /// [`keel_aa::validation`].
    pub validation: keel_aa::validation::ValidationMode,
    /// ERC-7562 `MIN_STAKE_VALUE`: the EntryPoint stake an entity needs to count as
    /// staked, wei (decimal string, or an integer; default 1 ether).
    #[serde(deserialize_with = "decimal_string")]
    pub min_stake_wei: String,
    /// ERC-7562 `MIN_UNSTAKE_DELAY`: the unstake delay a staked entity needs, seconds
    /// (default 86400).
    pub min_unstake_delay_secs: u32,
    /// Whether the bundler route answers the `debug_bundler_*` methods the ERC-4337
    /// conformance suite drives: bundling mode, send a bundle now, dump and clear the
    /// mempool ([`keel_aa::debug`]), reputation dump, set and clear, stake status
    /// ([`keel_aa::validation`]). Default false; never on a production deployment: any
    /// `operate` key could stop bundling, drop operations and change reputations.
    pub debug_methods: bool,
}

impl Default for AaSettings {
    fn default() -> Self {
        Self {
            enabled: true,
            sponsor_key_env: "KEEL_SPONSOR_KEY".to_owned(),
            sponsor_signer: None,
            beneficiary: String::new(),
            sponsorship_validity_secs: 600,
            paymaster_verification_gas_limit: 100_000,
            max_operations_per_bundle: 32,
            bundler_poll_ms: 200,
            watchdog_threshold_secs: 300,
            watchdog_interval_secs: 30,
            ready_ttl_secs: 3_600,
            same_sender_mempool_count: 4,
            runway_minimum_wei: "100000000000000000".to_owned(),
            runway_interval_secs: 60,
            max_bundle_gas: 25_000_000,
            block_gas_margin: 1_000_000,
            base_fee_percent: 100,
            min_priority_fee_per_gas_wei: "0".to_owned(),
            replacement_fee_increase_percent: 10,
            sponsorship_max_gas_per_operation: 5_000_000,
            sponsorship: SponsorshipSettings::default(),
            validation: keel_aa::validation::ValidationMode::Tracing,
            min_stake_wei: "1000000000000000000".to_owned(),
            min_unstake_delay_secs: 86_400,
            debug_methods: false,
        }
    }
}

/// `[aa.sponsorship]`: which operations Keel's paymaster sponsors, beyond its
/// signature. Without any policy every operation the api role is asked to sponsor is
/// signed.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct SponsorshipSettings {
    /// `aa.sponsorship.default`: the policy of every organization without its own.
    pub default: Option<PolicySettings>,
    /// `aa.sponsorship.organizations.<organization id>`: an organization's own policy.
    pub organizations: BTreeMap<String, PolicySettings>,
}

/// One sponsorship policy ([`SponsorshipPolicy`]).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PolicySettings {
    /// Accounts (`sender`, hex addresses) that may be sponsored; empty: any account.
    #[serde(default)]
    pub accounts: Vec<String>,
    /// Contracts the accounts may call; every call of an operation must match one.
    #[serde(default)]
    pub targets: Vec<TargetSettings>,
    /// Ceiling of an operation's total gas (its five gas fields), gas units.
    pub max_gas_per_operation: u64,
    /// Budget of maximum costs per UTC day, wei (decimal string, or an integer).
    #[serde(deserialize_with = "decimal_string")]
    pub daily_budget_wei: String,
}

/// One allowed target.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TargetSettings {
    /// The contract (hex address).
    pub target: String,
    /// Allowed 4-byte selectors (`0xa9059cbb`); absent: every call.
    #[serde(default)]
    pub selectors: Option<Vec<String>>,
}

/// A wei amount written as a decimal string or as an integer (an environment
/// override `KEEL__AA__RUNWAYMINIMUMWEI=100` reads as an integer).
fn decimal_string<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        Text(String),
        Int(u64),
        Signed(i64),
    }
    Ok(match Raw::deserialize(d)? {
        Raw::Text(s) => s,
        Raw::Int(n) => n.to_string(),
        // Negative: kept as written, refused by validation with the key.
        Raw::Signed(n) => n.to_string(),
    })
}

fn invalid(key: &str, reason: &str) -> ConfigError {
    ConfigError::Invalid {
        key: key.to_owned(),
        reason: reason.to_owned(),
    }
}

fn in_range(key: &str, v: u64, lo: u64, hi: u64) -> Result<(), ConfigError> {
    if (lo..=hi).contains(&v) {
        Ok(())
    } else {
        Err(invalid(key, &format!("must be within {lo}..={hi}")))
    }
}

fn parse_wei(key: &str, v: &str) -> Result<Wei, ConfigError> {
    if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
        return Err(invalid(key, "must be a decimal number of wei"));
    }
    v.parse::<alloy::primitives::U256>()
        .map(Wei::new)
        .map_err(|_| invalid(key, "must be a decimal number of wei below 2^256"))
}

fn parse_address(key: &str, v: &str) -> Result<Address, ConfigError> {
    v.parse::<Address>()
        .map_err(|_| invalid(key, "must be a 0x-prefixed 20-byte hex address"))
}

impl PolicySettings {
    /// The policy, with errors naming `key.<field>`.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the key.
    pub fn to_policy(&self, key: &str) -> Result<SponsorshipPolicy, ConfigError> {
        let accounts = if self.accounts.is_empty() {
            AccountRule::Any
        } else {
            AccountRule::Only(
                self.accounts
                    .iter()
                    .map(|a| parse_address(&format!("{key}.accounts"), a))
                    .collect::<Result<BTreeSet<_>, _>>()?,
            )
        };
        let mut targets = Vec::new();
        for t in &self.targets {
            let target = parse_address(&format!("{key}.targets"), &t.target)?;
            let selectors = match &t.selectors {
                None => None,
                Some(list) => Some(
                    list.iter()
                        .map(|s| {
                            s.parse::<FixedBytes<4>>().map_err(|_| {
                                invalid(
                                    &format!("{key}.targets.selectors"),
                                    "each selector must be 0x and 4 bytes of hex",
                                )
                            })
                        })
                        .collect::<Result<BTreeSet<_>, _>>()?,
                ),
            };
            targets.push(TargetRule { target, selectors });
        }
        if self.max_gas_per_operation == 0 {
            return Err(invalid(
                &format!("{key}.maxGasPerOperation"),
                "must be greater than 0",
            ));
        }
        Ok(SponsorshipPolicy {
            accounts,
            targets,
            max_gas_per_operation: self.max_gas_per_operation,
            daily_budget: parse_wei(&format!("{key}.dailyBudgetWei"), &self.daily_budget_wei)?,
        })
    }
}

/// The policies of [`SponsorshipSettings`], parsed.
#[derive(Debug, Clone, Default)]
pub struct Policies {
    /// The default policy.
    pub default: Option<SponsorshipPolicy>,
    /// Per organization.
    pub organizations: HashMap<Uuid, SponsorshipPolicy>,
}

impl AaSettings {
    /// Checks every rule of `[aa]`.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        match &self.sponsor_signer {
            Some(signer) => signer.validate("aa.sponsorSigner")?,
            None if self.sponsor_key_env.is_empty() => {
                return Err(invalid(
                    "aa.sponsorKeyEnv",
                    "must name an environment variable",
                ));
            }
            None => {}
        }
        self.beneficiary()?;
        in_range(
            "aa.sponsorshipValiditySecs",
            self.sponsorship_validity_secs,
            60,
            86_400,
        )?;
        in_range(
            "aa.paymasterVerificationGasLimit",
            self.paymaster_verification_gas_limit,
            10_000,
            1_000_000,
        )?;
        in_range(
            "aa.maxOperationsPerBundle",
            u64::from(self.max_operations_per_bundle),
            1,
            256,
        )?;
        in_range("aa.bundlerPollMs", self.bundler_poll_ms, 20, 60_000)?;
        in_range("aa.readyTtlSecs", self.ready_ttl_secs, 60, 604_800)?;
        in_range(
            "aa.sameSenderMempoolCount",
            u64::from(self.same_sender_mempool_count),
            1,
            64,
        )?;
        in_range(
            "aa.watchdogThresholdSecs",
            self.watchdog_threshold_secs,
            10,
            86_400,
        )?;
        in_range(
            "aa.watchdogIntervalSecs",
            self.watchdog_interval_secs,
            1,
            3_600,
        )?;
        parse_wei("aa.runwayMinimumWei", &self.runway_minimum_wei)?;
        in_range(
            "aa.runwayIntervalSecs",
            self.runway_interval_secs,
            1,
            86_400,
        )?;
        in_range(
            "aa.maxBundleGas",
            self.max_bundle_gas,
            100_000,
            1_000_000_000,
        )?;
        in_range("aa.blockGasMargin", self.block_gas_margin, 0, 100_000_000)?;
        in_range(
            "aa.baseFeePercent",
            u64::from(self.base_fee_percent),
            0,
            1_000,
        )?;
        parse_wei(
            "aa.minPriorityFeePerGasWei",
            &self.min_priority_fee_per_gas_wei,
        )?;
        in_range(
            "aa.replacementFeeIncreasePercent",
            u64::from(self.replacement_fee_increase_percent),
            10,
            1_000,
        )?;
        in_range(
            "aa.sponsorshipMaxGasPerOperation",
            self.sponsorship_max_gas_per_operation,
            21_000,
            1_000_000_000,
        )?;
        parse_wei("aa.minStakeWei", &self.min_stake_wei)?;
        self.policies()?;
        Ok(())
    }

    /// The admission settings of every served chain ([`keel_aa::admission`]).
    pub fn admission(&self) -> keel_aa::admission::AdmissionConfig {
        keel_aa::admission::AdmissionConfig {
            max_bundle_gas: self.max_bundle_gas,
            block_gas_margin: self.block_gas_margin,
            bundle_gas_overhead: keel_aa::bundler::BundlerConfig::default().gas_overhead,
            base_fee_percent: self.base_fee_percent,
            min_priority_fee_per_gas: parse_wei(
                "aa.minPriorityFeePerGasWei",
                &self.min_priority_fee_per_gas_wei,
            )
            .unwrap_or(Wei::ZERO),
            replacement_increase_percent: self.replacement_fee_increase_percent,
            sponsorship_max_gas: self.sponsorship_max_gas_per_operation,
            same_sender_mempool_count: self.same_sender_mempool_count as usize,
        }
    }

    /// The validation settings of every served chain ([`keel_aa::validation`]).
    pub fn validation_settings(&self) -> keel_aa::validation::ValidationSettings {
        keel_aa::validation::ValidationSettings {
            mode: self.validation,
            min_stake_wei: parse_wei("aa.minStakeWei", &self.min_stake_wei)
                .map(Wei::get)
                .unwrap_or(alloy::primitives::U256::MAX),
            min_unstake_delay_secs: self.min_unstake_delay_secs,
            debug_methods: self.debug_methods,
            ..keel_aa::validation::ValidationSettings::default()
        }
    }

    /// The configured beneficiary (`None`: the operator).
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming `aa.beneficiary`.
    pub fn beneficiary(&self) -> Result<Option<Address>, ConfigError> {
        if self.beneficiary.is_empty() {
            return Ok(None);
        }
        parse_address("aa.beneficiary", &self.beneficiary).map(Some)
    }

    /// The runway threshold, wei.
    pub fn runway_minimum(&self) -> Wei {
        parse_wei("aa.runwayMinimumWei", &self.runway_minimum_wei).unwrap_or(Wei::ZERO)
    }

    /// The sponsorship policies.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the key (`aa.sponsorship.default.…`,
    /// `aa.sponsorship.organizations.<id>…`).
    pub fn policies(&self) -> Result<Policies, ConfigError> {
        let default = self
            .sponsorship
            .default
            .as_ref()
            .map(|p| p.to_policy("aa.sponsorship.default"))
            .transpose()?;
        let mut organizations = HashMap::new();
        for (id, p) in &self.sponsorship.organizations {
            let key = format!("aa.sponsorship.organizations.{id}");
            let org = id
                .parse::<Uuid>()
                .map_err(|_| invalid(&key, "the table's name must be an organization id (UUID)"))?;
            organizations.insert(org, p.to_policy(&key)?);
        }
        Ok(Policies {
            default,
            organizations,
        })
    }

    /// The bundler's settings.
    pub fn bundler_config(&self) -> keel_aa::bundler::BundlerConfig {
        keel_aa::bundler::BundlerConfig {
            max_operations: self.max_operations_per_bundle as usize,
            ready_ttl: std::time::Duration::from_secs(self.ready_ttl_secs),
            ..keel_aa::bundler::BundlerConfig::default()
        }
    }
}

impl AaSettings {
    /// The sponsor key's configuration and the configuration key it comes from
    /// (`aa.sponsorSigner`, or `aa.sponsorKeyEnv` when no signer table is given).
    pub fn sponsor_signer_config(&self) -> (crate::signer::SignerConfig, &'static str) {
        match &self.sponsor_signer {
            Some(s) => (s.clone(), "aa.sponsorSigner"),
            None => (
                crate::signer::SignerConfig::Env {
                    var: self.sponsor_key_env.clone(),
                },
                "aa.sponsorKeyEnv",
            ),
        }
    }
}

/// The sponsor key from `aa.sponsorSigner` (or `aa.sponsorKeyEnv`); `None` when its
/// variable is unset.
///
/// # Errors
/// When the key is configured but unusable (names the variable or file, never the
/// value).
pub async fn sponsor_key(
    settings: &AaSettings,
) -> Result<Option<keel_txq::SignerHandle>, crate::signer::SignerLoadError> {
    let (signer, key) = settings.sponsor_signer_config();
    signer.build(key).await
}

/// An [`AaEnv`] with an empty slot per configured chain (`chain_ids`).
pub fn env(pool: &PgPool, chain_ids: impl IntoIterator<Item = u64>) -> Arc<AaEnv> {
    Arc::new(AaEnv {
        db: pool.clone(),
        chains: HashMap::new(),
        later_chains: chain_ids
            .into_iter()
            .map(|id| (id, OnceLock::new()))
            .collect(),
    })
}

/// What a process puts into a chain's slot besides the chain itself.
#[derive(Clone)]
pub struct ChainParts {
    /// The bundler's sender (the operator; zero in an api process without the key:
    /// only the simulations' `from`).
    pub bundler: Address,
    /// The sponsor key (api role).
    pub sponsor_key: Option<keel_txq::SignerHandle>,
}

/// Fills the slot of `node`'s chain in `env` (idempotent): the Directory and the
/// SponsorPaymaster from the chain's platform contracts, the policies and the sponsor.
///
/// # Errors
/// A message (no secret) when the platform contracts cannot be read or the chain was
/// not bootstrapped.
pub async fn serve_chain(
    settings: &AaSettings,
    pool: &PgPool,
    env: &AaEnv,
    node: &Arc<UpstreamPool>,
    queue: &Arc<TxQueue>,
    parts: &ChainParts,
) -> Result<(), String> {
    let chain_id = node.chain().get();
    if env.chain(chain_id).is_some() {
        return Ok(());
    }
    let id = i64::try_from(chain_id).map_err(|_| "chain id out of range".to_owned())?;
    let validation = settings.validation_settings();
    if validation.mode == keel_aa::validation::ValidationMode::Tracing {
        match keel_aa::validation::probe(node).await {
            Ok(()) => {}
            Err(e @ keel_aa::validation::ProbeError::NoTracing) => {
                // Only user operations are refused on this chain; the chain's other
                // services run.
                tracing::error!(target: TARGET, chain_id, error = %e,
                    "user operations (and the bundler) are not served on this chain");
                return Ok(());
            }
            Err(e) => return Err(format!("chain {chain_id}: {e}")),
        }
    }
    keel_aa::validation::configure(chain_id, validation);
    let rows = keel_store::platform::platform_contract_list(pool, id)
        .await
        .map_err(|e| format!("platform contracts: {e}"))?;
    let find = |name: &str| {
        rows.iter()
            .find(|r| r.name == name)
            .and_then(|r| Address::try_from(r.address.as_slice()).ok())
    };
    let directory = find(keel_abi::platform::names::DIRECTORY).ok_or_else(|| {
        format!("platform contract `directory` is not recorded for chain {chain_id}; run `keel chain bootstrap`")
    })?;
    let paymaster = find(keel_abi::platform::names::SPONSOR_PAYMASTER);
    let policies = settings.policies().map_err(|e| e.to_string())?;
    let sponsor = match (paymaster, &parts.sponsor_key) {
        (Some(paymaster), Some(signer)) => Some(Sponsor {
            paymaster,
            signer: signer.clone(),
            validity_secs: settings.sponsorship_validity_secs,
            verification_gas_limit: u128::from(settings.paymaster_verification_gas_limit),
            post_op_gas_limit: 0,
        }),
        _ => None,
    };
    let beneficiary = settings.beneficiary().map_err(|e| e.to_string())?;
    env.serve_later(AaChain {
        pool: node.clone(),
        queue: queue.clone(),
        directory,
        bundler: parts.bundler,
        policy: policies.default,
        organization_policies: policies.organizations,
        beneficiary,
        sponsor,
        admission: settings.admission(),
    });
    tracing::info!(target: TARGET, chain_id, %directory, paymaster = ?paymaster,
        sponsor = parts.sponsor_key.is_some(), "account abstraction served");
    Ok(())
}

/// The SponsorPaymaster of a served chain (platform contract `sponsorPaymaster`).
async fn paymaster_of(pool: &PgPool, chain_id: u64) -> Option<Address> {
    let id = i64::try_from(chain_id).ok()?;
    let rows = keel_store::platform::platform_contract_list(pool, id)
        .await
        .ok()?;
    rows.iter()
        .find(|r| r.name == keel_abi::platform::names::SPONSOR_PAYMASTER)
        .and_then(|r| Address::try_from(r.address.as_slice()).ok())
}

/// The runner's bundler of `chain_id` until `stop` (a lease's token): the
/// [`keel_aa::bundler::Bundler`] service, started once the chain's slot is filled.
pub async fn run_bundler(
    settings: AaSettings,
    env: Arc<AaEnv>,
    engine: keel_durable::Engine,
    chain_id: u64,
    stop: tokio_util::sync::CancellationToken,
) {
    let bundler =
        match keel_aa::bundler::Bundler::new(env, engine, chain_id, settings.bundler_config()) {
            Ok(b) => b,
            Err(e) => {
                tracing::warn!(target: TARGET, chain_id, error = %e, "bundler not started");
                return;
            }
        };
    tracing::info!(target: TARGET, chain_id, "bundler owned");
    let poll = Duration::from_millis(settings.bundler_poll_ms);
    keel_service::run(
        bundler,
        keel_service::ServiceConfig::new(poll).with_backoff(poll, Duration::from_secs(10)),
        stop,
    )
    .await;
}

/// The bundler watchdog until `stop`.
pub async fn run_watchdog(
    settings: AaSettings,
    pool: PgPool,
    stop: tokio_util::sync::CancellationToken,
) {
    let interval = Duration::from_secs(settings.watchdog_interval_secs);
    let watchdog = keel_aa::bundler::Watchdog::new(
        pool,
        Duration::from_secs(settings.watchdog_threshold_secs),
        interval,
    );
    keel_service::run(
        watchdog,
        keel_service::ServiceConfig::new(interval).with_backoff(interval, interval * 4),
        stop,
    )
    .await;
}

/// The paymaster deposit runway check of `chain_id` until `stop`.
pub async fn run_runway(
    settings: AaSettings,
    env: Arc<AaEnv>,
    chain_id: u64,
    stop: tokio_util::sync::CancellationToken,
) {
    let Some(paymaster) = paymaster_of(&env.db, chain_id).await else {
        // Held until the lease ends (a return would be restarted at once).
        tracing::info!(target: TARGET, chain_id, "no SponsorPaymaster recorded: no runway check");
        stop.cancelled().await;
        return;
    };
    let interval = Duration::from_secs(settings.runway_interval_secs);
    let check = keel_aa::runway::RunwayCheck::new(
        env,
        chain_id,
        paymaster,
        settings.runway_minimum(),
        interval,
    );
    keel_service::run(
        check,
        keel_service::ServiceConfig::new(interval).with_backoff(interval, interval * 4),
        stop,
    )
    .await;
}

/// How often the api role retries filling the slot of a chain whose platform contracts
/// were not readable yet (a chain bootstrapped after the api started).
pub const API_SLOT_RETRY: Duration = Duration::from_secs(2);

/// The api role's [`keel_aa::service::AaService`] (`None` when `aa.enabled` is false):
/// a slot per configured chain, filled now when its platform contracts are recorded,
/// else retried every [`API_SLOT_RETRY`] by the supervised task `aa-chains` until
/// every slot is filled. The sponsor key and the bundler's address (the simulations'
/// `from`: the operator key's, else the beneficiary) come from the process's
/// [`crate::signer::Signers`], built once at start.
///
/// # Errors
/// An invalid configuration (naming its key).
pub async fn api_service(
    config: &crate::config::Config,
    pool: &PgPool,
    engine: keel_durable::Engine,
    supervisor: &crate::supervise::Supervisor,
    signers: &crate::signer::Signers,
) -> anyhow::Result<Option<keel_aa::service::AaService>> {
    if !config.aa.enabled {
        return Ok(None);
    }
    let settings = config.aa.clone();
    let bundler = signers
        .operator
        .as_ref()
        .map(keel_txq::SignerHandle::address)
        .or(settings.beneficiary()?)
        .unwrap_or(Address::ZERO);
    let parts = ChainParts {
        bundler,
        sponsor_key: signers.sponsor.clone(),
    };
    let env = env(pool, config.chains.values().map(|c| c.chain_id));
    let mut chains = Vec::new();
    for node in crate::services::upstreams(config)? {
        let chain_id = node.chain().get();
        // Never run here: the struct's queue is the runner's business (the api only
        // simulates and records).
        let queue = TxQueue::new(
            pool.clone(),
            node.clone(),
            crate::services::queue_config(config, chain_id),
        )
        .map_err(|e| anyhow::anyhow!("transaction queue of chain {chain_id}: {e}"))?;
        chains.push((node, Arc::new(queue)));
    }
    let mut pending = Vec::new();
    for (node, queue) in chains {
        if let Err(reason) = serve_chain(&settings, pool, &env, &node, &queue, &parts).await {
            tracing::warn!(target: TARGET, chain_id = node.chain().get(), reason,
                "user operations not served yet on this chain; retrying");
            pending.push((node, queue));
        }
    }
    if !pending.is_empty() {
        let (settings, pool, env2, parts, stop) = (
            settings.clone(),
            pool.clone(),
            env.clone(),
            parts.clone(),
            supervisor.stop_token(),
        );
        let pending = Arc::new(pending);
        supervisor.spawn("aa-chains", move || {
            let (settings, pool, env, parts, stop, pending) = (
                settings.clone(),
                pool.clone(),
                env2.clone(),
                parts.clone(),
                stop.clone(),
                pending.clone(),
            );
            async move {
                loop {
                    let mut left = 0;
                    for (node, queue) in pending.iter() {
                        if serve_chain(&settings, &pool, &env, node, queue, &parts)
                            .await
                            .is_err()
                        {
                            left += 1;
                        }
                    }
                    if left == 0 {
                        stop.cancelled().await;
                        return;
                    }
                    tokio::select! {
                        () = stop.cancelled() => return,
                        () = tokio::time::sleep(API_SLOT_RETRY) => {}
                    }
                }
            }
        });
    }
    if settings.debug_methods {
        tracing::warn!(target: "keel::aa", "aa.debugMethods is on: the debug_bundler_* methods let any operate key change the bundling mode and drop user operations; never on a production deployment");
    }
    Ok(Some(
        keel_aa::service::AaService::new(env, engine).with_debug_namespace(settings.debug_methods),
    ))
}
