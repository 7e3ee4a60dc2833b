//! `keel dev`: local development in one command (not a production role) — a fresh
//! database, an Anvil chain, `chain bootstrap`, a demo organization, key and template,
//! and the three roles as child processes.

use anyhow::{Context, bail};
use std::path::PathBuf;
use std::time::Duration;

/// Runs `keel <args>` with `env` to completion; its stdout (trimmed).
async fn keel_child(env: &[(String, String)], args: &[&str]) -> anyhow::Result<String> {
    let exe = std::env::current_exe().context("locating the keel binary")?;
    let out = tokio::process::Command::new(exe)
        .args(args)
        .envs(env.iter().cloned())
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .with_context(|| format!("running keel {}", args.join(" ")))?;
    if !out.status.success() {
        bail!(
            "keel {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// Starts `keel run --role <role>` with `env`, its output lines printed on stderr with
/// the prefix `[<role>]`.
fn spawn_role(
    env: &[(String, String)],
    role: &'static str,
) -> anyhow::Result<tokio::process::Child> {
    use tokio::io::AsyncBufReadExt;
    let exe = std::env::current_exe().context("locating the keel binary")?;
    let mut child = tokio::process::Command::new(exe)
        .args(["run", "--role", role, "--termination-grace-seconds", "5"])
        .envs(env.iter().cloned())
        .env("KEEL__CLUSTER__HOST", format!("dev-{role}"))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting the {role} role"))?;
    let outputs: [Option<Box<dyn tokio::io::AsyncRead + Unpin + Send>>; 2] = [
        child.stdout.take().map(|o| Box::new(o) as _),
        child.stderr.take().map(|o| Box::new(o) as _),
    ];
    for out in outputs.into_iter().flatten() {
        tokio::spawn(async move {
            let mut lines = tokio::io::BufReader::new(out).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                eprintln!("[{role}] {line}");
            }
        });
    }
    Ok(child)
}

/// `keel dev`: see the `Dev` command.
pub(super) async fn run(api_address: &str, anvil: Option<PathBuf>) -> anyhow::Result<()> {
    let db = keel_store::testing::TestDatabase::create().await.context(
        "creating a fresh database (is PostgreSQL running? DATABASE_URL names its admin connection, default postgres://postgres@127.0.0.1:5432/postgres)",
    )?;
    eprintln!("keel dev: database {} created and migrated", db.name());
    let anvil_path = anvil.unwrap_or_else(|| {
        super::workspace_root().join("tools/node_modules/@foundry-rs/anvil-linux-amd64/bin/anvil")
    });
    // Anvil's persisted older states go to a directory removed when `keel dev` ends
    // (its default, ~/.foundry/anvil/tmp, is never cleaned when the node is killed).
    let states = tempfile::Builder::new()
        .prefix("keel-dev-anvil-states-")
        .tempdir()
        .context("a directory for Anvil's persisted states")?;
    let node = alloy::node_bindings::Anvil::at(&anvil_path)
        .args([
            "--cache-path".to_owned(),
            states.path().display().to_string(),
        ])
        .try_spawn()
        .with_context(|| {
            format!(
                "starting Anvil at {} (run scripts/setup)",
                anvil_path.display()
            )
        })?;
    let key = node
        .keys()
        .first()
        .map(|k| format!("0x{}", alloy::hex::encode(k.to_bytes())))
        .context("Anvil has no dev account")?;
    let chain_id = node.chain_id();
    let rpc = node.endpoint();
    eprintln!("keel dev: Anvil chain {chain_id} at {rpc}");
    let env: Vec<(String, String)> = vec![
        ("KEEL__DATABASE__URL".into(), db.url().to_owned()),
        ("KEEL__CHAINS__LOCAL__CHAINID".into(), chain_id.to_string()),
        (
            "KEEL__CHAINS__LOCAL__RPCURLS".into(),
            format!("[\"{rpc}\"]"),
        ),
        ("KEEL__API__LISTENADDRESS".into(), api_address.to_owned()),
        ("KEEL__TELEMETRY__METRICSADDRESS".into(), String::new()),
        ("KEEL__TELEMETRY__LOGFORMAT".into(), "human".into()),
        ("KEEL__DEPLOYMENTID".into(), "dev".into()),
        ("KEEL_OPERATOR_KEY".into(), key.clone()),
        ("KEEL_DEPLOYER_KEY".into(), key),
    ];
    keel_child(
        &env,
        &["chain", "bootstrap", "--chain", "local", "--deploy-erc4337"],
    )
    .await?;
    keel_child(&env, &["org", "create", "--name", "dev"]).await?;
    let api_key = keel_child(
        &env,
        &["api-key", "create", "--org", "dev", "--label", "dev"],
    )
    .await?;
    keel_child(
        &env,
        &[
            "template", "set", "--org", "dev", "--id", "std", "--chain", "local",
        ],
    )
    .await?;
    let shutdown = keel::shutdown::on_signal();
    let mut children = Vec::new();
    for role in ["indexer", "runner", "api"] {
        children.push((role, spawn_role(&env, role)?));
    }
    let api = format!("http://{api_address}");
    let http = reqwest::Client::new();
    let ready = async {
        loop {
            if let Ok(r) = http.get(format!("{api}/readyz")).send().await
                && r.status().is_success()
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    let outcome = tokio::select! {
        () = ready => Ok(()),
        () = shutdown.cancelled() => Err(anyhow::anyhow!("stopped before the API was ready")),
        () = tokio::time::sleep(Duration::from_secs(120)) => Err(anyhow::anyhow!("the API did not become ready within 120 s")),
    };
    if outcome.is_ok() {
        println!("keel dev is ready (not for production)");
        println!("  API            {api}");
        println!("  API key        {api_key}");
        println!("  status page    {api}/status");
        println!("  OpenAPI        {api}/openapi.json");
        println!("  chain          {rpc} (chainId {chain_id}, chain `local`, template `std`)");
        println!("  database       {} (dropped on exit)", db.name());
        println!("  try            KEEL_API_KEY={api_key} keel ops list --api-url {api}");
        use std::io::Write as _;
        let _ = std::io::stdout().flush();
    }
    // Until a signal, or until a role exits.
    let failure = if outcome.is_ok() {
        let exited = futures_any_exit(&mut children);
        tokio::select! {
            () = shutdown.cancelled() => None,
            role = exited => Some(role),
        }
    } else {
        None
    };
    for (_, child) in &children {
        if let Some(pid) = child.id() {
            let _ = tokio::process::Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status()
                .await;
        }
    }
    for (role, child) in &mut children {
        if tokio::time::timeout(Duration::from_secs(10), child.wait())
            .await
            .is_err()
        {
            eprintln!("keel dev: the {role} role did not stop within 10 s; killing it");
            let _ = child.kill().await;
        }
    }
    drop(node);
    drop(db);
    outcome?;
    if let Some(role) = failure {
        bail!("the {role} role exited");
    }
    eprintln!("keel dev: stopped; database dropped");
    Ok(())
}

/// Resolves with the role of the first child that exits.
async fn futures_any_exit(children: &mut [(&'static str, tokio::process::Child)]) -> &'static str {
    loop {
        for (role, child) in children.iter_mut() {
            if let Ok(Some(_)) = child.try_wait() {
                return role;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
