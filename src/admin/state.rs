//! `GET /admin/state?top=N&q=TEXT&timeline=1`: the console's compact live view, read once a
//! second by `/admin/ui`.
//!
//! Per pool: configured and learned capacity, in flight, queue depth, oldest wait, Jain's index,
//! upstream 429 rate, cluster degraded state (and, with `timeline=1`, its timeline of shares).
//! Per (pool, tenant) row: plan and weight, entitled vs served share over the rolling window,
//! queue depth, oldest wait, p50/p95 queue wait, in flight, tokens/s, estimate error, refusals
//! by reason, and its spend against each of its budgets ([`budgets`]: spent, reserved by
//! requests in flight, left; USD in dollars; `null` for a tenant without budgets). Rows are sorted by who is furthest below their entitlement (entitled − served,
//! largest first), filtered by `q` (a case-insensitive substring of the tenant id).
//!
//! Entitlement is max-min fair (water-filling) over the rolling window: a tenant that is not
//! waiting (nothing queued) is entitled to what it was served — it got all it asked for; the
//! rest of the pool's service is split among the waiting tenants by weight. So the gap shows
//! who waits while others get more than their weight, and a quiet tenant never looks wronged.
//!
//! Invariants: the payload is bounded whatever the number of tenants — at most `top` rows
//! ([`MAX_TOP`]; default [`DEFAULT_TOP`]) and the timeline's bounded rings; the work is one pass
//! over every tenant (no per-tenant allocation but its row) and the enrichment of the shown rows
//! only.

use std::sync::Arc;

use serde_json::{json, Value};

use crate::metrics::WINDOW_SECS;

/// Rows shown when `top` is not given.
pub const DEFAULT_TOP: usize = 50;
/// Most rows shown, whatever `top` says.
pub const MAX_TOP: usize = 500;
/// Longest search string kept (bytes).
const MAX_QUERY: usize = 128;

/// The parameters of one read.
#[derive(Debug, Default, PartialEq)]
pub struct Query {
    /// Rows wanted (bounded by [`MAX_TOP`]).
    pub top: usize,
    /// Lower-case substring of the tenant ids to keep (empty: all).
    pub search: String,
    /// Include the pools' timelines.
    pub timeline: bool,
}

impl Query {
    /// Parses a query string (`top`, `q`, `timeline`; anything else ignored).
    pub fn parse(query: Option<&str>) -> Self {
        let mut q = Query {
            top: DEFAULT_TOP,
            ..Query::default()
        };
        for pair in query.unwrap_or("").split('&') {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            match k {
                "top" => q.top = v.parse().unwrap_or(DEFAULT_TOP).min(MAX_TOP),
                "q" => {
                    let mut s = decode(v).to_lowercase();
                    let mut end = s.len().min(MAX_QUERY);
                    while !s.is_char_boundary(end) {
                        end -= 1;
                    }
                    s.truncate(end);
                    q.search = s;
                }
                "timeline" => q.timeline = v == "1" || v == "true",
                _ => {}
            }
        }
        q
    }
}

/// Percent-decodes a query value (`+` is a space); invalid escapes are kept as they are.
fn decode(v: &str) -> String {
    let b = v.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => {
                let hex = |c: u8| (c as char).to_digit(16);
                match (hex(b[i + 1]), hex(b[i + 2])) {
                    (Some(h), Some(l)) => {
                        out.push((h * 16 + l) as u8);
                        i += 2;
                    }
                    _ => out.push(b'%'),
                }
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// One (pool, tenant) row before enrichment.
struct Row {
    pool: usize,
    tenant: crate::domain::TenantId,
    weight: f64,
    queued: usize,
    in_flight: u32,
    oldest_ms: Option<u64>,
    served: u64,
    served_share: f64,
    entitled_share: f64,
}

/// Jain's index of weighted service over backlogged tenants (`None`: none backlogged or
/// nothing served).
fn jain(xs: impl Iterator<Item = f64>) -> Option<f64> {
    let (mut n, mut sum, mut sq) = (0f64, 0f64, 0f64);
    for x in xs {
        n += 1.0;
        sum += x;
        sq += x * x;
    }
    (sum > 0.0).then(|| sum * sum / (n * sq))
}

impl super::Admin {
    /// The `/admin/state` document.
    pub fn state(&self, query: &Query) -> Value {
        let m = &self.metrics;
        m.sample(&self.pools, &self.admission);
        let sec = m.second();
        let mut rows = Vec::new();
        let mut pools = Vec::new();
        let mut total = 0usize;
        for (i, pool) in self.pools.iter().enumerate() {
            let configured = |id: &crate::domain::TenantId| m.tenant(id).is_some();
            let mut snap = pool.snapshot();
            snap.retain(|(t, _)| configured(&t.id) || t.queued > 0 || t.in_flight > 0);
            let served: Vec<u64> = snap
                .iter()
                .map(|(t, _)| m.window_served(i, &t.id, sec))
                .collect();
            let total_served: u64 = served.iter().sum();
            let share = |s: u64| {
                if total_served > 0 {
                    s as f64 / total_served as f64
                } else {
                    0.0
                }
            };
            let waiting_weight: f64 = snap
                .iter()
                .filter(|(t, _)| t.queued > 0)
                .map(|(t, _)| t.weight.get())
                .sum();
            // What the tenants that do not wait took; the rest is the waiting tenants' by weight.
            let satisfied: f64 = snap
                .iter()
                .zip(&served)
                .filter(|((t, _), _)| t.queued == 0)
                .map(|(_, s)| share(*s))
                .sum();
            let remaining = if total_served > 0 {
                (1.0 - satisfied).max(0.0)
            } else {
                1.0
            };
            let (mut queued, mut in_flight, mut oldest) = (0usize, 0u32, None::<u64>);
            let index = jain(
                snap.iter()
                    .zip(&served)
                    .filter(|((t, _), _)| t.queued > 0)
                    .map(|((t, _), s)| *s as f64 / t.weight.get()),
            );
            total += snap.len();
            for ((t, age), served) in snap.into_iter().zip(served) {
                let age = age.map(|a| a.as_millis() as u64);
                queued += t.queued;
                in_flight += t.in_flight;
                oldest = oldest.max(age);
                if !query.search.is_empty() && !t.id.as_str().to_lowercase().contains(&query.search)
                {
                    continue;
                }
                rows.push(Row {
                    pool: i,
                    weight: t.weight.get(),
                    queued: t.queued,
                    in_flight: t.in_flight,
                    oldest_ms: age,
                    served,
                    served_share: share(served),
                    entitled_share: if t.queued > 0 {
                        remaining * t.weight.get() / waiting_weight
                    } else {
                        share(served)
                    },
                    tenant: t.id,
                });
            }
            let name = self.pool_names.get(i).cloned().unwrap_or_default();
            let cap = self.admission.capacity.get(i);
            let timeline = m.timeline().samples(&name);
            let throttled_per_s = timeline.last().map_or(0.0, |s| s.throttled_per_s);
            let mut p = json!({
                "name": name,
                "configured": cap.map(|c| c.configured()),
                "learned": cap.map(|c| c.limit()),
                "in_flight": in_flight,
                "queued": queued,
                "oldest_ms": oldest,
                "jain": index,
                "throttled_total": cap.map(|c| c.throttled()),
                "throttled_per_s": throttled_per_s,
                "degraded": self.cluster.as_ref().map(|c| c.degraded()),
                "endpoints": cap.map(|c| endpoint_rows(c)).unwrap_or_default(),
            });
            if query.timeline {
                p["timeline"] = json!(timeline);
            }
            pools.push(p);
        }
        let matched = rows.len();
        let gap = |r: &Row| r.entitled_share - r.served_share;
        let top = query.top.min(MAX_TOP);
        let by_gap = |a: &Row, b: &Row| {
            gap(b)
                .total_cmp(&gap(a))
                .then(b.queued.cmp(&a.queued))
                .then(a.tenant.as_str().cmp(b.tenant.as_str()))
        };
        if rows.len() > top {
            rows.select_nth_unstable_by(top, by_gap);
            rows.truncate(top);
        }
        rows.sort_unstable_by(by_gap);
        let shown: Vec<Value> = rows.iter().map(|r| self.row(r)).collect();
        json!({
            "at": sec,
            "window_s": WINDOW_SECS,
            "pools": pools,
            "tenants_total": total,
            "matched": matched,
            "tenants": shown,
        })
    }

    /// One shown row, enriched with what costs a lock per tenant.
    fn row(&self, r: &Row) -> Value {
        let m = &self.metrics;
        let live = m.live(&r.tenant).map(Arc::clone);
        let waits = live.as_ref().and_then(|l| l.wait_quantiles());
        let refusals: serde_json::Map<String, Value> = live
            .map(|l| l.refusals())
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k.to_owned(), json!(v)))
            .collect();
        let stats = self.estimator.stats().tenant(&r.tenant).unwrap_or_default();
        // An API tenant (`tenant::runtime`): its keys' ids, shown, never editable here.
        let api_keys = (self.runtime.runtime.as_ref())
            .filter(|rt| rt.is_api_tenant(r.tenant.as_str()))
            .map(|rt| {
                let keys = rt.keys_of(r.tenant.as_str());
                keys.into_iter().map(|k| k.id).collect::<Vec<_>>()
            });
        json!({
            "tenant": r.tenant.as_str(),
            "source": if api_keys.is_some() { "api" } else { "config" },
            "keys": api_keys,
            "pool": self.pool_names.get(r.pool),
            "plan": m.plan(&r.tenant),
            "weight": r.weight,
            "entitled_share": r.entitled_share,
            "served_share": r.served_share,
            "queued": r.queued,
            "oldest_ms": r.oldest_ms,
            "p50_wait_ms": waits.map(|w| w.0),
            "p95_wait_ms": waits.map(|w| w.1),
            "in_flight": r.in_flight,
            "tokens_per_s": r.served as f64 / WINDOW_SECS as f64,
            "estimate_error": stats.mean_ratio(),
            "refusals": refusals,
            "budgets": budgets(&self.admission.budgets, &r.tenant),
        })
    }
}

/// A tenant's spend against each of its budgets, in their configured order (`null`: none).
/// Tokens as counts, USD in dollars. With `[cluster]`, what Redis counted at this replica's
/// last reservation for the tenant, updated by what it settled since.
pub fn budgets(b: &crate::budget::Budgets, tenant: &crate::domain::TenantId) -> Value {
    use crate::budget::Unit;
    let Some(limits) = b.limits(tenant) else {
        return Value::Null;
    };
    let spending = b.spending();
    let left = spending.left(tenant, limits);
    let reserved = spending.reserved(tenant);
    let show = |unit: Unit, v: u64| match unit {
        Unit::Tokens => json!(v),
        Unit::Usd => json!(crate::domain::Usd(v).dollars()),
    };
    let rows: Vec<Value> = limits
        .iter()
        .zip(left)
        .map(|(l, left)| {
            let spent = spending.spent(tenant, l.period).of(l.unit);
            json!({
                "period": l.period.name(),
                "unit": l.unit.name(),
                "amount": show(l.unit, l.amount),
                "spent": show(l.unit, spent),
                "reserved": show(l.unit, reserved.of(l.unit)),
                "left": show(l.unit, left),
                "used_share": if l.amount > 0 { spent as f64 / l.amount as f64 } else { 1.0 },
            })
        })
        .collect();
    json!(rows)
}

/// One row per endpoint of a pool: its state, load, learned limit and counters.
fn endpoint_rows(cap: &crate::feedback::capacity::PoolCapacity) -> Vec<Value> {
    cap.views()
        .into_iter()
        .map(|v| {
            json!({
                "name": &*v.name,
                "state": v.state,
                "priority": v.priority,
                "in_flight": v.in_flight,
                "limit": v.limit,
                "configured": v.max,
                "paused_ms": v.paused_for.as_millis() as u64,
                "ejections": v.ejections,
                "failovers": v.failovers,
                "overloads": v.throttled,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_query_is_parsed_and_bounded() {
        assert_eq!(
            Query::parse(None),
            Query {
                top: DEFAULT_TOP,
                search: String::new(),
                timeline: false
            }
        );
        let q = Query::parse(Some("top=100000&q=Acme%2D1+x%zz&timeline=1&other=2"));
        assert_eq!(q.top, MAX_TOP);
        assert_eq!(q.search, "acme-1 x%zz");
        assert!(q.timeline);
        let long = "é".repeat(200);
        assert!(Query::parse(Some(&format!("q={long}"))).search.len() <= MAX_QUERY);
        assert_eq!(Query::parse(Some("top=abc")).top, DEFAULT_TOP);
        assert_eq!(decode("%"), "%");
        assert_eq!(decode("a%4"), "a%4");
    }

    #[test]
    fn jain_of_equal_and_unequal_service() {
        assert_eq!(jain([].into_iter()), None);
        assert!((jain([2.0, 2.0].into_iter()).unwrap() - 1.0).abs() < 1e-9);
        assert!((jain([1.0, 0.0].into_iter()).unwrap() - 0.5).abs() < 1e-9);
    }
}
