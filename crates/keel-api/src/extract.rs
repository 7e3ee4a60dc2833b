//! Request extraction: authentication, headers, path ids, query strings and JSON bodies,
//! each refusing bad input with a [`Problem`] (never a panic, never a 500, never a
//! value of the request in the answer).

use crate::ApiState;
use crate::problem::Problem;
use alloy_primitives::Address;
use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Path, Request};
use axum::http::{HeaderMap, StatusCode, header, request::Parts};
use keel_workflows::Caller;
use serde::de::DeserializeOwned;
use serde_json::Value;
use uuid::Uuid;

/// Maximum nesting depth of a request body; every object and array counts one level
/// (the operations service's input bound, [`keel_workflows::MAX_INPUT_DEPTH`]).
pub const MAX_JSON_DEPTH: usize = keel_workflows::MAX_INPUT_DEPTH;

/// The authenticated caller (`Authorization: Bearer <api key>`).
#[derive(Debug, Clone, Copy)]
pub struct Authed(pub Caller);

impl FromRequestParts<ApiState> for Authed {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, state: &ApiState) -> Result<Self, Problem> {
        use crate::metrics::{AuthFailure, auth_failed};
        let refuse = |reason: AuthFailure| {
            auth_failed(reason);
            Problem::unauthenticated()
        };
        let value = parts
            .headers
            .get(header::AUTHORIZATION)
            .ok_or_else(|| refuse(AuthFailure::Missing))?;
        let value = value.to_str().map_err(|_| refuse(AuthFailure::Malformed))?;
        let (scheme, token) = value
            .trim()
            .split_once(' ')
            .ok_or_else(|| refuse(AuthFailure::Malformed))?;
        if !scheme.eq_ignore_ascii_case("bearer") {
            return Err(refuse(AuthFailure::Malformed));
        }
        match state.ops().authenticate(token.trim()).await {
            Ok(caller) => Ok(Self(caller)),
            Err(keel_workflows::OpsError::Unauthenticated) => {
                auth_failed(AuthFailure::Invalid);
                Err(keel_workflows::OpsError::Unauthenticated.into())
            }
            Err(e) => Err(e.into()),
        }
    }
}

/// The `Idempotency-Key` header (required on operation-creating POSTs; 1 to 255
/// printable characters, checked by the operations service).
#[derive(Debug, Clone)]
pub struct IdempotencyKey(pub String);

impl<S: Send + Sync> FromRequestParts<S> for IdempotencyKey {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Problem> {
        let value = parts.headers.get("idempotency-key").ok_or_else(|| {
            Problem::bad_request(
                "IDEMPOTENCY_KEY_REQUIRED",
                "the Idempotency-Key header is required",
            )
        })?;
        let key = std::str::from_utf8(value.as_bytes()).map_err(|_| {
            Problem::bad_request(
                "INVALID_FIELD",
                "field `Idempotency-Key`: must be 1 to 255 printable characters",
            )
        })?;
        Ok(Self(key.to_owned()))
    }
}

/// The `wait` preference of the `Prefer` headers (RFC 7240), in seconds, before any
/// cap. Unknown preferences and malformed values are ignored (RFC 7240 §2); the first
/// well-formed `wait` wins.
#[derive(Debug, Clone, Copy, Default)]
pub struct PreferWait(pub Option<u64>);

impl<S: Send + Sync> FromRequestParts<S> for PreferWait {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(Self(prefer_wait(&parts.headers)))
    }
}

/// Parses `Prefer: wait=<seconds>` out of `headers` (see [`PreferWait`]).
pub fn prefer_wait(headers: &HeaderMap) -> Option<u64> {
    for value in headers.get_all("prefer") {
        let Ok(value) = value.to_str() else { continue };
        for pref in value.split(',') {
            let head = pref.split(';').next().unwrap_or("");
            let Some((name, v)) = head.split_once('=') else {
                continue;
            };
            if !name.trim().eq_ignore_ascii_case("wait") {
                continue;
            }
            let v = v.trim();
            let v = v
                .strip_prefix('"')
                .and_then(|s| s.strip_suffix('"'))
                .unwrap_or(v);
            if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) {
                // Absurdly long digit strings saturate rather than being ignored.
                return Some(v.parse::<u64>().unwrap_or(u64::MAX));
            }
        }
    }
    None
}

/// Path parameters as strings; a path that does not decode answers 404.
#[derive(Debug, Clone)]
pub struct RawPath<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for RawPath<T> {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Problem> {
        Path::<T>::from_request_parts(parts, state)
            .await
            .map(|Path(t)| Self(t))
            .map_err(|_| Problem::not_found("resource"))
    }
}

/// Parses a path id: anything but a UUID is `404 NOT_FOUND` for `what` (no such
/// resource can exist).
pub fn parse_id(s: &str, what: &str) -> Result<Uuid, Problem> {
    Uuid::parse_str(s).map_err(|_| Problem::not_found(what))
}

/// Parses an address: `0x` + 40 hex digits; mixed-case digits must carry a valid EIP-55
/// checksum. `422 INVALID_ADDRESS` otherwise, naming only the field.
pub fn parse_address(s: &str, field: &str) -> Result<Address, Problem> {
    let bad = || {
        Problem::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "INVALID_ADDRESS",
            format!(
                "field `{field}`: must be 0x followed by 40 hex digits (mixed case must be a valid EIP-55 checksum)"
            ),
        )
    };
    let hex = s.strip_prefix("0x").ok_or_else(bad)?;
    if hex.len() != 40 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(bad());
    }
    let has_upper = hex.bytes().any(|b| b.is_ascii_uppercase());
    let has_lower = hex.bytes().any(|b| b.is_ascii_lowercase());
    if has_upper && has_lower {
        Address::parse_checksummed(s, None).map_err(|_| bad())
    } else {
        s.parse::<Address>().map_err(|_| bad())
    }
}

/// The JSON kind a request field must have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldKind {
    /// A string.
    Text,
    /// A decimal string (an amount or price); JSON numbers are refused.
    Decimal,
    /// An address string (`0x` + 40 hex digits).
    Address,
    /// An optional address: absent, `null`, or as [`FieldKind::Address`]. The only kind
    /// whose field may be missing.
    OptionalAddress,
    /// ERC-20 decimals: an integer (0 to 36; larger values are refused with
    /// `DECIMALS_OUT_OF_RANGE`).
    Decimals,
}

/// A field of a request body's schema.
#[derive(Debug, Clone, Copy)]
pub struct Field {
    /// The JSON name.
    pub name: &'static str,
    /// Its kind.
    pub kind: FieldKind,
}

/// A request body type: its fields (all required but those of kind
/// [`FieldKind::OptionalAddress`]) and whether an empty body means `{}`.
pub trait RequestBody: DeserializeOwned {
    /// Every field the body accepts; each is required unless its kind is optional.
    const FIELDS: &'static [Field];
    /// Whether an empty body (no bytes) stands for `{}`.
    const EMPTY_ALLOWED: bool = false;
}

impl RequestBody for crate::dto::CreateAssetRequest {
    const FIELDS: &'static [Field] = &[
        Field {
            name: "name",
            kind: FieldKind::Text,
        },
        Field {
            name: "symbol",
            kind: FieldKind::Text,
        },
        Field {
            name: "decimals",
            kind: FieldKind::Decimals,
        },
        Field {
            name: "templateId",
            kind: FieldKind::Text,
        },
        Field {
            name: "initialPrice",
            kind: FieldKind::Decimal,
        },
    ];
}

impl RequestBody for crate::dto::TokenAmountRequest {
    const FIELDS: &'static [Field] = &[
        Field {
            name: "recipient",
            kind: FieldKind::Address,
        },
        Field {
            name: "amount",
            kind: FieldKind::Decimal,
        },
    ];
}

impl RequestBody for crate::dto::BurnRequest {
    const FIELDS: &'static [Field] = &[
        Field {
            name: "amount",
            kind: FieldKind::Decimal,
        },
        Field {
            name: "from",
            kind: FieldKind::OptionalAddress,
        },
    ];
}

impl RequestBody for crate::dto::RoleRequest {
    const FIELDS: &'static [Field] = &[
        Field {
            name: "role",
            kind: FieldKind::Text,
        },
        Field {
            name: "account",
            kind: FieldKind::Address,
        },
    ];
}

impl RequestBody for crate::dto::EmptyRequest {
    const FIELDS: &'static [Field] = &[];
    const EMPTY_ALLOWED: bool = true;
}

/// A validated JSON request body of type `T`.
///
/// Checks, in order: the body limit (`413 PAYLOAD_TOO_LARGE`), the media type
/// (`415 UNSUPPORTED_MEDIA_TYPE`), nesting depth over [`MAX_JSON_DEPTH`] counted on the
/// raw bytes without recursion and before parsing (`400 JSON_TOO_DEEP`), JSON syntax
/// (`400 MALFORMED_JSON`), a top-level object (`400 INVALID_FIELD`), unknown members
/// (`400 UNKNOWN_FIELD`), each field's presence and kind (`400 INVALID_FIELD`,
/// `422 INVALID_ADDRESS`, `422 DECIMALS_OUT_OF_RANGE`), then deserializes `T`
/// (duplicate members: `400 INVALID_FIELD`).
#[derive(Debug, Clone)]
pub struct JsonBody<T>(pub T);

impl<T: RequestBody> FromRequest<ApiState> for JsonBody<T> {
    type Rejection = Problem;

    async fn from_request(req: Request, state: &ApiState) -> Result<Self, Problem> {
        let is_json = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(is_json_media_type);
        let bytes = Bytes::from_request(req, state).await.map_err(|e| {
            if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                crate::metrics::body_too_large();
                Problem::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "PAYLOAD_TOO_LARGE",
                    format!(
                        "the request body exceeds {} bytes",
                        state.config().max_body_bytes
                    ),
                )
            } else {
                Problem::bad_request("MALFORMED_BODY", "the request body could not be read")
            }
        })?;
        if bytes.is_empty() && T::EMPTY_ALLOWED {
            return parse_body::<T>(b"{}").map(Self);
        }
        if is_json != Some(true) {
            return Err(Problem::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "UNSUPPORTED_MEDIA_TYPE",
                "the request body must be application/json",
            ));
        }
        parse_body::<T>(&bytes).map(Self)
    }
}

/// `application/json` or `application/<anything>+json`, parameters allowed.
fn is_json_media_type(v: &str) -> bool {
    let essence = v.split(';').next().unwrap_or("").trim();
    let Some((ty, sub)) = essence.split_once('/') else {
        return false;
    };
    ty.eq_ignore_ascii_case("application")
        && (sub.eq_ignore_ascii_case("json")
            || (sub.len() > 5
                && sub
                    .get(sub.len() - 5..)
                    .is_some_and(|s| s.eq_ignore_ascii_case("+json"))))
}

/// Whether `bytes`, read as JSON, nests deeper than `max` levels (objects and arrays
/// each count one). A byte scan with a counter: no recursion, no allocation; brackets
/// inside strings (escapes included) do not count. Malformed input is left to the
/// parser.
pub fn json_too_deep(bytes: &[u8], max: usize) -> bool {
    keel_workflows::input_too_deep(bytes, max)
}

fn invalid(detail: String) -> Problem {
    Problem::bad_request("INVALID_FIELD", detail)
}

/// Validates and deserializes a body (see [`JsonBody`]).
///
/// # Errors
/// A [`Problem`] naming the broken rule (and at most a field name of `T`'s schema).
pub fn parse_body<T: RequestBody>(bytes: &[u8]) -> Result<T, Problem> {
    if json_too_deep(bytes, MAX_JSON_DEPTH) {
        return Err(Problem::bad_request(
            "JSON_TOO_DEEP",
            format!("the request body is nested deeper than {MAX_JSON_DEPTH} levels"),
        ));
    }
    let value: Value = serde_json::from_slice(bytes).map_err(|_| {
        Problem::bad_request("MALFORMED_JSON", "the request body is not valid JSON")
    })?;
    let Value::Object(members) = &value else {
        return Err(invalid("the request body must be a JSON object".to_owned()));
    };
    if members
        .keys()
        .any(|k| !T::FIELDS.iter().any(|f| f.name == k.as_str()))
    {
        let accepted: Vec<&str> = T::FIELDS.iter().map(|f| f.name).collect();
        let detail = if accepted.is_empty() {
            "the request body accepts no fields".to_owned()
        } else {
            format!(
                "the request body has a field this endpoint does not accept (accepted: {})",
                accepted.join(", ")
            )
        };
        return Err(Problem::bad_request("UNKNOWN_FIELD", detail));
    }
    for f in T::FIELDS {
        let name = f.name;
        let Some(v) = members.get(name) else {
            if f.kind == FieldKind::OptionalAddress {
                continue;
            }
            return Err(invalid(format!("field `{name}`: is required")));
        };
        match f.kind {
            FieldKind::Text => {
                if !v.is_string() {
                    return Err(invalid(format!("field `{name}`: must be a string")));
                }
            }
            FieldKind::Decimal => {
                if !v.is_string() {
                    return Err(invalid(format!(
                        "field `{name}`: must be a decimal string such as \"12.5\" (JSON numbers are refused to avoid precision loss)"
                    )));
                }
            }
            FieldKind::OptionalAddress if v.is_null() => {}
            FieldKind::Address | FieldKind::OptionalAddress => match v.as_str() {
                Some(s) => {
                    parse_address(s, name)?;
                }
                None => {
                    return Err(invalid(format!(
                        "field `{name}`: must be an address string"
                    )));
                }
            },
            FieldKind::Decimals => match v.as_number().and_then(crate::dto::integral_u64) {
                Some(d) if d <= u64::from(u8::MAX) => {}
                Some(_) => {
                    return Err(Problem::new(
                        StatusCode::UNPROCESSABLE_ENTITY,
                        "DECIMALS_OUT_OF_RANGE",
                        format!("field `{name}`: must be an integer from 0 to 36"),
                    ));
                }
                None => {
                    return Err(invalid(format!(
                        "field `{name}`: must be an integer from 0 to 36"
                    )));
                }
            },
        }
    }
    // Deserialize from the bytes (not the parsed value) so duplicate members are refused.
    serde_json::from_slice(bytes)
        .map_err(|_| invalid("the request body does not match the schema".to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dto::{CreateAssetRequest, EmptyRequest, TokenAmountRequest};

    #[test]
    fn depth_scan_counts_containers_outside_strings() {
        let deep = "[".repeat(65) + &"]".repeat(65);
        assert!(json_too_deep(deep.as_bytes(), 64));
        let ok = "[".repeat(64) + &"]".repeat(64);
        assert!(!json_too_deep(ok.as_bytes(), 64));
        let in_string = format!("{{\"a\":\"{}\\\"{}\"}}", "[".repeat(100), "{".repeat(100));
        assert!(!json_too_deep(in_string.as_bytes(), 64));
        // A million levels: no stack overflow, refused early.
        let huge = "[".repeat(1_000_000);
        assert!(json_too_deep(huge.as_bytes(), 64));
    }

    #[test]
    fn prefer_wait_is_lenient() {
        let mut h = HeaderMap::new();
        h.append("prefer", "respond-async, wait=5".parse().unwrap());
        assert_eq!(prefer_wait(&h), Some(5));
        let mut h = HeaderMap::new();
        h.append("prefer", "wait=abc".parse().unwrap());
        h.append("prefer", "WAIT = \"7\"; foo".parse().unwrap());
        assert_eq!(prefer_wait(&h), Some(7));
        let mut h = HeaderMap::new();
        h.append("prefer", "wait=-1, wait".parse().unwrap());
        assert_eq!(prefer_wait(&h), None);
        let mut h = HeaderMap::new();
        h.append("prefer", "wait=99999999999999999999999".parse().unwrap());
        assert_eq!(prefer_wait(&h), Some(u64::MAX));
    }

    #[test]
    fn bodies_are_checked_field_by_field() {
        let code = |r: Result<CreateAssetRequest, Problem>| r.unwrap_err().code;
        let ok = br#"{"name":"A","symbol":"A","decimals":6,"templateId":"t","initialPrice":"1"}"#;
        assert!(parse_body::<CreateAssetRequest>(ok).is_ok());
        assert_eq!(
            code(parse_body(
                br#"{"name":"A","symbol":"A","decimals":6,"templateId":"t","initialPrice":1}"#
            )),
            "INVALID_FIELD"
        );
        assert_eq!(
            code(parse_body(
                br#"{"name":"A","symbol":"A","decimals":300,"templateId":"t","initialPrice":"1"}"#
            )),
            "DECIMALS_OUT_OF_RANGE"
        );
        assert_eq!(
            code(parse_body(
                br#"{"name":"A","name":"B","symbol":"A","decimals":6,"templateId":"t","initialPrice":"1"}"#
            )),
            "INVALID_FIELD"
        );
        assert_eq!(code(parse_body(br#"{"x":1}"#)), "UNKNOWN_FIELD");
        assert_eq!(code(parse_body(b"[1]")), "INVALID_FIELD");
        assert_eq!(code(parse_body(b"{")), "MALFORMED_JSON");
        let r = parse_body::<TokenAmountRequest>(br#"{"recipient":"0x12","amount":"1"}"#);
        assert_eq!(r.unwrap_err().code, "INVALID_ADDRESS");
        assert!(parse_body::<EmptyRequest>(b"{}").is_ok());
        assert_eq!(
            parse_body::<EmptyRequest>(br#"{"a":null}"#)
                .unwrap_err()
                .code,
            "UNKNOWN_FIELD"
        );
    }

    #[test]
    fn addresses_check_eip55_when_mixed_case() {
        let good = "0x70997970C51812dc3A010C7d01b50e0d17dc79C8";
        assert!(parse_address(good, "recipient").is_ok());
        assert!(parse_address(&good.to_lowercase(), "recipient").is_ok());
        let bad = "0x70997970c51812dc3A010C7d01b50e0d17dc79C8";
        assert!(parse_address(bad, "recipient").is_err());
        assert!(parse_address("70997970c51812dc3a010c7d01b50e0d17dc79c8", "r").is_err());
        assert!(is_json_media_type("application/json; charset=utf-8"));
        assert!(is_json_media_type("application/merge-patch+json"));
        assert!(!is_json_media_type("text/plain"));
    }
}
