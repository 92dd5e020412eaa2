//! The hostile-tenant suite (issue 13): for each attack, a victim tenant's requests are served
//! while an attacker does its worst, with the attacker's effect printed as a figure (victim
//! requests served under attack ÷ alone, or the victim's share of a resource) measured in the
//! same run. Assertions are on counts, ratios and bounds, never on wall time; every load loop is
//! bounded in count and time.
//!
//! Run with `cargo test --test e2e hostile:: -- --nocapture` to see the figures (one `ISOLATION`
//! line per attack; docs/isolation.md's and BENCHMARKS.md's "Isolation" tables quote them).

mod attacks;

mod bytes;

mod stall;

mod support;
