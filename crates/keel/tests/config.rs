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
    assert_eq!(
        c.chains["sepolia"].confirmations, 1,
        "default applies to new chains"
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
    ])
    .unwrap();
    let printed = c.redacted_toml();
    assert!(!printed.contains("hunter2"), "{printed}");
    assert!(!printed.contains("apikey123"), "{printed}");
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
