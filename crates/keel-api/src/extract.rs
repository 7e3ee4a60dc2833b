//! Request extraction: authentication, headers, path ids, query strings and JSON bodies,
//! each refusing bad input with a [`Problem`] (never a panic, never a 500, never a
//! value of the request in the answer).

use crate::ApiState;
use crate::problem::Problem;
use alloy_primitives::Address;
use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Path, Request};
use axum::http::{HeaderMap, StatusCode, header, request::Parts};
use keel_workflows::{Caller, Credential};
use serde::de::{DeserializeOwned, IgnoredAny};
use serde_json::Value;
use uuid::Uuid;

/// Maximum nesting depth of a request body; every object and array counts one level
/// (the operations service's input bound, [`keel_workflows::MAX_INPUT_DEPTH`]).
pub const MAX_JSON_DEPTH: usize = keel_workflows::MAX_INPUT_DEPTH;

/// The authenticated caller (`Authorization: Bearer <api key>`), whose key holds the
/// route's scope: authenticated and checked by the authorization layer
/// ([`crate::scope::authorize`]) before any extractor runs.
#[derive(Debug, Clone, Copy)]
pub struct Authed(pub Caller);

impl<S: Send + Sync> FromRequestParts<S> for Authed {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Problem> {
        Authorized::from_request_parts(parts, state)
            .await
            .map(|Authorized(c)| Self(c.caller))
    }
}

/// The authenticated caller with its key's scopes (see [`Authed`]).
#[derive(Debug, Clone, Copy)]
pub struct Authorized(pub Credential);

impl<S: Send + Sync> FromRequestParts<S> for Authorized {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Problem> {
        // Absent only on a route `scope::ROUTES` calls public: a server bug, refused.
        parts
            .extensions
            .get::<Credential>()
            .copied()
            .map(Self)
            .ok_or_else(|| {
                tracing::error!("a public route asked for the caller; refusing");
                Problem::internal()
            })
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
    /// ERC-20 decimals: an integer (0 to 36; larger values are refused with
    /// `DECIMALS_OUT_OF_RANGE`).
    Decimals,
    /// A non-negative integer (an integral JSON number such as `60` or `60.0`); its
    /// range is the handler's or service's rule (`422 INVALID_FIELD`).
    UnsignedInteger,
    /// An array of at most `max_items` strings (which strings, the handler decides).
    TextList {
        /// The most elements accepted.
        max_items: usize,
    },
    /// `true` or `false`.
    Bool,
    /// A JSON object whose members the handler reads itself (kept as its raw text,
    /// copied once, never as a tree of values; e.g. a user operation, whose own
    /// deserializer refuses its unknown and duplicate members).
    Object,
}

impl FieldKind {
    /// Whether a string value is this kind's JSON type (and must be kept).
    fn wants_text(self) -> bool {
        matches!(self, Self::Text | Self::Decimal | Self::Address)
    }
}

/// A field of a request body's schema.
#[derive(Debug, Clone, Copy)]
pub struct Field {
    /// The JSON name.
    pub name: &'static str,
    /// Its kind.
    pub kind: FieldKind,
}

/// A request body type: its fields, which of them may be absent, and whether an empty
/// body means `{}`.
///
/// A new body type implements this next to its DTO: list every member in `FIELDS`
/// (the order is the order in which problems are reported) and the optional ones in
/// `OPTIONAL`; the DTO's `Deserialize` then only sees values of the listed kinds.
pub trait RequestBody: DeserializeOwned {
    /// Every field the body accepts; each is required unless named in `OPTIONAL`.
    const FIELDS: &'static [Field];
    /// The fields of `FIELDS` that may be absent (or `null`).
    const OPTIONAL: &'static [&'static str] = &[];
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
            kind: FieldKind::Address,
        },
    ];
    const OPTIONAL: &'static [&'static str] = &["from"];
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

impl RequestBody for crate::dto::CreateApiKeyRequest {
    const FIELDS: &'static [Field] = &[
        Field {
            name: "label",
            kind: FieldKind::Text,
        },
        Field {
            name: "scopes",
            kind: FieldKind::TextList {
                max_items: crate::dto::MAX_SCOPES_PER_KEY,
            },
        },
        Field {
            name: "issuedTo",
            kind: FieldKind::Text,
        },
    ];
    const OPTIONAL: &'static [&'static str] = &["issuedTo"];
}

impl RequestBody for crate::dto::RotateApiKeyRequest {
    const FIELDS: &'static [Field] = &[Field {
        name: "expiresInSeconds",
        kind: FieldKind::UnsignedInteger,
    }];
    const OPTIONAL: &'static [&'static str] = &["expiresInSeconds"];
    const EMPTY_ALLOWED: bool = true;
}

/// A validated JSON request body of type `T`.
///
/// Checks the body limit (`413 PAYLOAD_TOO_LARGE`) and the media type
/// (`415 UNSUPPORTED_MEDIA_TYPE`), then [`parse_body`]: depth, syntax, shape, unknown
/// and duplicate members, each field's kind — in one streaming pass that never builds
/// a `serde_json::Value` of the body.
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
        let RawBody(bytes) = RawBody::from_request(req, state).await?;
        if bytes.is_empty() && T::EMPTY_ALLOWED {
            return parse_body::<T>(b"{}").map(Self);
        }
        if is_json != Some(true) {
            return Err(unsupported_media_type());
        }
        parse_body::<T>(&bytes).map(Self)
    }
}

/// A request body as bytes, read within the body limit: over
/// [`crate::ApiConfig::max_body_bytes`] → `413 PAYLOAD_TOO_LARGE` (a problem, as every
/// other refusal), unreadable → `400 MALFORMED_BODY`. [`JsonBody`] reads through it;
/// routes whose body is not a JSON object of a schema (a JSON-RPC request, a signed
/// provider webhook verified over its raw bytes) take it directly.
#[derive(Debug, Clone)]
pub struct RawBody(pub Bytes);

impl FromRequest<ApiState> for RawBody {
    type Rejection = Problem;

    async fn from_request(req: Request, state: &ApiState) -> Result<Self, Problem> {
        Bytes::from_request(req, state)
            .await
            .map(Self)
            .map_err(|e| {
                if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                    crate::metrics::body_too_large();
                    payload_too_large(state.config().max_body_bytes)
                } else {
                    Problem::bad_request("MALFORMED_BODY", "the request body could not be read")
                }
            })
    }
}

/// `413 PAYLOAD_TOO_LARGE` for a body over `limit` bytes.
pub fn payload_too_large(limit: usize) -> Problem {
    Problem::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "PAYLOAD_TOO_LARGE",
        format!("the request body exceeds {limit} bytes"),
    )
}

/// Refuses a request whose `Content-Type` is not JSON (`application/json` or
/// `application/<anything>+json`, parameters allowed; RFC 6839 for the `+json` suffix).
///
/// # Errors
/// `415 UNSUPPORTED_MEDIA_TYPE` when the header is missing or names another type.
pub fn require_json(headers: &HeaderMap) -> Result<(), Problem> {
    let is_json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(is_json_media_type);
    if is_json {
        Ok(())
    } else {
        Err(unsupported_media_type())
    }
}

fn unsupported_media_type() -> Problem {
    Problem::new(
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "UNSUPPORTED_MEDIA_TYPE",
        "the request body must be application/json",
    )
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

/// What the scan kept of one member's value: the value itself for the JSON types its
/// field accepts (a string, a number, a short list of strings), else only that it was
/// something else.
#[derive(Debug)]
enum Seen {
    /// `null`.
    Null,
    /// A number.
    Number(serde_json::Number),
    /// A string, for a field that takes one.
    Text(String),
    /// An array of strings within the field's bound, for a field that takes one.
    TextList(Vec<String>),
    /// A boolean.
    Bool(bool),
    /// A member's raw text, for a field that takes an object.
    Object(Box<serde_json::value::RawValue>),
    /// Any other value (skipped without being kept).
    Other,
}

/// The result of one pass over a body: flags for the object as a whole and, per field
/// of the schema, what its member held and whether it appeared more than once. Its
/// size depends on the schema only, never on the body.
#[derive(Debug)]
struct Scan {
    fields: &'static [Field],
    not_object: bool,
    unknown: bool,
    repeated: Vec<bool>,
    slots: Vec<Option<Seen>>,
}

impl Scan {
    fn new(fields: &'static [Field]) -> Self {
        Self {
            fields,
            not_object: false,
            unknown: false,
            repeated: vec![false; fields.len()],
            slots: fields.iter().map(|_| None).collect(),
        }
    }
}

/// Visits the top-level value: an object's members are matched against the schema
/// (unknown and repeated names are flagged, their values skipped); anything else is
/// flagged and skipped. Never fails on content: only the parser's syntax errors end the
/// pass, so every problem is judged after the whole body parsed.
struct TopVisitor<'a>(&'a mut Scan);

impl<'de> serde::de::Visitor<'de> for TopVisitor<'_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let scan = self.0;
        while let Some(index) = map.next_key_seed(KeySeed(scan.fields))? {
            match index {
                None => {
                    scan.unknown = true;
                    map.next_value::<IgnoredAny>()?;
                }
                Some(i) if scan.slots[i].is_some() => {
                    scan.repeated[i] = true;
                    map.next_value::<IgnoredAny>()?;
                }
                Some(i) if scan.fields[i].kind == FieldKind::Object => {
                    // The raw text of the member (any JSON value); its kind is judged
                    // after the pass.
                    let raw = map.next_value::<Box<serde_json::value::RawValue>>()?;
                    scan.slots[i] = Some(if raw.get() == "null" {
                        Seen::Null
                    } else {
                        Seen::Object(raw)
                    });
                }
                Some(i) => {
                    let seen = map.next_value_seed(ValueSeed(scan.fields[i].kind))?;
                    scan.slots[i] = Some(seen);
                }
            }
        }
        Ok(())
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        self.0.not_object = true;
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(())
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        self.0.not_object = true;
        Ok(())
    }

    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        self.0.not_object = true;
        Ok(())
    }

    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        self.0.not_object = true;
        Ok(())
    }

    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        self.0.not_object = true;
        Ok(())
    }

    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        self.0.not_object = true;
        Ok(())
    }

    fn visit_unit<E>(self) -> Result<(), E> {
        self.0.not_object = true;
        Ok(())
    }
}

/// A member name → the index of its field in the schema (`None`: not in it). The name
/// is compared where the parser holds it, never copied.
struct KeySeed(&'static [Field]);

impl<'de> serde::de::DeserializeSeed<'de> for KeySeed {
    type Value = Option<usize>;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Option<usize>, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> serde::de::Visitor<'de> for KeySeed {
    type Value = Option<usize>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a member name")
    }

    fn visit_str<E>(self, name: &str) -> Result<Option<usize>, E> {
        Ok(self.0.iter().position(|f| f.name == name))
    }
}

/// One member's value, kept only when it has a JSON type `.0` accepts.
struct ValueSeed(FieldKind);

impl<'de> serde::de::DeserializeSeed<'de> for ValueSeed {
    type Value = Seen;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Seen, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for ValueSeed {
    type Value = Seen;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_unit<E>(self) -> Result<Seen, E> {
        Ok(Seen::Null)
    }

    fn visit_bool<E>(self, b: bool) -> Result<Seen, E> {
        Ok(if self.0 == FieldKind::Bool {
            Seen::Bool(b)
        } else {
            Seen::Other
        })
    }

    fn visit_i64<E>(self, n: i64) -> Result<Seen, E> {
        Ok(Seen::Number(n.into()))
    }

    fn visit_u64<E>(self, n: u64) -> Result<Seen, E> {
        Ok(Seen::Number(n.into()))
    }

    fn visit_f64<E>(self, n: f64) -> Result<Seen, E> {
        Ok(serde_json::Number::from_f64(n).map_or(Seen::Other, Seen::Number))
    }

    fn visit_str<E>(self, s: &str) -> Result<Seen, E> {
        Ok(if self.0.wants_text() {
            Seen::Text(s.to_owned())
        } else {
            Seen::Other
        })
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Seen, A::Error> {
        let FieldKind::TextList { max_items } = self.0 else {
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            return Ok(Seen::Other);
        };
        let mut items = Vec::new();
        let mut fits = true;
        while let Some(item) = seq.next_element_seed(ListItemSeed)? {
            match item {
                Some(s) if fits && items.len() < max_items => items.push(s),
                _ => fits = false,
            }
        }
        Ok(if fits {
            Seen::TextList(items)
        } else {
            Seen::Other
        })
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Seen, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Seen::Other)
    }
}

/// An element of a string list: the string, or `None` (skipped) for anything else.
struct ListItemSeed;

impl<'de> serde::de::DeserializeSeed<'de> for ListItemSeed {
    type Value = Option<String>;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Option<String>, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for ListItemSeed {
    type Value = Option<String>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_str<E>(self, s: &str) -> Result<Option<String>, E> {
        // Bounded: `max_items` strings are kept at most, each no longer than the body.
        Ok(Some(s.to_owned()))
    }

    fn visit_unit<E>(self) -> Result<Option<String>, E> {
        Ok(None)
    }

    fn visit_bool<E>(self, _: bool) -> Result<Option<String>, E> {
        Ok(None)
    }

    fn visit_i64<E>(self, _: i64) -> Result<Option<String>, E> {
        Ok(None)
    }

    fn visit_u64<E>(self, _: u64) -> Result<Option<String>, E> {
        Ok(None)
    }

    fn visit_f64<E>(self, _: f64) -> Result<Option<String>, E> {
        Ok(None)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(
        self,
        mut seq: A,
    ) -> Result<Option<String>, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(None)
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(
        self,
        mut map: A,
    ) -> Result<Option<String>, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(None)
    }
}

/// What `T`'s `Deserialize` is given for one member, as JSON text: a checked small
/// value, or the raw text of an object member.
enum Member {
    Json(String),
    Raw(Box<serde_json::value::RawValue>),
}

impl Member {
    fn text(&self) -> &str {
        match self {
            Self::Json(t) => t,
            Self::Raw(raw) => raw.get(),
        }
    }
}

/// Checks one present member against its field's kind; the value, when it passes, as
/// `T`'s `Deserialize` is given it.
fn check_field(f: &Field, seen: Seen) -> Result<Member, Problem> {
    let name = f.name;
    match (f.kind, seen) {
        (FieldKind::Object, Seen::Object(raw)) if raw.get().trim_start().starts_with('{') => {
            Ok(Member::Raw(raw))
        }
        (FieldKind::Object, _) => Err(invalid(format!("field `{name}`: must be a JSON object"))),
        (FieldKind::Bool, Seen::Bool(b)) => Ok(Member::Json(b.to_string())),
        (FieldKind::Bool, _) => Err(invalid(format!("field `{name}`: must be true or false"))),
        (_, seen) => check_scalar(f, seen).map(|v| Member::Json(v.to_string())),
    }
}

fn check_scalar(f: &Field, seen: Seen) -> Result<Value, Problem> {
    let name = f.name;
    match (f.kind, seen) {
        (FieldKind::Text | FieldKind::Decimal | FieldKind::Address, Seen::Text(s)) => {
            if f.kind == FieldKind::Address {
                parse_address(&s, name)?;
            }
            Ok(Value::String(s))
        }
        (FieldKind::Text, _) => Err(invalid(format!("field `{name}`: must be a string"))),
        (FieldKind::Decimal, _) => Err(invalid(format!(
            "field `{name}`: must be a decimal string such as \"12.5\" (JSON numbers are refused to avoid precision loss)"
        ))),
        (FieldKind::Address, _) => Err(invalid(format!(
            "field `{name}`: must be an address string"
        ))),
        (FieldKind::Decimals, seen) => {
            let n = match seen {
                Seen::Number(n) => Some(n),
                _ => None,
            };
            match n.as_ref().and_then(crate::dto::integral_u64) {
                Some(d) if d <= u64::from(u8::MAX) => Ok(Value::from(d)),
                Some(_) => Err(Problem::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "DECIMALS_OUT_OF_RANGE",
                    format!("field `{name}`: must be an integer from 0 to 36"),
                )),
                None => Err(invalid(format!(
                    "field `{name}`: must be an integer from 0 to 36"
                ))),
            }
        }
        (FieldKind::UnsignedInteger, Seen::Number(n)) => crate::dto::integral_u64(&n)
            .map(Value::from)
            .ok_or_else(|| invalid(format!("field `{name}`: must be a non-negative integer"))),
        (FieldKind::UnsignedInteger, _) => Err(invalid(format!(
            "field `{name}`: must be a non-negative integer"
        ))),
        (FieldKind::TextList { .. }, Seen::TextList(items)) => {
            Ok(Value::Array(items.into_iter().map(Value::String).collect()))
        }
        (FieldKind::TextList { max_items }, _) => Err(invalid(format!(
            "field `{name}`: must be an array of at most {max_items} strings"
        ))),
        // Judged by `check_field`.
        (FieldKind::Bool | FieldKind::Object, _) => {
            Err(invalid(format!("field `{name}`: has the wrong JSON type")))
        }
    }
}

/// Validates and deserializes a body (see [`JsonBody`]) in one streaming pass: no
/// `serde_json::Value` of the body is ever built. What is kept is bounded by the
/// schema — per field at most its own value (a string, a number, a short list of
/// strings) — so a body of any size costs at most about its own length in memory
/// (a long string member is copied once), never a tree of its values.
///
/// Order of the checks (the first that fails answers; each is judged on the whole
/// body, so the answer never depends on member order): nesting depth
/// (`JSON_TOO_DEEP`, a byte scan before parsing), UTF-8 and syntax
/// (`MALFORMED_JSON`), a top-level object (`INVALID_FIELD`), members the schema does
/// not define (`UNKNOWN_FIELD`), a member that appears more than once
/// (`INVALID_FIELD`, naming it — whatever the values of its copies), then each field
/// in the schema's order: presence and JSON kind (`INVALID_FIELD`), address form
/// (`422 INVALID_ADDRESS`), decimals range (`422 DECIMALS_OUT_OF_RANGE`). A member
/// whose value has the wrong JSON type is refused as such without its content being
/// kept (objects nested in it are not inspected: the schemas define no nested
/// objects).
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
    let malformed = || Problem::bad_request("MALFORMED_JSON", "the request body is not valid JSON");
    // JSON text is UTF-8 (RFC 8259 §8.1), skipped strings included.
    let text = std::str::from_utf8(bytes).map_err(|_| malformed())?;
    let mut scan = Scan::new(T::FIELDS);
    let mut de = serde_json::Deserializer::from_str(text);
    serde::Deserializer::deserialize_any(&mut de, TopVisitor(&mut scan))
        .and_then(|()| de.end())
        .map_err(|_| malformed())?;
    if scan.not_object {
        return Err(invalid("the request body must be a JSON object".to_owned()));
    }
    if scan.unknown {
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
    if let Some(f) = T::FIELDS
        .iter()
        .zip(&scan.repeated)
        .find_map(|(f, r)| r.then_some(f))
    {
        return Err(invalid(format!(
            "field `{}`: appears more than once (duplicate members are refused)",
            f.name
        )));
    }
    // The checked members as one small JSON text (an object member's raw text is
    // spliced in, not parsed into a tree), read by `T`'s `Deserialize`.
    let mut members = Vec::with_capacity(T::FIELDS.len());
    for (f, slot) in T::FIELDS.iter().zip(scan.slots) {
        let optional = T::OPTIONAL.contains(&f.name);
        let member = match slot {
            None | Some(Seen::Null) if optional => continue,
            None => return Err(invalid(format!("field `{}`: is required", f.name))),
            Some(seen) => check_field(f, seen)?,
        };
        members.push((f.name, member));
    }
    // Sized once: a raw member is copied into it exactly once.
    let size: usize = members
        .iter()
        .map(|(name, m)| name.len() + 4 + m.text().len())
        .sum();
    let mut text = String::with_capacity(size + 2);
    text.push('{');
    for (name, member) in members {
        if text.len() > 1 {
            text.push(',');
        }
        text.push('"');
        text.push_str(name);
        text.push_str("\":");
        text.push_str(member.text());
    }
    text.push('}');
    serde_json::from_str(&text)
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

    /// A duplicate member answers the same problem whichever copy is first and whatever
    /// the copies hold (a refused value first and an accepted one last included), in
    /// every body type; a member unknown to the schema stays unknown when repeated.
    #[test]
    fn duplicates_answer_the_same_in_any_order() {
        fn answer<T: RequestBody + std::fmt::Debug>(body: &str) -> Problem {
            parse_body::<T>(body.as_bytes()).unwrap_err()
        }
        let asset = r#""symbol":"A","decimals":6,"templateId":"t","initialPrice":"1""#;
        let a = [
            format!(r#"{{"name":"A","name":"B",{asset}}}"#),
            format!(r#"{{"name":5,"name":"A",{asset}}}"#),
            format!(r#"{{"name":"A",{asset},"name":5}}"#),
            format!(r#"{{"name":"A",{asset},"name":{{"d":1,"d":2}}}}"#),
            format!(r#"{{"name":"A","name":"A",{asset}}}"#),
        ];
        let first = answer::<CreateAssetRequest>(&a[0]);
        assert_eq!(first.code, "INVALID_FIELD");
        assert!(first.detail.contains("`name`: appears more than once"));
        for body in &a {
            assert_eq!(answer::<CreateAssetRequest>(body), first, "{body}");
        }
        let d = [
            format!(r#"{{"name":"A",{asset},"decimals":300}}"#),
            format!(r#"{{"decimals":300,"name":"A",{asset}}}"#),
        ];
        for body in &d {
            let p = answer::<CreateAssetRequest>(body);
            assert!(
                p.detail.contains("`decimals`: appears more than once"),
                "{body}"
            );
        }
        let t = [
            r#"{"recipient":"0x12","amount":"1","recipient":"0x70997970C51812dc3A010C7d01b50e0d17dc79C8"}"#,
            r#"{"amount":"1","recipient":"0x70997970C51812dc3A010C7d01b50e0d17dc79C8","recipient":"0x12"}"#,
        ];
        assert_eq!(
            answer::<TokenAmountRequest>(t[0]),
            answer::<TokenAmountRequest>(t[1])
        );
        let k = [
            r#"{"label":"a","scopes":["read"],"scopes":"x"}"#,
            r#"{"scopes":"x","label":"a","scopes":["read"]}"#,
        ];
        let p = answer::<crate::dto::CreateApiKeyRequest>(k[0]);
        assert!(p.detail.contains("`scopes`"), "{p:?}");
        assert_eq!(answer::<crate::dto::CreateApiKeyRequest>(k[1]), p);
        let r = [
            r#"{"expiresInSeconds":1,"expiresInSeconds":null}"#,
            r#"{"expiresInSeconds":null,"expiresInSeconds":1}"#,
        ];
        let p = answer::<crate::dto::RotateApiKeyRequest>(r[0]);
        assert_eq!(p.code, "INVALID_FIELD");
        assert_eq!(answer::<crate::dto::RotateApiKeyRequest>(r[1]), p);
        let e = [r#"{"a":1,"a":2}"#, r#"{"a":2,"a":1}"#];
        assert_eq!(answer::<EmptyRequest>(e[0]).code, "UNKNOWN_FIELD");
        assert_eq!(answer::<EmptyRequest>(e[0]), answer::<EmptyRequest>(e[1]));
        // Unknown members take precedence over duplicates, in any order.
        let u = [
            format!(r#"{{"x":1,"name":"A","name":"B",{asset}}}"#),
            format!(r#"{{"name":"A","name":"B",{asset},"x":1}}"#),
        ];
        for body in &u {
            assert_eq!(answer::<CreateAssetRequest>(body).code, "UNKNOWN_FIELD");
        }
    }

    /// Booleans and object members (webhook endpoints, user operations) are judged by
    /// the same pass: a wrong JSON type names the field, an object member is handed on
    /// as its raw text, and duplicates are refused whatever they hold.
    #[test]
    fn booleans_and_objects_are_checked_by_kind() {
        use crate::user_ops::SubmitUserOperationRequest;
        use crate::webhooks::CreateWebhookEndpointRequest;
        let p = parse_body::<CreateWebhookEndpointRequest>(
            br#"{"url":"https://x","eventTypes":["*"],"enabled":"yes"}"#,
        )
        .unwrap_err();
        assert_eq!(p.code, "INVALID_FIELD");
        assert!(p.detail.contains("`enabled`"), "{p:?}");
        let ok = parse_body::<CreateWebhookEndpointRequest>(
            br#"{"url":"https://x","eventTypes":["*"],"enabled":false,"description":null}"#,
        )
        .unwrap();
        assert_eq!(ok.enabled, Some(false));
        let op = br#"{"chainId":1,"entryPoint":"e","userOperation":{"a": [1, {"b":2}]}}"#;
        let r = parse_body::<SubmitUserOperationRequest>(op).unwrap();
        assert_eq!(r.user_operation.get(), r#"{"a": [1, {"b":2}]}"#);
        for bad in [
            &br#"{"chainId":1,"entryPoint":"e","userOperation":[1]}"#[..],
            br#"{"chainId":1,"entryPoint":"e","userOperation":null}"#,
            br#"{"chainId":1,"entryPoint":"e","userOperation":"x"}"#,
        ] {
            let p = parse_body::<SubmitUserOperationRequest>(bad).unwrap_err();
            assert_eq!(p.code, "INVALID_FIELD");
            assert!(p.detail.contains("`userOperation`"), "{p:?}");
        }
        let dup = br#"{"chainId":1,"entryPoint":"e","userOperation":{},"userOperation":{}}"#;
        let p = parse_body::<SubmitUserOperationRequest>(dup).unwrap_err();
        assert!(p.detail.contains("`userOperation`: appears more than once"));
    }

    #[test]
    fn optional_members_may_be_absent_or_null() {
        use crate::dto::RotateApiKeyRequest;
        for body in [&b"{}"[..], br#"{"expiresInSeconds":null}"#] {
            let r = parse_body::<RotateApiKeyRequest>(body).unwrap();
            assert_eq!(r.expires_in_seconds, None);
        }
        let r = parse_body::<RotateApiKeyRequest>(br#"{"expiresInSeconds":60.0}"#).unwrap();
        assert_eq!(r.expires_in_seconds, Some(60));
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
