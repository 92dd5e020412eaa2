//! Upstream feedback: what the provider's answers teach fairgate, and the retries they allow.
//!
//! - [`aimd`]: the pure additive-increase / multiplicative-decrease controller (no I/O, time
//!   passed in), shared with the simulator.
//! - [`endpoints`]: the pure core below one pool's fair queue: which endpoint a request goes
//!   to, each endpoint's learned limit ([`aimd::Aimd`]), pauses and health (ejection, probes);
//!   the pool's capacity is the sum of its usable endpoints'.
//! - [`signals`]: what an answer's status and headers say (waits, spent budgets, a model's
//!   limit), as an endpoint [`endpoints::Signal`].
//! - [`capacity`]: the shell around [`endpoints::Balancer`] ([`capacity::PoolCapacity`]): picks
//!   an endpoint per attempt, feeds it the answers, applies the capacity to the fair queue.
//! - [`keys`]: what a tenant's own provider key learned (a pause per pool, endpoint, tenant and
//!   model); never the pool's.
//! - [`retry`]: the stage just above `upstream`, inside the fair-queue permit: picks each
//!   attempt's endpoint, feeds every upstream answer to it (or, for a tenant's own key, to
//!   [`keys`]), sends a request refused or failed before any byte reached the client on to
//!   another endpoint (charged once), and retries 429/502/503 with backoff, waiting at most
//!   `max_retry_wait_ms` in all.
//!
//! Imports `queue` (the capacity sets the pool's dispatch limit) and `ratelimit` (a retried
//! attempt is charged to the tenant), never a stage above the queue.

pub mod aimd;
pub mod capacity;
pub mod endpoints;
pub mod keys;
pub mod retry;
pub mod signals;
