//! The fair queue in the request path: the imperative shell around the pure `scheduler`.
//!
//! One [`FairQueue`] per upstream pool. `acquire` enqueues a request with its cost inputs and
//! waits for a grant; the grant is a [`Permit`] (tenant slot + pool slot) that lives as long as
//! the response body (the stage attaches it there) and is released by `Drop`.
//!
//! Invariants:
//! - No lock is held across `.await`; the scheduler is only touched under a short std mutex.
//! - Nothing leaks: a waiter dropped while queued is removed without charge; a grant that finds
//!   its waiter gone is released at once; a dropped permit (body finished, client gone, upstream
//!   aborted, future cancelled) returns its slot exactly once and dispatches the next request.
//! - Permits dropped inside the lock's scope are never released there (that would re-enter the
//!   mutex): they are collected and dropped after unlocking.
//! - Request bytes held per pool and tenant are bounded (`bytes`, a reservation released on
//!   `Drop`).

pub mod bytes;
mod fair;
mod layer;
mod permit;
mod pools;

pub use crate::estimate::CostInputs;
pub use fair::{FairQueue, QueueError, QueueSettings, TenantSettings, WaitInputs};
pub use layer::{Layer, Observer, Queueing};
pub use permit::Permit;
pub use pools::{pool, pools, scheduler_config, tenant_settings};
#[cfg(test)]
mod tests;
