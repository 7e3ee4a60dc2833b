//! `keel ops …`: operator commands on operations, through a running Platform API
//! (an API key; never the database), with the API's codes on failure.

use clap::Subcommand;
use std::time::Duration;

/// Where the Platform API is and the API key to call it with (`keel ops` commands
/// other than `cancel`).
#[derive(clap::Args, Debug)]
pub(super) struct ApiArgs {
    /// The Platform API's base URL.
    #[arg(long, env = "KEEL_API_URL", default_value = "http://127.0.0.1:8080")]
    api_url: String,
    /// The API key (`keel_sk_...`). Prefer the environment variable: a command-line
    /// argument is visible to other users of the machine.
    #[arg(long, env = "KEEL_API_KEY", hide_env_values = true)]
    api_key: String,
    /// Seconds one HTTP request may take.
    #[arg(long, default_value_t = 30)]
    request_timeout_seconds: u64,
}

#[derive(Subcommand, Debug)]
pub(super) enum OpsCommand {
    /// List operations through `GET /v1/operations` (oldest first; the API's filters),
    /// as a table, or one JSON object per line with `--json`.
    List {
        #[command(flatten)]
        api: ApiArgs,
        /// Only this state: queued, running, waiting, suspended, completed, failed,
        /// cancelled.
        #[arg(long)]
        state: Option<String>,
        /// Only this kind (`asset.create`, `asset.mint`, ...).
        #[arg(long)]
        kind: Option<String>,
        /// Only operations of this asset id.
        #[arg(long)]
        asset: Option<String>,
        /// Only operations accepted after this RFC 3339 instant.
        #[arg(long)]
        created_after: Option<String>,
        /// Only operations accepted before this RFC 3339 instant.
        #[arg(long)]
        created_before: Option<String>,
        /// Only open operations unchanged (`updatedAt`) for `--stuck-after-seconds`.
        #[arg(long)]
        stuck: bool,
        /// What `--stuck` means, seconds without a change (default 900, the status
        /// page's no-mutation threshold).
        #[arg(long, default_value_t = 900)]
        stuck_after_seconds: u64,
        /// At most this many operations (following the API's pages).
        #[arg(long, default_value_t = 50)]
        limit: usize,
        /// Continue from this cursor (printed on stderr when more remain).
        #[arg(long)]
        cursor: Option<String>,
        /// One JSON object per line (the API's `Operation` shape).
        #[arg(long)]
        json: bool,
    },
    /// Show one operation (`GET /v1/operations/{id}`): state, wait, milestones with
    /// each transaction, progress, result or error, attribution.
    Show {
        #[command(flatten)]
        api: ApiArgs,
        /// The operation id.
        id: String,
        /// The API's JSON document instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Follow one operation live until it ends, printing each milestone as it happens.
    /// Exit code: 0 completed, 3 failed, 4 cancelled, 5 `--timeout-seconds` passed,
    /// 1 an error (the API's code is printed).
    Watch {
        #[command(flatten)]
        api: ApiArgs,
        /// The operation id.
        id: String,
        /// Milliseconds between polls.
        #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u64).range(50..=60_000))]
        interval_ms: u64,
        /// Give up after this many seconds (exit code 5); default: wait until it ends.
        #[arg(long)]
        timeout_seconds: Option<u64>,
    },
    /// Retry a failed or suspended operation (`POST /v1/operations/{id}/retry`, scope
    /// `operate`); prints the operation afterwards as JSON.
    Retry {
        #[command(flatten)]
        api: ApiArgs,
        /// The operation id.
        id: String,
    },
    /// Approve an operation waiting for an approval (`POST .../approve`, scope
    /// `approve`, another key than the one that started it); prints it as JSON.
    Approve {
        #[command(flatten)]
        api: ApiArgs,
        /// The operation id.
        id: String,
    },
    /// Reject an operation waiting for an approval (`POST .../reject`, scope
    /// `approve`): it fails `APPROVAL_REJECTED`; prints it as JSON.
    Reject {
        #[command(flatten)]
        api: ApiArgs,
        /// The operation id.
        id: String,
    },
    /// Cancel an operation, with the semantics of `POST /v1/operations/{id}/cancel`:
    /// before any transaction it ends `cancelled`; an unsigned transaction is withdrawn;
    /// a signed one runs to its verdict (what landed is listed). Prints the operation's
    /// view as JSON; exits non-zero when the operation has ended or does not exist.
    Cancel {
        #[command(flatten)]
        api: ApiArgs,
        /// The operation id.
        id: String,
    },
    /// Print an operation's history (the decision log of its workflow, oldest first,
    /// with the actor of each entry and the state after it) as the JSON array
    /// `GET /v1/operations/{id}/history` pages through.
    History {
        #[command(flatten)]
        api: ApiArgs,
        /// The operation id.
        id: String,
    },
}

/// Runs an API-backed `keel ops` command; errors print `keel: CODE: detail` on
/// stderr with a non-zero exit.
pub(super) fn run(command: OpsCommand) -> std::process::ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("keel: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(api_ops_run(command)) {
        Ok(code) => std::process::ExitCode::from(code),
        Err(e) => {
            eprintln!("keel: {e}");
            std::process::ExitCode::from(keel::ops::WatchExit::Error.code())
        }
    }
}

fn client(api: &ApiArgs) -> Result<keel::ops::ApiClient, keel::ops::OpsError> {
    keel::ops::ApiClient::new(
        &api.api_url,
        &api.api_key,
        Duration::from_secs(api.request_timeout_seconds.max(1)),
    )
}

fn print_json(v: &serde_json::Value, pretty: bool) {
    let text = if pretty {
        serde_json::to_string_pretty(v)
    } else {
        serde_json::to_string(v)
    };
    println!("{}", text.unwrap_or_default());
}

/// The exit code of a finished command (0 unless `watch` says otherwise).
async fn api_ops_run(command: OpsCommand) -> Result<u8, keel::ops::OpsError> {
    use keel::ops::{Action, ListFilter, parse_operation};
    match command {
        OpsCommand::List {
            api,
            state,
            kind,
            asset,
            created_after,
            created_before,
            stuck,
            stuck_after_seconds,
            limit,
            cursor,
            json,
        } => {
            let client = client(&api)?;
            let filter = ListFilter {
                state,
                kind,
                asset_id: asset,
                created_after,
                created_before,
            };
            // `--stuck` filters here, so it walks the pages with a larger budget.
            let budget = if stuck {
                limit.saturating_mul(20)
            } else {
                limit
            };
            let (items, next) = client.list(&filter, cursor, budget.max(1)).await?;
            let now = chrono::Utc::now();
            let threshold = Duration::from_secs(stuck_after_seconds);
            let mut shown = Vec::new();
            for item in items {
                let op = parse_operation(&item)?;
                if stuck && !keel::ops::is_stuck(&op, now, threshold) {
                    continue;
                }
                if shown.len() < limit {
                    shown.push((item, op));
                }
            }
            if json {
                for (item, _) in &shown {
                    print_json(item, false);
                }
            } else {
                let ops: Vec<_> = shown.into_iter().map(|(_, op)| op).collect();
                print!("{}", keel::ops::table(&ops));
            }
            if let Some(c) = next {
                eprintln!("more operations follow: pass --cursor {c}");
            }
            Ok(0)
        }
        OpsCommand::Show { api, id, json } => {
            let v = client(&api)?.operation_json(&id).await?;
            if json {
                print_json(&v, true);
            } else {
                print!("{}", keel::ops::describe(&parse_operation(&v)?));
            }
            Ok(0)
        }
        OpsCommand::Retry { api, id } => act(&api, &id, Action::Retry).await,
        OpsCommand::Approve { api, id } => act(&api, &id, Action::Approve).await,
        OpsCommand::Reject { api, id } => act(&api, &id, Action::Reject).await,
        OpsCommand::Watch {
            api,
            id,
            interval_ms,
            timeout_seconds,
        } => {
            watch(
                &client(&api)?,
                &id,
                Duration::from_millis(interval_ms),
                timeout_seconds.map(Duration::from_secs),
            )
            .await
        }
        OpsCommand::Cancel { api, id } => act(&api, &id, Action::Cancel).await,
        OpsCommand::History { api, id } => {
            let entries = client(&api)?.history(&id).await?;
            print_json(&serde_json::Value::Array(entries), true);
            Ok(0)
        }
    }
}

async fn act(
    api: &ApiArgs,
    id: &str,
    action: keel::ops::Action,
) -> Result<u8, keel::ops::OpsError> {
    let v = client(api)?.act(id, action).await?;
    print_json(&v, true);
    Ok(0)
}

/// `keel ops watch`: polls the operation every `interval` and prints each change
/// ([`keel::ops::changes`]) until it ends. On a terminal stdout, a spinner (indicatif)
/// shows the current state, phase and elapsed time below the printed milestones;
/// otherwise plain lines only. Transient API errors are retried with backoff (up to
/// 10 s apart); any other error ends the watch with exit code 1.
async fn watch(
    client: &keel::ops::ApiClient,
    id: &str,
    interval: Duration,
    timeout: Option<Duration>,
) -> Result<u8, keel::ops::OpsError> {
    use keel::ops::{WatchExit, changes, parse_operation, state_name};
    use std::io::IsTerminal;
    let tty = std::io::stdout().is_terminal();
    let spinner = if tty {
        let pb = indicatif::ProgressBar::new_spinner();
        pb.set_style(
            indicatif::ProgressStyle::with_template("{spinner} {msg} ({elapsed})")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
        );
        pb.enable_steady_tick(Duration::from_millis(120));
        Some(pb)
    } else {
        None
    };
    let emit = |line: &str| match &spinner {
        Some(pb) => pb.println(line),
        None => println!("{line}"),
    };
    let started = tokio::time::Instant::now();
    let mut last: Option<keel_api::dto::Operation> = None;
    let mut backoff = interval;
    loop {
        match client.operation_json(id).await {
            Ok(v) => {
                backoff = interval;
                let op = parse_operation(&v)?;
                for line in changes(last.as_ref(), &op) {
                    emit(&line);
                }
                if let Some(pb) = &spinner {
                    let phase = op
                        .progress
                        .as_ref()
                        .and_then(|p| p.get("phase"))
                        .and_then(|p| p.as_str())
                        .map(|p| format!(" · {p}"))
                        .unwrap_or_default();
                    pb.set_message(format!("{} {}{phase}", op.kind, state_name(op.state)));
                }
                if let Some(exit) = WatchExit::of(op.state) {
                    if let Some(pb) = &spinner {
                        pb.finish_and_clear();
                    }
                    if let Some(e) = &op.error {
                        eprintln!("keel: operation {}: {}: {}", op.id, e.code, e.detail);
                    }
                    return Ok(exit.code());
                }
                last = Some(op);
            }
            Err(e) if e.is_transient() => {
                emit(&format!("(the API answered {}; retrying)", e.code()));
                backoff = (backoff * 2).min(Duration::from_secs(10));
            }
            Err(e) => {
                if let Some(pb) = &spinner {
                    pb.finish_and_clear();
                }
                return Err(e);
            }
        }
        if let Some(limit) = timeout
            && started.elapsed() >= limit
        {
            if let Some(pb) = &spinner {
                pb.finish_and_clear();
            }
            eprintln!(
                "keel: operation {id} has not ended after {} s",
                limit.as_secs()
            );
            return Ok(WatchExit::TimedOut.code());
        }
        tokio::time::sleep(backoff).await;
    }
}
