//! fairgate: a reverse proxy for OpenAI-compatible LLM APIs that keeps many tenants fair on one
//! shared provider.
//!
//! The request path, one module per stage: `tenant` → `estimate` → `admission` → `queue`
//! (driving the pure `scheduler`) → `upstream` → `usage`/reconcile. `server` assembles them into
//! one tower stack; `mock` is the bundled OpenAI-compatible test upstream; `sim` drives the same
//! scheduler on a virtual clock.
#![forbid(unsafe_code)]

pub mod domain;
pub mod mock;
