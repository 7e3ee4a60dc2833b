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
//! Every list route takes its `limit` and `cursor` as one [`PageParams`] (its own
//! filters, if any, in a separate query struct), so the parameters, their document
//! entries and their errors are the same on every list.
//!
//! Errors: a `limit` that is not an integer, or outside 1..=[`MAX_LIMIT`] → `400
//! INVALID_QUERY` ([`PageParams::limit`], [`limit`]); a cursor that does not decode to
//! the route's keyset → `400 INVALID_CURSOR` ([`PageParams::cursor`],
//! [`decode_cursor`]).

use crate::Problem;
use axum::extract::Query;
use axum::extract::rejection::QueryRejection;
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use utoipa::IntoParams;

/// The page size when `limit` is absent.
pub const DEFAULT_LIMIT: u32 = 50;
/// The largest accepted `limit`.
pub const MAX_LIMIT: u32 = 200;
/// The longest accepted cursor string, bytes (a cursor Keel issues is far shorter).
pub const MAX_CURSOR_LEN: usize = 512;

/// The pagination query parameters of every list route: `limit` and `cursor`.
///
/// Extract it as `Result<Query<PageParams>, QueryRejection>` next to the route's own
/// filter query (each reads the members it knows) and pass it to [`PageParams::from_query`];
/// list it in the route's `params(...)` for the OpenAPI document.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, IntoParams)]
#[serde(rename_all = "camelCase")]
#[into_params(parameter_in = Query)]
pub struct PageParams {
    /// Page size, 1 to 200 (default 50).
    #[param(value_type = Option<u32>, minimum = 1, maximum = 200)]
    pub limit: Option<String>,
    /// The `nextCursor` of the previous page, passed back unchanged (opaque; with the
    /// same filters).
    #[param(max_length = 512)]
    pub cursor: Option<String>,
}

impl PageParams {
    /// The parameters of an extracted query.
    ///
    /// # Errors
    /// `400 INVALID_QUERY` when the query string cannot be read at all.
    pub fn from_query(q: Result<Query<Self>, QueryRejection>) -> Result<Self, Problem> {
        q.map(|Query(p)| p)
            .map_err(|_| Problem::bad_request("INVALID_QUERY", "a query parameter is malformed"))
    }

    /// The page size: [`DEFAULT_LIMIT`] when `limit` is absent.
    ///
    /// # Errors
    /// `400 INVALID_QUERY` when `limit` is not a decimal integer from 1 to [`MAX_LIMIT`].
    pub fn limit(&self) -> Result<u32, Problem> {
        let n = match self.limit.as_deref() {
            None => None,
            Some(t) => Some(t.parse::<u32>().map_err(|_| {
                Problem::bad_request("INVALID_QUERY", "query parameter `limit` is malformed")
            })?),
        };
        limit(n)
    }

    /// The keyset position `cursor` names, decoded as the route's keyset type `K`;
    /// `None` without a cursor (the first page).
    ///
    /// # Errors
    /// `400 INVALID_CURSOR` as [`decode_cursor`].
    pub fn cursor<K: DeserializeOwned>(&self) -> Result<Option<K>, Problem> {
        self.cursor.as_deref().map(decode_cursor).transpose()
    }
}

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
    fn page_params_limit_and_cursor() {
        let p = |limit: Option<&str>, cursor: Option<&str>| PageParams {
            limit: limit.map(str::to_owned),
            cursor: cursor.map(str::to_owned),
        };
        assert_eq!(p(None, None).limit().ok(), Some(DEFAULT_LIMIT));
        assert_eq!(p(Some("200"), None).limit().ok(), Some(200));
        for bad in ["0", "201", "-1", "1.5", "x", ""] {
            let e = p(Some(bad), None).limit().err().map(|e| e.code);
            assert_eq!(e.as_deref(), Some("INVALID_QUERY"), "limit={bad}");
        }
        assert_eq!(p(None, None).cursor::<u64>().ok(), Some(None));
        let c = encode_cursor(&7_u64);
        assert_eq!(p(None, Some(&c)).cursor::<u64>().ok(), Some(Some(7)));
        let e = p(None, Some("%%")).cursor::<u64>().err().map(|e| e.code);
        assert_eq!(e.as_deref(), Some("INVALID_CURSOR"));
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
