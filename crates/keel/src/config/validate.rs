//! The rules types alone do not express, each error naming its key.

use super::{ChainCustodyConfig, Config, ConfigError, invalid};
use std::net::SocketAddr;

/// The rules of `[chains.<chain>.custody]` and its vaults (keys named in full).
pub(super) fn validate_custody(chain: &str, c: &ChainCustodyConfig) -> Result<(), ConfigError> {
    let key = |k: &str| format!("chains.{chain}.custody.{k}");
    let origin = c
        .base_url
        .strip_prefix("https://")
        .or_else(|| c.base_url.strip_prefix("http://"));
    if !origin.is_some_and(|rest| !rest.is_empty() && !rest.trim_end_matches('/').contains('/')) {
        return Err(invalid(
            &key("baseUrl"),
            "must be an http:// or https:// origin without a path",
        ));
    }
    if !(1..=10_000).contains(&c.requests_per_second) {
        return Err(invalid(
            &key("requestsPerSecond"),
            "must be within 1..=10000",
        ));
    }
    if !(1..=10_000).contains(&c.burst) {
        return Err(invalid(&key("burst"), "must be within 1..=10000"));
    }
    if !(100..=600_000).contains(&c.request_timeout_ms) {
        return Err(invalid(
            &key("requestTimeoutMs"),
            "must be within 100..=600000 milliseconds",
        ));
    }
    let mut addresses = std::collections::BTreeSet::new();
    for (name, v) in &c.vaults {
        let vkey = |k: &str| format!("chains.{chain}.custody.vaults.{name}.{k}");
        if !keel_workflows::tenancy::valid_template_id(name) {
            return Err(invalid(
                &format!("chains.{chain}.custody.vaults.{name}"),
                "a vault's name must match ^[a-z0-9][a-z0-9._-]{0,63}$",
            ));
        }
        if keel_custody::VaultAccountId::new(v.vault_account_id.clone()).is_err() {
            return Err(invalid(
                &vkey("vaultAccountId"),
                "must be 1..255 characters of [A-Za-z0-9._:-]",
            ));
        }
        if keel_custody::AssetId::new(v.asset_id.clone()).is_err() {
            return Err(invalid(
                &vkey("assetId"),
                "must be 1..255 characters of [A-Za-z0-9._:-]",
            ));
        }
        if v.address.is_zero() {
            return Err(invalid(&vkey("address"), "must not be the zero address"));
        }
        if !addresses.insert(v.address) {
            return Err(invalid(&vkey("address"), "two vaults share an address"));
        }
        if v.poll_interval_ms == 0 || v.poll_interval_ms > 3_600_000 {
            return Err(invalid(
                &vkey("pollIntervalMs"),
                "must be within 1..=3600000 milliseconds",
            ));
        }
        if v.max_poll_interval_ms < v.poll_interval_ms || v.max_poll_interval_ms > 3_600_000 {
            return Err(invalid(
                &vkey("maxPollIntervalMs"),
                "must be at least pollIntervalMs and at most 3600000 milliseconds",
            ));
        }
        if v.poll_budget_secs == 0 {
            return Err(invalid(&vkey("pollBudgetSecs"), "must be at least 1"));
        }
        if v.clock_skew_secs > 3_600 {
            return Err(invalid(&vkey("clockSkewSecs"), "must be within 0..=3600"));
        }
    }
    Ok(())
}

impl Config {
    /// Checks every rule that types alone do not express.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let id_ok = !self.deployment_id.is_empty()
            && self.deployment_id.len() <= 64
            && self
                .deployment_id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
        if !id_ok {
            return Err(invalid(
                "deploymentId",
                "must be 1..=64 characters of [A-Za-z0-9._-]",
            ));
        }
        self.database.validate().map_err(|e| match e {
            keel_store::StoreError::Config { key, reason } => invalid(key, reason),
            _ => invalid("database", "invalid"),
        })?;
        for (name, chain) in &self.chains {
            let key = |k: &str| format!("chains.{name}.{k}");
            if chain.chain_id == 0 {
                return Err(invalid(&key("chainId"), "must be greater than 0 (EIP-155)"));
            }
            if chain.rpc_urls.is_empty() {
                return Err(invalid(&key("rpcUrls"), "needs at least one URL"));
            }
            for url in &chain.rpc_urls {
                let ok = ["http://", "https://", "ws://", "wss://"]
                    .iter()
                    .any(|s| url.starts_with(s) && url.len() > s.len());
                if !ok {
                    return Err(invalid(
                        &key("rpcUrls"),
                        "each URL must be http(s):// or ws(s)://",
                    ));
                }
            }
            if let Some(ws) = &chain.ws_url {
                let ok = ["ws://", "wss://"]
                    .iter()
                    .any(|s| ws.starts_with(s) && ws.len() > s.len());
                if !ok {
                    return Err(invalid(&key("wsUrl"), "must be ws:// or wss://"));
                }
            }
        }
        for (name, chain) in &self.chains {
            chain.validate_profile(name)?;
            if let Some(custody) = &chain.custody {
                validate_custody(name, custody)?;
            }
            for (sender, signer) in &chain.senders {
                let key = format!("chains.{name}.senders.{sender}");
                if !keel_workflows::tenancy::valid_template_id(sender) {
                    return Err(invalid(
                        &key,
                        "a sender's name must match ^[a-z0-9][a-z0-9._-]{0,63}$",
                    ));
                }
                signer.validate(&key)?;
            }
        }
        let jwks = &self.custody.webhook_jwks_url;
        if !(jwks.is_empty() || jwks.starts_with("http://") || jwks.starts_with("https://")) {
            return Err(invalid(
                "custody.webhookJwksUrl",
                "must be an http:// or https:// URL, or empty to disable",
            ));
        }
        let mut ids: Vec<u64> = self.chains.values().map(|c| c.chain_id).collect();
        ids.sort_unstable();
        if ids.windows(2).any(|w| w[0] == w[1]) {
            return Err(invalid("chains", "two chains share a chainId"));
        }
        if self.api.listen_address.parse::<SocketAddr>().is_err() {
            return Err(invalid("api.listenAddress", "must be ip:port"));
        }
        if !(1024..=16_777_216).contains(&self.api.body_limit_bytes) {
            return Err(invalid(
                "api.bodyLimitBytes",
                "must be within 1024..=16777216",
            ));
        }
        if self.api.status.pending_threshold_secs > 86_400 {
            return Err(invalid(
                "api.status.pendingThresholdSecs",
                "must be within 0..=86400",
            ));
        }
        if !(1..=2_592_000).contains(&self.api.status.no_mutation_threshold_secs) {
            return Err(invalid(
                "api.status.noMutationThresholdSecs",
                "must be within 1..=2592000",
            ));
        }
        let limits = &self.api.rate_limit;
        for (key, value, min) in [
            (
                "api.rateLimit.perKeyRequestsPerSecond",
                limits.per_key_requests_per_second,
                0,
            ),
            ("api.rateLimit.perKeyBurst", limits.per_key_burst, 1),
            (
                "api.rateLimit.perOrganizationRequestsPerSecond",
                limits.per_organization_requests_per_second,
                0,
            ),
            (
                "api.rateLimit.perOrganizationBurst",
                limits.per_organization_burst,
                1,
            ),
        ] {
            if !(min..=super::api::MAX_RATE_LIMIT).contains(&value) {
                return Err(invalid(
                    key,
                    &format!("must be within {min}..={}", super::api::MAX_RATE_LIMIT),
                ));
            }
        }
        if !(1..=64).contains(&self.index.history_fetch_concurrency) {
            return Err(invalid(
                "index.historyFetchConcurrency",
                "must be within 1..=64",
            ));
        }
        if !(100..=600_000).contains(&self.index.subscribed_poll_interval_ms) {
            return Err(invalid(
                "index.subscribedPollIntervalMs",
                "must be within 100..=600000 milliseconds",
            ));
        }
        if !(50..=60_000).contains(&self.index.poll_interval_ms) {
            return Err(invalid(
                "index.pollIntervalMs",
                "must be within 50..=60000 milliseconds",
            ));
        }
        if self.index.read_after_write_wait_ms == 0 {
            return Err(invalid("index.readAfterWriteWaitMs", "must be positive"));
        }
        let interval = self.durable.confirmation_watcher.interval_ms;
        if !(50..=60_000).contains(&interval) {
            return Err(invalid(
                "durable.confirmationWatcher.intervalMs",
                "must be within 50..=60000 milliseconds",
            ));
        }
        if !(1_000..=600_000).contains(&self.durable.lease_ms) {
            return Err(invalid(
                "durable.leaseMs",
                "must be within 1000..=600000 milliseconds",
            ));
        }
        let d = &self.durable;
        if !(1_024..=16_777_216).contains(&d.max_payload_bytes) {
            return Err(invalid(
                "durable.maxPayloadBytes",
                "must be within 1024..=16777216",
            ));
        }
        if !(1..=100_000).contains(&d.max_open_signals) {
            return Err(invalid(
                "durable.maxOpenSignals",
                "must be within 1..=100000",
            ));
        }
        if !(1..=1_000).contains(&d.command_max_attempts) {
            return Err(invalid(
                "durable.commandMaxAttempts",
                "must be within 1..=1000",
            ));
        }
        if !(1..=100).contains(&d.step_attempts) {
            return Err(invalid("durable.stepAttempts", "must be within 1..=100"));
        }
        let e = &d.executor;
        if !(1..=1_024).contains(&e.concurrency) {
            return Err(invalid(
                "durable.executor.concurrency",
                "must be within 1..=1024",
            ));
        }
        if !(10..=60_000).contains(&e.poll_interval_ms) {
            return Err(invalid(
                "durable.executor.pollIntervalMs",
                "must be within 10..=60000 milliseconds",
            ));
        }
        if e.renew_interval_ms != 0
            && (e.renew_interval_ms < 100 || e.renew_interval_ms >= d.lease_ms)
        {
            return Err(invalid(
                "durable.executor.renewIntervalMs",
                "must be 0 (a third of durable.leaseMs), or at least 100 and below durable.leaseMs",
            ));
        }
        let q = &self.txq;
        if q.bump_after_ms != 0 && !(1_000..=86_400_000).contains(&q.bump_after_ms) {
            return Err(invalid(
                "txq.bumpAfterMs",
                "must be 0 (no fee bumping) or within 1000..=86400000 milliseconds",
            ));
        }
        if !(10..=1_000).contains(&q.bump_percent) {
            return Err(invalid(
                "txq.bumpPercent",
                "must be within 10..=1000 (geth and reth refuse replacements below +10 %)",
            ));
        }
        if !(1..=10_000_000).contains(&q.max_fee_cap_gwei) {
            return Err(invalid(
                "txq.maxFeeCapGwei",
                "must be within 1..=10000000 gwei",
            ));
        }
        if q.gas_limit_headroom_percent > 1_000 {
            return Err(invalid(
                "txq.gasLimitHeadroomPercent",
                "must be within 0..=1000",
            ));
        }
        if !(1..=100_000).contains(&q.sign_batch) {
            return Err(invalid("txq.signBatch", "must be within 1..=100000"));
        }
        if !(1..=1_000_000).contains(&q.recovery_every_ticks) {
            return Err(invalid(
                "txq.recoveryEveryTicks",
                "must be within 1..=1000000",
            ));
        }
        if q.funding_broadcast_retries > 10_000 {
            return Err(invalid(
                "txq.fundingBroadcastRetries",
                "must be within 0..=10000",
            ));
        }
        if !(1..=4_096).contains(&q.broadcast_in_flight) {
            return Err(invalid("txq.broadcastInFlight", "must be within 1..=4096"));
        }
        if !(1..=1_024).contains(&q.broadcast_batch) {
            return Err(invalid("txq.broadcastBatch", "must be within 1..=1024"));
        }
        let h = &self.index.history;
        if !(1_000..=3_600_000).contains(&h.lease_ms) {
            return Err(invalid(
                "index.history.leaseMs",
                "must be within 1000..=3600000 milliseconds",
            ));
        }
        if !(1..=1_000_000).contains(&h.max_span) {
            return Err(invalid(
                "index.history.maxSpan",
                "must be within 1..=1000000 blocks",
            ));
        }
        if h.retries > 100 {
            return Err(invalid("index.history.retries", "must be within 0..=100"));
        }
        let c = &self.chain_health;
        if !(10..=600_000).contains(&c.retry_initial_ms) {
            return Err(invalid(
                "chainHealth.retryInitialMs",
                "must be within 10..=600000 milliseconds",
            ));
        }
        if c.retry_max_ms < c.retry_initial_ms || c.retry_max_ms > 600_000 {
            return Err(invalid(
                "chainHealth.retryMaxMs",
                "must be at least chainHealth.retryInitialMs and at most 600000 milliseconds",
            ));
        }
        if !(10..=600_000).contains(&c.probe_interval_ms) {
            return Err(invalid(
                "chainHealth.probeIntervalMs",
                "must be within 10..=600000 milliseconds",
            ));
        }
        if !(1..=1_000).contains(&c.failures_before_unserved) {
            return Err(invalid(
                "chainHealth.failuresBeforeUnserved",
                "must be within 1..=1000",
            ));
        }
        let v = &self.supervision;
        if !(10..=600_000).contains(&v.restart_initial_ms) {
            return Err(invalid(
                "supervision.restartInitialMs",
                "must be within 10..=600000 milliseconds",
            ));
        }
        if v.restart_max_ms < v.restart_initial_ms || v.restart_max_ms > 600_000 {
            return Err(invalid(
                "supervision.restartMaxMs",
                "must be at least supervision.restartInitialMs and at most 600000 milliseconds",
            ));
        }
        if !(1..=1_000).contains(&v.max_restarts) {
            return Err(invalid(
                "supervision.maxRestarts",
                "must be within 1..=1000",
            ));
        }
        if self.durable.sharding.shards == 0 {
            return Err(invalid("durable.sharding.shards", "must be greater than 0"));
        }
        if self.durable.sharding.shards > 65_536 {
            return Err(invalid("durable.sharding.shards", "must be at most 65536"));
        }
        let refresh = self.cluster.refresh_interval_ms;
        if !(50..=60_000).contains(&refresh) {
            return Err(invalid(
                "cluster.refreshIntervalMs",
                "must be within 50..=60000 milliseconds",
            ));
        }
        if self.cluster.liveness_window_ms < refresh.saturating_mul(3) {
            return Err(invalid(
                "cluster.livenessWindowMs",
                "must be at least three times cluster.refreshIntervalMs",
            ));
        }
        if self.cluster.host.len() > 255 {
            return Err(invalid("cluster.host", "must be at most 255 bytes"));
        }
        let o = &self.organizations;
        if !(1..=86_400).contains(&o.sweep_interval_seconds) {
            return Err(invalid(
                "organizations.sweepIntervalSeconds",
                "must be within 1..=86400",
            ));
        }
        if o.abandon_after_seconds == 0 {
            return Err(invalid(
                "organizations.abandonAfterSeconds",
                "must be at least 1",
            ));
        }
        let r = &self.retention;
        if r.window_days == 0 || r.window_days > 36_500 {
            return Err(invalid(
                "retention.windowDays",
                "must be within 1..=36500 days",
            ));
        }
        if !(1..=100_000).contains(&r.batch_size) {
            return Err(invalid("retention.batchSize", "must be within 1..=100000"));
        }
        if r.max_batches_per_pass == 0 {
            return Err(invalid("retention.maxBatchesPerPass", "must be at least 1"));
        }
        if !(10..=60_000).contains(&r.lock_timeout_ms) {
            return Err(invalid(
                "retention.lockTimeoutMs",
                "must be within 10..=60000 milliseconds",
            ));
        }
        if r.hour_utc > 23 {
            return Err(invalid("retention.hourUtc", "must be within 0..=23"));
        }
        if r.stale_replica_windows < 2 {
            return Err(invalid(
                "retention.staleReplicaWindows",
                "must be at least 2",
            ));
        }
        let secs = self.monitoring.blockchain_health_collector.interval_seconds;
        if secs == 0 || (secs < 60 && 60 % secs != 0) {
            return Err(invalid(
                "monitoring.blockchainHealthCollector.intervalSeconds",
                "must be at least 60, or a divisor of 60 below it",
            ));
        }
        match &self.operator.signer {
            Some(signer) => signer.validate("operator.signer")?,
            None if self.operator.key_env.is_empty() => {
                return Err(invalid(
                    "operator.keyEnv",
                    "must name an environment variable",
                ));
            }
            None => {}
        }
        self.aa.validate()?;
        self.telemetry.metrics_socket()?;
        let otlp = &self.telemetry.otlp.endpoint;
        if !(otlp.is_empty() || otlp.starts_with("http://") || otlp.starts_with("https://")) {
            return Err(invalid(
                "telemetry.otlp.endpoint",
                "must be an http:// or https:// URL, or empty to disable",
            ));
        }
        Ok(())
    }
}
