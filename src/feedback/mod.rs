//! Upstream feedback: what the provider's answers teach fairgate, and the retries they allow.
//!
//! - [`aimd`]: the pure additive-increase / multiplicative-decrease controller (no I/O, time
//!   passed in), shared with the simulator.
//! - [`capacity`]: a pool's learned capacity ([`capacity::PoolCapacity`] around [`aimd::Aimd`]):
//!   429s, `Retry-After` and `x-ratelimit-*` lower or pause it; successes raise it; the fair
//!   queue's dispatch follows it.
//! - [`keys`]: what a tenant's own provider key learned (a pause per pool, tenant and model);
//!   never the pool's.
//! - [`retry`]: the stage just above `upstream`, inside the fair-queue permit: feeds every
//!   upstream answer to the pool's capacity (or, for a tenant's own key, to [`keys`]) and
//!   retries 429/502/503 answered before any byte reached the client, waiting at most
//!   `max_retry_wait_ms` in all.
//!
//! Imports `queue` (the capacity sets the pool's dispatch limit) and `ratelimit` (a retried
//! attempt is charged to the tenant), never a stage above the queue.

pub mod aimd;
pub mod capacity;
pub mod keys;
pub mod retry;
