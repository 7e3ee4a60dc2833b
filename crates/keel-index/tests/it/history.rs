//! Leased historical catch-up: ranges complete once, meet the tip without gap or
//! overlap, are redone after a lease expires, and survive injected getLogs errors.

use crate::common::{Env, catch_up, config, env, fingerprint, reindex};
use anvil_tests::proxy::{RpcProxy, Rule};
use keel_chain::{UpstreamConfig, UpstreamPool};
use keel_index::history::pending_ranges;
use keel_index::{HistoryConfig, HistoryWorker, IndexError, RangeDone, plan_history};
use std::sync::Arc;
use std::time::Duration;

/// A token created inside history, a mint and `n` transfers, one block each.
async fn activity(env: &Env, symbol: &str, n: u64) -> anyhow::Result<alloy::primitives::Address> {
    let asset = env.mintable(symbol).await?;
    let a0 = env.chain.account(0)?;
    env.mint(asset.token, a0, 1_000_000).await?;
    for i in 0..n {
        let to = env.chain.account(1 + (i as usize % 5))?;
        env.transfer(asset.token, to, i + 1).await?;
    }
    Ok(asset.token)
}

fn worker(env: &Env, node: Arc<UpstreamPool>, id: &str, lease: Duration) -> HistoryWorker {
    worker_with_span(env, node, id, lease, 4)
}

fn worker_with_span(
    env: &Env,
    node: Arc<UpstreamPool>,
    id: &str,
    lease: Duration,
    max_span: u64,
) -> HistoryWorker {
    HistoryWorker::new(
        env.db.pool().clone(),
        node,
        id,
        HistoryConfig {
            lease,
            max_span,
            retries: 5,
        },
    )
    .unwrap()
}

async fn drain(w: &HistoryWorker) -> anyhow::Result<Vec<RangeDone>> {
    let mut done = Vec::new();
    while let Some(d) = w.run_once().await? {
        done.push(d);
    }
    Ok(done)
}

#[tokio::test]
async fn three_workers_and_the_tip_meet_without_gap_or_overlap() -> anyhow::Result<()> {
    let env = env().await?;
    let token = activity(&env, "HIST", 12).await?;
    let boundary = env.chain.block_number().await?; // holds the last transfer
    for i in 0..6 {
        env.transfer(token, env.chain.account(7)?, 100 + i).await?;
    }

    let planned = plan_history(env.db.pool(), env.chain_id, boundary, 3).await?;
    assert!(planned >= 5);
    // Planning again never plans a block twice.
    assert_eq!(
        plan_history(env.db.pool(), env.chain_id, boundary, 3).await?,
        0
    );

    let lease = Duration::from_secs(60);
    let (w1, w2, w3) = (
        worker(&env, env.node.clone(), "w1", lease),
        worker(&env, env.node.clone(), "w2", lease),
        worker(&env, env.node.clone(), "w3", lease),
    );
    let (d1, d2, d3) = tokio::join!(drain(&w1), drain(&w2), drain(&w3));
    let worked = d1?.len() + d2?.len() + d3?.len();
    assert!(worked as u64 >= planned);
    // Address ranges scheduled by discoveries are drained too.
    drain(&w1).await?;
    assert_eq!(pending_ranges(env.db.pool(), env.chain_id).await?, 0);
    let attempts: Vec<i32> =
        sqlx::query_scalar("SELECT attempt FROM index_range WHERE address IS NULL")
            .fetch_all(env.db.pool())
            .await?;
    assert!(attempts.iter().all(|a| *a == 1), "{attempts:?}");

    let tip = env
        .owner(
            keel_index::TipConfig {
                start_block: Some(boundary + 1),
                ..config(64)
            },
            "tip",
        )
        .await?;
    catch_up(&tip).await?;

    let at_boundary: i64 =
        sqlx::query_scalar("SELECT count(*) FROM index_transfer WHERE block_number = $1")
            .bind(boundary as i64)
            .fetch_one(env.db.pool())
            .await?;
    assert_eq!(at_boundary, 1);
    assert_eq!(
        fingerprint(&env.db, env.chain_id, &env.deployed).await?,
        reindex(&env).await?
    );
    Ok(())
}

#[tokio::test]
async fn an_expired_lease_is_redone_by_another_worker_and_the_late_one_commits_nothing()
-> anyhow::Result<()> {
    let env = env().await?;
    activity(&env, "LEASE", 4).await?;
    let head = env.chain.block_number().await?;
    plan_history(env.db.pool(), env.chain_id, head, 4).await?;

    let a = worker(&env, env.node.clone(), "a", Duration::from_millis(300));
    let b = worker(&env, env.node.clone(), "b", Duration::from_secs(60));
    let stuck = a.claim().await?.unwrap();
    assert_eq!(stuck.attempt, 1);
    let other = b.claim().await?.unwrap();
    assert_ne!(other.id, stuck.id, "a live lease is skipped");
    b.work(&other).await?;

    // a's 300 ms lease runs out (the database's clock decides, as the claim does).
    keel_store::testing::until("the stuck lease to expire", Duration::from_secs(30), || {
        sqlx::query_scalar::<_, bool>(
            "SELECT lease_expires_at < now() FROM index_range WHERE id = $1",
        )
        .bind(stuck.id)
        .fetch_one(env.db.pool())
    })
    .await;
    let redo = b.claim().await?.unwrap();
    assert_eq!((redo.id, redo.attempt), (stuck.id, 2));
    b.work(&redo).await?;

    let before = fingerprint(&env.db, env.chain_id, &env.deployed).await?;
    let err = a.work(&stuck).await.unwrap_err();
    assert!(
        matches!(err, IndexError::LeaseLost { attempt: 1, .. }),
        "{err}"
    );
    assert_eq!(
        before,
        fingerprint(&env.db, env.chain_id, &env.deployed).await?
    );

    drain(&b).await?;
    assert_eq!(pending_ranges(env.db.pool(), env.chain_id).await?, 0);
    assert_eq!(
        fingerprint(&env.db, env.chain_id, &env.deployed).await?,
        reindex(&env).await?
    );
    Ok(())
}

#[tokio::test]
async fn injected_get_logs_errors_split_ranges_and_the_run_completes() -> anyhow::Result<()> {
    let env = env().await?;
    activity(&env, "FAULT", 6).await?;
    let head = env.chain.block_number().await?;
    plan_history(env.db.pool(), env.chain_id, head, 1_000).await?;

    let proxy = RpcProxy::start(env.chain.endpoint()).await?;
    proxy.add_rule(
        Rule::error(
            "eth_getLogs",
            -32005,
            "query returned more than 10000 results",
        )
        .times(2),
    );
    proxy.add_rule(Rule::error("eth_getLogs", -32005, "block range is too wide").times(1));
    proxy.add_rule(Rule::error("eth_getLogs", 429, "Too Many Requests").times(2));
    proxy.add_rule(Rule::fail_then_recover("eth_getLogs", 2));
    let node = Arc::new(UpstreamPool::new(
        env.chain_id,
        UpstreamConfig::new(vec![proxy.url().to_string()]),
    )?);
    // ~26 blocks: 64 → 13 → 6 → 3 under three "too large" answers in a row.
    let w = worker_with_span(&env, node, "w", Duration::from_secs(60), 64);
    let done = match drain(&w).await {
        Ok(d) => d,
        Err(e) => {
            eprintln!("head {head} getLogs calls {}", proxy.count("eth_getLogs"));
            return Err(e);
        }
    };
    assert!(done.iter().map(|d| d.splits).sum::<u64>() >= 3, "{done:?}");
    drain(&w).await?;
    assert_eq!(pending_ranges(env.db.pool(), env.chain_id).await?, 0);
    assert_eq!(
        fingerprint(&env.db, env.chain_id, &env.deployed).await?,
        reindex(&env).await?
    );
    Ok(())
}

#[tokio::test]
async fn an_address_added_after_ingest_passed_it_gets_its_history_scheduled() -> anyhow::Result<()>
{
    let env = env().await?;
    let resolver = env.deployed.price_resolver;
    assert!(keel_index::scope::remove_scope(env.db.pool(), env.chain_id, resolver).await?);
    activity(&env, "LATE", 2).await?;
    let tip = env.owner(config(64), "tip").await?;
    catch_up(&tip).await?;
    let bounds: i64 = sqlx::query_scalar("SELECT count(*) FROM index_staleness_bound")
        .fetch_one(env.db.pool())
        .await?;
    assert_eq!(bounds, 0, "the resolver was not in scope");

    let entry = keel_index::ScopeEntry {
        address: resolver,
        kind: keel_index::ScopeKind::PriceResolver,
        organization: Some("org-1".into()),
        from_block: 0,
    };
    assert!(keel_index::scope::add_scope(env.db.pool(), env.chain_id, &entry).await?);
    assert!(!keel_index::scope::add_scope(env.db.pool(), env.chain_id, &entry).await?);
    assert_eq!(pending_ranges(env.db.pool(), env.chain_id).await?, 1);
    // Blocks after the addition come from the tip, blocks up to it from the range.
    env.chain.mine().await?;
    catch_up(&tip).await?;
    drain(&worker(
        &env,
        env.node.clone(),
        "w",
        Duration::from_secs(60),
    ))
    .await?;
    assert_eq!(pending_ranges(env.db.pool(), env.chain_id).await?, 0);
    assert_eq!(
        fingerprint(&env.db, env.chain_id, &env.deployed).await?,
        reindex(&env).await?
    );
    Ok(())
}

#[tokio::test]
async fn a_contract_discovered_after_later_ranges_completed_gets_those_ranges_redone()
-> anyhow::Result<()> {
    let env = env().await?;
    activity(&env, "ORDER", 8).await?;
    let head = env.chain.block_number().await?;
    plan_history(env.db.pool(), env.chain_id, head, 3).await?;
    let w = worker(&env, env.node.clone(), "w", Duration::from_secs(60));
    // Claim every range, then work them from the highest down: the token's transfers
    // are in ranges completed before the range announcing the token is worked.
    let mut leases = Vec::new();
    while let Some(l) = w.claim().await? {
        leases.push(l);
    }
    for l in leases.iter().rev() {
        w.work(l).await?;
    }
    let redo: i64 =
        sqlx::query_scalar("SELECT count(*) FROM index_range WHERE address IS NOT NULL")
            .fetch_one(env.db.pool())
            .await?;
    assert!(redo > 0, "no address range was scheduled");
    drain(&w).await?;
    assert_eq!(pending_ranges(env.db.pool(), env.chain_id).await?, 0);
    assert_eq!(
        fingerprint(&env.db, env.chain_id, &env.deployed).await?,
        reindex(&env).await?
    );
    Ok(())
}

/// A worker whose node answers `eth_getLogs` slowly (through the proxy), working one
/// range in spans of `max_span` blocks, with a 2 s lease.
fn slow_worker(env: &Env, proxy: &RpcProxy, id: &str, max_span: u64) -> HistoryWorker {
    let node = Arc::new(
        UpstreamPool::new(
            env.chain_id,
            UpstreamConfig::new(vec![proxy.url().to_string()]),
        )
        .unwrap(),
    );
    worker_with_span(env, node, id, Duration::from_secs(2), max_span)
}

async fn range_state(env: &Env) -> anyhow::Result<Vec<(String, i32, Option<String>)>> {
    Ok(sqlx::query_as(
        "SELECT state, attempt, lease_owner FROM index_range WHERE address IS NULL ORDER BY from_block",
    )
    .fetch_all(env.db.pool())
    .await?)
}

#[tokio::test]
async fn a_range_longer_than_its_lease_is_renewed_and_completes_exactly_once() -> anyhow::Result<()>
{
    let env = env().await?;
    activity(&env, "RENEW", 4).await?;
    let head = env.chain.block_number().await?;
    // One range holding the whole history.
    assert_eq!(
        plan_history(env.db.pool(), env.chain_id, head, head + 1).await?,
        1
    );
    let proxy = RpcProxy::start(env.chain.endpoint()).await?;
    proxy.add_rule(Rule::latency("eth_getLogs", Duration::from_millis(500)));
    let lease = Duration::from_secs(2);
    let a = slow_worker(&env, &proxy, "a", 3);
    let b = worker(&env, env.node.clone(), "b", Duration::from_secs(60));

    let claimed = a.claim().await?.unwrap();
    let started = std::time::Instant::now();
    let finished = std::sync::atomic::AtomicBool::new(false);
    let work = async {
        let out = a.work(&claimed).await;
        finished.store(true, std::sync::atomic::Ordering::SeqCst);
        out
    };
    // Another worker keeps trying to claim while `a` works, well past the lease.
    let rival = async {
        let mut tries = 0u32;
        while !finished.load(std::sync::atomic::Ordering::SeqCst) {
            if let Some(stolen) = b.claim().await? {
                anyhow::bail!(
                    "range claimed by a second worker after {:?}: {stolen:?}",
                    started.elapsed()
                );
            }
            tries += 1;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(tries)
    };
    let (done, tries) = tokio::join!(work, rival);
    let done = done?;
    let tries = tries?;
    let elapsed = started.elapsed();
    assert!(
        elapsed > lease * 2,
        "the work must outlast the lease to test renewal: {elapsed:?} ({} getLogs calls)",
        proxy.count("eth_getLogs")
    );
    assert!(tries > 20, "{tries}");
    assert!(done.logs > 0);
    assert_eq!(
        range_state(&env).await?,
        vec![("completed".to_owned(), 1, Some("a".to_owned()))]
    );
    // Nothing is left to claim, and the rows equal a fresh index.
    assert!(b.claim().await?.is_none());
    assert_eq!(pending_ranges(env.db.pool(), env.chain_id).await?, 0);
    assert_eq!(
        fingerprint(&env.db, env.chain_id, &env.deployed).await?,
        reindex(&env).await?
    );
    Ok(())
}

#[tokio::test]
async fn a_worker_whose_renewal_finds_its_lease_lost_stops_and_commits_nothing()
-> anyhow::Result<()> {
    let env = env().await?;
    activity(&env, "LOST", 4).await?;
    let head = env.chain.block_number().await?;
    plan_history(env.db.pool(), env.chain_id, head, head + 1).await?;
    let proxy = RpcProxy::start(env.chain.endpoint()).await?;
    proxy.add_rule(Rule::latency("eth_getLogs", Duration::from_millis(500)));
    let a = slow_worker(&env, &proxy, "a", 1);
    let b = worker(&env, env.node.clone(), "b", Duration::from_secs(60));

    let claimed = a.claim().await?.unwrap();
    let work = async {
        let out = a.work(&claimed).await;
        (out, std::time::Instant::now())
    };
    // While `a` fetches, its lease is made to lapse and `b` claims the range (as if
    // `a` had been paused past its lease).
    let takeover = async {
        // Probe: wait until `a` holds the range (its first attempt is leased).
        loop {
            let leased: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM index_range WHERE state = 'running' AND attempt = 1",
            )
            .fetch_one(env.db.pool())
            .await?;
            if leased > 0 {
                break;
            }
            tokio::task::yield_now().await;
        }
        for _ in 0..50 {
            sqlx::query("UPDATE index_range SET lease_expires_at = now() - interval '1 second'")
                .execute(env.db.pool())
                .await?;
            if let Some(l) = b.claim().await? {
                return Ok((l, std::time::Instant::now()));
            }
        }
        anyhow::bail!("b never claimed the range")
    };
    let ((out, stopped_at), taken) = tokio::join!(work, takeover);
    let (redo, taken_at) = taken?;
    assert_eq!((redo.id, redo.attempt), (claimed.id, 2));
    let err = out.unwrap_err();
    assert!(
        matches!(err, IndexError::LeaseLost { attempt: 1, .. }),
        "{err}"
    );
    // `a` noticed at its next renewal (every lease/3), long before its fetch of one
    // block per slow call would have ended.
    let noticed = stopped_at.saturating_duration_since(taken_at);
    assert!(noticed < Duration::from_millis(1_500), "{noticed:?}");
    let calls = proxy.count("eth_getLogs");
    assert!(
        calls < head,
        "a stopped fetching: {calls} calls for {head} blocks"
    );
    // Nothing of `a`'s attempt was committed.
    assert_eq!(
        range_state(&env).await?,
        vec![("running".to_owned(), 2, Some("b".to_owned()))]
    );
    let logs: i64 = sqlx::query_scalar("SELECT count(*) FROM index_log")
        .fetch_one(env.db.pool())
        .await?;
    assert_eq!(logs, 0);
    // A renewal by the superseded attempt is refused; `b`'s succeeds.
    assert!(!a.renew(&claimed).await?);
    assert!(b.renew(&redo).await?);

    b.work(&redo).await?;
    drain(&b).await?;
    assert_eq!(pending_ranges(env.db.pool(), env.chain_id).await?, 0);
    assert_eq!(
        fingerprint(&env.db, env.chain_id, &env.deployed).await?,
        reindex(&env).await?
    );
    Ok(())
}

/// A worker that pipelines (`drain`) with `n` getLogs in flight and two writers.
fn pipelined(env: &Env, node: Arc<UpstreamPool>, id: &str, n: usize) -> HistoryWorker {
    worker_with_span(env, node, id, Duration::from_secs(60), 2)
        .with_fetch_concurrency(n)
        .with_write_concurrency(2)
}

#[tokio::test]
async fn three_pipelined_workers_complete_every_range_once_and_equal_a_reindex()
-> anyhow::Result<()> {
    let env = env().await?;
    activity(&env, "PIPE", 10).await?;
    let head = env.chain.block_number().await?;
    let planned = plan_history(env.db.pool(), env.chain_id, head, 3).await?;
    assert!(planned >= 5);
    let (w1, w2, w3) = (
        pipelined(&env, env.node.clone(), "p1", 4),
        pipelined(&env, env.node.clone(), "p2", 4),
        pipelined(&env, env.node.clone(), "p3", 4),
    );
    let (d1, d2, d3) = tokio::join!(w1.drain(), w2.drain(), w3.drain());
    let done = d1?.len() + d2?.len() + d3?.len();
    // `drain` also works the address ranges that discoveries schedule.
    w1.drain().await?;
    assert!(done as u64 >= planned);
    assert_eq!(pending_ranges(env.db.pool(), env.chain_id).await?, 0);
    let attempts: Vec<i32> =
        sqlx::query_scalar("SELECT attempt FROM index_range WHERE address IS NULL")
            .fetch_all(env.db.pool())
            .await?;
    assert!(attempts.iter().all(|a| *a == 1), "{attempts:?}");
    assert_eq!(
        fingerprint(&env.db, env.chain_id, &env.deployed).await?,
        reindex(&env).await?
    );
    Ok(())
}

#[tokio::test]
async fn ranges_written_twice_yield_one_row_set() -> anyhow::Result<()> {
    let env = env().await?;
    activity(&env, "TWICE", 6).await?;
    let head = env.chain.block_number().await?;
    plan_history(env.db.pool(), env.chain_id, head, 4).await?;
    let w = pipelined(&env, env.node.clone(), "w", 8);
    w.drain().await?;
    let once = fingerprint(&env.db, env.chain_id, &env.deployed).await?;
    let logs = |db: &keel_store::PgPool| {
        let db = db.clone();
        async move {
            sqlx::query_scalar::<_, i64>("SELECT count(*) FROM index_log")
                .fetch_one(&db)
                .await
        }
    };
    let stored = logs(env.db.pool()).await?;
    assert!(stored > 0);
    // Every range offered again (as after lost leases) and redone, serially and
    // pipelined: the rows are stored once.
    for again in 0..2 {
        sqlx::query(
            "UPDATE index_range SET state = 'pending', completed_at = NULL, lease_expires_at = NULL",
        )
        .execute(env.db.pool())
        .await?;
        if again == 0 {
            drain(&w).await?;
        } else {
            w.drain().await?;
        }
        assert_eq!(pending_ranges(env.db.pool(), env.chain_id).await?, 0);
        assert_eq!(logs(env.db.pool()).await?, stored);
        assert_eq!(
            fingerprint(&env.db, env.chain_id, &env.deployed).await?,
            once
        );
    }
    assert_eq!(once, reindex(&env).await?);
    Ok(())
}

#[tokio::test]
async fn a_pipelined_worker_whose_lease_is_taken_over_commits_nothing() -> anyhow::Result<()> {
    let env = env().await?;
    activity(&env, "LATE", 4).await?;
    let head = env.chain.block_number().await?;
    plan_history(env.db.pool(), env.chain_id, head, head + 1).await?;
    let proxy = RpcProxy::start(env.chain.endpoint()).await?;
    proxy.add_rule(Rule::latency("eth_getLogs", Duration::from_millis(500)));
    let a = slow_worker(&env, &proxy, "a", 1).with_fetch_concurrency(2);
    let b = worker(&env, env.node.clone(), "b", Duration::from_secs(60));
    let takeover = async {
        // Probe: wait until `a` holds the range (its first attempt is leased).
        loop {
            let leased: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM index_range WHERE state = 'running' AND attempt = 1",
            )
            .fetch_one(env.db.pool())
            .await?;
            if leased > 0 {
                break;
            }
            tokio::task::yield_now().await;
        }
        for _ in 0..50 {
            sqlx::query("UPDATE index_range SET lease_expires_at = now() - interval '1 second'")
                .execute(env.db.pool())
                .await?;
            if let Some(l) = b.claim().await? {
                return Ok(l);
            }
        }
        anyhow::bail!("b never claimed the range")
    };
    let (out, taken) = tokio::join!(a.drain(), takeover);
    let redo = taken?;
    assert_eq!(redo.attempt, 2);
    let err = out.unwrap_err();
    assert!(
        matches!(err, IndexError::LeaseLost { attempt: 1, .. }),
        "{err}"
    );
    let logs: i64 = sqlx::query_scalar("SELECT count(*) FROM index_log")
        .fetch_one(env.db.pool())
        .await?;
    assert_eq!(logs, 0, "nothing of the superseded attempt was committed");
    b.work(&redo).await?;
    drain(&b).await?;
    assert_eq!(pending_ranges(env.db.pool(), env.chain_id).await?, 0);
    assert_eq!(
        fingerprint(&env.db, env.chain_id, &env.deployed).await?,
        reindex(&env).await?
    );
    Ok(())
}

#[tokio::test]
async fn injected_get_logs_errors_split_concurrent_spans_and_the_pipelined_run_completes()
-> anyhow::Result<()> {
    let env = env().await?;
    activity(&env, "FAULTS", 6).await?;
    let head = env.chain.block_number().await?;
    plan_history(env.db.pool(), env.chain_id, head, 12).await?;
    let proxy = RpcProxy::start(env.chain.endpoint()).await?;
    proxy.add_rule(
        Rule::error(
            "eth_getLogs",
            -32005,
            "query returned more than 10000 results",
        )
        .times(3),
    );
    proxy.add_rule(Rule::error("eth_getLogs", -32005, "block range is too wide").times(2));
    proxy.add_rule(Rule::error("eth_getLogs", 429, "Too Many Requests").times(3));
    proxy.add_rule(Rule::fail_then_recover("eth_getLogs", 2));
    let node = Arc::new(UpstreamPool::new(
        env.chain_id,
        UpstreamConfig::new(vec![proxy.url().to_string()]),
    )?);
    let w = worker_with_span(&env, node, "w", Duration::from_secs(60), 8)
        .with_fetch_concurrency(4)
        .with_write_concurrency(2)
        .with_target_logs_per_request(0);
    let done = w.drain().await?;
    assert!(done.iter().map(|d| d.splits).sum::<u64>() >= 3, "{done:?}");
    assert_eq!(pending_ranges(env.db.pool(), env.chain_id).await?, 0);
    assert_eq!(
        fingerprint(&env.db, env.chain_id, &env.deployed).await?,
        reindex(&env).await?
    );
    Ok(())
}
