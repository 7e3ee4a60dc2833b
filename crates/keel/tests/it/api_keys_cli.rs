//! `keel api-key create|list|rotate|revoke` as processes against a real PostgreSQL: the
//! token is printed once, listing shows no secret, a rotation with an overlap keeps the
//! old secret working, a revoke stops both at once.

use crate::common::keel;

use keel_store::testing::TestDatabase;
use keel_workflows::tenancy::authenticate_credential;
use keel_workflows::{Scope, Scopes};

/// Runs `keel args…` on `db`; (success, stdout, stderr).
fn run(db: &TestDatabase, args: &[&str]) -> (bool, String, String) {
    let out = keel()
        .args(args)
        .env("KEEL__DATABASE__URL", db.url())
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).trim().to_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn ok(db: &TestDatabase, args: &[&str]) -> String {
    let (success, stdout, stderr) = run(db, args);
    assert!(success, "keel {args:?}: {stderr}");
    stdout
}

#[tokio::test]
async fn the_key_lifecycle_from_the_command_line() {
    let db = TestDatabase::create().await.unwrap();
    ok(&db, &["org", "create", "--name", "acme"]);
    let full = ok(
        &db,
        &["api-key", "create", "--org", "acme", "--label", "ops"],
    );
    let reader = ok(
        &db,
        &[
            "api-key", "create", "--org", "acme", "--label", "reader", "--scope", "read",
        ],
    );
    let pool = db.pool();
    let c = authenticate_credential(pool, &full).await.unwrap();
    assert_eq!(c.scopes, Scopes::all(), "no --scope: every scope");
    let r = authenticate_credential(pool, &reader).await.unwrap();
    assert_eq!(r.scopes, Scopes::NONE.with(Scope::Read));
    let (success, _, _) = run(
        &db,
        &[
            "api-key", "create", "--org", "acme", "--label", "x", "--scope", "write",
        ],
    );
    assert!(!success, "an unknown scope is refused");

    let listed = ok(&db, &["api-key", "list", "--org", "acme"]);
    let lines: Vec<serde_json::Value> = listed
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2, "{listed}");
    assert!(!listed.contains("keel_sk_"), "no secret is listed");
    assert_eq!(lines[1]["scopes"], serde_json::json!(["read"]));
    let id = r.caller.api_key_id.to_string();

    let rotated = ok(
        &db,
        &[
            "api-key",
            "rotate",
            "--org",
            "acme",
            &id,
            "--expires-in-seconds",
            "3600",
        ],
    );
    assert_ne!(rotated, reader);
    assert!(
        authenticate_credential(pool, &reader).await.is_ok(),
        "overlap"
    );
    assert!(authenticate_credential(pool, &rotated).await.is_ok());

    let revoked = ok(&db, &["api-key", "revoke", "--org", "acme", &id]);
    let view: serde_json::Value = serde_json::from_str(&revoked).unwrap();
    assert!(view["revokedAt"].is_string(), "{revoked}");
    assert!(authenticate_credential(pool, &reader).await.is_err());
    assert!(authenticate_credential(pool, &rotated).await.is_err());
    assert!(authenticate_credential(pool, &full).await.is_ok());

    let (success, _, stderr) = run(&db, &["api-key", "rotate", "--org", "acme", &id]);
    assert!(!success, "a revoked key cannot be rotated");
    assert!(stderr.contains("revoked"), "{stderr}");
    // Another organization's key id is not found.
    ok(&db, &["org", "create", "--name", "other"]);
    let (success, _, _) = run(&db, &["api-key", "revoke", "--org", "other", &id]);
    assert!(!success);
}
