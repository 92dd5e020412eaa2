//! `fairgate simulate`: a deterministic what-if run of a scenario through the real scheduler on
//! a virtual clock. See `scenarios/` for the seven scenarios of the design, and issue 13's
//! non-reading client (`non-reading-client.toml`, a tenant's `hold_ms`), and closed-loop tenants
//! (`arrivals = { kind = "closed", concurrency, think_ms }`: `sequential-agent.toml`,
//! `interactive-user.toml`), compared alone / FIFO / DRR / at the limit by `compare`.
//!
//! Invariant: the simulator drives `crate::scheduler::Scheduler` (and the AIMD limiter) exactly
//! as the proxy does — enqueue, dispatch with the estimate of the moment, complete, reconcile —
//! so what it shows is what the proxy's scheduling does, minus the network.

mod compare;
mod endpoints;
mod engine;
mod maxmin;
mod report;
mod rng;
mod scenario;

pub use compare::{compare, Comparison};
pub use engine::run;
pub use report::{jain, Report, Row};
pub use rng::Rng;
pub use scenario::{Scenario, ScenarioError};
#[cfg(test)]
mod props;
#[cfg(test)]
mod tests;
