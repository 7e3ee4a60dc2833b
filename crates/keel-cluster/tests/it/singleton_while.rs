use crate::*;
use keel_cluster::shard_of;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use tokio::sync::watch;

/// Which of the replicas runs the work right now (by counting running copies).
fn runner_of(counts: &[Arc<AtomicUsize>]) -> Vec<usize> {
    counts
        .iter()
        .enumerate()
        .filter(|(_, c)| c.load(Ordering::SeqCst) > 0)
        .map(|(i, _)| i)
        .collect()
}

fn start_work(
    owner: &ShardOwner,
    name: &str,
    serving: watch::Receiver<bool>,
    count: Arc<AtomicUsize>,
) -> tokio::task::JoinHandle<()> {
    owner.singleton_while(name, serving, move |lease| {
        let count = Arc::clone(&count);
        async move {
            count.fetch_add(1, Ordering::SeqCst);
            lease.token().cancelled().await;
            count.fetch_sub(1, Ordering::SeqCst);
        }
    })
}

/// A replica that cannot serve a conditional singleton declines its shard: the shard
/// and the singleton go to the replica that can, whichever the plain rendezvous owner
/// is, and come back when availability flips; when nobody can serve it the shard is
/// still held but the work does not run.
#[tokio::test]
async fn a_replica_that_cannot_serve_hands_the_singleton_on() {
    let db = TestDatabase::create().await.unwrap();
    let shards = 8;
    let name = "txq/31337";
    let shard = shard_of(name.as_bytes(), shards);
    let a = start(&db, shards).await;
    let (a_tx, a_rx) = watch::channel(false);
    let a_count = Arc::new(AtomicUsize::new(0));
    let _a_work = start_work(&a, name, a_rx, Arc::clone(&a_count));
    // Alone and unable to serve: A holds every shard (someone must) but does not run it.
    eventually("A owns every shard", Duration::from_secs(20), || async {
        a.snapshot().len() == shards as usize
    })
    .await;
    let counts = vec![Arc::clone(&a_count)];
    assert!(
        runner_of(&counts).is_empty(),
        "ran on a replica that cannot serve"
    );

    let b = start(&db, shards).await;
    let (b_tx, b_rx) = watch::channel(true);
    let b_count = Arc::new(AtomicUsize::new(0));
    let _b_work = start_work(&b, name, b_rx, Arc::clone(&b_count));
    let counts = vec![Arc::clone(&a_count), Arc::clone(&b_count)];
    eventually("B runs the singleton", Duration::from_secs(20), || async {
        runner_of(&counts) == vec![1]
            && b.snapshot().contains(shard)
            && !a.snapshot().contains(shard)
    })
    .await;
    let declined: Vec<i32> =
        sqlx::query_scalar("SELECT declined_shards FROM cluster_replica WHERE id = $1")
            .bind(a.replica_id())
            .fetch_one(db.pool())
            .await
            .map(|v: Vec<i32>| v)
            .unwrap();
    assert_eq!(declined, vec![i32::try_from(shard).unwrap()]);

    // Availability flips: the singleton moves to A.
    b_tx.send_replace(false);
    a_tx.send_replace(true);
    eventually("A runs the singleton", Duration::from_secs(20), || async {
        runner_of(&counts) == vec![0] && a.snapshot().contains(shard)
    })
    .await;

    // Nobody can serve it: the work stops everywhere, the shard stays held once.
    a_tx.send_replace(false);
    eventually(
        "nobody runs the singleton",
        Duration::from_secs(20),
        || async {
            runner_of(&counts).is_empty()
                && (a.snapshot().contains(shard) != b.snapshot().contains(shard))
        },
    )
    .await;
    a.shutdown().await;
    b.shutdown().await;
}
