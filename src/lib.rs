//! fairgate: a reverse proxy for OpenAI-compatible LLM APIs that keeps many tenants fair on one
//! shared provider.
//!
//! The request path, one module per stage, outermost first: `render` (every outcome becomes one
//! response) → `tenant` → `ratelimit` (headers) → `metrics` → `body` → `route` → `estimate` →
//! `admission` → `usage` (reconcile) → `queue` (driving the pure `scheduler`) → `feedback`
//! (upstream capacity and retries) → `upstream`. Stages share one per-request [`context`] and
//! fail with their own [`error`] types. `server` assembles them into one tower stack;
//! ARCHITECTURE.md says which module may import which. `sim` drives the same scheduler on a
//! virtual clock. The bundled OpenAI-compatible test upstream is its own crate, `fairgate-mock`
//! (`crates/mock`), used only by `demo` and `fairgate mock-upstream`.
// `deny`, not `forbid`: `scheduler::prefetch` allows one cache-prefetch intrinsic and `memory`
// two calls into the allocator.
#![deny(unsafe_code)]

pub mod admin;
pub mod admission;
pub mod body;
pub mod budget;
pub mod cli;
pub mod cluster;
pub mod config;
pub mod context;
pub mod demo;
pub mod domain;
pub mod error;
pub mod estimate;
pub mod fdlimit;
pub mod feedback;
pub mod health;
pub mod jobs;
pub mod log;
pub mod memory;
pub mod metrics;
pub mod otel;
pub mod queue;
pub mod ratelimit;
pub mod render;
pub mod response;
pub mod route;
pub mod scheduler;
pub mod server;
pub mod sim;
pub mod stage;
pub mod tenant;
pub mod upstream;
pub mod usage;
pub mod worker;

pub use error::Error;
