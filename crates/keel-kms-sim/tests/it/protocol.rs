//! The simulator speaks KMS as the AWS SDK expects it.

use crate::sim::{Sim, runtime, use_sim_credentials};
use alloy::primitives::B256;
use alloy::signers::Signer;
use alloy::signers::aws::AwsSigner;
use aws_sdk_kms::error::ProvideErrorMetadata;
use aws_sdk_kms::primitives::Blob;
use aws_sdk_kms::types::{MessageType, SigningAlgorithmSpec};

/// alloy's AWS signer against the simulator: every signature (half of them answered
/// with the high s, as KMS does not normalise) recovers to the key's address and is
/// low-s (EIP-2), through the key id, the key ARN and an alias.
#[test]
fn alloys_aws_signer_signs_digests_that_recover_to_the_key() {
    use_sim_credentials();
    runtime().block_on(async {
        let sim = Sim::start();
        let key = sim.create_key().await;
        let client = sim.client().await;
        let signer = AwsSigner::new(client.clone(), key.clone(), None)
            .await
            .unwrap();
        let half_n = alloy::primitives::U256::from_be_slice(
            &alloy::hex::decode("7fffffffffffffffffffffffffffffff5d576e7357a4501ddfe92f46681b20a0")
                .unwrap(),
        );
        let mut raw_high = 0;
        for i in 0u8..8 {
            let digest = B256::repeat_byte(i + 1);
            let sig = signer.sign_hash(&digest).await.unwrap();
            assert_eq!(
                sig.recover_address_from_prehash(&digest).unwrap(),
                signer.address()
            );
            assert!(sig.s() <= half_n, "signature {i} is not low-s");
            // The raw answer: DER, and every other one high-s.
            let raw = client
                .sign()
                .key_id(&key)
                .message(Blob::new(digest.as_slice()))
                .message_type(MessageType::Digest)
                .signing_algorithm(SigningAlgorithmSpec::EcdsaSha256)
                .send()
                .await
                .unwrap();
            let der = k256::ecdsa::Signature::from_der(raw.signature.unwrap().as_ref()).unwrap();
            if der.normalize_s().is_some() {
                raw_high += 1;
            }
        }
        assert!(
            raw_high >= 4,
            "the simulator answered {raw_high} high-s signatures of 8"
        );
        // The ARN and an alias name the same key.
        let arn = client
            .describe_key()
            .key_id(&key)
            .send()
            .await
            .unwrap()
            .key_metadata
            .unwrap()
            .arn
            .unwrap();
        client
            .create_alias()
            .alias_name("alias/keel-operator")
            .target_key_id(&key)
            .send()
            .await
            .unwrap();
        for id in [arn, "alias/keel-operator".to_owned()] {
            let other = AwsSigner::new(client.clone(), id, None).await.unwrap();
            assert_eq!(other.address(), signer.address());
        }
    });
}

/// SigV4 is checked: an unknown access key, a wrong secret and a missing signature are
/// refused with KMS's error types, and nothing is signed for them.
#[test]
fn requests_not_signed_by_known_credentials_are_refused() {
    use_sim_credentials();
    runtime().block_on(async {
        let sim = Sim::start();
        let key = sim.create_key().await;
        for (access, secret, expected) in [
            ("AKIDUNKNOWN", "whatever", "UnrecognizedClientException"),
            (
                crate::sim::ACCESS_KEY,
                "not-the-secret",
                "InvalidSignatureException",
            ),
        ] {
            let e = sim
                .client_as(access, secret)
                .await
                .get_public_key()
                .key_id(&key)
                .send()
                .await
                .unwrap_err();
            assert_eq!(e.code(), Some(expected), "{e:?}");
        }
        let r = reqwest::Client::new()
            .post(&sim.url)
            .header("x-amz-target", "TrentService.Sign")
            .header("content-type", "application/x-amz-json-1.1")
            .body("{}")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400);
        let body: serde_json::Value = r.json().await.unwrap();
        assert_eq!(body["__type"], "MissingAuthenticationTokenException");
        let stats = sim.stats().await;
        assert_eq!(stats["signs"], 0);
        assert_eq!(stats["refusedAuth"], 3);
    });
}

/// Key states and faults answer as KMS does, and the keys survive a restart of the
/// simulator (its state file).
#[test]
fn key_states_faults_and_restarts() {
    use_sim_credentials();
    runtime().block_on(async {
        let mut sim = Sim::start();
        let key = sim.create_key().await;
        let client = sim.client().await;
        let signer = AwsSigner::new(client.clone(), key.clone(), None)
            .await
            .unwrap();
        let address = signer.address();

        sim.set_enabled(&key, false).await;
        let e = client
            .get_public_key()
            .key_id(&key)
            .send()
            .await
            .unwrap_err();
        assert_eq!(e.code(), Some("DisabledException"));
        sim.set_enabled(&key, true).await;

        let e = client
            .get_public_key()
            .key_id("0b5e9c1e-0000-4000-8000-000000000000")
            .send()
            .await
            .unwrap_err();
        assert_eq!(e.code(), Some("NotFoundException"));

        sim.faults(serde_json::json!({"throttle": 1})).await;
        let e = client
            .get_public_key()
            .key_id(&key)
            .send()
            .await
            .unwrap_err();
        assert_eq!(e.code(), Some("ThrottlingException"));
        assert_eq!(e.raw_response().unwrap().status().as_u16(), 400);
        sim.faults(serde_json::json!({"internalError": 1})).await;
        let e = client
            .get_public_key()
            .key_id(&key)
            .send()
            .await
            .unwrap_err();
        assert_eq!(e.code(), Some("KMSInternalException"));
        assert_eq!(e.raw_response().unwrap().status().as_u16(), 500);

        // A 31-byte digest is refused.
        let e = client
            .sign()
            .key_id(&key)
            .message(Blob::new(vec![1u8; 31]))
            .message_type(MessageType::Digest)
            .signing_algorithm(SigningAlgorithmSpec::EcdsaSha256)
            .send()
            .await
            .unwrap_err();
        assert_eq!(e.code(), Some("ValidationException"));

        sim.restart();
        let again = AwsSigner::new(sim.client().await, key.clone(), None)
            .await
            .unwrap();
        assert_eq!(again.address(), address);
    });
}

/// `--create-key alias/<name>` creates the key when the alias is absent and keeps it
/// across a restart with the same state file: the same key id, the same public key.
#[test]
fn create_key_at_start_is_kept_across_restarts() {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("kms.json");
    let start = || {
        let mut child = Command::new(env!("CARGO_BIN_EXE_keel-kms-sim"))
            .args(["--create-key", "alias/keel-operator", "--state"])
            .arg(&state)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let (mut key, mut listening) = (String::new(), String::new());
        out.read_line(&mut key).unwrap();
        out.read_line(&mut listening).unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(
            listening.starts_with("keel-kms-sim listening on "),
            "{listening:?}"
        );
        key.trim()
            .strip_prefix("key alias/keel-operator ")
            .unwrap_or_else(|| panic!("unexpected key line {key:?}"))
            .to_owned()
    };
    let first = start();
    assert_eq!(first.len(), 36, "a key id (uuid): {first:?}");
    assert_eq!(start(), first, "a restart made another key");
}
