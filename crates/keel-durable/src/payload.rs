//! Input bounds, checked before any lock or write.
//!
//! - Payloads (start inputs, signal payloads) are at most `max_payload_bytes` of compact
//!   UTF-8 JSON (default [`DEFAULT_MAX_PAYLOAD_BYTES`], minimum
//!   [`MIN_MAX_PAYLOAD_BYTES`]) and at most [`MAX_DEPTH`] levels deep, where every object
//!   and array counts as one level. Values exactly at a bound pass.
//! - Names and keys (workflow names, idempotency, serialization and dedupe keys, signal
//!   and step names) are 1 to [`MAX_NAME_CHARS`] characters.
//!
//! The validators never recurse and stop as soon as a bound is crossed, so a deeply
//! nested or oversized value is refused without a stack overflow and without being
//! encoded in full. Errors name the bound, never the value.

use serde_json::Value;

/// Default payload bound in bytes (256 KiB).
pub const DEFAULT_MAX_PAYLOAD_BYTES: usize = 262_144;
/// The smallest payload bound a configuration may set.
pub const MIN_MAX_PAYLOAD_BYTES: usize = 1_024;
/// Maximum nesting depth of a payload (objects and arrays each count one level).
pub const MAX_DEPTH: usize = 64;
/// Maximum length of a name or key, in characters.
pub const MAX_NAME_CHARS: usize = 255;

/// A refused input. `what` names the field (`input`, `signal payload`,
/// `idempotency key`, ...); the value is never included.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BoundError {
    /// Over `maxPayloadBytes`.
    #[error("{what} exceeds maxPayloadBytes ({limit} bytes)")]
    TooLarge {
        /// Which field.
        what: &'static str,
        /// The bound, in bytes.
        limit: usize,
    },
    /// Nested deeper than [`MAX_DEPTH`].
    #[error("{what} is nested deeper than {limit} levels")]
    TooDeep {
        /// Which field.
        what: &'static str,
        /// The bound ([`MAX_DEPTH`]).
        limit: usize,
    },
    /// Empty, or longer than [`MAX_NAME_CHARS`] characters.
    #[error("{what} must be 1 to {limit} characters")]
    BadName {
        /// Which field.
        what: &'static str,
        /// The bound ([`MAX_NAME_CHARS`]).
        limit: usize,
    },
    /// Not valid JSON.
    #[error("{what} is not valid JSON")]
    NotJson {
        /// Which field.
        what: &'static str,
    },
}

/// Checks a name or key: 1 to [`MAX_NAME_CHARS`] characters.
///
/// # Errors
/// [`BoundError::BadName`] naming `what`.
pub fn validate_name(what: &'static str, value: &str) -> Result<(), BoundError> {
    // Byte length bounds the char count from above: cheap fast path.
    let ok = !value.is_empty()
        && (value.len() <= MAX_NAME_CHARS || value.chars().count() <= MAX_NAME_CHARS);
    if ok {
        Ok(())
    } else {
        Err(BoundError::BadName {
            what,
            limit: MAX_NAME_CHARS,
        })
    }
}

/// Compact-JSON encoded length of a string, quotes included (serde_json's escaping).
fn encoded_str_len(s: &str) -> usize {
    let mut n = 2;
    for b in s.bytes() {
        n += match b {
            b'"' | b'\\' | b'\n' | b'\r' | b'\t' | 0x08 | 0x0c => 2,
            0..=0x1f => 6,
            _ => 1,
        };
    }
    n
}

/// Checks a JSON value against the size and depth bounds without recursion and without
/// encoding it: the encoded size is counted while walking and the walk stops at the
/// first crossed bound. Size is that of the compact encoding (`serde_json::to_vec`).
///
/// # Errors
/// [`BoundError::TooLarge`] or [`BoundError::TooDeep`] naming `what`.
pub fn validate_value(
    what: &'static str,
    value: &Value,
    max_bytes: usize,
) -> Result<(), BoundError> {
    enum Frame<'a> {
        Arr(std::slice::Iter<'a, Value>),
        Obj(serde_json::map::Iter<'a>),
    }
    let too_large = BoundError::TooLarge {
        what,
        limit: max_bytes,
    };
    let mut size: usize = 0;
    let mut stack: Vec<Frame<'_>> = Vec::new();
    // Visits one value: scalars add their size; containers push a frame.
    let mut next: Option<&Value> = Some(value);
    loop {
        if let Some(v) = next.take() {
            match v {
                Value::Null => size += 4,
                Value::Bool(b) => size += if *b { 4 } else { 5 },
                Value::Number(n) => size += n.to_string().len(),
                Value::String(s) => size += encoded_str_len(s),
                Value::Array(a) => {
                    if stack.len() + 1 > MAX_DEPTH {
                        return Err(BoundError::TooDeep {
                            what,
                            limit: MAX_DEPTH,
                        });
                    }
                    // brackets + commas
                    size += 2 + a.len().saturating_sub(1);
                    stack.push(Frame::Arr(a.iter()));
                }
                Value::Object(o) => {
                    if stack.len() + 1 > MAX_DEPTH {
                        return Err(BoundError::TooDeep {
                            what,
                            limit: MAX_DEPTH,
                        });
                    }
                    // braces + commas + one colon per member
                    size += 2 + o.len().saturating_sub(1) + o.len();
                    stack.push(Frame::Obj(o.iter()));
                }
            }
            if size > max_bytes {
                return Err(too_large);
            }
        }
        let Some(top) = stack.last_mut() else {
            return Ok(());
        };
        match top {
            Frame::Arr(it) => match it.next() {
                Some(v) => next = Some(v),
                None => {
                    stack.pop();
                }
            },
            Frame::Obj(it) => match it.next() {
                Some((k, v)) => {
                    size += encoded_str_len(k);
                    next = Some(v);
                }
                None => {
                    stack.pop();
                }
            },
        }
    }
}

/// Checks raw JSON text before parsing it: its byte length against `max_bytes` and its
/// nesting against [`MAX_DEPTH`] by a single scan (no recursion, no allocation), then
/// parses it. The size bound applies to the text as given (whitespace included).
///
/// Use this for payloads that arrive as text (the HTTP API): a 1 MB, deeply nested
/// document is refused before the parser sees it.
///
/// Whether `bytes`, read as JSON, nests deeper than `max` levels (objects and arrays
/// each count one). A byte scan with a counter: no recursion, no allocation; brackets
/// inside strings (escapes included) do not count. Malformed input is left to the
/// parser.
pub fn json_depth_exceeds(bytes: &[u8], max: usize) -> bool {
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    for &b in bytes {
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > max {
                    return true;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    false
}

/// # Errors
/// [`BoundError::TooLarge`], [`BoundError::TooDeep`] or [`BoundError::NotJson`].
pub fn validate_payload_str(
    what: &'static str,
    text: &str,
    max_bytes: usize,
) -> Result<Value, BoundError> {
    if text.len() > max_bytes {
        return Err(BoundError::TooLarge {
            what,
            limit: max_bytes,
        });
    }
    if json_depth_exceeds(text.as_bytes(), MAX_DEPTH) {
        return Err(BoundError::TooDeep {
            what,
            limit: MAX_DEPTH,
        });
    }
    serde_json::from_str(text).map_err(|_| BoundError::NotJson { what })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn nested(depth: usize) -> Value {
        let mut v = json!(1);
        for _ in 0..depth {
            v = json!([v]);
        }
        v
    }

    #[test]
    fn size_matches_compact_encoding() {
        let samples = [
            json!(null),
            json!({"a": [1, 2.5, -3, true, false, null], "b\"\n\u{1}": "x\\y\té"}),
            json!([[], {}, "", [{}]]),
            json!({"k": {"n": 12345678901234567890u64}}),
        ];
        for v in samples {
            let len = serde_json::to_vec(&v).unwrap().len();
            assert!(validate_value("input", &v, len).is_ok(), "{v}");
            assert_eq!(
                validate_value("input", &v, len - 1),
                Err(BoundError::TooLarge {
                    what: "input",
                    limit: len - 1
                }),
                "{v}"
            );
        }
    }

    #[test]
    fn depth_at_and_over_the_limit() {
        assert!(validate_value("input", &nested(64), 1 << 20).is_ok());
        assert!(matches!(
            validate_value("input", &nested(65), 1 << 20),
            Err(BoundError::TooDeep { limit: 64, .. })
        ));
        let text_ok = format!("{}1{}", "[".repeat(64), "]".repeat(64));
        assert!(validate_payload_str("input", &text_ok, 1 << 20).is_ok());
        let text_deep = format!("{}1{}", "[".repeat(65), "]".repeat(65));
        assert!(matches!(
            validate_payload_str("input", &text_deep, 1 << 20),
            Err(BoundError::TooDeep { .. })
        ));
        // brackets inside strings do not count
        let in_string = format!("[\"{}\"]", "[".repeat(100));
        assert!(validate_payload_str("input", &in_string, 1 << 20).is_ok());
    }

    #[test]
    fn megabyte_of_nesting_is_refused_without_overflow() {
        let text = "[".repeat(1 << 20);
        assert!(matches!(
            validate_payload_str("input", &text, 2 << 20),
            Err(BoundError::TooDeep { .. })
        ));
        assert!(matches!(
            validate_payload_str("input", &text, DEFAULT_MAX_PAYLOAD_BYTES),
            Err(BoundError::TooLarge { .. })
        ));
        let err = validate_payload_str("input", "{\"secret\": ", 100).unwrap_err();
        assert!(!err.to_string().contains("secret"));
    }

    #[test]
    fn names() {
        assert!(validate_name("key", &"k".repeat(255)).is_ok());
        assert!(validate_name("key", &"é".repeat(255)).is_ok());
        assert!(validate_name("key", &"k".repeat(256)).is_err());
        assert!(validate_name("key", "").is_err());
    }
}
