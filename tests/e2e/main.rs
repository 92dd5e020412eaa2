//! fairgate end to end, in one test binary: every module below is a topic (the file of the same
//! name), its tests over real sockets on port 0 against the bundled mock upstream
//! (`fairgate-mock`), with raw HTTP and the real `async-openai` client. One binary links the
//! crate (with its bundled SQLite and tiktoken) once, instead of once per topic.
//!
//! Run one topic, or one test, by its path: `cargo test --test e2e cluster::` or
//! `cargo test --test e2e fair_queue::noisy_neighbor`. The whole suite, with what it needs
//! installed first, is `scripts/test`.
//!
//! Tests run in parallel threads of this one process, so none may change process-wide state:
//! no `set_var` (a proxy's `*_env` settings come from `support::proxy_with_env`), no rlimits
//! (`connections::fdlimit` lowers its descriptor limit in a spawned `fairgate serve`), no
//! global recorder or subscriber. A test that needs its own process runs the `fairgate` binary
//! (`cli`, `serve`, `jobs_restart`, `connections::fdlimit`, `mock_profiles`).
//!
//! `support` holds the shared helpers: the mock and proxy starters, the config builder, raw
//! HTTP, metrics scraping, and the external programs (`redis-server`, chromium) a test needs.

mod support;

mod accounting;
mod admin;
mod admission;
mod answer_headers;
mod backpressure;
mod budgets;
mod caps;
mod cli;
mod cluster;
mod connections;
mod console;
mod deploy;
mod endpoints;
mod errors;
mod estimate;
mod fair_queue;
mod forwarding;
mod hostile;
mod jobs;
mod jobs_files;
mod jobs_restart;
mod key_isolation;
mod light_tenants;
mod metrics;
mod metrics_format;
mod metrics_scale;
mod mock_profiles;
mod openai_client;
mod ops_access;
mod otel;
mod otel_genai;
mod refusals;
mod reload;
mod serve;
mod stream_budget;
mod tenants;
mod tls;
