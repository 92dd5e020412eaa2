//! The simulator's endpoints (`[[pool.endpoints]]` in a scenario): the pool's fair queue over
//! several provider deployments, driven through the very `Balancer` the proxy uses
//! (`feedback::endpoints`) on the virtual clock — choice by priority and free learned capacity ×
//! weight, per-endpoint learning from 429s, ejection and probes, failover before any byte.
//!
//! Each endpoint's provider accepts `provider_capacity` concurrent requests and answers 429
//! beyond; during its `down` windows it refuses connections. An attempt refused or failed goes
//! on to another endpoint at once inside the same slot (charged once, as the retry stage does);
//! with none left the request is overloaded (the engine retries it later).
//!
//! Invariants: deterministic (no clock, no randomness of its own); every ticket taken is
//! released exactly once ([`Fleet::done`] or at once for a refused attempt).

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::feedback::endpoints::{health::Rules, Balancer, Signal, Spec, Ticket};

/// The time a refused or failed attempt costs before the next one, µs.
const ATTEMPT_US: u64 = 1_000;

/// One endpoint of the pool, as a scenario gives it.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EndpointSpec {
    /// Its name (in the report).
    pub name: String,
    /// fairgate's `max_concurrency` for it.
    pub max_concurrency: u32,
    /// 0 primary, higher: backups.
    #[serde(default)]
    pub priority: u32,
    /// Share of free capacity.
    #[serde(default = "one")]
    pub weight: f64,
    /// The deployment accepts this many concurrent requests and answers 429 beyond (default:
    /// `max_concurrency`).
    #[serde(default)]
    pub provider_capacity: Option<u32>,
    /// Its service time relative to the pool's `service_ms` (a slower deployment: > 1).
    #[serde(default = "one")]
    pub slowdown: f64,
    /// `[from_s, to_s)` windows in which it refuses connections.
    #[serde(default)]
    pub down: Vec<[f64; 2]>,
}

fn one() -> f64 {
    1.0
}

/// One endpoint's figures at the end of a run.
#[derive(Clone, Debug, Serialize)]
pub struct EndpointRow {
    /// Its name.
    pub name: String,
    /// Requests it served.
    pub served: u64,
    /// Attempts it answered 429.
    pub refused: u64,
    /// Attempts it failed (down).
    pub failed: u64,
    /// Times it was ejected.
    pub ejections: u64,
    /// Its learned limit at the end.
    pub learned_limit: u32,
    /// The most requests it had at once.
    pub peak: u32,
}

/// Where an attempt went.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Sent {
    /// Served by an endpoint, its service time multiplied by `slowdown`; `delay_us` spent on
    /// refused or failed attempts before it.
    Served {
        /// The endpoint's slowdown.
        slowdown: f64,
        /// Time lost to earlier attempts.
        delay_us: u64,
    },
    /// No endpoint could take it now.
    Overloaded,
}

/// The pool's endpoints during a run; see the module docs.
pub struct Fleet {
    balancer: Balancer,
    specs: Vec<EndpointSpec>,
    in_flight: Vec<u32>,
    rows: Vec<EndpointRow>,
    tickets: HashMap<u64, Ticket>,
    retry_after: Duration,
}

impl Fleet {
    /// The fleet of `specs` under a pool of `capacity` (`None` without endpoints).
    pub fn new(
        specs: &[EndpointSpec],
        capacity: u32,
        cooldown: Duration,
        retry_after: Duration,
    ) -> Option<Self> {
        if specs.is_empty() {
            return None;
        }
        let balancer = Balancer::new(
            specs
                .iter()
                .map(|s| Spec {
                    name: Arc::from(s.name.as_str()),
                    max: s.max_concurrency.max(1),
                    priority: s.priority,
                    weight: if s.weight > 0.0 { s.weight } else { 1.0 },
                })
                .collect(),
            capacity,
            Rules::default(),
            cooldown,
        );
        let rows = specs
            .iter()
            .map(|s| EndpointRow {
                name: s.name.clone(),
                served: 0,
                refused: 0,
                failed: 0,
                ejections: 0,
                learned_limit: s.max_concurrency,
                peak: 0,
            })
            .collect();
        Some(Self {
            balancer,
            specs: specs.to_vec(),
            in_flight: vec![0; specs.len()],
            rows,
            tickets: HashMap::new(),
            retry_after,
        })
    }

    /// What the fair queue may dispatch at `now`.
    pub fn capacity(&self, now: Duration) -> u32 {
        self.balancer.capacity(now)
    }

    /// The next moment the capacity changes by itself (a pause ends, a probe falls due).
    pub fn next_change(&self, now: Duration) -> Option<Duration> {
        self.balancer.next_change(now)
    }

    fn down(&self, i: usize, now: Duration) -> bool {
        let s = now.as_secs_f64();
        self.specs[i]
            .down
            .iter()
            .any(|[from, to]| *from <= s && s < *to)
    }

    /// Sends the request known as `id` at `now`: picks an endpoint, fails over from those that
    /// refuse or fail it; its ticket is kept until [`Fleet::done`].
    pub fn send(&mut self, id: u64, now: Duration) -> Sent {
        let mut exclude = 0u64;
        let mut delay_us = 0;
        loop {
            let Ok(t) = self.balancer.pick(now, "", exclude) else {
                return Sent::Overloaded;
            };
            let i = t.endpoint;
            let cap = self.specs[i]
                .provider_capacity
                .unwrap_or(self.specs[i].max_concurrency);
            let signal = if self.down(i, now) {
                self.rows[i].failed += 1;
                Signal::Failure
            } else if self.in_flight[i] >= cap {
                self.rows[i].refused += 1;
                Signal::Overload {
                    wait: Some(self.retry_after),
                    failed: false,
                }
            } else {
                self.in_flight[i] += 1;
                let row = &mut self.rows[i];
                row.served += 1;
                row.peak = row.peak.max(self.in_flight[i]);
                self.tickets.insert(id, t);
                return Sent::Served {
                    slowdown: self.specs[i].slowdown,
                    delay_us,
                };
            };
            self.balancer.observe(&t, now, signal);
            self.balancer.release(t);
            self.balancer.count_failover(i);
            delay_us += ATTEMPT_US;
            if i < 64 {
                exclude |= 1 << i;
            }
        }
    }

    /// The request known as `id` was answered at `now`.
    pub fn done(&mut self, id: u64, now: Duration) {
        if let Some(t) = self.tickets.remove(&id) {
            self.in_flight[t.endpoint] -= 1;
            self.balancer
                .observe(&t, now, Signal::Success { spent: None });
            self.balancer.release(t);
        }
    }

    /// Every endpoint's figures at `now`.
    pub fn rows(&self, now: Duration) -> Vec<EndpointRow> {
        let views = self.balancer.views(now);
        self.rows
            .iter()
            .zip(views)
            .map(|(r, v)| EndpointRow {
                ejections: v.ejections,
                learned_limit: v.limit,
                ..r.clone()
            })
            .collect()
    }
}

/// The report's endpoint table.
pub fn table(f: &mut fmt::Formatter<'_>, rows: &[EndpointRow]) -> fmt::Result {
    if rows.is_empty() {
        return Ok(());
    }
    writeln!(
        f,
        "{:<16} {:>8} {:>6} {:>7} {:>9} {:>7} {:>5}",
        "endpoint", "served", "429s", "failed", "ejections", "learned", "peak"
    )?;
    for r in rows {
        writeln!(
            f,
            "{:<16} {:>8} {:>6} {:>7} {:>9} {:>7} {:>5}",
            r.name, r.served, r.refused, r.failed, r.ejections, r.learned_limit, r.peak
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
