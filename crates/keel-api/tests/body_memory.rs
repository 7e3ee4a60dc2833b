//! The memory a request body costs to validate, measured by a counting global allocator
//! (this test binary's own, so nothing else shares its counters): for bodies at the
//! largest configurable limit (16 MiB), `keel_api::extract::parse_body` never builds a
//! tree of the body's values. Bodies made of many small values cost under 1 MiB of heap
//! beyond the body itself; a body holding one long string costs a copy of it (plus the
//! parser's unescaping buffer). The control — parsing the same body into a
//! `serde_json::Value`, as before issue 18 — must cost far more, so this test fails if
//! that tree came back.
//!
//! One `#[test]` runs every case in sequence: the counters are process-wide.

use keel_api::dto::{CreateApiKeyRequest, CreateAssetRequest, TokenAmountRequest};
use keel_api::extract::{RequestBody, parse_body};
use keel_api::user_ops::SubmitUserOperationRequest;
use keel_api::webhooks::CreateWebhookEndpointRequest;
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

/// The largest body limit the configuration accepts (`api.bodyLimitBytes`).
const MAX_BODY: usize = 16 * 1024 * 1024;
const MIB: usize = 1024 * 1024;

struct Counting;

static CURRENT: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn grew(by: usize) {
    let now = CURRENT.fetch_add(by, Ordering::SeqCst) + by;
    PEAK.fetch_max(now, Ordering::SeqCst);
}

// SAFETY: every call is forwarded to `System` unchanged; only counters are updated.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's layout.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's layout.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator with `layout`.
        unsafe { System.dealloc(ptr, layout) };
        CURRENT.fetch_sub(layout.size(), Ordering::SeqCst);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` came from this allocator with `layout`.
        let q = unsafe { System.realloc(ptr, layout, new_size) };
        if !q.is_null() {
            if new_size >= layout.size() {
                grew(new_size - layout.size());
            } else {
                CURRENT.fetch_sub(layout.size() - new_size, Ordering::SeqCst);
            }
        }
        q
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Runs `f` and returns its result with the peak heap it held above the level at the
/// start (bytes).
fn peak_during<R>(f: impl FnOnce() -> R) -> (R, usize) {
    let base = CURRENT.load(Ordering::SeqCst);
    PEAK.store(base, Ordering::SeqCst);
    let r = f();
    let peak = PEAK.load(Ordering::SeqCst) - base;
    (r, peak)
}

/// `head` + `item` repeated (joined by `,`) + `tail`, as long as fits `MAX_BODY`.
fn fill(head: &str, item: impl Fn(usize) -> String, tail: &str) -> Vec<u8> {
    let mut body = head.as_bytes().to_vec();
    let mut i = 0;
    loop {
        let it = item(i);
        let sep = usize::from(i > 0);
        if body.len() + sep + it.len() + tail.len() > MAX_BODY {
            break;
        }
        if sep == 1 {
            body.push(b',');
        }
        body.extend_from_slice(it.as_bytes());
        i += 1;
    }
    body.extend_from_slice(tail.as_bytes());
    body
}

/// `head` + `unit` repeated (no separator) + `tail`, as long as fits `MAX_BODY`.
fn repeat_fit(head: &str, unit: &str, tail: &str) -> Vec<u8> {
    let n = (MAX_BODY - head.len() - tail.len()) / unit.len();
    let mut body = head.as_bytes().to_vec();
    body.extend_from_slice(unit.repeat(n).as_bytes());
    body.extend_from_slice(tail.as_bytes());
    body
}

/// Parses `body` as `T` and returns (problem code or "ok", peak extra heap).
fn measure<T: RequestBody>(body: &[u8]) -> (String, usize) {
    let (result, peak) = peak_during(|| parse_body::<T>(body).map(drop));
    let code = match result {
        Ok(()) => "ok".to_owned(),
        Err(p) => p.code,
    };
    (code, peak)
}

fn mib(bytes: usize) -> f64 {
    bytes as f64 / MIB as f64
}

#[test]
fn maximal_bodies_are_validated_in_bounded_memory() {
    let many_numbers = fill(r#"{"name":["#, |_| "0".to_owned(), "]}");
    let wide_object = fill(r#"{"name":{"#, |i| format!("\"k{i}\":0"), "}}");
    let many_unknown = fill("{", |i| format!("\"x{i}\":[0]"), "}");
    let nested_arrays = fill(r#"{"amount":["#, |_| "[[[]]]".to_owned(), "]}");
    let scopes_list = fill(
        r#"{"label":"l","scopes":["#,
        |_| "\"read\"".to_owned(),
        "]}",
    );
    let asset_tail = r#"","symbol":"A","decimals":6,"templateId":"t","initialPrice":"1"}"#;
    let long_name = repeat_fit(r#"{"name":""#, "a", asset_tail);
    let escaped_name = repeat_fit(r#"{"name":""#, "\\u0061", asset_tail);
    // Webhook endpoints and user operations (issue 32 §9: their routes built a
    // `serde_json::Value` of the body; a 16 MiB body raised the api's RSS by 460 MiB).
    let wide_url = fill(r#"{"url":{"#, |i| format!("\"k{i}\":0"), "}}");
    let many_event_types = fill(r#"{"eventTypes":["#, |_| "0".to_owned(), "]}");
    let wide_user_op = fill(
        r#"{"chainId":1,"entryPoint":"e","userOperation":{"#,
        |i| format!("\"k{i}\":0"),
        "}}",
    );
    for b in [
        &many_numbers,
        &wide_object,
        &many_unknown,
        &nested_arrays,
        &scopes_list,
        &long_name,
        &escaped_name,
        &wide_url,
        &many_event_types,
        &wide_user_op,
    ] {
        assert!(
            b.len() > MAX_BODY - 64 && b.len() <= MAX_BODY,
            "{}",
            b.len()
        );
    }

    // Bodies of many small values: a constant, small cost.
    let small: [(&str, (String, usize)); 7] = [
        (
            "1.4M members in a webhook url",
            measure::<CreateWebhookEndpointRequest>(&wide_url),
        ),
        (
            "8M numbers in webhook eventTypes",
            measure::<CreateWebhookEndpointRequest>(&many_event_types),
        ),
        (
            "8M numbers in a string field",
            measure::<CreateAssetRequest>(&many_numbers),
        ),
        (
            "1.4M members nested in a field",
            measure::<CreateAssetRequest>(&wide_object),
        ),
        (
            "1.2M unknown members",
            measure::<CreateAssetRequest>(&many_unknown),
        ),
        (
            "2.4M nested arrays",
            measure::<TokenAmountRequest>(&nested_arrays),
        ),
        (
            "2M strings in a 4-item list",
            measure::<CreateApiKeyRequest>(&scopes_list),
        ),
    ];
    for (label, (code, peak)) in &small {
        println!("{label}: {code}, peak extra heap {:.3} MiB", mib(*peak));
        assert_ne!(code, "ok", "{label}");
        assert!(*peak < MIB, "{label}: {peak} bytes");
    }

    // A user operation is kept as its raw text for its own deserializer: one copy.
    let (code, peak) = measure::<SubmitUserOperationRequest>(&wide_user_op);
    println!(
        "16 MiB user operation: {code}, peak extra heap {:.3} MiB",
        mib(peak)
    );
    assert_eq!(code, "ok");
    assert!(
        peak <= 3 * wide_user_op.len() + MIB,
        "user operation: {peak} bytes"
    );

    // One long string member: copied once (plus the unescaping buffer when escaped).
    for (label, body) in [
        ("16 MiB name", &long_name),
        ("16 MiB escaped name", &escaped_name),
    ] {
        let (code, peak) = measure::<CreateAssetRequest>(body);
        println!("{label}: {code}, peak extra heap {:.3} MiB", mib(peak));
        assert_eq!(code, "ok", "{label}");
        assert!(peak <= 3 * body.len() + MIB, "{label}: {peak} bytes");
    }

    // The control: the generic tree the parser used to build first.
    let (tree, peak) =
        peak_during(|| serde_json::from_slice::<serde_json::Value>(&many_numbers).map(drop));
    tree.unwrap();
    println!(
        "control: serde_json::Value of the 8M-number body, peak extra heap {:.1} MiB",
        mib(peak)
    );
    assert!(peak > 100 * MIB, "the control should cost far more: {peak}");
}
