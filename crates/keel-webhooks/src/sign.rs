//! Standard Webhooks signatures (<https://www.standardwebhooks.com/>, "Signature
//! scheme"): a secret is `whsec_` followed by the base64 (standard alphabet, padded) of
//! its key bytes; a signature is `v1,` followed by the base64 of
//! HMAC-SHA256(key, `"{webhook-id}.{webhook-timestamp}.{body}"`); the
//! `webhook-signature` header lists one or more signatures separated by spaces (two
//! during a secret rotation overlap; a receiver accepts the message when any matches).

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, Mac};
use rand::RngCore;
use sha2::Sha256;

/// The prefix of a signing secret.
pub const SECRET_PREFIX: &str = "whsec_";

/// Key bytes of a generated secret (256 bits).
pub const SECRET_BYTES: usize = 32;

/// A new random signing secret: `whsec_` + base64 of 32 random bytes.
pub fn generate_secret() -> String {
    let mut key = [0u8; SECRET_BYTES];
    rand::rng().fill_bytes(&mut key);
    format!("{SECRET_PREFIX}{}", STANDARD.encode(key))
}

/// The key bytes of a `whsec_` secret (the prefix is optional, as verifier libraries
/// accept it); `None` when the rest is not base64.
pub fn secret_key(secret: &str) -> Option<Vec<u8>> {
    let b64 = secret.strip_prefix(SECRET_PREFIX).unwrap_or(secret);
    STANDARD.decode(b64).ok().filter(|k| !k.is_empty())
}

/// The signature `v1,<base64>` of (`id`, `timestamp` in unix seconds, `body`) under
/// `secret`; `None` when the secret does not decode.
pub fn sign(secret: &str, id: &str, timestamp: i64, body: &[u8]) -> Option<String> {
    let key = secret_key(secret)?;
    let mut mac = Hmac::<Sha256>::new_from_slice(&key).ok()?;
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    Some(format!(
        "v1,{}",
        STANDARD.encode(mac.finalize().into_bytes())
    ))
}

/// The `webhook-signature` header value: one signature per secret, space-separated
/// (secrets that do not decode are skipped).
pub fn signature_header(secrets: &[&str], id: &str, timestamp: i64, body: &[u8]) -> String {
    secrets
        .iter()
        .filter_map(|s| sign(s, id, timestamp, body))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The example of the Standard Webhooks reference libraries' test suites.
    #[test]
    fn matches_the_standard_webhooks_reference_vector() {
        let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
        let sig = sign(
            secret,
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1614265330,
            br#"{"test": 2432232314}"#,
        )
        .unwrap();
        assert_eq!(sig, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
    }

    #[test]
    fn generated_secrets_decode_to_32_bytes() {
        let s = generate_secret();
        assert!(s.starts_with(SECRET_PREFIX));
        assert_eq!(secret_key(&s).unwrap().len(), SECRET_BYTES);
        assert_ne!(s, generate_secret());
    }
}
