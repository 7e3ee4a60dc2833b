//! Helpers shared by the binary's process tests: the `keel` command, a free port, the
//! stack environment, the full stack of processes ([`stack::Procs`]), the OpenAPI
//! answer check ([`doc_check::DocCheck`], keel-api's) and the OTLP receiver.

#[path = "../../../../keel-api/tests/it/doc_check.rs"]
pub(crate) mod doc_check;
pub(crate) mod otlp;
pub(crate) mod stack;

use std::process::Command;

/// The `keel` binary, with every `KEEL*` variable of the test's environment removed.
pub(crate) fn keel() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_keel"));
    for (k, _) in std::env::vars() {
        if k.starts_with("KEEL") {
            cmd.env_remove(k);
        }
    }
    cmd
}

/// A TCP port of 127.0.0.1 that was free a moment ago.
pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The environment every process of a test stack shares: the database at `db_url`,
/// chain `local` (`chain_id`, one RPC URL), the api on 127.0.0.1:`api_port`, JSON logs,
/// no metrics listener, 4 shards, a 3 s lease and fast cluster, confirmation and index
/// intervals (100-1000 ms), and `operator_key` (hex) as operator and deployer key. A
/// test's `KEEL_AA_ARTIFACTS` / `KEEL_TOOLS` are passed on (`keel()` clears `KEEL*`; a
/// worktree without `tools/node_modules` names them).
#[allow(dead_code)]
pub(crate) fn stack_env(
    db_url: &str,
    chain_id: u64,
    rpc_url: &str,
    api_port: u16,
    operator_key: &str,
) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = [
        ("KEEL__DATABASE__URL", db_url.to_owned()),
        ("KEEL__CHAINS__LOCAL__CHAINID", chain_id.to_string()),
        ("KEEL__CHAINS__LOCAL__RPCURLS", format!("[\"{rpc_url}\"]")),
        ("KEEL__API__LISTENADDRESS", format!("127.0.0.1:{api_port}")),
        ("KEEL__TELEMETRY__METRICSADDRESS", String::new()),
        ("KEEL__TELEMETRY__LOGFORMAT", "json".to_owned()),
        ("KEEL__DURABLE__SHARDING__SHARDS", "4".to_owned()),
        ("KEEL__DURABLE__LEASEMS", "3000".to_owned()),
        (
            "KEEL__DURABLE__CONFIRMATIONWATCHER__INTERVALMS",
            "100".to_owned(),
        ),
        ("KEEL__CLUSTER__REFRESHINTERVALMS", "200".to_owned()),
        ("KEEL__CLUSTER__LIVENESSWINDOWMS", "1000".to_owned()),
        ("KEEL__INDEX__POLLINTERVALMS", "100".to_owned()),
        ("KEEL_OPERATOR_KEY", operator_key.to_owned()),
        ("KEEL_DEPLOYER_KEY", operator_key.to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    for var in ["KEEL_AA_ARTIFACTS", "KEEL_TOOLS"] {
        if let Ok(v) = std::env::var(var) {
            env.push((var.to_owned(), v));
        }
    }
    env
}
