//! Keel's request signing checked by an independent verifier: the simulator refuses a
//! wrong bodyHash, an expired token, a reused nonce, a wrong uri and a wrong key.

use anvil_tests::TestChain;
use keel_custody::fireblocks::auth::RequestSigner;
use keel_custody::{CustodyError, CustodyProvider, FireblocksProvider, ProviderTxId, Secret};

use crate::harness::*;

/// Sends a request with an explicit JWT; returns (HTTP status, provider code).
async fn send(
    sim: &Sim,
    method: reqwest::Method,
    path: &str,
    body: &[u8],
    jwt: &str,
) -> (u16, Option<i64>) {
    let mut request = sim
        .http
        .request(method, format!("{}{path}", sim.base))
        .header("X-API-Key", API_KEY)
        .bearer_auth(jwt);
    if !body.is_empty() {
        request = request
            .header("Content-Type", "application/json")
            .body(body.to_vec());
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let json: serde_json::Value = response.json().await.unwrap_or_default();
    (status, json["code"].as_i64())
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

#[tokio::test]
async fn the_simulator_refuses_a_wrong_body_hash_an_expired_token_a_reused_nonce_a_wrong_uri_and_key()
 {
    let chain = TestChain::start().await.unwrap();
    let sim = Sim::start(&chain).await;
    let signer =
        RequestSigner::new(Secret::new(API_KEY), &Secret::new(sim.key.private.clone())).unwrap();
    let path = "/v1/transactions/00000000-0000-0000-0000-000000000000";

    // A correct token passes the JWT check (and the unknown id is a 404).
    let good = signer.sign(path, b"", now()).unwrap();
    assert_eq!(
        send(&sim, reqwest::Method::GET, path, b"", &good).await,
        (404, Some(1404))
    );
    // The same token again: the nonce is reused.
    assert_eq!(
        send(&sim, reqwest::Method::GET, path, b"", &good).await,
        (401, Some(-7))
    );

    // bodyHash over other bytes than those sent.
    let body = br#"{"operation":"CONTRACT_CALL"}"#;
    let jwt = signer
        .sign("/v1/transactions", br#"{"operation":"TRANSFER"}"#, now())
        .unwrap();
    assert_eq!(
        send(&sim, reqwest::Method::POST, "/v1/transactions", body, &jwt).await,
        (401, Some(-7))
    );

    // Expired: issued a minute ago (exp = iat + 29 s is past).
    let jwt = signer.sign(path, b"", now() - 60).unwrap();
    assert_eq!(
        send(&sim, reqwest::Method::GET, path, b"", &jwt).await,
        (401, Some(-10))
    );

    // Signed for another uri.
    let jwt = signer.sign("/v1/transactions/other", b"", now()).unwrap();
    assert_eq!(
        send(&sim, reqwest::Method::GET, path, b"", &jwt).await,
        (401, Some(-4))
    );

    // Signed with a key that is not the registered one.
    let stranger =
        RequestSigner::new(Secret::new(API_KEY), &Secret::new(rsa_key().private)).unwrap();
    let jwt = stranger.sign(path, b"", now()).unwrap();
    assert_eq!(
        send(&sim, reqwest::Method::GET, path, b"", &jwt).await,
        (401, Some(-1))
    );

    // Through the adapter: the wrong key is a typed, permanent Unauthorized.
    let wrong = FireblocksProvider::with_secrets(
        &sim.config(),
        Secret::new(API_KEY),
        &Secret::new(rsa_key().private),
    )
    .unwrap();
    let id = ProviderTxId::new("00000000-0000-0000-0000-000000000000").unwrap();
    let err = wrong.get(&id).await.unwrap_err();
    assert!(
        matches!(
            err,
            CustodyError::Unauthorized {
                http_status: 401,
                code: Some(-1)
            }
        ),
        "{err}"
    );
    assert!(!err.is_retryable());

    let stats = sim.admin_get("/admin/stats").await;
    assert_eq!(stats["refusedAuth"], 6);

    // The adapter's own requests pass, and its Debug shows no secret.
    let provider = sim.provider();
    assert!(matches!(
        provider.get(&id).await,
        Err(CustodyError::NotFound)
    ));
    let shown = format!("{provider:?} {err} {err:?}");
    assert!(!shown.contains(API_KEY), "{shown}");
    assert!(!shown.contains("PRIVATE KEY"), "{shown}");
}
