//! `keel-custody-sim --help` documents the provider paths, the JWT checks and every knob.

#[test]
fn help_documents_the_paths_the_jwt_checks_and_every_fault_knob() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_keel-custody-sim"))
        .arg("--help")
        .output()
        .unwrap();
    assert!(out.status.success());
    let help = String::from_utf8(out.stdout).unwrap();
    for needle in [
        "POST /v1/transactions",
        "GET  /v1/transactions/external_tx_id/{externalTxId}",
        "/cancel",
        "/.well-known/jwks.json",
        "bodyHash",
        "nonce (never reused)",
        "loseResponse",
        "silent_drop",
        "reject",
        "block",
        "revert",
        "require_approval",
        "/approve",
        "rate_limit",
        "server_error",
        "slow",
        "duplicate",
        "reorder",
        "delay",
        "/admin/webhooks/resend",
        "/admin/webhook-keys/rotate",
        "Fireblocks-Webhook-Signature",
    ] {
        assert!(help.contains(needle), "--help does not mention {needle:?}");
    }
}
