//! Configuration loading: defaults, file, `KEEL__…` overrides, validation naming keys,
//! redaction.

use keel::config::{Config, ConfigError, LogFormat, Role};

fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn load(pairs: &[(&str, &str)]) -> Result<Config, ConfigError> {
    Config::load_with_env(None, env(pairs))
}

fn invalid_key(result: Result<Config, ConfigError>) -> String {
    match result {
        Err(ConfigError::Invalid { key, .. }) | Err(ConfigError::Parse { key, .. }) => key,
        Err(other) => panic!("unexpected error {other:?}"),
        Ok(_) => panic!("expected a configuration error"),
    }
}

#[test]
fn defaults_load_and_validate() {
    let c = load(&[]).unwrap();
    assert_eq!(c.deployment_id, "local");
    assert_eq!(c.durable.confirmation_watcher.interval_ms, 250);
    assert_eq!(
        c.monitoring.blockchain_health_collector.interval_seconds,
        60
    );
    assert_eq!(c.durable.sharding.shards, 64);
    assert_eq!(c.chains["local"].chain_id, 31337);
    assert_eq!(c.role, None);
    assert_eq!(c.telemetry.log_format, LogFormat::Auto);
}

#[test]
fn env_overrides_are_case_insensitive_and_typed() {
    let c = load(&[
        ("KEEL__DURABLE__CONFIRMATIONWATCHER__INTERVALMS", "500"),
        ("KEEL__DATABASE__URL", "postgres://keel@db:5432/keel"),
        ("KEEL__ROLE", "indexer"),
        ("KEEL__DEPLOYMENTID", "eu-1"),
        (
            "KEEL__CHAINS__LOCAL__RPCURLS",
            r#"["http://a:1", "http://b:2"]"#,
        ),
        ("KEEL__CHAINS__SEPOLIA__CHAINID", "11155111"),
        (
            "KEEL__CHAINS__SEPOLIA__RPCURLS",
            r#"["https://rpc.example/v2/k"]"#,
        ),
        ("UNRELATED", "ignored"),
    ])
    .unwrap();
    assert_eq!(c.durable.confirmation_watcher.interval_ms, 500);
    assert_eq!(c.database.url, "postgres://keel@db:5432/keel");
    assert_eq!(c.role, Some(Role::Indexer));
    assert_eq!(c.deployment_id, "eu-1");
    assert_eq!(c.chains["local"].rpc_urls, vec!["http://a:1", "http://b:2"]);
    assert_eq!(c.chains["sepolia"].chain_id, 11_155_111);
    assert_eq!(c.chains["sepolia"].confirmations, None);
    assert_eq!(
        c.chains["sepolia"].settings(&c.txq).confirmations,
        2,
        "the ethereum profile applies to a new Sepolia chain"
    );
}

#[test]
fn file_is_merged_between_defaults_and_env() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keel.toml");
    std::fs::write(
        &path,
        "deploymentId = \"from-file\"\n[durable.sharding]\nshards = 8\n",
    )
    .unwrap();
    let c = Config::load_with_env(
        Some(&path),
        env(&[("KEEL__DURABLE__SHARDING__SHARDS", "16")]),
    )
    .unwrap();
    assert_eq!(c.deployment_id, "from-file");
    assert_eq!(c.durable.sharding.shards, 16);
    let missing = Config::load_with_env(Some(&dir.path().join("nope.toml")), env(&[]));
    assert!(missing.is_err());
}

#[test]
fn confirmation_watcher_interval_bounds() {
    for ok in ["50", "250", "60000"] {
        assert!(
            load(&[("KEEL__DURABLE__CONFIRMATIONWATCHER__INTERVALMS", ok)]).is_ok(),
            "{ok}"
        );
    }
    for bad in ["49", "0", "60001"] {
        assert_eq!(
            invalid_key(load(&[(
                "KEEL__DURABLE__CONFIRMATIONWATCHER__INTERVALMS",
                bad
            )])),
            "durable.confirmationWatcher.intervalMs",
            "{bad}"
        );
    }
}

#[test]
fn health_collector_interval_must_divide_a_minute_below_sixty() {
    for ok in ["1", "5", "15", "30", "60", "61", "3600"] {
        assert!(
            load(&[(
                "KEEL__MONITORING__BLOCKCHAINHEALTHCOLLECTOR__INTERVALSECONDS",
                ok
            )])
            .is_ok(),
            "{ok}"
        );
    }
    for bad in ["0", "7", "45", "59"] {
        assert_eq!(
            invalid_key(load(&[(
                "KEEL__MONITORING__BLOCKCHAINHEALTHCOLLECTOR__INTERVALSECONDS",
                bad
            )])),
            "monitoring.blockchainHealthCollector.intervalSeconds",
            "{bad}"
        );
    }
}

#[test]
fn other_rules_name_their_keys() {
    assert_eq!(
        invalid_key(load(&[("KEEL__DURABLE__SHARDING__SHARDS", "0")])),
        "durable.sharding.shards"
    );
    assert_eq!(
        invalid_key(load(&[("KEEL__DURABLE__SHARDING__SHARDS", "many")])),
        "durable.sharding.shards"
    );
    assert_eq!(
        invalid_key(load(&[("KEEL__DATABASE__URL", "mysql://x")])),
        "database.url"
    );
    assert_eq!(
        invalid_key(load(&[("KEEL__DEPLOYMENTID", "has space")])),
        "deploymentId"
    );
    assert_eq!(
        invalid_key(load(&[("KEEL__CHAINS__LOCAL__CHAINID", "0")])),
        "chains.local.chainId"
    );
    assert_eq!(
        invalid_key(load(&[("KEEL__CHAINS__LOCAL__RPCURLS", "[]")])),
        "chains.local.rpcUrls"
    );
    assert_eq!(
        invalid_key(load(&[("KEEL__CHAINS__LOCAL__RPCURLS", r#"["ftp://x"]"#)])),
        "chains.local.rpcUrls"
    );
    assert_eq!(invalid_key(load(&[("KEEL__ROLE", "combined")])), "role");
    assert_eq!(
        invalid_key(load(&[("KEEL__TELEMETRY__METRICSADDRESS", "nowhere")])),
        "telemetry.metricsAddress"
    );
    assert_eq!(
        invalid_key(load(&[("KEEL__DATABASE__TYPO", "1")])),
        "database.typo"
    );
}

#[test]
fn errors_do_not_echo_values() {
    let secret = "postgres-secret-value-123";
    let err = load(&[("KEEL__DURABLE__SHARDING__SHARDS", secret)]).unwrap_err();
    assert!(!err.to_string().contains(secret), "{err}");
    let err = load(&[("KEEL__DATABASE__URL", "mysql://user:hunter2@h/d")]).unwrap_err();
    assert!(!err.to_string().contains("hunter2"), "{err}");
}

#[test]
fn print_redacts_secrets() {
    let c = load(&[
        (
            "KEEL__DATABASE__URL",
            "postgres://keel:hunter2@db:5432/keel",
        ),
        (
            "KEEL__CHAINS__LOCAL__RPCURLS",
            r#"["https://eth.example.com/v2/apikey123", "http://127.0.0.1:8545"]"#,
        ),
        (
            "KEEL__CHAINS__LOCAL__WSURL",
            "wss://eth.example.com/ws/wskey456",
        ),
    ])
    .unwrap();
    let printed = c.redacted_toml();
    assert!(!printed.contains("hunter2"), "{printed}");
    assert!(!printed.contains("apikey123"), "{printed}");
    assert!(!printed.contains("wskey456"), "{printed}");
    assert!(printed.contains("wss://eth.example.com/***"), "{printed}");
    assert!(
        printed.contains("postgres://keel:***@db:5432/keel"),
        "{printed}"
    );
    assert!(printed.contains("https://eth.example.com/***"), "{printed}");
    assert!(printed.contains("http://127.0.0.1:8545"), "{printed}");
    // The printed form is itself a loadable configuration file.
    let reparsed: toml::Table = printed.parse().unwrap();
    assert!(reparsed.contains_key("durable"));
}

#[test]
fn cluster_and_retention_keys_load_override_and_validate() {
    let c = load(&[]).unwrap();
    assert_eq!(c.cluster.refresh_interval_ms, 1000);
    assert_eq!(c.cluster.liveness_window_ms, 5000);
    assert_eq!(c.retention.window_days, 30);
    assert_eq!(c.retention.batch_size, 1000);
    let c = load(&[
        ("KEEL__CLUSTER__REFRESHINTERVALMS", "2000"),
        ("KEEL__RETENTION__WINDOWDAYS", "7"),
    ]);
    // A 2 s refresh needs a liveness window of at least 6 s; the default is 5 s.
    assert_eq!(invalid_key(c), "cluster.livenessWindowMs");
    let c = load(&[
        ("KEEL__CLUSTER__REFRESHINTERVALMS", "200"),
        ("KEEL__Cluster__LivenessWindowMs", "1000"),
        ("KEEL__RETENTION__WINDOWDAYS", "7"),
        ("KEEL__RETENTION__BATCHSIZE", "50"),
    ])
    .unwrap();
    assert_eq!(c.cluster.refresh_interval_ms, 200);
    assert_eq!(c.cluster.liveness_window_ms, 1000);
    assert_eq!(c.retention.window_days, 7);
    assert_eq!(c.retention.batch_size, 50);
    for (var, value, key) in [
        (
            "KEEL__CLUSTER__REFRESHINTERVALMS",
            "10",
            "cluster.refreshIntervalMs",
        ),
        ("KEEL__RETENTION__WINDOWDAYS", "0", "retention.windowDays"),
        ("KEEL__RETENTION__BATCHSIZE", "0", "retention.batchSize"),
        (
            "KEEL__RETENTION__MAXBATCHESPERPASS",
            "0",
            "retention.maxBatchesPerPass",
        ),
        (
            "KEEL__RETENTION__LOCKTIMEOUTMS",
            "1",
            "retention.lockTimeoutMs",
        ),
        ("KEEL__RETENTION__HOURUTC", "24", "retention.hourUtc"),
        (
            "KEEL__RETENTION__STALEREPLICAWINDOWS",
            "1",
            "retention.staleReplicaWindows",
        ),
        ("KEEL__RETENTION__BATCHSIZE", "lots", "retention.batchSize"),
    ] {
        assert_eq!(invalid_key(load(&[(var, value)])), key, "{var}={value}");
    }
}

/// Every validation rule of the configuration: an override breaking it and the key
/// the error must name. Each named key must exist in the configuration (so an operator
/// can set it) and be the key the override set.
const RULES: &[(&str, &str, &str)] = &[
    (
        "KEEL__CHAINS__LOCAL__PROFILE",
        "\"mainnet\"",
        "chains.local.profile",
    ),
    (
        "KEEL__CHAINS__LOCAL__FEES__BASEFEEMULTIPLIERPERCENT",
        "50",
        "chains.local.fees.baseFeeMultiplierPercent",
    ),
    (
        "KEEL__CHAINS__LOCAL__FEES__PRIORITYFEE",
        "\"oracle\"",
        "chains.local.fees.priorityFee",
    ),
    (
        "KEEL__CHAINS__LOCAL__FEES__GASPRICEMULTIPLIERPERCENT",
        "120",
        "chains.local.fees.gasPriceMultiplierPercent",
    ),
    (
        "KEEL__CHAINS__LOCAL__FEES__L1FEEORACLE",
        "\"0x0000000000000000000000000000000000000000\"",
        "chains.local.fees.l1FeeOracle",
    ),
    (
        "KEEL__CHAINS__LOCAL__MAXGASPERTRANSACTION",
        "100",
        "chains.local.maxGasPerTransaction",
    ),
    (
        "KEEL__CHAINS__LOCAL__BUMPPERCENT",
        "9",
        "chains.local.bumpPercent",
    ),
    (
        "KEEL__CHAINS__LOCAL__BUMPAFTERMS",
        "5",
        "chains.local.bumpAfterMs",
    ),
    (
        "KEEL__CHAINS__LOCAL__CONFIRMATIONS",
        "0",
        "chains.local.confirmations",
    ),
    (
        "KEEL__CHAINS__LOCAL__INDEXFINALITYDEPTH",
        "0",
        "chains.local.indexFinalityDepth",
    ),
    ("KEEL__DEPLOYMENTID", "bad id!", "deploymentId"),
    ("KEEL__AA__BUNDLERPOLLMS", "5", "aa.bundlerPollMs"),
    ("KEEL__AA__BENEFICIARY", "nope", "aa.beneficiary"),
    (
        "KEEL__AA__RUNWAYMINIMUMWEI",
        "\"1e18\"",
        "aa.runwayMinimumWei",
    ),
    (
        "KEEL__AA__SPONSORSHIPVALIDITYSECS",
        "1",
        "aa.sponsorshipValiditySecs",
    ),
    (
        "KEEL__AA__MAXOPERATIONSPERBUNDLE",
        "0",
        "aa.maxOperationsPerBundle",
    ),
    ("KEEL__AA__SPONSORKEYENV", "\"\"", "aa.sponsorKeyEnv"),
    ("KEEL__AA__MAXBUNDLEGAS", "99999", "aa.maxBundleGas"),
    ("KEEL__AA__BLOCKGASMARGIN", "100000001", "aa.blockGasMargin"),
    ("KEEL__AA__BASEFEEPERCENT", "1001", "aa.baseFeePercent"),
    (
        "KEEL__AA__MINPRIORITYFEEPERGASWEI",
        "\"1 gwei\"",
        "aa.minPriorityFeePerGasWei",
    ),
    (
        "KEEL__AA__REPLACEMENTFEEINCREASEPERCENT",
        "9",
        "aa.replacementFeeIncreasePercent",
    ),
    (
        "KEEL__AA__SPONSORSHIPMAXGASPEROPERATION",
        "20999",
        "aa.sponsorshipMaxGasPerOperation",
    ),
    ("KEEL__CHAINS__LOCAL__CHAINID", "0", "chains.local.chainId"),
    ("KEEL__CHAINS__LOCAL__RPCURLS", "[]", "chains.local.rpcUrls"),
    (
        "KEEL__CHAINS__LOCAL__RPCURLS",
        "[\"ftp://x\"]",
        "chains.local.rpcUrls",
    ),
    ("KEEL__API__LISTENADDRESS", "nowhere", "api.listenAddress"),
    ("KEEL__API__BODYLIMITBYTES", "10", "api.bodyLimitBytes"),
    (
        "KEEL__INDEX__HISTORYFETCHCONCURRENCY",
        "0",
        "index.historyFetchConcurrency",
    ),
    ("KEEL__INDEX__POLLINTERVALMS", "1", "index.pollIntervalMs"),
    (
        "KEEL__INDEX__SUBSCRIBEDPOLLINTERVALMS",
        "10",
        "index.subscribedPollIntervalMs",
    ),
    (
        "KEEL__CHAINS__LOCAL__WSURL",
        "http://127.0.0.1:8545",
        "chains.local.wsUrl",
    ),
    (
        "KEEL__INDEX__READAFTERWRITEWAITMS",
        "0",
        "index.readAfterWriteWaitMs",
    ),
    (
        "KEEL__INDEX__HISTORY__LEASEMS",
        "10",
        "index.history.leaseMs",
    ),
    (
        "KEEL__INDEX__HISTORY__MAXSPAN",
        "0",
        "index.history.maxSpan",
    ),
    (
        "KEEL__INDEX__HISTORY__RETRIES",
        "1000",
        "index.history.retries",
    ),
    (
        "KEEL__DURABLE__CONFIRMATIONWATCHER__INTERVALMS",
        "10",
        "durable.confirmationWatcher.intervalMs",
    ),
    ("KEEL__DURABLE__LEASEMS", "10", "durable.leaseMs"),
    (
        "KEEL__DURABLE__MAXPAYLOADBYTES",
        "10",
        "durable.maxPayloadBytes",
    ),
    (
        "KEEL__DURABLE__MAXOPENSIGNALS",
        "0",
        "durable.maxOpenSignals",
    ),
    (
        "KEEL__DURABLE__COMMANDMAXATTEMPTS",
        "0",
        "durable.commandMaxAttempts",
    ),
    ("KEEL__DURABLE__STEPATTEMPTS", "0", "durable.stepAttempts"),
    (
        "KEEL__DURABLE__EXECUTOR__CONCURRENCY",
        "0",
        "durable.executor.concurrency",
    ),
    (
        "KEEL__DURABLE__EXECUTOR__POLLINTERVALMS",
        "0",
        "durable.executor.pollIntervalMs",
    ),
    (
        "KEEL__DURABLE__EXECUTOR__RENEWINTERVALMS",
        "30000",
        "durable.executor.renewIntervalMs",
    ),
    (
        "KEEL__DURABLE__SHARDING__SHARDS",
        "0",
        "durable.sharding.shards",
    ),
    (
        "KEEL__DURABLE__SHARDING__SHARDS",
        "70000",
        "durable.sharding.shards",
    ),
    ("KEEL__TXQ__BUMPAFTERMS", "10", "txq.bumpAfterMs"),
    ("KEEL__TXQ__BUMPPERCENT", "5", "txq.bumpPercent"),
    ("KEEL__TXQ__MAXFEECAPGWEI", "0", "txq.maxFeeCapGwei"),
    (
        "KEEL__TXQ__GASLIMITHEADROOMPERCENT",
        "5000",
        "txq.gasLimitHeadroomPercent",
    ),
    ("KEEL__TXQ__SIGNBATCH", "0", "txq.signBatch"),
    (
        "KEEL__TXQ__RECOVERYEVERYTICKS",
        "0",
        "txq.recoveryEveryTicks",
    ),
    (
        "KEEL__TXQ__FUNDINGBROADCASTRETRIES",
        "100000",
        "txq.fundingBroadcastRetries",
    ),
    ("KEEL__TXQ__BROADCASTINFLIGHT", "0", "txq.broadcastInFlight"),
    ("KEEL__TXQ__BROADCASTBATCH", "0", "txq.broadcastBatch"),
    (
        "KEEL__CHAINHEALTH__RETRYINITIALMS",
        "1",
        "chainHealth.retryInitialMs",
    ),
    (
        "KEEL__CHAINHEALTH__RETRYMAXMS",
        "20",
        "chainHealth.retryMaxMs",
    ),
    (
        "KEEL__CHAINHEALTH__PROBEINTERVALMS",
        "1",
        "chainHealth.probeIntervalMs",
    ),
    (
        "KEEL__CHAINHEALTH__FAILURESBEFOREUNSERVED",
        "0",
        "chainHealth.failuresBeforeUnserved",
    ),
    (
        "KEEL__SUPERVISION__RESTARTINITIALMS",
        "1",
        "supervision.restartInitialMs",
    ),
    (
        "KEEL__SUPERVISION__RESTARTMAXMS",
        "20",
        "supervision.restartMaxMs",
    ),
    (
        "KEEL__SUPERVISION__MAXRESTARTS",
        "0",
        "supervision.maxRestarts",
    ),
    (
        "KEEL__CLUSTER__REFRESHINTERVALMS",
        "1",
        "cluster.refreshIntervalMs",
    ),
    (
        "KEEL__CLUSTER__LIVENESSWINDOWMS",
        "100",
        "cluster.livenessWindowMs",
    ),
    ("KEEL__RETENTION__WINDOWDAYS", "0", "retention.windowDays"),
    ("KEEL__RETENTION__BATCHSIZE", "0", "retention.batchSize"),
    (
        "KEEL__RETENTION__MAXBATCHESPERPASS",
        "0",
        "retention.maxBatchesPerPass",
    ),
    (
        "KEEL__RETENTION__LOCKTIMEOUTMS",
        "1",
        "retention.lockTimeoutMs",
    ),
    ("KEEL__RETENTION__HOURUTC", "24", "retention.hourUtc"),
    (
        "KEEL__RETENTION__STALEREPLICAWINDOWS",
        "1",
        "retention.staleReplicaWindows",
    ),
    (
        "KEEL__MONITORING__BLOCKCHAINHEALTHCOLLECTOR__INTERVALSECONDS",
        "7",
        "monitoring.blockchainHealthCollector.intervalSeconds",
    ),
    (
        "KEEL__TELEMETRY__METRICSADDRESS",
        "nowhere",
        "telemetry.metricsAddress",
    ),
    (
        "KEEL__DURABLE__EXECUTOR__CONCURRENCY",
        "\"many\"",
        "durable.executor.concurrency",
    ),
    ("KEEL__TXQ__NOSUCHKEY", "1", "txq.nosuchkey"),
];

#[test]
fn every_validation_error_names_a_key_that_exists() {
    for (var, value, expected) in RULES {
        let key = invalid_key(load(&[(var, value)]));
        assert_eq!(&key, expected, "{var}={value}");
        if var.ends_with("NOSUCHKEY") {
            // An unknown key is named as written, in a section that exists.
            let (section, _) = key.rsplit_once('.').unwrap();
            assert!(keel::config::is_known_key(section), "{key}");
            assert!(!keel::config::is_known_key(&key), "{key}");
            continue;
        }
        assert!(
            keel::config::is_known_key(&key),
            "{var}={value}: the error names `{key}`, which the configuration does not have"
        );
        // The override that broke the rule sets exactly that key (env names are the
        // key's segments, case-insensitively).
        let from_var = var
            .trim_start_matches("KEEL__")
            .replace("__", ".")
            .to_ascii_lowercase();
        assert_eq!(from_var, key.to_ascii_lowercase(), "{var}");
    }
    assert!(!keel::config::is_known_key("durable.executor.segments"));
    assert!(!keel::config::is_known_key("durable.leaseSeconds"));
}

/// The settings the libraries validate themselves: a configuration that bypasses the
/// binary's validation still gets errors whose key, as the binary reports it
/// ([`keel::services::config_key`]), exists in the configuration.
#[tokio::test]
async fn library_validation_errors_map_to_existing_keys() {
    use keel::services::{
        config_key, engine_config, executor_config, history_config, queue_config,
    };
    let base = load(&[]).unwrap();
    let durable_key = |e: keel_durable::DurableError| match e {
        keel_durable::DurableError::Config { key, .. } => config_key(key).to_owned(),
        other => panic!("{other:?}"),
    };
    let mut keys = Vec::new();
    let mut bad = base.clone();
    bad.durable.lease_ms = 10;
    keys.push(durable_key(engine_config(&bad).validate().unwrap_err()));
    let mut bad = base.clone();
    bad.durable.max_payload_bytes = 1;
    keys.push(durable_key(engine_config(&bad).validate().unwrap_err()));
    let mut bad = base.clone();
    bad.durable.step_attempts = 0;
    keys.push(durable_key(engine_config(&bad).validate().unwrap_err()));
    for tweak in [
        |c: &mut keel::config::Config| c.durable.executor.concurrency = 0,
        |c: &mut keel::config::Config| c.durable.executor.poll_interval_ms = 0,
        |c: &mut keel::config::Config| c.durable.executor.renew_interval_ms = 60_000,
    ] {
        let mut bad = base.clone();
        tweak(&mut bad);
        keys.push(durable_key(
            executor_config(&bad)
                .validate(&engine_config(&bad))
                .unwrap_err(),
        ));
    }
    let node = std::sync::Arc::new(
        keel_chain::UpstreamPool::new(
            keel_units::ChainId(31337),
            keel_chain::UpstreamConfig::new(vec!["http://127.0.0.1:1".into()]),
        )
        .unwrap(),
    );
    let db = sqlx::postgres::PgPoolOptions::new()
        .connect_lazy("postgres://postgres@127.0.0.1:5432/unused")
        .unwrap();
    let mut bad = base.clone();
    bad.txq.bump_percent = 5;
    match keel_txq::TxQueue::new(db.clone(), node.clone(), queue_config(&bad, 31337)) {
        Err(keel_txq::TxqError::Config { key, .. }) => keys.push(config_key(key).to_owned()),
        other => panic!("{:?}", other.err()),
    }
    for tweak in [
        |c: &mut keel::config::Config| c.index.history.max_span = 0,
        |c: &mut keel::config::Config| c.index.history.lease_ms = 0,
    ] {
        let mut bad = base.clone();
        tweak(&mut bad);
        match keel_index::HistoryWorker::new(db.clone(), node.clone(), "w", history_config(&bad)) {
            Err(keel_index::IndexError::Config { key, .. }) => {
                keys.push(config_key(key).to_owned())
            }
            other => panic!("{:?}", other.err()),
        }
    }
    assert_eq!(
        keys,
        [
            "durable.leaseMs",
            "durable.maxPayloadBytes",
            "durable.stepAttempts",
            "durable.executor.concurrency",
            "durable.executor.pollIntervalMs",
            "durable.executor.renewIntervalMs",
            "txq.bumpPercent",
            "index.history.maxSpan",
            "index.history.leaseMs",
        ]
    );
    for key in &keys {
        assert!(
            keel::config::is_known_key(key),
            "`{key}` is not a configuration key"
        );
    }
}

/// The new sections' defaults are the libraries' defaults, and overrides reach the
/// library settings.
#[test]
fn executor_queue_and_history_settings_come_from_the_configuration() {
    use keel::services::{engine_config, executor_config, history_config, queue_config};
    let c = load(&[]).unwrap();
    let e = executor_config(&c);
    let d = keel_durable::ExecutorConfig::default();
    assert_eq!(
        (e.concurrency, e.poll_interval, e.renew_interval),
        (d.concurrency, d.poll_interval, d.renew_interval)
    );
    let q = queue_config(&c, 31337);
    let dq = keel_txq::TxQueueConfig::default();
    assert_eq!(q.bump_after, dq.bump_after);
    assert_eq!(q.bump_percent, dq.bump_percent);
    assert_eq!(q.max_fee_cap, dq.max_fee_cap);
    assert_eq!(q.sign_batch, dq.sign_batch);
    assert_eq!(q.gas_limit_headroom_percent, dq.gas_limit_headroom_percent);
    assert_eq!(q.recovery_every_ticks, dq.recovery_every_ticks);
    assert_eq!(q.funding_broadcast_retries, dq.funding_broadcast_retries);
    assert_eq!(q.broadcast_in_flight, dq.broadcast_in_flight);
    assert_eq!(q.broadcast_batch, dq.broadcast_batch);
    let h = history_config(&c);
    let dh = keel_index::HistoryConfig::default();
    assert_eq!(
        (h.lease, h.max_span, h.retries),
        (dh.lease, dh.max_span, dh.retries)
    );
    let en = engine_config(&c);
    let de = keel_durable::EngineConfig::default();
    assert_eq!(
        (
            en.max_payload_bytes,
            en.max_open_signals,
            en.command_max_attempts,
            en.step_attempts
        ),
        (
            de.max_payload_bytes,
            de.max_open_signals,
            de.command_max_attempts,
            de.step_attempts
        )
    );

    let c = load(&[
        ("KEEL__DURABLE__EXECUTOR__CONCURRENCY", "9"),
        ("KEEL__DURABLE__EXECUTOR__POLLINTERVALMS", "250"),
        ("KEEL__DURABLE__EXECUTOR__RENEWINTERVALMS", "5000"),
        ("KEEL__TXQ__BUMPAFTERMS", "0"),
        ("KEEL__TXQ__BUMPPERCENT", "25"),
        ("KEEL__TXQ__MAXFEECAPGWEI", "7"),
        ("KEEL__INDEX__HISTORY__MAXSPAN", "500"),
        ("KEEL__INDEX__HISTORY__LEASEMS", "9000"),
    ])
    .unwrap();
    let e = executor_config(&c);
    assert_eq!(e.concurrency, 9);
    assert_eq!(e.poll_interval, std::time::Duration::from_millis(250));
    assert_eq!(e.renew_interval, Some(std::time::Duration::from_secs(5)));
    let q = queue_config(&c, 31337);
    assert_eq!(q.bump_after, None);
    assert_eq!(q.bump_percent, 25);
    assert_eq!(q.max_fee_cap, 7_000_000_000);
    let h = history_config(&c);
    assert_eq!(h.max_span, 500);
    assert_eq!(h.lease, std::time::Duration::from_secs(9));
}

/// A custody section of chain `local` (issue 19) with one vault, from the environment.
fn custody_env(extra: &[(&'static str, &'static str)]) -> Vec<(&'static str, &'static str)> {
    let mut pairs = vec![
        ("KEEL__CHAINS__LOCAL__CUSTODY__PROVIDER", "fireblocks"),
        (
            "KEEL__CHAINS__LOCAL__CUSTODY__BASEURL",
            "http://127.0.0.1:9",
        ),
        (
            "KEEL__CHAINS__LOCAL__CUSTODY__APIKEY",
            "env:KEEL_FB_API_KEY",
        ),
        (
            "KEEL__CHAINS__LOCAL__CUSTODY__PRIVATEKEY",
            "file:/run/secrets/fb.pem",
        ),
        (
            "KEEL__CHAINS__LOCAL__CUSTODY__VAULTS__TREASURY__VAULTACCOUNTID",
            "\"7\"",
        ),
        (
            "KEEL__CHAINS__LOCAL__CUSTODY__VAULTS__TREASURY__ASSETID",
            "ETH_TEST",
        ),
        (
            "KEEL__CHAINS__LOCAL__CUSTODY__VAULTS__TREASURY__ADDRESS",
            "0x00000000000000000000000000000000000000aa",
        ),
        (
            "KEEL__CUSTODY__WEBHOOKJWKSURL",
            "http://127.0.0.1:9/.well-known/jwks.json",
        ),
    ];
    pairs.extend_from_slice(extra);
    pairs
}

#[test]
fn a_custody_section_loads_from_the_environment_and_prints_only_secret_sources() {
    let c = load(&custody_env(&[(
        "KEEL__CHAINS__LOCAL__CUSTODY__VAULTS__TREASURY__SILENTDROPAFTERSECS",
        "120",
    )]))
    .unwrap();
    let custody = c.chains["local"].custody.as_ref().unwrap();
    assert_eq!(custody.base_url, "http://127.0.0.1:9");
    assert_eq!(custody.api_key.to_string(), "env:KEEL_FB_API_KEY");
    let vault = &custody.vaults["treasury"];
    assert_eq!(vault.vault_account_id, "7");
    assert_eq!(vault.asset_id, "ETH_TEST");
    assert_eq!(vault.silent_drop_after_secs, Some(120));
    assert_eq!(vault.poll_interval_ms, 1000, "defaults apply");
    assert_eq!(
        c.custody.webhook_jwks_url,
        "http://127.0.0.1:9/.well-known/jwks.json"
    );
    let sender = c.template_sender("local", "treasury").unwrap();
    assert_eq!(sender.address, vault.address);
    assert!(matches!(
        c.template_sender("local", "nope"),
        Err(ConfigError::UnknownSender { .. })
    ));
    assert!(matches!(
        c.template_sender("other", "treasury"),
        Err(ConfigError::UnknownSender { .. })
    ));
    // The printed configuration names where the secrets are, never a value (the
    // configuration never holds one).
    let printed = c.redacted_toml();
    assert!(printed.contains("env:KEEL_FB_API_KEY"), "{printed}");
    assert!(printed.contains("file:/run/secrets/fb.pem"), "{printed}");
    // Without a chain's custody section nothing of it is printed.
    assert!(
        !load(&[])
            .unwrap()
            .redacted_toml()
            .contains("chains.local.custody")
    );
}

#[test]
fn custody_errors_name_their_key() {
    let cases: &[(&str, &str, &str)] = &[
        (
            "KEEL__CHAINS__LOCAL__CUSTODY__BASEURL",
            "http://127.0.0.1:9/v1",
            "chains.local.custody.baseUrl",
        ),
        (
            "KEEL__CHAINS__LOCAL__CUSTODY__BASEURL",
            "ftp://x",
            "chains.local.custody.baseUrl",
        ),
        (
            "KEEL__CHAINS__LOCAL__CUSTODY__REQUESTSPERSECOND",
            "0",
            "chains.local.custody.requestsPerSecond",
        ),
        (
            "KEEL__CHAINS__LOCAL__CUSTODY__VAULTS__TREASURY__VAULTACCOUNTID",
            "\"7/../8\"",
            "chains.local.custody.vaults.treasury.vaultAccountId",
        ),
        (
            "KEEL__CHAINS__LOCAL__CUSTODY__VAULTS__TREASURY__ADDRESS",
            "0x0000000000000000000000000000000000000000",
            "chains.local.custody.vaults.treasury.address",
        ),
        (
            "KEEL__CHAINS__LOCAL__CUSTODY__VAULTS__TREASURY__MAXPOLLINTERVALMS",
            "10",
            "chains.local.custody.vaults.treasury.maxPollIntervalMs",
        ),
        (
            "KEEL__CUSTODY__WEBHOOKJWKSURL",
            "keys.example/jwks.json",
            "custody.webhookJwksUrl",
        ),
        (
            "KEEL__CHAINS__LOCAL__CUSTODY__APIKEY",
            "the-key-itself",
            "chains.local.custody.apiKey",
        ),
    ];
    for (var, value, key) in cases {
        let result = load(&custody_env(&[(var, value)]));
        let err = result.as_ref().map(|_| ()).unwrap_err().to_string();
        assert!(
            !err.contains("the-key-itself"),
            "an error never echoes a value: {err}"
        );
        assert_eq!(invalid_key(result), *key, "{var}={value}");
    }
    // An unknown key of a vault is refused, naming it.
    let err = load(&custody_env(&[(
        "KEEL__CHAINS__LOCAL__CUSTODY__VAULTS__TREASURY__APISECRET",
        "x",
    )]))
    .unwrap_err()
    .to_string();
    assert!(err.contains("apisecret"), "{err}");
}

/// `[aa.sponsorship]` policies from a file: the default one and one per organization;
/// errors name the policy's key, and the sponsor key's variable is never printed.
#[test]
fn aa_sponsorship_policies_load_from_a_file_and_errors_name_their_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keel.toml");
    let org = "7d1f3c2a-0000-4000-8000-000000000001";
    std::fs::write(
        &path,
        format!(
            "[aa.sponsorship.default]\nmaxGasPerOperation = 2000000\ndailyBudgetWei = \"1000000000000000000\"\n\
             targets = [{{ target = \"0x00000000000000000000000000000000000000aa\", selectors = [\"0xa9059cbb\"] }}]\n\
             [aa.sponsorship.organizations.\"{org}\"]\naccounts = [\"0x00000000000000000000000000000000000000bb\"]\n\
             maxGasPerOperation = 1000000\ndailyBudgetWei = 5\n"
        ),
    )
    .unwrap();
    let c = Config::load_with_env(Some(&path), env(&[])).unwrap();
    assert!(c.aa.enabled);
    let p = c.aa.policies().unwrap();
    let default = p.default.unwrap();
    assert_eq!(default.max_gas_per_operation, 2_000_000);
    assert_eq!(default.targets.len(), 1);
    let own = &p.organizations[&org.parse::<uuid::Uuid>().unwrap()];
    assert_eq!(own.daily_budget.get(), alloy::primitives::U256::from(5));
    assert!(matches!(
        own.accounts,
        keel_aa::policy::AccountRule::Only(_)
    ));

    std::fs::write(
        &path,
        "[aa.sponsorship.organizations.acme]\nmaxGasPerOperation = 1\ndailyBudgetWei = \"1\"\n",
    )
    .unwrap();
    let key = invalid_key(Config::load_with_env(Some(&path), env(&[])));
    assert_eq!(key, "aa.sponsorship.organizations.acme");
    std::fs::write(
        &path,
        "[aa.sponsorship.default]\nmaxGasPerOperation = 1\ndailyBudgetWei = \"1\"\n\
         targets = [{ target = \"0x01\" }]\n",
    )
    .unwrap();
    let key = invalid_key(Config::load_with_env(Some(&path), env(&[])));
    assert_eq!(key, "aa.sponsorship.default.targets");
    // A sponsor key variable holding no key is refused naming the variable only.
    let mut settings = keel::aa::AaSettings {
        sponsor_key_env: "KEEL_TEST_SPONSOR_KEY_CONFIG".to_owned(),
        ..Default::default()
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    assert!(
        rt.block_on(keel::aa::sponsor_key(&settings))
            .unwrap()
            .is_none()
    );
    settings.sponsor_key_env = "PATH".to_owned();
    let e = rt
        .block_on(keel::aa::sponsor_key(&settings))
        .unwrap_err()
        .to_string();
    assert!(e.contains("PATH") && !e.contains("/usr"), "{e}");
}

#[test]
fn aa_validation_mode_and_stake_minimums_load_and_validate() {
    use keel_aa::validation::ValidationMode;
    let c = load(&[]).unwrap();
    assert_eq!(c.aa.validation, ValidationMode::Tracing);
    let v = c.aa.validation_settings();
    assert_eq!(v.mode, ValidationMode::Tracing);
    assert_eq!(
        v.min_stake_wei,
        alloy::primitives::U256::from(10u64).pow(alloy::primitives::U256::from(18u64))
    );
    assert_eq!(v.min_unstake_delay_secs, 86_400);

    let c = load(&[
        ("KEEL__AA__VALIDATION", "unsafe"),
        ("KEEL__AA__MINSTAKEWEI", "5"),
        ("KEEL__AA__MINUNSTAKEDELAYSECS", "60"),
        ("KEEL__AA__DEBUGMETHODS", "true"),
    ])
    .unwrap();
    let v = c.aa.validation_settings();
    assert_eq!(v.mode, ValidationMode::Unsafe);
    assert_eq!(v.min_stake_wei, alloy::primitives::U256::from(5u64));
    assert_eq!(v.min_unstake_delay_secs, 60);
    assert!(v.debug_methods);
    assert!(!load(&[]).unwrap().aa.validation_settings().debug_methods);

    assert!(load(&[("KEEL__AA__VALIDATION", "sometimes")]).is_err());
    assert_eq!(
        invalid_key(load(&[("KEEL__AA__MINSTAKEWEI", "-1")])),
        "aa.minStakeWei"
    );
}

/// One signer configuration for every key (issue 34 §3): the shorthands `operator.keyEnv`
/// and `aa.sponsorKeyEnv` are `env` signers; a signer table loads from a file or the
/// environment; errors name their key; a keystore builds into a handle of its key; an
/// unusable key is refused naming its source, never a secret.
#[tokio::test]
async fn signer_tables_load_and_build() {
    use keel::signer::{SignerConfig, SignerLoadError};
    let c = load(&[]).unwrap();
    assert_eq!(
        c.operator.signer_config(),
        (
            SignerConfig::Env {
                var: "KEEL_OPERATOR_KEY".to_owned()
            },
            "operator.keyEnv"
        )
    );
    assert_eq!(
        c.aa.sponsor_signer_config(),
        (
            SignerConfig::Env {
                var: "KEEL_SPONSOR_KEY".to_owned()
            },
            "aa.sponsorKeyEnv"
        )
    );
    let c = load(&[
        ("KEEL__OPERATOR__SIGNER__KIND", "keystore"),
        ("KEEL__OPERATOR__SIGNER__PATH", "/etc/keel/operator.json"),
        ("KEEL__OPERATOR__SIGNER__PASSWORDENV", "KEEL_PW"),
        ("KEEL__AA__SPONSORSIGNER__KIND", "env"),
        ("KEEL__AA__SPONSORSIGNER__VAR", "KEEL_OTHER_SPONSOR"),
    ])
    .unwrap();
    let keystore = SignerConfig::Keystore {
        path: "/etc/keel/operator.json".into(),
        password_env: "KEEL_PW".to_owned(),
    };
    assert_eq!(
        c.operator.signer_config(),
        (keystore.clone(), "operator.signer")
    );
    assert_eq!(
        c.aa.sponsor_signer_config().0,
        SignerConfig::Env {
            var: "KEEL_OTHER_SPONSOR".to_owned()
        }
    );
    // Printed and read back unchanged.
    let printed = c.redacted_toml();
    assert!(printed.contains("kind = \"keystore\""), "{printed}");
    // Rules name their keys.
    let key = invalid_key(load(&[
        ("KEEL__OPERATOR__SIGNER__KIND", "env"),
        ("KEEL__OPERATOR__SIGNER__VAR", "\"\""),
    ]));
    assert_eq!(key, "operator.signer.var");
    let key = invalid_key(load(&[
        ("KEEL__AA__SPONSORSIGNER__KIND", "keystore"),
        ("KEEL__AA__SPONSORSIGNER__PATH", "/k.json"),
        ("KEEL__AA__SPONSORSIGNER__PASSWORDENV", "\"\""),
    ]));
    assert_eq!(key, "aa.sponsorSigner.passwordEnv");
    assert_eq!(
        invalid_key(load(&[("KEEL__OPERATOR__KEYENV", "\"\"")])),
        "operator.keyEnv"
    );
    let key = invalid_key(load(&[("KEEL__OPERATOR__SIGNER__KIND", "vault")]));
    assert!(key.starts_with("operator.signer"), "{key}");
    for key in [
        "operator.signer",
        "operator.signer.kind",
        "operator.signer.passwordEnv",
        "aa.sponsorSigner.var",
    ] {
        assert!(keel::config::is_known_key(key), "{key}");
    }

    // A keystore (its password in a variable that is set: PATH's value) builds into a
    // handle of its key; a wrong password or a missing password variable is refused.
    let dir = tempfile::tempdir().unwrap();
    let key = alloy::signers::local::PrivateKeySigner::random();
    let password = std::env::var("PATH").unwrap();
    alloy::signers::local::PrivateKeySigner::encrypt_keystore(
        dir.path(),
        &mut rand::thread_rng(),
        key.to_bytes(),
        &password,
        Some("operator.json"),
    )
    .unwrap();
    let path = dir.path().join("operator.json");
    let built = SignerConfig::Keystore {
        path: path.clone(),
        password_env: "PATH".to_owned(),
    }
    .build("operator.signer")
    .await
    .unwrap()
    .unwrap();
    assert_eq!(built.address(), key.address());
    assert_eq!(built.kind(), "keystore");
    let e = SignerConfig::Keystore {
        path: path.clone(),
        password_env: "HOME".to_owned(),
    }
    .build("operator.signer")
    .await
    .unwrap_err();
    assert!(matches!(e, SignerLoadError::Keystore { .. }), "{e}");
    let text = e.to_string();
    assert!(
        text.contains("operator.signer.path") && text.contains("operator.json"),
        "{text}"
    );
    let e = SignerConfig::Keystore {
        path,
        password_env: "KEEL_TEST_NO_SUCH_PASSWORD_VARIABLE".to_owned(),
    }
    .build("operator.signer")
    .await
    .unwrap_err();
    assert!(matches!(e, SignerLoadError::MissingPassword { .. }), "{e}");
    // An env key: unset is no key; a value that is no key is refused naming the
    // variable, never its value.
    let unset = SignerConfig::Env {
        var: "KEEL_TEST_NO_SUCH_KEY_VARIABLE".to_owned(),
    };
    assert!(unset.build("operator.keyEnv").await.unwrap().is_none());
    let e = SignerConfig::Env {
        var: "PATH".to_owned(),
    }
    .build("operator.keyEnv")
    .await
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("PATH") && e.contains("operator.keyEnv") && !e.contains(&password),
        "{e}"
    );
}

/// `[chains.<name>.senders.<sender>]` (issue 35 §2) from the environment: each pool
/// sender is a signer table of any kind; a bad name or an incomplete table is refused
/// naming the key.
#[test]
fn pool_senders_load_from_the_environment_and_bad_ones_name_their_key() {
    let c = load(&[
        ("KEEL__CHAINS__LOCAL__SENDERS__S1__KIND", "env"),
        ("KEEL__CHAINS__LOCAL__SENDERS__S1__VAR", "KEEL_S1_KEY"),
        ("KEEL__CHAINS__LOCAL__SENDERS__KMS-2__KIND", "awsKms"),
        ("KEEL__CHAINS__LOCAL__SENDERS__KMS-2__KEYID", "alias/s2"),
        ("KEEL__CHAINS__LOCAL__SENDERS__KMS-2__REGION", "eu-west-1"),
    ])
    .unwrap();
    let senders = &c.chains["local"].senders;
    assert_eq!(
        senders.keys().collect::<Vec<_>>(),
        ["kms-2", "s1"],
        "{senders:?}"
    );
    assert_eq!(senders["s1"].kind(), "env");
    assert_eq!(senders["kms-2"].kind(), "awsKms");
    let key = invalid_key(load(&[
        ("KEEL__CHAINS__LOCAL__SENDERS__S1__KIND", "env"),
        ("KEEL__CHAINS__LOCAL__SENDERS__S1__VAR", ""),
    ]));
    assert_eq!(key, "chains.local.senders.s1.var");
    let key = invalid_key(load(&[
        ("KEEL__CHAINS__LOCAL__SENDERS__S1__KIND", "awsKms"),
        ("KEEL__CHAINS__LOCAL__SENDERS__S1__KEYID", "alias/x"),
        ("KEEL__CHAINS__LOCAL__SENDERS__S1__REGION", " "),
    ]));
    assert_eq!(key, "chains.local.senders.s1.region");
}

/// Chain profiles (issue 35 §3) reach the queue and the indexer: a chain's profile by
/// chain id or by name, its `[chains.<name>.fees]` and limits from the environment, the
/// `[txq]` bump policy where a chain sets none.
#[test]
fn chain_profiles_and_their_overrides_reach_the_queue() {
    use keel::services::{chain_settings, queue_config};
    use keel_txq::{FeeModel, Finality, L1DataFee, PriorityFee};
    let c = load(&[
        ("KEEL__CHAINS__LOCAL__PROFILE", "anvil"),
        (
            "KEEL__CHAINS__LOCAL__RPCURLS",
            r#"["http://127.0.0.1:8545"]"#,
        ),
        ("KEEL__CHAINS__BASE__CHAINID", "8453"),
        (
            "KEEL__CHAINS__BASE__RPCURLS",
            r#"["https://base.example/k"]"#,
        ),
        ("KEEL__CHAINS__BASE__FEES__L1FEEMULTIPLIERPERCENT", "200"),
        ("KEEL__CHAINS__BASE__INDEXFINALITYDEPTH", "30"),
        ("KEEL__CHAINS__MAIN__CHAINID", "1"),
        (
            "KEEL__CHAINS__MAIN__RPCURLS",
            r#"["https://eth.example/k"]"#,
        ),
        ("KEEL__CHAINS__MAIN__BUMPPERCENT", "20"),
        ("KEEL__CHAINS__MAIN__FEES__PRIORITYFEE", "2000000000"),
        ("KEEL__CHAINS__BSC__CHAINID", "56"),
        ("KEEL__CHAINS__BSC__RPCURLS", r#"["https://bsc.example"]"#),
        ("KEEL__CHAINS__BSC__FEES__MODEL", "legacy"),
        ("KEEL__CHAINS__BSC__SUBSCRIBE", "false"),
        ("KEEL__TXQ__BUMPPERCENT", "15"),
    ])
    .unwrap();
    let local = queue_config(&c, 31337);
    assert_eq!(local.finality, Finality::Depth(0));
    assert_eq!(local.fee_model, FeeModel::default());
    assert_eq!(local.bump_percent, 15, "[txq] where the chain sets none");
    assert_eq!(
        chain_settings(&c, 31337).ws_url.as_deref(),
        Some("ws://127.0.0.1:8545"),
        "anvil serves eth_subscribe on its RPC port"
    );

    let base = queue_config(&c, 8453);
    assert_eq!(
        base.l1_data_fee,
        Some(L1DataFee {
            oracle: L1DataFee::OP_STACK_ORACLE,
            multiplier_percent: 200
        })
    );
    assert_eq!(
        base.finality,
        Finality::Finalized {
            fallback_depth: 450
        }
    );
    assert_eq!(chain_settings(&c, 8453).index_finality_depth, Some(30));
    assert_eq!(chain_settings(&c, 8453).ws_url, None);

    let main = queue_config(&c, 1);
    assert_eq!(main.max_gas_per_transaction, Some(16_777_216));
    assert_eq!(main.confirmations, 2);
    assert_eq!(main.bump_percent, 20);
    assert!(matches!(
        main.fee_model,
        FeeModel::Eip1559 {
            priority_fee: PriorityFee::Fixed(2_000_000_000),
            base_fee_multiplier_percent: 200,
            ..
        }
    ));

    let bsc = queue_config(&c, 56);
    assert_eq!(
        bsc.fee_model,
        FeeModel::Legacy {
            gas_price_multiplier_percent: 110
        }
    );
    assert_eq!(bsc.max_gas_per_transaction, None);
    assert_eq!(chain_settings(&c, 56).ws_url, None);

    // What `keel config show` prints loads back to the same chains.
    let printed = c.redacted_toml();
    assert!(printed.contains("profile = \"anvil\""), "{printed}");
    assert!(printed.contains("model = \"legacy\""), "{printed}");
}
