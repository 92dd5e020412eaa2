//! fairgate: a reverse proxy for OpenAI-compatible LLM APIs that keeps many tenants fair on one
//! shared provider.
//!
//! The request path, one module per stage: `tenant` → `body` (→ `estimate` → `admission`) →
//! `route` → `queue` (driving the pure `scheduler`) → `upstream` → `usage`/reconcile. `server`
//! assembles them into one tower stack; `edge` renders errors (`error`) once; `mock` is the
//! bundled OpenAI-compatible test upstream; `sim` drives the same scheduler on a virtual clock.
// `deny`, not `forbid`: `scheduler::prefetch` allows one cache-prefetch intrinsic.
#![deny(unsafe_code)]

pub mod admin;
pub mod admission;
pub mod body;
pub mod cli;
pub mod cluster;
pub mod config;
pub mod demo;
pub mod domain;
pub mod edge;
pub mod error;
pub mod estimate;
pub mod health;
pub mod logfields;
pub mod logout;
pub mod logtime;
pub mod metrics;
pub mod mock;
pub mod queue;
pub mod response;
pub mod route;
pub mod scheduler;
pub mod server;
pub mod sim;
pub mod tenant;
pub mod upstream;
pub mod usage;

pub use error::Error;
