//! The end of a chaos run: the drain (every accepted operation ends, every webhook is
//! delivered), the invariants read from the chain, the Ledger Index (through the API)
//! and Platform Status, and the report.

use super::client::Receiver;
use super::{ChaosArgs, Run, Submitted};
use anyhow::{Context, bail};
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::PoisonError;
use std::time::{Duration, Instant};

/// Topic 0 of `Transfer(address,address,uint256)`.
const TRANSFER: &str = "0xddf252ad1be2c89b69c2b068fc378daa952ba7f163c4a11628f55a4df523b3ef";
const ZERO_TOPIC: &str = "0x0000000000000000000000000000000000000000000000000000000000000000";
const TERMINAL: [&str; 3] = ["completed", "failed", "cancelled"];

/// One checked invariant.
struct Check {
    name: &'static str,
    ok: bool,
    detail: String,
}

async fn rpc(run: &Run, method: &str, params: Value) -> anyhow::Result<Value> {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
    let answer: Value = reqwest::Client::new()
        .post(run.rpc.clone())
        .json(&body)
        .send()
        .await
        .with_context(|| format!("{method} to the node"))?
        .json()
        .await
        .with_context(|| format!("{method}'s answer"))?;
    if let Some(e) = answer.get("error") {
        bail!("{method}: {e}");
    }
    Ok(answer["result"].clone())
}

fn hex_u128(v: &Value) -> u128 {
    v.as_str()
        .and_then(|s| u128::from_str_radix(s.trim_start_matches("0x"), 16).ok())
        .unwrap_or(u128::MAX)
}

async fn call_u128(run: &Run, to: &str, data: String, block: u64) -> anyhow::Result<u128> {
    let r = rpc(
        run,
        "eth_call",
        json!([{"to": to, "data": data}, format!("0x{block:x}")]),
    )
    .await?;
    Ok(hex_u128(&r))
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn time_of(v: &Value) -> Option<chrono::DateTime<chrono::Utc>> {
    v.as_str()
        .and_then(|s| chrono::DateTime::parse_from_rfc3339(s).ok())
        .map(|t| t.with_timezone(&chrono::Utc))
}

/// Every operation of the run's organization, by id.
async fn operations(run: &Run) -> anyhow::Result<HashMap<String, Value>> {
    let rows = run.api.all(&run.key, "/v1/operations?limit=200").await?;
    Ok(rows
        .into_iter()
        .filter_map(|v| v["id"].as_str().map(|id| (id.to_owned(), v.clone())))
        .collect())
}

/// Drains the run, checks every invariant and prints the report; `Ok(true)` when every
/// invariant held.
pub(super) async fn drain_and_check(
    run: &Run,
    args: &ChaosArgs,
    receiver: &Receiver,
    churn_secs: f64,
) -> anyhow::Result<bool> {
    let answers_in_churn = run.api.answers();
    let submitted: Vec<Submitted> = Run::lock(&run.submitted).clone();
    let drain_started = Instant::now();
    let deadline = drain_started + Duration::from_secs(args.drain_secs);
    // 1. Every accepted operation ends.
    let mut views = loop {
        super::decide_waiting(run).await;
        let views = operations(run).await?;
        let open = submitted
            .iter()
            .filter(|s| {
                views
                    .get(&s.id)
                    .and_then(|v| v["state"].as_str())
                    .is_none_or(|st| !TERMINAL.contains(&st))
            })
            .count();
        if open == 0 || Instant::now() > deadline {
            break views;
        }
        super::sample_once(run).await;
        tokio::time::sleep(Duration::from_secs(2)).await;
    };
    let drained_in = drain_started.elapsed().as_secs_f64();
    // 2. Every webhook delivered: nothing undelivered, and each terminal operation's
    //    final state arrived at the receiver.
    let webhook_deadline = Instant::now() + Duration::from_secs(120);
    let (undelivered, missing_events) = loop {
        let (status, platform) = run.api.get(&run.key, "/v1/status").await?;
        let undelivered = if status == 200 {
            platform["webhooks"]["undelivered"]
                .as_u64()
                .unwrap_or(u64::MAX)
        } else {
            u64::MAX
        };
        let missing: Vec<String> = {
            let r = receiver
                .received
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            submitted
                .iter()
                .filter_map(|s| {
                    let state = views.get(&s.id)?["state"].as_str()?.to_owned();
                    let got = r.states.get(&s.id).is_some_and(|st| st.contains(&state));
                    (!got).then(|| format!("{} {state}", s.id))
                })
                .collect()
        };
        if (undelivered == 0 && missing.is_empty()) || Instant::now() > webhook_deadline {
            break (undelivered, missing);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    views = operations(run).await?;
    let mut checks = Vec::new();

    let stuck: Vec<String> = submitted
        .iter()
        .filter_map(|s| {
            let st = views
                .get(&s.id)
                .and_then(|v| v["state"].as_str())
                .unwrap_or("missing");
            (!TERMINAL.contains(&st)).then(|| format!("{} {} ({st})", s.kind, s.id))
        })
        .collect();
    checks.push(Check {
        name: "every accepted operation ended",
        ok: stuck.is_empty(),
        detail: if stuck.is_empty() {
            format!(
                "{} operations, all terminal {drained_in:.0} s after the churn",
                submitted.len()
            )
        } else {
            format!(
                "{} not terminal after {} s: {}",
                stuck.len(),
                args.drain_secs,
                stuck
                    .iter()
                    .take(10)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        },
    });

    // Failures: only the rejected approvals may fail.
    let mut codes: BTreeMap<String, u64> = BTreeMap::new();
    let mut unexpected = Vec::new();
    for s in &submitted {
        let Some(v) = views.get(&s.id) else { continue };
        if v["state"] == "failed" || v["state"] == "cancelled" {
            let code = v["error"]["code"].as_str().unwrap_or("?").to_owned();
            *codes.entry(code.clone()).or_default() += 1;
            if !(s.reject && code == "APPROVAL_REJECTED") {
                let why = v["error"]["detail"].as_str().unwrap_or("");
                unexpected.push(format!(
                    "{} {} {code} ({})",
                    s.kind,
                    s.id,
                    why.chars().take(200).collect::<String>()
                ));
            }
        } else if v["state"] == "completed" && s.reject {
            unexpected.push(format!("{} {} completed though rejected", s.kind, s.id));
        }
    }
    checks.push(Check {
        name: "no operation failed but the rejected ones",
        ok: unexpected.is_empty(),
        detail: if unexpected.is_empty() {
            format!("failures by code: {codes:?}")
        } else {
            format!(
                "{} unexpected: {}",
                unexpected.len(),
                unexpected
                    .iter()
                    .take(10)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        },
    });

    // 3. Effects on chain, exactly once, and the index equal to the chain.
    let head = hex_u128(&rpc(run, "eth_blockNumber", json!([])).await?) as u64;
    let assets = Run::lock(&run.assets).clone();
    let holders: Vec<String> = super::holders()
        .into_iter()
        .chain([run.operator.clone()])
        .map(|h| h.to_lowercase())
        .collect();
    let mut effect_problems = Vec::new();
    let mut index_problems = Vec::new();
    let mut tx_hashes: HashSet<String> = HashSet::new();
    let mut duplicate_txs = 0u64;
    let mut completed_token_ops = 0u64;
    for (ai, asset) in assets.iter().enumerate() {
        if asset.token.is_empty() {
            effect_problems.push(format!("asset {} has no token", asset.id));
            continue;
        }
        let mut expected: HashMap<String, u128> = HashMap::new();
        let mut mints = 0u64;
        let mut transfers = 0u64;
        for s in submitted
            .iter()
            .filter(|s| s.asset == ai && s.kind != "create")
        {
            let Some(v) = views.get(&s.id) else { continue };
            if v["state"] != "completed" {
                continue;
            }
            completed_token_ops += 1;
            let to = s.recipient.to_lowercase();
            *expected.entry(to).or_default() += s.base_units;
            if s.kind == "transfer" {
                transfers += 1;
                let from = expected.entry(run.operator.to_lowercase()).or_default();
                *from = from.wrapping_sub(s.base_units);
            } else {
                mints += 1;
            }
            for m in v["milestones"]["confirmed"]
                .as_array()
                .into_iter()
                .flatten()
            {
                if let Some(h) = m["txHash"].as_str()
                    && !tx_hashes.insert(h.to_owned())
                {
                    duplicate_txs += 1;
                }
            }
        }
        let supply_expected: u128 = submitted
            .iter()
            .filter(|s| s.asset == ai && s.kind == "mint")
            .filter(|s| views.get(&s.id).is_some_and(|v| v["state"] == "completed"))
            .map(|s| s.base_units)
            .sum();
        let supply = call_u128(run, &asset.token, "0x18160ddd".to_owned(), head).await?;
        if supply != supply_expected {
            effect_problems.push(format!(
                "{}: totalSupply {supply} != completed mints {supply_expected}",
                asset.token
            ));
        }
        let mut chain_balances: HashMap<String, u128> = HashMap::new();
        for h in &holders {
            let data = format!("0x70a08231{:0>64}", h.trim_start_matches("0x"));
            let b = call_u128(run, &asset.token, data, head).await?;
            let want = expected.get(h).copied().unwrap_or(0);
            if b != want {
                effect_problems.push(format!(
                    "{} holder {h}: balance {b} != expected {want}",
                    asset.token
                ));
            }
            if b > 0 {
                chain_balances.insert(h.clone(), b);
            }
        }
        let logs = rpc(
            run,
            "eth_getLogs",
            json!([{"address": asset.token, "fromBlock": "0x0", "toBlock": format!("0x{head:x}"), "topics": [TRANSFER]}]),
        )
        .await?;
        let logs = logs.as_array().cloned().unwrap_or_default();
        let chain_mints = logs.iter().filter(|l| l["topics"][1] == ZERO_TOPIC).count() as u64;
        if chain_mints != mints || logs.len() as u64 != mints + transfers {
            effect_problems.push(format!(
                "{}: {chain_mints} mint logs and {} transfer logs on chain for {mints} completed mints and {transfers} completed transfers",
                asset.token,
                logs.len()
            ));
        }
        // The index at the same block (waiting for it to reach the block).
        let index_deadline = Instant::now() + Duration::from_secs(90);
        let supply_page = loop {
            let (status, body) = run
                .api
                .get(
                    &run.key,
                    &format!("/v1/assets/{}/supply?atBlock={head}", asset.id),
                )
                .await?;
            if status == 200 || Instant::now() > index_deadline {
                break (status, body);
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        };
        if supply_page.0 != 200 {
            index_problems.push(format!(
                "{}: supply at {head} answered {}: {}",
                asset.id, supply_page.0, supply_page.1["code"]
            ));
            continue;
        }
        if supply_page.1["supplyBaseUnits"].as_str() != Some(&supply.to_string()) {
            index_problems.push(format!(
                "{}: index supply {} != chain {supply}",
                asset.id, supply_page.1["supplyBaseUnits"]
            ));
        }
        let indexed = run
            .api
            .all(
                &run.key,
                &format!("/v1/assets/{}/holders?atBlock={head}&limit=200", asset.id),
            )
            .await?;
        let indexed: HashMap<String, u128> = indexed
            .iter()
            .filter_map(|h| {
                let a = h["address"].as_str()?.to_lowercase();
                let b = h["balanceBaseUnits"].as_str()?.parse().ok()?;
                (b > 0).then_some((a, b))
            })
            .collect();
        if indexed != chain_balances {
            index_problems.push(format!(
                "{}: index holders {indexed:?} != chain {chain_balances:?}",
                asset.id
            ));
        }
        let transfers_indexed = run
            .api
            .all(
                &run.key,
                &format!("/v1/assets/{}/transfers?limit=200", asset.id),
            )
            .await?
            .iter()
            .filter(|t| t["blockNumber"].as_u64().is_some_and(|b| b <= head))
            .count();
        if transfers_indexed != logs.len() {
            index_problems.push(format!(
                "{}: {transfers_indexed} indexed transfers != {} logs on chain",
                asset.id,
                logs.len()
            ));
        }
    }
    checks.push(Check {
        name: "effects on chain exactly once",
        ok: effect_problems.is_empty() && duplicate_txs == 0,
        detail: if effect_problems.is_empty() && duplicate_txs == 0 {
            format!("{completed_token_ops} completed mints and transfers over {} assets: supply, {} balances per asset and Transfer logs match; {} distinct transactions", assets.len(), holders.len(), tx_hashes.len())
        } else {
            format!("{duplicate_txs} transactions claimed twice; {}", effect_problems.join("; "))
        },
    });
    checks.push(Check {
        name: "the index equals the chain",
        ok: index_problems.is_empty(),
        detail: if index_problems.is_empty() {
            format!("at block {head}: supply, holders and transfers of every asset")
        } else {
            index_problems.join("; ")
        },
    });

    // 4. Platform Status: nothing stuck, no dead commands, queues empty.
    let (_, platform) = run.api.get(&run.key, "/v1/status").await?;
    let dead = platform["workflows"]["deadLetters"]
        .as_u64()
        .unwrap_or(u64::MAX);
    let no_mutation = platform["workflows"]["overNoMutation"]
        .as_u64()
        .unwrap_or(u64::MAX);
    let awaiting = platform["workflows"]["awaitingRunner"]
        .as_array()
        .map_or(usize::MAX, Vec::len);
    let depth: u64 = platform["queue"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|q| q["depth"].as_u64().unwrap_or(u64::MAX))
        .sum();
    checks.push(Check {
        name: "no dead commands",
        ok: dead == 0,
        detail: format!("{dead} dead-lettered commands"),
    });
    checks.push(Check {
        name: "nothing stuck",
        ok: no_mutation == 0 && awaiting == 0 && depth == 0,
        detail: format!("{no_mutation} instances without progress, {awaiting} awaiting a runner, {depth} unsettled queue requests"),
    });
    let (deliveries, distinct) = {
        let r = receiver
            .received
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        (r.deliveries, r.ids.len())
    };
    checks.push(Check {
        name: "every webhook event delivered",
        ok: undelivered == 0 && missing_events.is_empty(),
        detail: format!(
            "{distinct} distinct events in {deliveries} deliveries; {undelivered} undelivered; {} final states missing{}",
            missing_events.len(),
            missing_events.first().map(|m| format!(" (e.g. {m})")).unwrap_or_default()
        ),
    });
    let answers = run.api.answers();
    let server_errors: u64 = answers.by_status.get(&500).copied().unwrap_or(0);
    checks.push(Check {
        name: "no 500 answer",
        ok: server_errors == 0,
        detail: format!(
            "answers by status {:?}; {} requests without an answer (replica down)",
            answers.by_status, answers.transport_errors
        ),
    });
    let noisy_limited = run.noisy_limited.load(std::sync::atomic::Ordering::Relaxed);
    let noisy_ok = run.noisy_ok.load(std::sync::atomic::Ordering::Relaxed);
    let workload_limited = answers_in_churn.by_status.get(&429).copied().unwrap_or(0);
    // The noisy loop must meet the limit whenever it got more than the limit through
    // (an overloaded API can slow it below the limit on its own).
    let allowed = f64::from(args.key_rate_limit) * args.api as f64 * churn_secs;
    let noisy_held = noisy_limited > 0 || (noisy_ok as f64) <= allowed;
    checks.push(Check {
        name: "the noisy integrator is limited, the workload is not",
        ok: noisy_held && workload_limited == 0,
        detail: format!(
            "noisy key: {noisy_ok} served ({:.1}/s; limit {}/s per replica), {noisy_limited} answered 429; workload: {workload_limited} answered 429 during the churn",
            noisy_ok as f64 / churn_secs,
            args.key_rate_limit
        ),
    });
    let faults = Run::lock(&run.faults).clone();
    checks.push(Check {
        name: "no replica exited by itself",
        ok: faults.unexpected_exits.is_empty() && faults.pg_restart_failures.is_empty(),
        detail: format!(
            "exits {:?}; failed PostgreSQL restarts {:?}",
            faults.unexpected_exits, faults.pg_restart_failures
        ),
    });

    // The report.
    let mut confirm = Vec::new();
    let mut index = Vec::new();
    let mut first_accept = None;
    let mut last_done = None;
    let mut completed = 0u64;
    for s in submitted.iter().filter(|s| s.kind != "create" && !s.reject) {
        let Some(v) = views.get(&s.id) else { continue };
        if v["state"] != "completed" {
            continue;
        }
        completed += 1;
        let Some(accepted) = time_of(&v["milestones"]["accepted"]) else {
            continue;
        };
        first_accept =
            Some(first_accept.map_or(accepted, |f: chrono::DateTime<chrono::Utc>| f.min(accepted)));
        let confirmed = v["milestones"]["confirmed"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|m| time_of(&m["confirmedAt"]))
            .max();
        if let Some(c) = confirmed {
            confirm.push((c - accepted).num_milliseconds() as f64 / 1000.0);
        }
        if let Some(i) = time_of(&v["milestones"]["indexed"]["at"]) {
            index.push((i - accepted).num_milliseconds() as f64 / 1000.0);
            last_done = Some(last_done.map_or(i, |l: chrono::DateTime<chrono::Utc>| l.max(i)));
        }
    }
    confirm.sort_by(f64::total_cmp);
    index.sort_by(f64::total_cmp);
    let span = match (first_accept, last_done) {
        (Some(a), Some(b)) => (b - a).num_milliseconds() as f64 / 1000.0,
        _ => f64::NAN,
    };
    let accepted_ops = submitted.iter().filter(|s| s.kind != "create").count();
    println!();
    println!(
        "keel chaos report ({} api, {} runner, {} indexer; churn {churn_secs:.0} s)",
        args.api, args.runners, args.indexers
    );
    println!(
        "  faults      kill -9 {:?}; PostgreSQL restarts {}; reorgs by depth {:?}; RPC faults {:?}",
        faults.kills, faults.pg_restarts, faults.reorgs_by_depth, faults.rpc_faults
    );
    println!(
        "  throughput  {accepted_ops} token operations accepted ({:.2}/s over the churn); {completed} completed and indexed ({:.2}/s, first accept to last indexed: {span:.0} s); {} refused at submission",
        accepted_ops as f64 / churn_secs,
        completed as f64 / span,
        Run::lock(&run.refused).len()
    );
    println!(
        "  latency     accept -> confirmed p50 {:.2} s p99 {:.2} s; accept -> indexed p50 {:.2} s p99 {:.2} s (completed operations without an approval wait)",
        percentile(&confirm, 0.5),
        percentile(&confirm, 0.99),
        percentile(&index, 0.5),
        percentile(&index, 0.99)
    );
    let samples = run
        .pg_connection_samples
        .load(std::sync::atomic::Ordering::Relaxed)
        .max(1);
    let pg_ticks = Run::lock(&run.pg_cpu).total();
    let wall = churn_secs + drained_in;
    println!(
        "  postgres    connections to the run's database: peak {} mean {:.1} (budget {} = replicas x {}); server CPU {:.0} s = {:.0} % of one core over {wall:.0} s",
        run.pg_connections_peak
            .load(std::sync::atomic::Ordering::Relaxed),
        run.pg_connections_sum
            .load(std::sync::atomic::Ordering::Relaxed) as f64
            / samples as f64,
        u64::from(args.db_connections) * (args.api + args.runners + args.indexers) as u64,
        args.db_connections,
        pg_ticks as f64 / super::fleet::TICKS_PER_SECOND as f64,
        100.0 * pg_ticks as f64 / super::fleet::TICKS_PER_SECOND as f64 / wall,
    );
    for (role, u) in run.fleet.lock().await.by_role() {
        println!(
            "  {role:<11} {} replicas, {} restarts; RSS peak {:.0} MiB, mean {:.0} MiB per replica; CPU {:.0} s = {:.0} % of one core",
            u.replicas,
            u.restarts,
            u.rss_peak_kib as f64 / 1024.0,
            u.rss_mean_sum_kib as f64 / 1024.0 / u.replicas.max(1) as f64,
            u.cpu_ticks as f64 / super::fleet::TICKS_PER_SECOND as f64,
            100.0 * u.cpu_ticks as f64 / super::fleet::TICKS_PER_SECOND as f64 / wall,
        );
    }
    println!("  invariants");
    let mut all = true;
    for c in &checks {
        all &= c.ok;
        println!(
            "    {} {:<52} {}",
            if c.ok { "PASS" } else { "FAIL" },
            c.name,
            c.detail
        );
    }
    if !all {
        let failed: Vec<&str> = checks.iter().filter(|c| !c.ok).map(|c| c.name).collect();
        eprintln!("keel chaos: FAILED: {}", failed.join("; "));
    }
    Ok(all)
}
