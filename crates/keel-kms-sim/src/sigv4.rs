//! AWS Signature Version 4 request authentication, as KMS checks it: the
//! `Authorization: AWS4-HMAC-SHA256 Credential=…, SignedHeaders=…, Signature=…` header
//! is recomputed from the request (canonical request → string to sign → HMAC-SHA256
//! chain of the secret key over date, region, service and `aws4_request`) and compared.
//! Source: AWS's "Create a signed AWS API request" (SigV4) documentation.

use axum::http::{HeaderMap, Method};
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};
use std::collections::HashMap;

type HmacSha256 = Hmac<Sha256>;

/// How far `X-Amz-Date` may be from the simulator's clock (KMS: 5 minutes).
const MAX_SKEW_SECONDS: i64 = 300;

/// Why a request's signature was refused, with the error type KMS answers (HTTP 400).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refusal {
    /// The `__type` KMS answers.
    pub(crate) kind: &'static str,
    /// The message KMS answers.
    pub(crate) message: String,
}

fn refuse(kind: &'static str, message: impl Into<String>) -> Refusal {
    Refusal {
        kind,
        message: message.into(),
    }
}

/// The parts of an `Authorization` header.
struct Authorization<'a> {
    access_key: &'a str,
    date: &'a str,
    region: &'a str,
    service: &'a str,
    signed_headers: Vec<&'a str>,
    signature: &'a str,
}

fn parse(header: &str) -> Option<Authorization<'_>> {
    let rest = header.strip_prefix("AWS4-HMAC-SHA256 ")?;
    let mut credential = None;
    let mut signed = None;
    let mut signature = None;
    for part in rest.split(',') {
        let (k, v) = part.trim().split_once('=')?;
        match k {
            "Credential" => credential = Some(v),
            "SignedHeaders" => signed = Some(v),
            "Signature" => signature = Some(v),
            _ => return None,
        }
    }
    let mut scope = credential?.split('/');
    let access_key = scope.next()?;
    let date = scope.next()?;
    let region = scope.next()?;
    let service = scope.next()?;
    if scope.next()? != "aws4_request" || scope.next().is_some() {
        return None;
    }
    Some(Authorization {
        access_key,
        date,
        region,
        service,
        signed_headers: signed?.split(';').collect(),
        signature: signature?,
    })
}

fn hmac(key: &[u8], data: &[u8]) -> Vec<u8> {
    // HMAC takes a key of any length: `new_from_slice` cannot fail for it.
    let mut mac = match HmacSha256::new_from_slice(key) {
        Ok(mac) => mac,
        Err(_) => return Vec::new(),
    };
    mac.update(data);
    mac.finalize().into_bytes().to_vec()
}

/// The SigV4 signature of a request (hex), given its signed parts.
#[allow(clippy::too_many_arguments)]
pub(crate) fn signature(
    secret: &str,
    method: &str,
    path: &str,
    query: &str,
    canonical_headers: &str,
    signed_headers: &str,
    body: &[u8],
    amz_date: &str,
    date: &str,
    region: &str,
    service: &str,
) -> String {
    let canonical_request = format!(
        "{method}\n{path}\n{query}\n{canonical_headers}\n{signed_headers}\n{}",
        hex::encode(Sha256::digest(body))
    );
    let scope = format!("{date}/{region}/{service}/aws4_request");
    let string_to_sign = format!(
        "AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{}",
        hex::encode(Sha256::digest(canonical_request.as_bytes()))
    );
    let k_date = hmac(format!("AWS4{secret}").as_bytes(), date.as_bytes());
    let k_region = hmac(&k_date, region.as_bytes());
    let k_service = hmac(&k_region, service.as_bytes());
    let k_signing = hmac(&k_service, b"aws4_request");
    hex::encode(hmac(&k_signing, string_to_sign.as_bytes()))
}

/// The canonical form of a query string: `k=v` pairs sorted (already URI-encoded by
/// the client, as the SDK sends them).
fn canonical_query(query: &str) -> String {
    let mut pairs: Vec<&str> = query.split('&').filter(|p| !p.is_empty()).collect();
    pairs.sort_unstable();
    pairs
        .iter()
        .map(|p| {
            if p.contains('=') {
                (*p).to_owned()
            } else {
                format!("{p}=")
            }
        })
        .collect::<Vec<_>>()
        .join("&")
}

/// Checks a request's SigV4 signature against `credentials` (access key id → secret),
/// for `service` in `region`, at `now` (seconds since the epoch). Returns the access key
/// id that signed it.
///
/// # Errors
/// A [`Refusal`] as KMS answers it: `MissingAuthenticationTokenException` (no
/// header), `IncompleteSignatureException` (malformed header, a missing signed
/// header), `UnrecognizedClientException` (unknown access key),
/// `InvalidSignatureException` (wrong signature, scope or an expired date).
#[allow(clippy::too_many_arguments)]
pub(crate) fn verify(
    credentials: &HashMap<String, String>,
    region: &str,
    service: &str,
    now: i64,
    method: &Method,
    path: &str,
    query: &str,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<String, Refusal> {
    let Some(header) = headers.get("authorization") else {
        return Err(refuse(
            "MissingAuthenticationTokenException",
            "Missing Authentication Token",
        ));
    };
    let header = header.to_str().map_err(|_| {
        refuse(
            "IncompleteSignatureException",
            "Authorization header is not text",
        )
    })?;
    let auth = parse(header).ok_or_else(|| {
        refuse(
            "IncompleteSignatureException",
            "Authorization header requires 'Credential', 'Signature' and 'SignedHeaders' parameters",
        )
    })?;
    let Some(secret) = credentials.get(auth.access_key) else {
        return Err(refuse(
            "UnrecognizedClientException",
            "The security token included in the request is invalid.",
        ));
    };
    if auth.region != region || auth.service != service {
        return Err(refuse(
            "InvalidSignatureException",
            format!(
                "Credential should be scoped to a valid region and service: {region}/{service}"
            ),
        ));
    }
    let amz_date = headers
        .get("x-amz-date")
        .and_then(|v| v.to_str().ok())
        .ok_or_else(|| refuse("IncompleteSignatureException", "X-Amz-Date is missing"))?;
    let signed_at = chrono::NaiveDateTime::parse_from_str(amz_date, "%Y%m%dT%H%M%SZ")
        .map_err(|_| refuse("IncompleteSignatureException", "X-Amz-Date is malformed"))?
        .and_utc()
        .timestamp();
    if (now - signed_at).abs() > MAX_SKEW_SECONDS {
        return Err(refuse(
            "InvalidSignatureException",
            "Signature expired: the request time is more than 5 minutes from the server time",
        ));
    }
    if !amz_date.starts_with(auth.date) {
        return Err(refuse(
            "InvalidSignatureException",
            "The credential date does not match X-Amz-Date",
        ));
    }
    if !auth.signed_headers.contains(&"host") {
        return Err(refuse(
            "IncompleteSignatureException",
            "SignedHeaders must include host",
        ));
    }
    let mut canonical_headers = String::new();
    for name in &auth.signed_headers {
        let values: Vec<String> = headers
            .get_all(*name)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .map(|v| v.split_whitespace().collect::<Vec<_>>().join(" "))
            .collect();
        if values.is_empty() {
            return Err(refuse(
                "IncompleteSignatureException",
                format!("Signed header '{name}' is missing"),
            ));
        }
        canonical_headers.push_str(&format!("{name}:{}\n", values.join(",")));
    }
    let expected = signature(
        secret,
        method.as_str(),
        if path.is_empty() { "/" } else { path },
        &canonical_query(query),
        &canonical_headers,
        &auth.signed_headers.join(";"),
        body,
        amz_date,
        auth.date,
        region,
        service,
    );
    if expected != auth.signature {
        return Err(refuse(
            "InvalidSignatureException",
            "The request signature we calculated does not match the signature you provided.",
        ));
    }
    Ok(auth.access_key.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// AWS's published SigV4 example ("get-vanilla" of the SigV4 test suite:
    /// `GET /` to `example.amazonaws.com`, service `service`, region `us-east-1`,
    /// secret `wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY`, 2015-08-30T12:36:00Z).
    #[test]
    fn the_published_example_signs_as_aws_documents() {
        let sig = signature(
            "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
            "GET",
            "/",
            "",
            "host:example.amazonaws.com\nx-amz-date:20150830T123600Z\n",
            "host;x-amz-date",
            b"",
            "20150830T123600Z",
            "20150830",
            "us-east-1",
            "service",
        );
        assert_eq!(
            sig,
            "5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31"
        );
    }

    #[test]
    fn malformed_headers_are_incomplete_signatures() {
        assert!(parse("Basic abc").is_none());
        assert!(parse("AWS4-HMAC-SHA256 Credential=a/b/c/d/e, SignedHeaders=host").is_none());
    }
}
