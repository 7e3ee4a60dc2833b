//! The page's HTML: every value escaped by [`esc`].

use chrono::{DateTime, Utc};
use std::fmt::Write as _;

use super::*;

/// HTML-escapes `s`.
pub(super) fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

pub(super) fn opt<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| "—".to_owned(), |v| esc(&v.to_string()))
}

pub(super) fn ts(t: Option<DateTime<Utc>>) -> String {
    t.map_or_else(
        || "—".to_owned(),
        |t| t.format("%Y-%m-%d %H:%M:%S UTC").to_string(),
    )
}

pub(super) fn dur(s: u64) -> String {
    match s {
        0..=119 => format!("{s} s"),
        120..=7199 => format!("{} min", s / 60),
        _ => format!("{} h", s / 3600),
    }
}

pub(super) fn instances_table(out: &mut String, list: &[StatusInstance]) {
    out.push_str("<table><tr><th>operation</th><th>instance</th><th>workflow</th><th>state</th><th>age</th><th>unchanged for</th></tr>");
    for i in list {
        let operation = match (&i.operation_id, &i.operation_url) {
            (Some(id), Some(url)) => format!("<a href=\"{}\"><code>{id}</code></a>", esc(url)),
            _ => "—".to_owned(),
        };
        let _ = write!(
            out,
            "<tr><td>{operation}</td><td><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            i.id,
            esc(&i.workflow),
            esc(&i.state),
            dur(i.age_seconds),
            dur(i.unchanged_seconds)
        );
    }
    out.push_str("</table>");
}

/// Renders the page (every value escaped).
pub(super) fn render(s: &PlatformStatus) -> String {
    let mut o = String::with_capacity(16 * 1024);
    let _ = write!(
        o,
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>Keel Platform Status</title>\
<style>{CSS}</style></head><body><h1>Keel Platform Status</h1>\
<p class=\"muted\">Read from the database at {} (database clock). Thresholds: pending {}, no mutation {}. \
Reload for fresh data.</p><form method=\"post\" action=\"/status/logout\"><button type=\"submit\">Sign out</button></form>",
        ts(Some(s.generated_at)),
        dur(s.thresholds.pending_seconds),
        dur(s.thresholds.no_mutation_seconds)
    );

    // Workflows
    let w = &s.workflows;
    o.push_str("<h2 id=\"workflows\">Workflows</h2>");
    let class = |n: u64| if n == 0 { "ok" } else { "bad" };
    let _ = write!(
        o,
        "<p><span class=\"{}\">{} over the pending threshold</span> · <span class=\"{}\">{} over the no-mutation threshold</span> · <span class=\"{}\">{} dead letters</span></p>",
        class(w.over_pending),
        w.over_pending,
        class(w.over_no_mutation),
        w.over_no_mutation,
        class(w.dead_letters),
        w.dead_letters
    );
    o.push_str("<table><tr><th>workflow</th><th>state</th><th>instances</th></tr>");
    for c in &w.counts {
        let _ = write!(
            o,
            "<tr><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&c.workflow),
            esc(&c.state),
            c.count
        );
    }
    o.push_str("</table>");
    if !w.over_pending_list.is_empty() {
        o.push_str("<h3>Over the pending threshold (not started)</h3>");
        instances_table(&mut o, &w.over_pending_list);
    }
    if !w.over_no_mutation_list.is_empty() {
        o.push_str("<h3>Over the no-mutation threshold (no progress)</h3>");
        instances_table(&mut o, &w.over_no_mutation_list);
    }
    if !w.oldest.is_empty() {
        o.push_str("<h3>Oldest running / waiting / suspended per workflow</h3>");
        instances_table(&mut o, &w.oldest);
    }
    if !w.awaiting_runner.is_empty() {
        o.push_str("<h3 class=\"bad\">Waiting for a runner that knows their version</h3><table><tr><th>workflow</th><th>version</th><th>instances</th><th>oldest started</th></tr>");
        for a in &w.awaiting_runner {
            let version = a
                .version
                .map_or_else(|| "none (no runner runs it)".to_owned(), |v| v.to_string());
            let _ = write!(
                o,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{} ({} s ago)</td></tr>",
                esc(&a.workflow),
                esc(&version),
                a.instances,
                ts(Some(a.oldest_created_at)),
                a.oldest_age_seconds
            );
        }
        o.push_str("</table>");
    }
    if !w.dead_letter_list.is_empty() {
        o.push_str("<h3>Dead letters</h3><table><tr><th>instance</th><th>workflow</th><th>command</th><th>last error</th><th>dead since</th></tr>");
        for d in &w.dead_letter_list {
            let _ = write!(
                o,
                "<tr><td><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                d.instance_id,
                esc(&d.workflow),
                esc(&d.kind),
                opt(d.last_error.as_deref()),
                ts(Some(d.dead_at))
            );
        }
        o.push_str("</table>");
    }

    // Queue
    o.push_str("<h2 id=\"queue\">Transaction queue</h2>");
    if s.queue.is_empty() {
        o.push_str(
            "<p class=\"muted\">No sender is registered and none has queued a transaction yet.</p>",
        );
    } else {
        o.push_str("<table><tr><th>chain</th><th>sender</th><th>depth</th><th>waiting funding</th><th>in flight</th><th>oldest unsettled</th><th>replacements (1 h)</th><th>next nonce</th><th>balance (wei)</th></tr>");
        for q in &s.queue {
            let _ = write!(
                o,
                "<tr><td>{}</td><td><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(&q.chain_id),
                esc(&q.sender),
                q.depth,
                q.waiting_funding,
                q.in_flight,
                q.oldest_unsettled_age_seconds
                    .map_or_else(|| "—".to_owned(), dur),
                q.replacements_last_hour,
                q.next_nonce,
                q.balance_wei.as_deref().map_or_else(|| "—".to_owned(), esc)
            );
        }
        o.push_str("</table>");
    }
    let _ = write!(
        o,
        "<p>Open funding requests: <span class=\"{}\">{}</span></p>",
        class(s.funding_requests.open),
        s.funding_requests.open
    );
    if !s.funding_requests.data.is_empty() {
        o.push_str("<table><tr><th>chain</th><th>address</th><th>required (wei)</th><th>deadline</th></tr>");
        for f in &s.funding_requests.data {
            let _ = write!(
                o,
                "<tr><td>{}</td><td><code>{}</code></td><td>{}</td><td>{}</td></tr>",
                esc(&f.chain_id),
                esc(&f.address),
                esc(&f.required_wei),
                ts(Some(f.deadline))
            );
        }
        o.push_str("</table>");
    }

    // Index
    o.push_str("<h2 id=\"index\">Ledger Index</h2>");
    if s.index.is_empty() {
        o.push_str("<p class=\"muted\">No chain is indexed yet.</p>");
    } else {
        o.push_str("<table><tr><th>chain</th><th>state</th><th>indexed tip</th><th>chain head</th><th>lag</th><th>owner's head observed</th><th>history ranges pending / leased / done</th><th>owner epoch</th></tr>");
        for c in &s.index {
            let (class, state) = if c.red {
                ("bad", format!("red: {}", c.red_reasons.join(", ")))
            } else {
                ("ok", "green".to_owned())
            };
            let head = match (c.node_head, c.head) {
                (Some(n), _) => format!("{n} (node)"),
                (None, Some(h)) => format!("{h} (owner's observation)"),
                (None, None) => "—".to_owned(),
            };
            let lag_class = if c.red_reasons.iter().any(|r| r == "lagging") {
                "bad"
            } else {
                "ok"
            };
            let extra = match (&c.degraded_reason, c.rebuilding_since) {
                (Some(r), _) => format!(
                    " <span class=\"bad\">degraded: {}</span> — re-index: <code>keel index reindex --chain NAME</code> or <code>POST {}</code>",
                    esc(r),
                    esc(&c.reindex_url)
                ),
                (None, Some(since)) => format!(
                    " <span class=\"warn\">rebuilding since {}</span>",
                    ts(Some(since))
                ),
                (None, None) => String::new(),
            };
            let _ = write!(
                o,
                "<tr><td>{}</td><td class=\"{class}\">{}</td><td>{}</td><td>{}</td><td class=\"{lag_class}\">{} blocks, {}</td><td>{}</td><td>{} / {} / {}</td><td>{}{}</td></tr>",
                esc(&c.chain_id),
                esc(&state),
                opt(c.tip),
                esc(&head),
                c.lag_blocks,
                dur(c.lag_seconds),
                c.head_observed_age_seconds
                    .map_or_else(|| "never".to_owned(), |a| format!("{} ago", dur(a))),
                c.ranges.pending,
                c.ranges.leased,
                c.ranges.done,
                c.owner_epoch,
                extra
            );
        }
        o.push_str("</table>");
    }

    // Cluster
    o.push_str("<h2 id=\"cluster\">Cluster</h2>");
    let _ = write!(o, "<p>Shards: {}</p>", opt(s.cluster.shards));
    o.push_str("<table><tr><th>role</th><th>host</th><th>replica</th><th>heartbeat</th><th>shards owned</th><th>declined</th></tr>");
    for r in &s.cluster.replicas {
        let _ = write!(
            o,
            "<tr><td>{}</td><td>{}</td><td><code>{}</code></td><td>{} ago</td><td>{}</td><td>{}</td></tr>",
            esc(&r.role),
            esc(&r.host),
            r.id,
            dur(r.heartbeat_age_seconds),
            r.shards_owned,
            r.shards_declined
        );
    }
    o.push_str("</table>");
    if !s.cluster.singletons.is_empty() {
        o.push_str("<table><tr><th>singleton</th><th>role</th><th>shard</th><th>owner</th></tr>");
        for g in &s.cluster.singletons {
            let owner = g.owner.map_or_else(
                || "<span class=\"bad\">none</span>".to_owned(),
                |id| format!("<code>{id}</code>"),
            );
            let _ = write!(
                o,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{owner}</td></tr>",
                esc(&g.name),
                esc(&g.role),
                g.shard
            );
        }
        o.push_str("</table>");
    }

    // Jobs
    o.push_str("<h2 id=\"jobs\">Scheduled jobs</h2>");
    if s.jobs.is_empty() {
        o.push_str("<p class=\"muted\">No job is registered.</p>");
    } else {
        o.push_str("<table><tr><th>job</th><th>verdict</th><th>last attempt</th><th>outcome</th><th>duration</th><th>items</th><th>last success</th><th>next due</th></tr>");
        for j in &s.jobs {
            let class = match j.verdict.as_str() {
                "ok" | "quiet" => "ok",
                _ => "bad",
            };
            let verdict = match j.verdict.as_str() {
                "quiet" => "quiet (ran, found nothing)",
                "stopped_reporting" => "stopped reporting",
                v => v,
            };
            let _ = write!(
                o,
                "<tr><td>{}</td><td class=\"{class}\">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(&j.name),
                esc(verdict),
                ts(j.last_attempt_at),
                opt(j.last_outcome.as_deref()),
                j.last_duration_ms
                    .map_or_else(|| "—".to_owned(), |ms| format!("{ms} ms")),
                opt(j.last_items),
                ts(j.last_success_at),
                ts(Some(j.next_due_at))
            );
        }
        o.push_str("</table>");
    }

    // Custody
    let c = &s.custody;
    o.push_str("<h2 id=\"custody\">Custody</h2>");
    match &c.oldest_pending_approval {
        Some(p) => {
            let _ = write!(
                o,
                "<p class=\"warn\">Oldest approval pending at a provider: {} transaction <code>{}</code> ({}, chain {}) since {}.</p>",
                esc(&p.provider),
                opt(p.provider_tx_id.as_deref()),
                opt(p.status.as_deref()),
                p.chain_id,
                ts(Some(p.since))
            );
        }
        None => o.push_str("<p>No approval pending at a provider.</p>"),
    }
    if c.requests.is_empty() {
        o.push_str("<p class=\"muted\">No live custody submission.</p>");
    } else {
        o.push_str("<table><tr><th>chain</th><th>provider</th><th>phase</th><th>provider status</th><th>submissions</th></tr>");
        for r in &c.requests {
            let _ = write!(
                o,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                r.chain_id,
                esc(&r.provider),
                esc(&r.phase),
                opt(r.status.as_deref()),
                r.count
            );
        }
        o.push_str("</table>");
    }

    // Webhooks
    let h = &s.webhooks;
    let _ = write!(
        o,
        "<h2 id=\"webhooks\">Webhooks</h2><p>Endpoints: {} healthy · <span class=\"{}\">{} failing</span> · <span class=\"{}\">{} breaker open</span> · {} disabled. Undelivered: {} (oldest {}).</p>",
        h.healthy,
        class(h.failing),
        h.failing,
        class(h.breaker_open),
        h.breaker_open,
        h.disabled,
        h.undelivered,
        ts(h.oldest_undelivered_at)
    );
    if !h.unhealthy_endpoints.is_empty() {
        o.push_str(
            "<table><tr><th>failing endpoint</th><th>organization</th><th>state</th><th>failing since</th><th>failures in a row</th></tr>",
        );
        for u in &h.unhealthy_endpoints {
            let state = if u.breaker_open {
                format!("breaker open until {}", ts(u.breaker_open_until))
            } else {
                "failing".to_owned()
            };
            let _ = write!(
                o,
                "<tr><td><code>{}</code></td><td><code>{}</code></td><td class=\"bad\">{}</td><td>{}</td><td>{}</td></tr>",
                u.id,
                u.organization_id,
                esc(&state),
                ts(u.failing_since),
                u.consecutive_failures
            );
        }
        o.push_str("</table>");
    }
    if !h.disabled_endpoints.is_empty() {
        o.push_str(
            "<table><tr><th>endpoint</th><th>organization</th><th>reason</th><th>since</th></tr>",
        );
        for d in &h.disabled_endpoints {
            let _ = write!(
                o,
                "<tr><td><code>{}</code></td><td><code>{}</code></td><td>{}</td><td>{}</td></tr>",
                d.id,
                d.organization_id,
                opt(d.reason.as_deref()),
                ts(Some(d.since))
            );
        }
        o.push_str("</table>");
    }
    // Distributions
    let _ = write!(
        o,
        "<h2 id=\"distributions\">Distributions</h2><p>{} unfinished.</p>",
        s.distributions.len()
    );
    if !s.distributions.is_empty() {
        o.push_str(
            "<table><tr><th>distribution</th><th>asset</th><th>chain</th><th>state</th><th>paid / holders</th><th>owed</th><th>refused</th><th>batches</th><th>age</th><th>unchanged for</th></tr>",
        );
        for d in &s.distributions {
            let state_class = match d.state.as_str() {
                "suspended" => "bad",
                "paused" | "waiting" => "warn",
                _ => "ok",
            };
            let _ = write!(
                o,
                "<tr><td><code>{}</code></td><td><code>{}</code></td><td>{}</td><td class=\"{state_class}\">{}</td><td>{} / {}</td><td>{}</td><td class=\"{}\">{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                d.id,
                d.asset_id,
                d.chain_id,
                esc(&d.state),
                d.paid,
                opt(d.holders),
                d.pending,
                class(d.refused),
                d.refused,
                d.batches_paid,
                dur(d.age_seconds),
                dur(d.unchanged_seconds)
            );
        }
        o.push_str("</table>");
    }
    o.push_str("</body></html>");
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_markup() {
        assert_eq!(
            esc("<a href=\"x\">'&'</a>"),
            "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;"
        );
    }
}
