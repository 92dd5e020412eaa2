//! A victim's service alone, beside the others under FIFO and under DRR, and at the limit a
//! non-preemptive pool allows (its weight ×1000: near-strict priority, it still waits for a slot
//! to free). `fairgate simulate` prints this for every tenant marked `victim = true`.
//!
//! Invariant: all four runs are the same scenario (same seed, same arrivals) but for the
//! tenants present or the victim's weight, so the ratios compare like with like.

use std::fmt;

use serde::Serialize;

use super::engine::run;
use super::report::Row;
use super::scenario::Scenario;
use crate::scheduler::Policy;

/// What one victim got in the four runs.
#[derive(Clone, Debug, Serialize)]
pub struct Comparison {
    /// The victim's row label.
    pub victim: String,
    /// The victim alone on the pool.
    pub alone: Row,
    /// Beside the others, FIFO.
    pub fifo: Row,
    /// Beside the others, DRR (the scenario's quantum).
    pub drr: Row,
    /// Beside the others, DRR with the victim's weight ×1000.
    pub limit: Row,
}

/// One comparison per tenant entry marked `victim`.
pub fn compare(s: &Scenario) -> Vec<Comparison> {
    let fifo = run(s, Policy::Fifo);
    let drr = run(s, Policy::Drr);
    let mut out = Vec::new();
    for (i, spec) in s.tenants.iter().enumerate().filter(|(_, t)| t.victim) {
        let row_of = |r: &super::Report| r.tenants[i].clone();
        let mut alone = s.clone();
        alone.tenants = vec![spec.clone()];
        let mut limit = s.clone();
        limit.tenants[i].weight *= 1000.0;
        out.push(Comparison {
            victim: drr.tenants[i].tenant.clone(),
            alone: run(&alone, Policy::Drr).tenants[0].clone(),
            fifo: row_of(&fifo),
            drr: row_of(&drr),
            limit: row_of(&run(&limit, Policy::Drr)),
        });
    }
    out
}

impl fmt::Display for Comparison {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "victim {}: requests/s (÷ alone), queue wait p95",
            self.victim
        )?;
        let alone = self.alone.per_s;
        for (name, r) in [
            ("alone", &self.alone),
            ("fifo", &self.fifo),
            ("drr", &self.drr),
            ("limit (weight ×1000)", &self.limit),
        ] {
            let ratio = if alone > 0.0 { r.per_s / alone } else { 0.0 };
            writeln!(
                f,
                "  {name:<21} {:>9.2}/s ({ratio:.2}×)  p95 {:>8.1} ms",
                r.per_s,
                r.wait_p95_s * 1000.0
            )?;
        }
        Ok(())
    }
}
