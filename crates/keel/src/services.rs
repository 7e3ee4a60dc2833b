//! The work each role runs, built from the configuration.
//!
//! | role | runs |
//! |---|---|
//! | `runner` | a durable executor with every workflow of [`keel_workflows::workflows::WORKFLOWS`]; per chain, once served ([`crate::chains`]), the transaction queue loop ([`TxQueue::run`]: its two [`keel_service`] services, `txq-rounds` for nonce recovery, signing and broadcast, woken by an enqueue, and `txq-confirm` for the confirmation watcher every `durable.confirmationWatcher.intervalMs`; they live in keel-txq and are only wired here) as the cluster singleton `txq/<chainId>` (its settlement sink records each verdict as the workflow's signal in the settling transaction), declined while the chain is not served |
//! | `indexer` | per chain, while served, the tip ingest as the singleton `index-tip/<chainId>` (epoch-fenced; a new owner takes a new epoch; before the chain's first tip block the owner plans the history below the settled height as leased ranges) and a history worker on every replica; both loops live in keel-index ([`keel_index::follow_tip`], [`keel_index::work_history`], on the [`keel_service`] shape) and are only wired here |
//! | `runner` (webhooks) | when `webhooks.enabled`, the webhook dispatcher (`webhooks-dispatch`, a [`keel_service`] service of keel-webhooks: signed, retried, per-operation ordered delivery); the engine's transition hook, the settlement sink and the queue's progress sink write the operations' webhook events in the transactions of their changes |
//! | `api` | the WorkflowEnv API (see [`keel_api`]) |
//!
//! Every long-lived task runs under the role's [`Supervisor`].

use crate::chains::{ChainSet, keep_health};
use crate::config::Config;
use crate::supervise::Supervisor;
use anyhow::Context;
use keel_chain::{AttributionSuffix, UpstreamConfig, UpstreamPool};
use keel_cluster::ShardOwner;
use keel_durable::{Engine, EngineConfig, ExecutorConfig, ExecutorHandle};
use keel_index::{HistoryConfig, HistoryWorker, TipConfig};
use keel_txq::{ProgressSink, SettlementSink, SignerHandle, TxQueue, TxQueueConfig, TxSigner};
use keel_units::ChainId;
use keel_workflows::{ChainContext, PlatformAddresses, VerdictSink, WorkflowEnv};
use sqlx::PgPool;
use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio::task::JoinHandle;

const TARGET: &str = "keel::services";

/// The settings of the chain with `chain_id` ([`crate::config::ChainConfig::settings`]:
/// its profile under its own keys); a chain that is not configured gets the `default`
/// profile's.
pub fn chain_settings(config: &Config, chain_id: u64) -> crate::config::ChainSettings {
    match config.chains.values().find(|c| c.chain_id == chain_id) {
        Some(chain) => chain.settings(&config.txq),
        None => crate::config::ChainConfig {
            chain_id,
            rpc_urls: Vec::new(),
            profile: None,
            fees: crate::config::ChainFees::default(),
            confirmations: None,
            max_gas_per_transaction: None,
            bump_percent: None,
            bump_after_ms: None,
            index_finality_depth: None,
            subscribe: None,
            finality_depth: None,
            ws_url: None,
            custody: None,
            senders: std::collections::BTreeMap::new(),
        }
        .settings(&config.txq),
    }
}

/// One upstream pool per configured chain, by chain id (no request is sent: whether a
/// chain answers is [`crate::chains::keep_health`]'s business).
///
/// # Errors
/// When a chain's upstream configuration is invalid (names `chains.<name>.rpcUrls`).
pub fn upstreams(config: &Config) -> anyhow::Result<Vec<Arc<UpstreamPool>>> {
    let mut out = Vec::new();
    for (name, chain) in &config.chains {
        let pool = UpstreamPool::new(
            ChainId(chain.chain_id),
            UpstreamConfig::new(chain.rpc_urls.clone()),
        )
        .with_context(|| format!("configuration key `chains.{name}.rpcUrls`"))?;
        out.push(Arc::new(pool));
    }
    Ok(out)
}

/// The durable engine's settings from `[durable]` (and `continue_traces` on when trace
/// export is, [`crate::traces::enabled`]).
pub fn engine_config(config: &Config) -> EngineConfig {
    let d = &config.durable;
    EngineConfig {
        lease: Duration::from_millis(d.lease_ms),
        max_payload_bytes: d.max_payload_bytes,
        max_open_signals: d.max_open_signals,
        command_max_attempts: d.command_max_attempts,
        step_attempts: d.step_attempts,
        // With trace export, segments continue the trace their instance was started in.
        continue_traces: crate::traces::enabled(&config.telemetry),
        ..EngineConfig::default()
    }
}

/// The runner's executor settings from `[durable.executor]`.
pub fn executor_config(config: &Config) -> ExecutorConfig {
    let e = &config.durable.executor;
    ExecutorConfig {
        concurrency: e.concurrency,
        poll_interval: Duration::from_millis(e.poll_interval_ms),
        renew_interval: (e.renew_interval_ms > 0)
            .then(|| Duration::from_millis(e.renew_interval_ms)),
        ..ExecutorConfig::default()
    }
}

/// The transaction queue's settings for `chain_id`: the chain's profile and keys
/// ([`chain_settings`]: fee model, L1 data fee, gas cap, confirmations, finality, bump
/// policy), `[txq]` and `durable.confirmationWatcher.intervalMs`.
pub fn queue_config(config: &Config, chain_id: u64) -> TxQueueConfig {
    let q = &config.txq;
    let chain = chain_settings(config, chain_id);
    TxQueueConfig {
        confirmations: chain.confirmations,
        poll_interval: Duration::from_millis(config.durable.confirmation_watcher.interval_ms),
        sign_batch: i64::from(q.sign_batch),
        gas_limit_headroom_percent: q.gas_limit_headroom_percent,
        recovery_every_ticks: q.recovery_every_ticks,
        bump_after: chain.bump_after,
        bump_percent: chain.bump_percent,
        max_fee_cap: u128::from(q.max_fee_cap_gwei) * 1_000_000_000,
        funding_broadcast_retries: q.funding_broadcast_retries,
        broadcast_in_flight: q.broadcast_in_flight,
        broadcast_batch: q.broadcast_batch,
        finality: chain.finality,
        fee_model: chain.fee_model,
        l1_data_fee: chain.l1_data_fee,
        max_gas_per_transaction: chain.max_gas_per_transaction,
    }
}

/// The history workers' settings from `[index.history]`.
pub fn history_config(config: &Config) -> HistoryConfig {
    let h = &config.index.history;
    HistoryConfig {
        lease: Duration::from_millis(h.lease_ms),
        max_span: h.max_span,
        retries: h.retries,
    }
}

/// The configuration key behind a key named by a library's configuration error (the
/// libraries name their own fields): the key of this binary's configuration that sets
/// it. Unknown names are returned unchanged.
pub fn config_key(library_key: &str) -> &str {
    match library_key {
        "durable.leaseSeconds" => "durable.leaseMs",
        "bumpPercent" => "txq.bumpPercent",
        "confirmations" => "chains.<name>.confirmations",
        "maxSpan" => "index.history.maxSpan",
        "lease" => "index.history.leaseMs",
        "chains.*.rpcUrls" => "chains.<name>.rpcUrls",
        "attribution.codes" => "operator.attributionCodes",
        other => other,
    }
}

/// The runner's workflow environment: every configured chain has a slot in
/// [`WorkflowEnv::later_chains`], filled when the chain is first served; the operator is
/// the operator key's address (zero without a key: then no chain is served, and
/// operations wait suspended with `CHAIN_UNAVAILABLE` until one is).
///
/// # Errors
/// When the attribution codes are invalid.
pub fn workflow_env(
    config: &Config,
    pool: &PgPool,
    operator: Option<&SignerHandle>,
) -> anyhow::Result<Arc<WorkflowEnv>> {
    let suffix = AttributionSuffix::new(&config.operator.attribution_codes)
        .context("configuration key `operator.attributionCodes`")?;
    let later_chains = config
        .chains
        .values()
        .map(|c| (ChainId(c.chain_id), OnceLock::new()))
        .collect();
    Ok(Arc::new(WorkflowEnv {
        db: pool.clone(),
        operator: operator.map_or(alloy::primitives::Address::ZERO, SignerHandle::address),
        suffix,
        chains: HashMap::new(),
        later_chains,
        index_wait: Duration::from_millis(config.index.read_after_write_wait_ms),
    }))
}

/// How long a runner waits, per chain, for the chain to answer before its executor
/// starts; a chain that does not is served later, by its chain-health task.
pub const STARTUP_PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// What the runner started.
#[derive(Debug)]
pub struct RunnerServices {
    /// The executor (shut down with a grace on stop; watched for an early end).
    pub executor: ExecutorHandle,
    /// The supervised tasks, by name.
    pub tasks: Vec<(&'static str, JoinHandle<()>)>,
}

/// The keys a runner's queues sign with: the operator's, and per chain (EIP-155 id) the
/// signer pool's other senders (`chains.<name>.senders`).
#[derive(Clone, Default)]
struct ChainSigners {
    operator: Option<Arc<dyn TxSigner>>,
    pool: Arc<std::collections::BTreeMap<u64, Vec<Arc<dyn TxSigner>>>>,
}

impl ChainSigners {
    fn new(signers: &crate::signer::Signers) -> Self {
        Self {
            operator: signers.operator.as_ref().map(SignerHandle::tx_signer),
            pool: Arc::new(
                signers
                    .pool
                    .iter()
                    .map(|(chain, senders)| {
                        (
                            *chain,
                            senders.iter().map(|s| s.handle.tx_signer()).collect(),
                        )
                    })
                    .collect(),
            ),
        }
    }
}

/// What a runner's queue hands to keel-workflows in its transactions: every verdict
/// (the settlement sink) and every first broadcast and opened funding request (the
/// progress sink); and the account-abstraction slots a served chain also fills.
#[derive(Clone)]
struct QueueSinks {
    settlement: Arc<dyn SettlementSink>,
    progress: Arc<dyn ProgressSink>,
    aa: Option<Arc<AaWiring>>,
}

/// The runner's account-abstraction side (`aa.enabled`, see [`crate::aa`]).
struct AaWiring {
    settings: crate::aa::AaSettings,
    env: Arc<keel_aa::flow::AaEnv>,
    parts: crate::aa::ChainParts,
}

/// The reason the RETRY of a wake records (`SYSTEM` / `chain-served`): the runner
/// started serving the chain an instance suspended on, or the chain came back up after
/// failed probes (issue 32 §4).
pub const CHAIN_SERVED_REASON: &str = "chain-served";

/// Makes a served chain of the runner ([`prepare_runner_chain`]) and then wakes the
/// work suspended on it (`CHAIN_UNAVAILABLE`, tag [`keel_workflows::workflows::chain_wake_tag`]):
/// it resumes now, not at its recovery backoff (up to 5 minutes). Idempotent.
#[allow(clippy::too_many_arguments)] // the runner's per-chain wiring, passed through to prepare_runner_chain
async fn serve_runner_chain(
    config: &Config,
    pool: &PgPool,
    engine: &Engine,
    env: &WorkflowEnv,
    node: &Arc<UpstreamPool>,
    signers: &ChainSigners,
    sinks: &QueueSinks,
    queue_slot: &OnceLock<Arc<TxQueue>>,
) -> Result<(), String> {
    prepare_runner_chain(config, pool, env, node, signers, sinks, queue_slot).await?;
    let chain_id = node.chain().get();
    let tag = keel_workflows::workflows::chain_wake_tag(chain_id);
    match engine.wake_suspended(&tag, CHAIN_SERVED_REASON).await {
        Ok(woken) => {
            if woken > 0 {
                tracing::info!(target: TARGET, chain_id, woken,
                    "work suspended on the chain resumed now that it is served");
            }
            Ok(())
        }
        // The chain is served; its suspended work keeps its recovery backoff, and the
        // follow-up call of the chain-health task tries the wake again.
        Err(e) => {
            tracing::warn!(target: TARGET, chain_id, error = %e,
                "could not wake the work suspended on the chain");
            Ok(())
        }
    }
}

/// Makes a served chain of the runner: its platform contracts, the queue with the
/// operator's signer and the chain's pool senders, the chain in the workflow
/// environment with its signer pool. Idempotent (a chain already there is kept).
async fn prepare_runner_chain(
    config: &Config,
    pool: &PgPool,
    env: &WorkflowEnv,
    node: &Arc<UpstreamPool>,
    signers: &ChainSigners,
    sinks: &QueueSinks,
    queue_slot: &OnceLock<Arc<TxQueue>>,
) -> Result<(), String> {
    let chain_id = node.chain().get();
    let aa_served = sinks
        .aa
        .as_ref()
        .is_none_or(|aa| aa.env.chain(chain_id).is_some());
    if env.chain(ChainId(chain_id)).is_some() && queue_slot.get().is_some() && aa_served {
        return Ok(());
    }
    let contracts = PlatformAddresses::load(pool, chain_id)
        .await
        .map_err(|e| e.to_string())?;
    let signer = signers.operator.as_ref().ok_or_else(|| match config.operator.signer_config() {
        (crate::signer::SignerConfig::Env { var }, key) => format!(
            "no operator key: set the environment variable {var} (hex private key; configuration key `{key}`)"
        ),
        (_, key) => format!("no operator key (configuration key `{key}`)"),
    })?;
    let mut queue = TxQueue::new(pool.clone(), node.clone(), queue_config(config, chain_id))
        .map_err(|e| format!("transaction queue: {e}"))?;
    queue.add_signer(signer.clone());
    let mut senders = vec![signer.address()];
    for extra in signers.pool.get(&chain_id).into_iter().flatten() {
        queue.add_signer(extra.clone());
        senders.push(extra.address());
    }
    for sender in custody_senders(config, chain_id)? {
        queue.add_custody_sender(sender);
    }
    queue.set_settlement_sink(sinks.settlement.clone());
    queue.set_progress_sink(sinks.progress.clone());
    let queue = Arc::new(queue);
    let queue = Arc::clone(queue_slot.get_or_init(|| queue));
    if let Some(aa) = &sinks.aa {
        crate::aa::serve_chain(&aa.settings, pool, &aa.env, node, &queue, &aa.parts).await?;
    }
    env.serve_later(ChainContext {
        chain_id: ChainId(chain_id),
        node: node.clone(),
        queue,
        contracts,
        senders: keel_workflows::SenderPool::new(senders),
    });
    Ok(())
}

/// The custody senders of chain `chain_id`: one per vault of `chains.<name>.custody`,
/// all sharing one provider adapter (one rate limit per provider account). Secrets are
/// read here (from their `env:`/`file:` sources); an error names the source and the
/// configuration key, never a secret's value.
///
/// # Errors
/// An unreadable secret, an invalid adapter setting or an invalid vault.
pub fn custody_senders(
    config: &Config,
    chain_id: u64,
) -> Result<Vec<keel_txq::CustodySender>, String> {
    let Some((name, custody)) = config
        .chains
        .iter()
        .find(|(_, c)| c.chain_id == chain_id)
        .and_then(|(n, c)| c.custody.as_ref().map(|cu| (n, cu)))
    else {
        return Ok(Vec::new());
    };
    if custody.vaults.is_empty() {
        return Ok(Vec::new());
    }
    let provider = match custody.provider {
        crate::config::CustodyProviderKind::Fireblocks => {
            keel_custody::FireblocksProvider::new(&custody.fireblocks())
                .map_err(|e| format!("configuration section `chains.{name}.custody`: {e}"))?
        }
    };
    let provider: Arc<dyn keel_custody::CustodyProvider> = Arc::new(provider);
    let mut out = Vec::new();
    for (vault, settings) in &custody.vaults {
        let mut settings = settings.clone();
        // `silentDropAfterSecs = 0` (TOML has no null): never.
        if settings.silent_drop_after_secs == Some(0) {
            settings.silent_drop_after_secs = None;
        }
        let sender = keel_txq::CustodySender::new(provider.clone(), &settings).map_err(|e| {
            format!("configuration section `chains.{name}.custody.vaults.{vault}`: {e}")
        })?;
        tracing::info!(target: TARGET, chain_id, vault = vault.as_str(), address = %sender.address(),
            "custody sender registered");
        out.push(sender);
    }
    Ok(out)
}

/// The api role's inbound custody webhooks (`POST /v1/custody/webhooks/fireblocks`),
/// verified against `custody.webhookJwksUrl`; `None` when it is empty (the route
/// answers 404).
///
/// # Errors
/// When the verifier's HTTP client cannot be built.
pub fn custody_webhooks(
    config: &Config,
) -> anyhow::Result<Option<keel_api::custody::CustodyWebhooks>> {
    let url = &config.custody.webhook_jwks_url;
    if url.is_empty() {
        return Ok(None);
    }
    let verifier =
        keel_custody::WebhookVerifier::new(keel_custody::WebhookVerifierConfig::new(url.clone()))
            .map_err(|e| anyhow::anyhow!("{e}"))
            .context("configuration key `custody.webhookJwksUrl`")?;
    Ok(Some(keel_api::custody::CustodyWebhooks::new(Arc::new(
        verifier,
    ))))
}

/// Starts the runner's work on `owner`'s shards, every task under `supervisor`; the
/// keys (`signers`, built once at start: [`crate::signer::Signers`]): the operator
/// signs every chain's queue and is the bundlers' sender, a chain's pool senders sign
/// its queue too.
///
/// # Errors
/// An invalid configuration (naming its key); a workflow the API can start that is
/// not registered.
pub async fn start_runner(
    config: &Config,
    pool: &PgPool,
    owner: &ShardOwner,
    chains: &ChainSet,
    supervisor: &Supervisor,
    signers: &crate::signer::Signers,
) -> anyhow::Result<RunnerServices> {
    let env = workflow_env(config, pool, signers.operator.as_ref())?;
    let signer = ChainSigners::new(signers);
    let engine = Engine::new(pool.clone(), engine_config(config))
        .map_err(|e| durable_config_error(&e))
        .context("durable engine")?;
    let engine = keel_workflows::workflows::register_all(engine, env.clone());
    // ERC-4337 (issue 20): the user-operation workflow, with a slot per chain.
    let aa = config.aa.enabled.then(|| {
        Arc::new(AaWiring {
            settings: config.aa.clone(),
            env: crate::aa::env(pool, config.chains.values().map(|c| c.chain_id)),
            parts: crate::aa::ChainParts {
                bundler: env.operator,
                sponsor_key: None,
            },
        })
    });
    let engine = match &aa {
        Some(aa) => keel_aa::flow::register(engine, aa.env.clone()),
        None => engine,
    };
    // Startup assertion: every workflow the API can start is executed here, so no
    // accepted operation can wait forever for an executor that does not know it.
    let registered = engine.registered();
    let aa_workflows = aa.as_ref().map(|_| keel_aa::flow::WORKFLOW);
    if let Some(missing) = keel_workflows::workflows::WORKFLOWS
        .iter()
        .copied()
        .chain(aa_workflows)
        .find(|w| !registered.iter().any(|r| r == w))
    {
        anyhow::bail!("workflow `{missing}` can be started by the API but is not registered");
    }
    // Webhook events (issue 21) are written in the transactions of the changes they
    // report: every status the engine writes (the transition hook) and every verdict.
    let events = keel_workflows::OperationEvents::new(
        engine.clone(),
        keel_api::webhooks::operation_renderer(),
    );
    engine.set_transition_hook(Arc::new(events.clone()));
    // A first broadcast and an opened funding request are reported in the queue's
    // transaction that records them.
    let progress: Arc<dyn ProgressSink> = Arc::new(events.clone());
    // Every verdict reaches its workflow in the transaction that settles it.
    let sink: Arc<dyn SettlementSink> =
        Arc::new(VerdictSink::new(engine.clone()).with_events(events));
    let sinks = QueueSinks {
        settlement: sink,
        progress,
        aa: aa.clone(),
    };
    let executor_settings = executor_config(config);
    executor_settings
        .validate(&engine_config(config))
        .map_err(|e| durable_config_error(&e))
        .context("durable executor")?;
    // Chains that answer now are served before the executor starts, so a workflow
    // resumed at start does not find its chain missing; the others are retried in the
    // background (below).
    let mut nodes = Vec::new();
    for node in upstreams(config)? {
        let queue_slot: Arc<OnceLock<Arc<TxQueue>>> = Arc::new(OnceLock::new());
        let chain_id = node.chain().get();
        let first = tokio::time::timeout(STARTUP_PROBE_TIMEOUT, async {
            node.verify_chain_id().await.map_err(|e| e.to_string())?;
            serve_runner_chain(
                config,
                pool,
                &engine,
                &env,
                &node,
                &signer,
                &sinks,
                &queue_slot,
            )
            .await
        })
        .await
        .unwrap_or_else(|_| Err("no answer within the startup probe".to_owned()));
        match first {
            Ok(()) => chains.set_served(chain_id, true),
            Err(reason) => {
                tracing::warn!(target: TARGET, chain_id, reason,
                    "chain not served at start; retrying in the background");
            }
        }
        nodes.push((node, queue_slot));
    }
    // A release that retired a workflow version (raised its MIN_VERSION) does not
    // start while live instances are pinned to it (docs/versioning.md).
    engine.check_versions().await.context("workflow versions")?;
    let executor = engine
        .spawn_executor(executor_settings)
        .map_err(|e| durable_config_error(&e))
        .context("durable executor")?;
    let mut tasks = Vec::new();
    let stop = supervisor.stop_token();
    let txq = supervisor.critical("txq");
    for (node, queue_slot) in nodes {
        let chain_id = node.chain().get();
        let slot = queue_slot.clone();
        let critical = txq.clone();
        let name = format!("txq/{chain_id}");
        let handle = owner.singleton_while(&name, chains.subscribe(chain_id), move |lease| {
            let queue = slot.get().cloned();
            let critical = critical.clone();
            async move {
                let Some(queue) = queue else { return };
                tracing::info!(target: TARGET, shard = lease.shard(), chain_id, "transaction queue loop owned");
                let token = lease.token().clone();
                let inner = token.clone();
                critical
                    .run(&token, async move {
                        queue.run(inner).await;
                        false
                    })
                    .await;
            }
        });
        tasks.push(("txq", supervisor.watch("txq", handle)));
        if let Some(aa) = &aa {
            tasks.extend(aa_chain_tasks(
                aa, &engine, owner, chains, supervisor, chain_id,
            ));
        }

        let (config, pool, engine, env, signer, sinks, chains, node, stop) = (
            config.clone(),
            pool.clone(),
            engine.clone(),
            env.clone(),
            signer.clone(),
            sinks.clone(),
            chains.clone(),
            node.clone(),
            stop.clone(),
        );
        let health = supervisor.spawn("chain-health", move || {
            let (config, pool, engine, env, signer, sinks, chains, node, stop, queue_slot) = (
                config.clone(),
                pool.clone(),
                engine.clone(),
                env.clone(),
                signer.clone(),
                sinks.clone(),
                chains.clone(),
                node.clone(),
                stop.clone(),
                queue_slot.clone(),
            );
            async move {
                let settings = config.chain_health.clone();
                let prepare = || {
                    serve_runner_chain(
                        &config,
                        &pool,
                        &engine,
                        &env,
                        &node,
                        &signer,
                        &sinks,
                        &queue_slot,
                    )
                };
                keep_health(chains, chain_id, node.clone(), settings, prepare, stop).await;
            }
        });
        tasks.push(("chain-health", health));
    }
    if let Some(aa) = &aa {
        let (settings, pool) = (aa.settings.clone(), pool.clone());
        let handle = owner.singleton("aa-watchdog", move |lease| {
            crate::aa::run_watchdog(settings.clone(), pool.clone(), lease.token().clone())
        });
        tasks.push(("aa-watchdog", supervisor.watch("aa-watchdog", handle)));
    }
    let census_engine = engine.clone();
    let census_stop = stop.clone();
    let census = supervisor.spawn("open-census", move || {
        let service = OpenCensusReport {
            engine: census_engine.clone(),
            gauge: keel_durable::OpenCensusGauge::new(keel_workflows::workflows::WORKFLOWS),
            waits: keel_durable::VersionWaitGauge::new(keel_workflows::workflows::WORKFLOWS),
        };
        let pacing = keel_service::ServiceConfig::new(OPEN_CENSUS_INTERVAL)
            .with_backoff(OPEN_CENSUS_INTERVAL, OPEN_CENSUS_INTERVAL);
        let stop = census_stop.clone();
        async move {
            keel_service::run(service, pacing, stop).await;
        }
    });
    tasks.push(("open-census", census));
    if config.webhooks.enabled {
        let webhook_config = config.webhooks.to_config();
        webhook_config
            .validate()
            .map_err(|e| anyhow::anyhow!("{e}"))
            .context("configuration section `webhooks`")?;
        let (pool, stop) = (pool.clone(), stop.clone());
        let dispatch = supervisor.spawn("webhooks-dispatch", move || {
            let (pool, stop) = (pool.clone(), stop.clone());
            async move {
                match keel_webhooks::Dispatcher::new(pool, webhook_config, WEBHOOK_POLL) {
                    Ok(d) => {
                        keel_service::run(d, keel_service::ServiceConfig::new(WEBHOOK_POLL), stop)
                            .await;
                    }
                    Err(e) => tracing::error!(target: TARGET, error = %e, "webhook dispatcher not started"),
                }
            }
        });
        tasks.push(("webhooks-dispatch", dispatch));
    }
    tracing::info!(target: TARGET, chains = config.chains.len(), operator = %env.operator,
        "runner services started");
    Ok(RunnerServices { executor, tasks })
}

/// The account-abstraction singletons of `chain_id` (declined while the chain is not
/// served): the bundler `aa-bundler/<chainId>` and the paymaster's deposit runway check
/// `aa-runway/<chainId>`.
fn aa_chain_tasks(
    aa: &Arc<AaWiring>,
    engine: &Engine,
    owner: &ShardOwner,
    chains: &ChainSet,
    supervisor: &Supervisor,
    chain_id: u64,
) -> Vec<(&'static str, JoinHandle<()>)> {
    let (settings, env, engine_b) = (aa.settings.clone(), aa.env.clone(), engine.clone());
    let bundler = owner.singleton_while(
        &format!("aa-bundler/{chain_id}"),
        chains.subscribe(chain_id),
        move |lease| {
            crate::aa::run_bundler(
                settings.clone(),
                env.clone(),
                engine_b.clone(),
                chain_id,
                lease.token().clone(),
            )
        },
    );
    let (settings, env) = (aa.settings.clone(), aa.env.clone());
    let runway = owner.singleton_while(
        &format!("aa-runway/{chain_id}"),
        chains.subscribe(chain_id),
        move |lease| {
            crate::aa::run_runway(
                settings.clone(),
                env.clone(),
                chain_id,
                lease.token().clone(),
            )
        },
    );
    vec![
        ("aa-bundler", supervisor.watch("aa-bundler", bundler)),
        ("aa-runway", supervisor.watch("aa-runway", runway)),
    ]
}

/// The webhook dispatcher's idle delay (it is also woken by `NOTIFY keel_webhooks`
/// when an event is written) and its wait for an attempt to end before claiming again.
pub const WEBHOOK_POLL: Duration = Duration::from_millis(500);

/// How often the runner exports the open-instance census.
pub const OPEN_CENSUS_INTERVAL: Duration = Duration::from_secs(15);

/// The runner's open-instance census as a background service (`open-census`): each run
/// reads [`Engine::open_census`] (one index-only scan) and sets
/// `keel_durable_open_instances{workflow, status}` (0 for registered workflows with no
/// open instance) and, from [`Engine::version_waits`],
/// `keel_durable_instances_awaiting_runner{workflow}` (open instances whose version no
/// live runner can run), then idles [`OPEN_CENSUS_INTERVAL`]; a failed read is logged at WARN
/// and retried after the same interval. Every runner reports the same database-wide
/// numbers, so dashboards aggregate it with `max`, not `sum`.
struct OpenCensusReport {
    engine: Engine,
    gauge: keel_durable::OpenCensusGauge,
    /// `keel_durable_instances_awaiting_runner{workflow}` from
    /// [`Engine::version_waits`], exported with the census.
    waits: keel_durable::VersionWaitGauge,
}

impl keel_service::BackgroundService for OpenCensusReport {
    type Error = keel_durable::DurableError;

    fn name(&self) -> &'static str {
        "open-census"
    }

    async fn run_once(&mut self) -> Result<keel_service::Report, Self::Error> {
        let census = self.engine.open_census().await?;
        self.gauge.export(&census);
        let waits = self.engine.version_waits().await?;
        self.waits.export(&waits);
        Ok(keel_service::Report::idle(census.len() as u64))
    }

    fn cancel_safe(&self) -> bool {
        true
    }
}

/// A durable configuration error with the key of this binary's configuration.
fn durable_config_error(e: &keel_durable::DurableError) -> anyhow::Error {
    match e {
        keel_durable::DurableError::Config { key, reason } => {
            anyhow::anyhow!("configuration key `{}`: {reason}", config_key(key))
        }
        other => anyhow::anyhow!("{other}"),
    }
}

/// How often the indexer seals the snapshots whose block became final.
const SNAPSHOT_SEAL_INTERVAL: Duration = Duration::from_secs(2);

/// Starts the indexer's work: per chain a chain-health task, a tip-ingest singleton
/// (declined while the chain is not served) and a history worker, every task under
/// `supervisor`.
///
/// # Errors
/// When a chain's or a worker's configuration is invalid.
pub async fn start_indexer(
    config: &Config,
    pool: &PgPool,
    owner: &ShardOwner,
    chains: &ChainSet,
    supervisor: &Supervisor,
) -> anyhow::Result<Vec<(&'static str, JoinHandle<()>)>> {
    let mut tasks = Vec::new();
    let stop = supervisor.stop_token();
    let poll = Duration::from_millis(config.index.poll_interval_ms);
    let replica = owner.replica_id().to_string();
    let tip_critical = supervisor.critical("index-tip");
    for node in upstreams(config)? {
        let chain_id = node.chain().get();
        let settings = chain_settings(config, chain_id);
        // A chain's own index finality depth replaces the node's `finalized` tag.
        let tip_config = match settings.index_finality_depth {
            Some(depth) => TipConfig {
                finalized_tag: false,
                ..TipConfig::new(depth)
            },
            None => TipConfig::new(config.index.finality_depth),
        };
        // With a WebSocket endpoint, new heads wake the loop and the poll is the slower
        // fallback.
        let heads = settings.ws_url.map(keel_chain::HeadWatchConfig::new);
        let poll = if heads.is_some() {
            Duration::from_millis(config.index.subscribed_poll_interval_ms)
        } else {
            poll
        };
        let confirmations = settings.confirmations;
        let tip_pool = pool.clone();
        let tip_node = node.clone();
        let owner_id = replica.clone();
        let critical = tip_critical.clone();
        let name = format!("index-tip/{chain_id}");
        let handle = owner.singleton_while(&name, chains.subscribe(chain_id), move |lease| {
            let pool = tip_pool.clone();
            let node = tip_node.clone();
            let config = tip_config.clone();
            let owner_id = owner_id.clone();
            let critical = critical.clone();
            let heads = heads.clone();
            async move {
                let token = lease.token().clone();
                let inner = token.clone();
                // A fenced owner's loop ends (a handoff, not a failure) unless a re-index
                // fenced it (it starts over); a degraded chain is held idle until a
                // re-index clears it or the lease's token fires.
                critical
                    .run(&token, async move {
                        keel_index::follow_tip_with_heads(
                            pool,
                            node,
                            config,
                            confirmations,
                            &owner_id,
                            poll,
                            heads,
                            inner,
                        )
                        .await;
                        true
                    })
                    .await;
            }
        });
        tasks.push(("index-tip", supervisor.watch("index-tip", handle)));

        let worker = HistoryWorker::new(
            pool.clone(),
            node.clone(),
            format!("{replica}/{chain_id}"),
            history_config(config),
        )
        .map_err(|e| match e {
            keel_index::IndexError::Config { key, reason } => {
                anyhow::anyhow!("configuration key `{}`: {reason}", config_key(key))
            }
            other => anyhow::anyhow!("{other}"),
        })
        .context("history worker")?
        .with_fetch_concurrency(config.index.history_fetch_concurrency);
        let worker = Arc::new(worker);
        let (history_chains, history_stop) = (chains.clone(), stop.clone());
        let history = supervisor.spawn("index-history", move || {
            keel_index::work_history(
                worker.clone(),
                history_chains.subscribe(chain_id),
                poll,
                history_stop.clone(),
            )
        });
        tasks.push(("index-history", history));

        // Pending snapshots turn final without a reader (issue 36 §2).
        let (seal_pool, seal_stop, chain) = (pool.clone(), stop.clone(), node.chain());
        let seal = supervisor.spawn("snapshot-seal", move || {
            keel_index::seal_snapshots(
                seal_pool.clone(),
                chain,
                SNAPSHOT_SEAL_INTERVAL,
                seal_stop.clone(),
            )
        });
        tasks.push(("snapshot-seal", seal));

        let (settings, health_chains, health_stop) =
            (config.chain_health.clone(), chains.clone(), stop.clone());
        let health = supervisor.spawn("chain-health", move || {
            keep_health(
                health_chains.clone(),
                chain_id,
                node.clone(),
                settings.clone(),
                || async { Ok(()) },
                health_stop.clone(),
            )
        });
        tasks.push(("chain-health", health));
    }
    Ok(tasks)
}
