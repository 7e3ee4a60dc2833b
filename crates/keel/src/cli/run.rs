//! `keel run --role api|runner|indexer`: one role until SIGTERM/SIGINT, its keys built
//! once at start, the Platform API server for the api role, and the orderly drain.

use anyhow::{Context, bail};
use keel::config::{Config, Role};
use keel::telemetry;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Runs `role` (or the configured one) until a signal or a critical failure, then
/// drains within `grace`.
pub(super) async fn run(config: Config, role: Option<Role>, grace: Duration) -> anyhow::Result<()> {
    let Some(role) = role.or(config.role) else {
        bail!(
            "no role: pass --role api|runner|indexer, set KEEL_ROLE, or `role` in the configuration"
        );
    };
    let span = tracing::info_span!("keel", role = role.as_str());
    let _entered = span.enter();
    // Every key the role signs with, built once and shared (a malformed key stops here).
    let signers = keel::signer::Signers::load(&config, role)
        .await
        .context("signing keys")?;
    let endpoint =
        telemetry::init_metrics(&config.telemetry, &config.deployment_id, role.as_str()).await?;
    let metrics_addr = endpoint
        .as_ref()
        .and_then(telemetry::MetricsEndpoint::local_addr);
    let pool = keel_store::connect(&config.database)
        .await
        .context("connecting to the database")?;
    let shutdown = keel::shutdown::on_signal();
    let runtime = keel::roles::RoleRuntime::start(role, &config, &pool, &signers).await?;
    let supervisor = runtime.supervisor().clone();
    let ready = Arc::new(AtomicBool::new(false));
    // The telemetry endpoint outlives the drain (readiness reports "not ready" while
    // draining); it stops with the process.
    let endpoint_stop = tokio_util::sync::CancellationToken::new();
    if let Some(endpoint) = endpoint {
        let readiness = telemetry::Readiness {
            role: role.as_str(),
            ready: ready.clone(),
            chains: runtime.chain_set().cloned(),
            index_db: matches!(role, Role::Indexer).then(|| pool.clone()),
        };
        let served = telemetry::serve_endpoint(endpoint, readiness, endpoint_stop.clone());
        let watcher = supervisor.clone();
        tokio::spawn(async move {
            let outcome = served.await;
            let reason = match outcome {
                Ok(Ok(())) => "stopped serving".to_owned(),
                Ok(Err(e)) => format!("failed: {e}"),
                Err(_) => "panicked".to_owned(),
            };
            watcher.fail("telemetry-endpoint", &reason);
        });
    }
    let api = if role == Role::Api {
        Some(
            start_api(
                &config,
                &pool,
                ready.clone(),
                shutdown.clone(),
                supervisor.clone(),
                &signers,
            )
            .await?,
        )
    } else {
        None
    };
    ready.store(true, Ordering::SeqCst);
    metrics::gauge!("keel_ready").set(1.0);
    tracing::info!(
        target: "keel",
        metrics = metrics_addr.map(|a| a.to_string()).unwrap_or_else(|| "disabled".into()),
        chains = ?runtime.chains(),
        "{} role ready",
        role.as_str()
    );
    // Runs until a signal, or until a critical task ended for good.
    let failure = tokio::select! {
        () = shutdown.cancelled() => None,
        reason = runtime.failed() => Some(reason),
    };
    // Readiness first, so load balancers and probes stop routing before work stops.
    ready.store(false, Ordering::SeqCst);
    metrics::gauge!("keel_ready").set(0.0);
    shutdown.cancel();
    tracing::info!(target: "keel", grace_seconds = grace.as_secs(), "draining");
    let started = std::time::Instant::now();
    if let Some(server) = api {
        // The server stops accepting at the signal and finishes in-flight requests.
        if tokio::time::timeout(grace, server).await.is_err() {
            tracing::warn!(target: "keel", "in-flight requests did not finish within the grace");
        }
    }
    runtime.stop(grace.saturating_sub(started.elapsed())).await;
    let left = grace.saturating_sub(started.elapsed());
    tokio::time::timeout(left, pool.close()).await.ok();
    endpoint_stop.cancel();
    if let Some(reason) = failure {
        tracing::error!(target: "keel", reason = reason.as_str(), "stopped after a critical task failed");
        bail!("{reason}");
    }
    tracing::info!(target: "keel", "stopped");
    Ok(())
}

/// Binds the Platform API and serves it until `shutdown` fires (graceful: in-flight
/// requests finish). A server that ends before `shutdown` fails the process through
/// `supervisor` (task `api-server`).
async fn start_api(
    config: &Config,
    pool: &sqlx::PgPool,
    ready: Arc<AtomicBool>,
    shutdown: tokio_util::sync::CancellationToken,
    supervisor: keel::supervise::Supervisor,
    signers: &keel::signer::Signers,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let engine = keel_durable::Engine::new(pool.clone(), keel::services::engine_config(config))
        .context("durable engine")?;
    // `operation.accepted` webhook events are written with each accepted operation.
    let events = keel_workflows::OperationEvents::new(
        engine.clone(),
        keel_api::webhooks::operation_renderer(),
    );
    // ERC-4337 (issue 20): user operations, when `aa.enabled`.
    let user_operations = keel::aa::api_service(config, pool, engine.clone(), &supervisor, signers)
        .await
        .context("account abstraction")?;
    let nodes = keel::services::upstreams(config)?;
    let ops = keel_workflows::Ops::new(pool.clone(), engine)
        .with_events(events)
        .with_nodes(nodes.clone());
    let webhooks = keel_webhooks::Webhooks::new(pool.clone(), config.webhooks.to_config());
    // Platform Status reads each chain's head itself (issue 32 §7), independently of the
    // index's tip owner.
    let mut state = keel_api::ApiState::new(ops, ready).with_chain_heads(nodes);
    if let Some(service) = user_operations {
        state = state.with_user_operations(service);
    }
    let state = state
        .with_webhooks(webhooks)
        .with_config(keel_api::ApiConfig {
            max_body_bytes: config.api.body_limit_bytes,
            status: config.api.status.to_query(),
            rate_limits: config.api.rate_limit.to_config(),
            ..keel_api::ApiConfig::default()
        });
    let state = match keel::services::custody_webhooks(config)? {
        Some(custody) => state.with_custody_webhooks(custody),
        None => state,
    };
    let listener = tokio::net::TcpListener::bind(&config.api.listen_address)
        .await
        .with_context(|| format!("binding api.listenAddress {}", config.api.listen_address))?;
    tracing::info!(target: "keel::api", address = %config.api.listen_address, "platform API listening");
    // Each request's span continues the caller's W3C trace context.
    let app = keel_api::router(state).layer(axum::middleware::from_fn(keel::traces::http_layer));
    let stop = shutdown.clone();
    let served = tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async move { stop.cancelled().await })
            .await
    });
    Ok(tokio::spawn(async move {
        let outcome = served.await;
        if shutdown.is_cancelled() {
            if let Ok(Err(e)) = outcome {
                tracing::error!(target: "keel::api", error = %e, "platform API server failed while draining");
            }
            return;
        }
        let reason = match outcome {
            Ok(Ok(())) => "stopped serving".to_owned(),
            Ok(Err(e)) => format!("failed: {e}"),
            Err(_) => "panicked".to_owned(),
        };
        supervisor.fail("api-server", &reason);
    }))
}
