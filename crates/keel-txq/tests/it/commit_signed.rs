//! `txq_commit_signed` (migrations 0013 and 0015), the statement that persists a
//! signing group, against real PostgreSQL: which senders of a group commit, and that
//! the others write nothing.

use keel_store::testing::TestDatabase;
use sqlx::PgPool;
use uuid::Uuid;

const CHAIN: i64 = 31_337;

fn sender(n: u8) -> Vec<u8> {
    vec![n; 20]
}

/// A sender row at `next_nonce` and `count` queued requests of it, oldest first.
async fn sender_with_queued(db: &PgPool, who: &[u8], next_nonce: i64, count: usize) -> Vec<Uuid> {
    sqlx::query("INSERT INTO txq_sender (chain_id, sender, next_nonce) VALUES ($1, $2, $3)")
        .bind(CHAIN)
        .bind(who)
        .bind(next_nonce)
        .execute(db)
        .await
        .unwrap();
    let mut ids = Vec::new();
    for i in 0..count {
        let id = Uuid::new_v4();
        sqlx::query(
            "INSERT INTO txq_request (id, chain_id, sender, idempotency_key, to_address, value_wei, calldata, gas_limit)
             VALUES ($1, $2, $3, $4, $5, '1', '', 21000)",
        )
        .bind(id)
        .bind(CHAIN)
        .bind(who)
        .bind(format!("k{i}"))
        .bind(vec![0x42u8; 20])
        .execute(db)
        .await
        .unwrap();
        ids.push(id);
    }
    ids
}

/// One slice of a group: a sender, the nonce its signatures start at, its requests.
struct Slice {
    sender: Vec<u8>,
    first: i64,
    ids: Vec<Uuid>,
}

/// Calls `txq_commit_signed` for `slices` (made-up hashes and bytes; fees in wei).
async fn commit(db: &PgPool, slices: &[Slice]) -> Result<Vec<Vec<u8>>, sqlx::Error> {
    let senders: Vec<&[u8]> = slices.iter().map(|s| s.sender.as_slice()).collect();
    let firsts: Vec<i64> = slices.iter().map(|s| s.first).collect();
    let counts: Vec<i32> = slices.iter().map(|s| s.ids.len() as i32).collect();
    let mut ids = Vec::new();
    let mut nonces = Vec::new();
    for s in slices {
        for (k, id) in s.ids.iter().enumerate() {
            ids.push(*id);
            nonces.push(s.first + k as i64);
        }
    }
    let hashes: Vec<Vec<u8>> = ids
        .iter()
        .map(|id| [id.as_bytes().as_slice(); 2].concat())
        .collect();
    let raws: Vec<Vec<u8>> = ids.iter().map(|id| id.as_bytes().to_vec()).collect();
    let fees: Vec<&str> = ids.iter().map(|_| "2000000000").collect();
    let tips: Vec<&str> = ids.iter().map(|_| "1000000000").collect();
    let gas: Vec<i64> = ids.iter().map(|_| 21_000).collect();
    sqlx::query_scalar(
        "SELECT s FROM txq_commit_signed($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) AS s",
    )
    .bind(CHAIN)
    .bind(&senders)
    .bind(&firsts)
    .bind(&counts)
    .bind(&ids)
    .bind(&nonces)
    .bind(&hashes)
    .bind(&raws)
    .bind(&fees)
    .bind(&tips)
    .bind(&gas)
    .fetch_all(db)
    .await
}

/// (state, nonce, attempts) of request `id`.
async fn request(db: &PgPool, id: Uuid) -> (String, Option<i64>, i64) {
    sqlx::query_as(
        "SELECT r.state, r.nonce, (SELECT count(*) FROM txq_attempt a WHERE a.request_id = r.id)
           FROM txq_request r WHERE r.id = $1",
    )
    .bind(id)
    .fetch_one(db)
    .await
    .unwrap()
}

async fn next_nonce(db: &PgPool, who: &[u8]) -> i64 {
    sqlx::query_scalar("SELECT next_nonce FROM txq_sender WHERE chain_id = $1 AND sender = $2")
        .bind(CHAIN)
        .bind(who)
        .fetch_one(db)
        .await
        .unwrap()
}

#[tokio::test]
async fn only_the_senders_whose_nonce_and_requests_are_unchanged_commit() {
    let db = TestDatabase::create().await.unwrap();
    let db = db.pool();
    let (a, b, c, d, e) = (sender(1), sender(2), sender(3), sender(4), sender(5));
    let a_ids = sender_with_queued(db, &a, 7, 3).await;
    let b_ids = sender_with_queued(db, &b, 0, 3).await;
    let c_ids = sender_with_queued(db, &c, 0, 2).await;
    let d_ids = sender_with_queued(db, &d, 4, 2).await;
    let e_ids = sender_with_queued(db, &e, 0, 2).await;
    // b: one of its requests settled meanwhile (it failed before signing).
    sqlx::query(
        "UPDATE txq_request SET state = 'settled', verdict = '{}', verdict_kind = 'failed', settled_at = now() WHERE id = $1",
    )
    .bind(b_ids[1])
    .execute(db)
    .await
    .unwrap();
    // d: its signatures start at a nonce another process has moved past.
    // e: one of its requests is listed under c and one of c's under e.
    let committed = commit(
        db,
        &[
            Slice {
                sender: a.clone(),
                first: 7,
                ids: a_ids.clone(),
            },
            Slice {
                sender: b.clone(),
                first: 0,
                ids: b_ids.clone(),
            },
            Slice {
                sender: c.clone(),
                first: 0,
                ids: vec![c_ids[0], e_ids[1]],
            },
            Slice {
                sender: d.clone(),
                first: 2,
                ids: d_ids.clone(),
            },
            Slice {
                sender: e.clone(),
                first: 0,
                ids: vec![e_ids[0], c_ids[1]],
            },
        ],
    )
    .await
    .unwrap();
    assert_eq!(committed, vec![a.clone()], "only a's slice commits");
    for (k, id) in a_ids.iter().enumerate() {
        assert_eq!(
            request(db, *id).await,
            ("signed".to_owned(), Some(7 + k as i64), 1),
            "a's requests take nonces 7, 8, 9 with one attempt each"
        );
    }
    assert_eq!(next_nonce(db, &a).await, 10);
    for id in b_ids.iter().chain(&c_ids).chain(&d_ids).chain(&e_ids) {
        let (state, nonce, attempts) = request(db, *id).await;
        assert!(
            state != "signed" && nonce.is_none() && attempts == 0,
            "a sender that failed a check writes nothing"
        );
    }
    assert_eq!(next_nonce(db, &b).await, 0);
    assert_eq!(next_nonce(db, &c).await, 0);
    assert_eq!(next_nonce(db, &d).await, 4);
    assert_eq!(next_nonce(db, &e).await, 0);

    // The same group again: a's requests are no longer queued, so nothing commits.
    let again = commit(
        db,
        &[Slice {
            sender: a.clone(),
            first: 10,
            ids: a_ids.clone(),
        }],
    )
    .await
    .unwrap();
    assert!(again.is_empty());
    assert_eq!(next_nonce(db, &a).await, 10);
}

#[tokio::test]
async fn senders_are_returned_in_the_order_given() {
    let db = TestDatabase::create().await.unwrap();
    let db = db.pool();
    let mut slices = Vec::new();
    for n in 1..=6u8 {
        let who = sender(n);
        let ids = sender_with_queued(db, &who, 0, usize::from(n)).await;
        slices.push(Slice {
            sender: who,
            first: 0,
            ids,
        });
    }
    let committed = commit(db, &slices).await.unwrap();
    assert_eq!(
        committed,
        slices.iter().map(|s| s.sender.clone()).collect::<Vec<_>>()
    );
    for s in &slices {
        assert_eq!(next_nonce(db, &s.sender).await, s.ids.len() as i64);
    }
}

#[tokio::test]
async fn a_sender_repeated_within_a_group_is_refused_whole() {
    let db = TestDatabase::create().await.unwrap();
    let db = db.pool();
    let a = sender(1);
    let ids = sender_with_queued(db, &a, 0, 2).await;
    let err = commit(
        db,
        &[
            Slice {
                sender: a.clone(),
                first: 0,
                ids: vec![ids[0]],
            },
            Slice {
                sender: a.clone(),
                first: 1,
                ids: vec![ids[1]],
            },
        ],
    )
    .await;
    assert!(err.is_err(), "a repeated sender is a caller error");
    assert_eq!(next_nonce(db, &a).await, 0);
    assert_eq!(request(db, ids[0]).await, ("queued".to_owned(), None, 0));
}
