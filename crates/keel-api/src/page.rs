//! Cursor pagination shared by every list route (the Stripe shape, camelCase).
//!
//! A list route takes `limit` (1..=[`MAX_LIMIT`], default [`DEFAULT_LIMIT`]) and an
//! optional opaque `cursor`, and answers `{ "data": [...], "hasMore": bool,
//! "nextCursor": string | null }`: pass `nextCursor` back as `cursor` (with the same
//! filters) to get the next page; it is null exactly when `hasMore` is false.
//!
//! A cursor is the keyset position of the last item of a page (whatever the service's
//! keyset type is: e.g. `(created_at, id)` or `(balance, holder)`), serialized as JSON
//! and encoded base64url without padding (RFC 4648 §5). It carries no secret and no
//! authority: the service still scopes every read to the caller's organization.
//! Each list DTO is a concrete struct with these three members (so the OpenAPI
//! document names each list's item schema); [`Page`] builds their values.
//!
//! Errors: a `limit` outside 1..=[`MAX_LIMIT`] → `400 INVALID_QUERY`
//! ([`limit`]); a cursor that does not decode to the route's keyset →
//! `400 INVALID_CURSOR` ([`decode_cursor`]).

use crate::Problem;
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::Serialize;
use serde::de::DeserializeOwned;

/// The page size when `limit` is absent.
pub const DEFAULT_LIMIT: u32 = 50;
/// The largest accepted `limit`.
pub const MAX_LIMIT: u32 = 200;
/// The longest accepted cursor string, bytes (a cursor Keel issues is far shorter).
pub const MAX_CURSOR_LEN: usize = 512;

/// The page size for a `limit` query value: the default when absent.
///
/// # Errors
/// `400 INVALID_QUERY` when `limit` is 0 or above [`MAX_LIMIT`].
pub fn limit(limit: Option<u32>) -> Result<u32, Problem> {
    match limit {
        None => Ok(DEFAULT_LIMIT),
        Some(n) if (1..=MAX_LIMIT).contains(&n) => Ok(n),
        Some(_) => Err(Problem::bad_request(
            "INVALID_QUERY",
            "limit must be between 1 and 200",
        )),
    }
}

/// Encodes a keyset position as an opaque cursor (base64url of its JSON).
pub fn encode_cursor<K: Serialize>(key: &K) -> String {
    // Serializing a keyset (plain integers, strings, timestamps) cannot fail; an
    // empty cursor would only restart the list, never skip items.
    let json = serde_json::to_vec(key).unwrap_or_default();
    URL_SAFE_NO_PAD.encode(json)
}

/// Decodes a cursor produced by [`encode_cursor`] for the same keyset type.
///
/// # Errors
/// `400 INVALID_CURSOR` when the text is too long, not base64url, or not the route's
/// keyset; the detail never echoes the cursor.
pub fn decode_cursor<K: DeserializeOwned>(cursor: &str) -> Result<K, Problem> {
    let bad = invalid_cursor;
    if cursor.len() > MAX_CURSOR_LEN {
        return Err(bad());
    }
    let bytes = URL_SAFE_NO_PAD.decode(cursor).map_err(|_| bad())?;
    serde_json::from_slice(&bytes).map_err(|_| bad())
}

/// `400 INVALID_CURSOR`: the refusal of [`decode_cursor`], also for a cursor that
/// decodes but names no position of the route's keyset (e.g. an instant out of range).
pub fn invalid_cursor() -> Problem {
    Problem::bad_request(
        "INVALID_CURSOR",
        "cursor is not one this list returned; pass nextCursor back unchanged",
    )
}

/// One page of items with its continuation, built from `limit + 1` fetched rows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page<T> {
    /// The items of this page (at most `limit`).
    pub data: Vec<T>,
    /// True when more items follow this page.
    pub has_more: bool,
    /// The cursor of the next page; `None` exactly when `has_more` is false.
    pub next_cursor: Option<String>,
}

impl<T> Page<T> {
    /// Builds a page from rows fetched with `LIMIT limit + 1` in keyset order: the
    /// extra row, when present, only says more follow; the cursor is the keyset of
    /// the last kept row (`key_of`).
    pub fn from_rows<K: Serialize>(mut rows: Vec<T>, limit: u32, key_of: impl Fn(&T) -> K) -> Self {
        let limit = limit as usize;
        let has_more = rows.len() > limit;
        rows.truncate(limit);
        let next_cursor = if has_more {
            rows.last().map(|last| encode_cursor(&key_of(last)))
        } else {
            None
        };
        Self {
            data: rows,
            has_more,
            next_cursor,
        }
    }

    /// Converts the items (service views into wire DTOs), keeping the continuation.
    pub fn map<U>(self, f: impl FnMut(T) -> U) -> Page<U> {
        Page {
            data: self.data.into_iter().map(f).collect(),
            has_more: self.has_more,
            next_cursor: self.next_cursor,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursor_round_trips_and_refuses_foreign_text() {
        let key = ("2026-12-01T00:00:00Z".to_string(), 7_u64);
        let c = encode_cursor(&key);
        assert_eq!(decode_cursor::<(String, u64)>(&c).ok(), Some(key));
        for bad in ["%%%", "bm90LWpzb24", &"A".repeat(MAX_CURSOR_LEN + 1)] {
            let p = decode_cursor::<(String, u64)>(bad).err();
            assert_eq!(p.map(|p| p.code), Some("INVALID_CURSOR".to_string()));
        }
    }

    #[test]
    fn limit_bounds() {
        assert_eq!(limit(None).ok(), Some(DEFAULT_LIMIT));
        assert_eq!(limit(Some(MAX_LIMIT)).ok(), Some(MAX_LIMIT));
        assert!(limit(Some(0)).is_err());
        assert!(limit(Some(MAX_LIMIT + 1)).is_err());
    }

    #[test]
    fn page_from_rows_keeps_limit_and_cursor_of_last_kept() {
        let p = Page::from_rows(vec![1, 2, 3], 2, |n| *n);
        assert_eq!(p.data, vec![1, 2]);
        assert!(p.has_more);
        assert_eq!(p.next_cursor, Some(encode_cursor(&2)));
        let p = Page::from_rows(vec![1, 2], 2, |n| *n);
        assert!(!p.has_more);
        assert_eq!(p.next_cursor, None);
    }
}
