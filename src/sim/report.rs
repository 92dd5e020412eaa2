//! What a simulation measured, per tenant and per group of identical tenants: served tokens,
//! served share against entitled share, queue waits, and Jain's index over backlogged tenants.
//!
//! Entitlement: each dispatched request's actual tokens are shared among the tenants that were
//! backlogged (queued work, under their cap) at that moment, in proportion to their weights. A
//! tenant served exactly its entitlement has ratio 1; work conservation gives a lone backlogged
//! tenant the whole pool, and that counts as its entitlement.

use std::fmt;

use serde::Serialize;

use super::scenario::Scenario;
use crate::scheduler::{Policy, Scheduler, TenantKey};

#[derive(Debug, Default)]
struct TenantRec {
    group: usize,
    weight: f64,
    cap: Option<u32>,
    arrived: u64,
    served: u64,
    served_tokens: u64,
    entitled: f64,
    waits_ms: Vec<f64>,
    errors: u64,
    provider_429: u64,
    arrived_tokens: u64,
    /// Tokens dispatched before the scenario's `duration_s`.
    in_run_tokens: u64,
}

/// Accumulates measurements while the simulation runs.
#[derive(Debug, Default)]
pub struct Recorder {
    tenants: Vec<TenantRec>,
    /// With `fairness_window_s`: the window length and, per window end, each tenant's
    /// (served tokens so far, tokens still queued).
    window_us: Option<u64>,
    windows: Vec<Vec<(u64, u64)>>,
    /// The scenario's `duration_s`, µs.
    pub(super) run_us: u64,
}

impl Recorder {
    pub(super) fn add_tenant(&mut self, id: String, group: usize, weight: f64, cap: Option<u32>) {
        let _ = id;
        self.tenants.push(TenantRec {
            group,
            weight,
            cap,
            ..TenantRec::default()
        });
    }

    pub(super) fn arrived(&mut self, t: usize, tokens: u64) {
        self.tenants[t].arrived += 1;
        self.tenants[t].arrived_tokens += tokens;
    }

    /// Entitlement by max-min fair windows of `window_s` (see `maxmin.rs`) instead of per
    /// dispatch.
    pub(super) fn with_window(mut self, window_s: Option<f64>) -> Self {
        self.window_us = window_s.map(|w| (w * 1e6) as u64).filter(|&w| w > 0);
        self
    }

    /// Closes every window that ended by `now_us`.
    pub(super) fn tick(&mut self, now_us: u64) {
        let Some(w) = self.window_us else { return };
        while (self.windows.len() as u64 + 1) * w <= now_us {
            let snap = self.snapshot();
            self.windows.push(snap);
        }
    }

    fn snapshot(&self) -> Vec<(u64, u64)> {
        self.tenants
            .iter()
            .map(|t| {
                (
                    t.served_tokens,
                    t.arrived_tokens.saturating_sub(t.served_tokens),
                )
            })
            .collect()
    }

    /// Replaces the per-dispatch entitlement by the max-min one of the windows.
    fn maxmin_entitlement(&mut self) {
        if self.window_us.is_none() {
            return;
        }
        let last = self.snapshot();
        self.windows.push(last);
        let weights: Vec<f64> = self.tenants.iter().map(|t| t.weight).collect();
        let mut before = vec![0u64; self.tenants.len()];
        for t in &mut self.tenants {
            t.entitled = 0.0;
        }
        for w in &self.windows {
            let served: Vec<f64> = w
                .iter()
                .zip(&before)
                .map(|(&(s, _), &b)| (s - b) as f64)
                .collect();
            let demand: Vec<f64> = served
                .iter()
                .zip(w)
                .map(|(&s, &(_, q))| s + q as f64)
                .collect();
            let e = super::maxmin::water_fill(served.iter().sum(), &demand, &weights);
            for (t, e) in self.tenants.iter_mut().zip(e) {
                t.entitled += e;
            }
            before = w.iter().map(|&(s, _)| s).collect();
        }
    }

    pub(super) fn client_error(&mut self, t: usize) {
        self.tenants[t].errors += 1;
    }

    pub(super) fn provider_429(&mut self, t: usize) {
        self.tenants[t].provider_429 += 1;
    }

    /// Tenants that could be served now: queued work and under their cap.
    pub(super) fn backlogged<T>(&self, s: &Scheduler<T>, keys: &[TenantKey]) -> Vec<usize> {
        keys.iter()
            .enumerate()
            .filter(|&(i, &k)| {
                let (queued, in_flight) = s.tenant_load(k);
                queued > 0 && self.tenants[i].cap.is_none_or(|c| in_flight < c)
            })
            .map(|(i, _)| i)
            .collect()
    }

    pub(super) fn dispatched(
        &mut self,
        t: usize,
        now_us: u64,
        wait_us: u64,
        tokens: u64,
        backlog: &[usize],
    ) {
        let in_run = now_us < self.run_us;
        let rec = &mut self.tenants[t];
        if in_run {
            rec.in_run_tokens += tokens;
        }
        rec.served += 1;
        rec.served_tokens += tokens;
        rec.waits_ms.push(wait_us as f64 / 1000.0);
        let total: f64 = backlog.iter().map(|&i| self.tenants[i].weight).sum();
        for &i in backlog {
            self.tenants[i].entitled += tokens as f64 * self.tenants[i].weight / total;
        }
    }

    pub(super) fn report(
        mut self,
        scenario: &Scenario,
        policy: Policy,
        end_us: u64,
        learned_limit: Option<u32>,
    ) -> Report {
        self.maxmin_entitlement();
        let total: u64 = self.tenants.iter().map(|t| t.served_tokens).sum();
        let ratios: Vec<f64> = self
            .tenants
            .iter()
            .filter(|t| t.entitled > 0.0)
            .map(|t| t.served_tokens as f64 / t.entitled)
            .collect();
        let jain = jain(&ratios);
        let mut groups: Vec<Row> = Vec::new();
        for (g, spec) in scenario.tenants.iter().enumerate() {
            let members: Vec<&mut TenantRec> =
                self.tenants.iter_mut().filter(|t| t.group == g).collect();
            let mut waits: Vec<f64> = members.iter().flat_map(|t| t.waits_ms.clone()).collect();
            waits.sort_by(f64::total_cmp);
            let served_tokens: u64 = members.iter().map(|t| t.served_tokens).sum();
            let entitled: f64 = members.iter().map(|t| t.entitled).sum();
            groups.push(Row {
                tenant: if spec.replicas > 1 {
                    format!("{} (×{})", spec.id, spec.replicas)
                } else {
                    spec.id.clone()
                },
                weight: spec.weight,
                arrived: members.iter().map(|t| t.arrived).sum(),
                served: members.iter().map(|t| t.served).sum(),
                served_tokens,
                in_run_tokens: members.iter().map(|t| t.in_run_tokens).sum(),
                share: ratio(served_tokens as f64, total as f64),
                entitled_share: ratio(entitled, total as f64),
                share_ratio: ratio(served_tokens as f64, entitled),
                wait_p50_s: quantile(&waits, 0.5) / 1000.0,
                wait_p95_s: quantile(&waits, 0.95) / 1000.0,
                wait_p99_s: quantile(&waits, 0.99) / 1000.0,
                per_s: members.iter().map(|t| t.served).sum::<u64>() as f64 / scenario.duration_s,
                wait_max_s: waits.last().copied().unwrap_or(0.0) / 1000.0,
                errors: members.iter().map(|t| t.errors).sum(),
                provider_429: members.iter().map(|t| t.provider_429).sum(),
            });
        }
        Report {
            scenario: scenario.name.clone(),
            policy: match policy {
                Policy::Drr => "drr",
                Policy::Fifo => "fifo",
            }
            .into(),
            simulated_s: end_us as f64 / 1e6,
            jain_index: jain,
            learned_limit,
            tenants: groups,
            endpoints: Vec::new(),
        }
    }
}

fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        0.0
    }
}

/// Jain's fairness index of `x`: 1 when all equal, 1/n when one takes everything.
pub fn jain(x: &[f64]) -> f64 {
    let sum: f64 = x.iter().sum();
    let sq: f64 = x.iter().map(|v| v * v).sum();
    if sq == 0.0 {
        1.0
    } else {
        sum * sum / (x.len() as f64 * sq)
    }
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let idx = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[idx]
}

/// One row of the report: a tenant, or a group of identical tenants.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    /// Tenant id (or `id (×N)` for a group).
    pub tenant: String,
    /// Weight of each member.
    pub weight: f64,
    /// Requests that arrived.
    pub arrived: u64,
    /// Requests served.
    pub served: u64,
    /// Actual tokens served.
    pub served_tokens: u64,
    /// Of those, tokens dispatched before the scenario's `duration_s` (while arrivals ran).
    pub in_run_tokens: u64,
    /// Fraction of all served tokens.
    pub share: f64,
    /// Fraction it was entitled to (see module docs).
    pub entitled_share: f64,
    /// served / entitled.
    pub share_ratio: f64,
    /// Queue wait percentiles, seconds.
    pub wait_p50_s: f64,
    /// 95th percentile wait, seconds.
    pub wait_p95_s: f64,
    /// 99th percentile wait, seconds.
    pub wait_p99_s: f64,
    /// Requests served per second of the scenario's duration.
    pub per_s: f64,
    /// Longest wait, seconds.
    pub wait_max_s: f64,
    /// Requests that failed (queue full, or retries exhausted against 429s).
    pub errors: u64,
    /// 429s the provider answered (absorbed by retries unless counted in `errors`).
    pub provider_429: u64,
}

/// The result of one run.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// Scenario name.
    pub scenario: String,
    /// `drr` or `fifo`.
    pub policy: String,
    /// Virtual time until the queue drained, seconds.
    pub simulated_s: f64,
    /// Jain's index of served/entitled over every tenant that was ever backlogged.
    pub jain_index: f64,
    /// The AIMD limit at the end (when the provider has a capacity).
    pub learned_limit: Option<u32>,
    /// Per tenant (or group).
    pub tenants: Vec<Row>,
    /// Per endpoint, when the pool has several (`sim::endpoints`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub endpoints: Vec<super::endpoints::EndpointRow>,
}

impl Report {
    /// The row of a tenant or group by its id prefix.
    pub fn row(&self, tenant: &str) -> Option<&Row> {
        self.tenants
            .iter()
            .find(|r| r.tenant == tenant || r.tenant.starts_with(&format!("{tenant} (")))
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "scenario {} · policy {} · {:.0} s simulated · Jain's index {:.3}{}",
            self.scenario,
            self.policy,
            self.simulated_s,
            self.jain_index,
            self.learned_limit
                .map(|l| format!(" · learned limit {l}"))
                .unwrap_or_default()
        )?;
        writeln!(
            f,
            "{:<16} {:>6} {:>8} {:>12} {:>7} {:>8} {:>6} {:>9} {:>9} {:>9} {:>6}",
            "tenant",
            "weight",
            "served",
            "tokens",
            "share",
            "entitled",
            "ratio",
            "wait p50",
            "wait p99",
            "wait max",
            "429s"
        )?;
        for r in &self.tenants {
            writeln!(
                f,
                "{:<16} {:>6.1} {:>8} {:>12} {:>6.1}% {:>7.1}% {:>6.2} {:>8.1}s {:>8.1}s {:>8.1}s {:>6}",
                r.tenant,
                r.weight,
                r.served,
                r.served_tokens,
                r.share * 100.0,
                r.entitled_share * 100.0,
                r.share_ratio,
                r.wait_p50_s,
                r.wait_p99_s,
                r.wait_max_s,
                r.provider_429
            )?;
        }
        super::endpoints::table(f, &self.endpoints)
    }
}
