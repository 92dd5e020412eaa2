//! Heap allocations per request through the whole stack (`server::stack`), counted, not timed:
//! the bench rig's chat request (`bench/chat.lua`'s 1.2 KB body, a tenant without limits,
//! `[admin]` on the main listener) sent `N` times through the stack in-process, its answer read
//! to the end, against the mock upstream running on another thread. Only allocations made on
//! the thread that drives the stack (and the upstream connection it opens) are counted; the
//! mock's are not. Deterministic: the figure to compare when a stage's future changes (a boxed
//! stage future is one allocation a request).
//!
//! `cargo run --example allocs` (debug is enough: allocations do not depend on the profile);
//! `N` overrides 2000. Prints `allocs/request`, `bytes/request` for a tenant without limits and
//! for one with a rate limit (whose `x-ratelimit-*` headers are written).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use tower::ServiceExt;

struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);
static BYTES: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static COUNTED: Cell<bool> = const { Cell::new(false) };
}

// SAFETY: every call is System's; the counters are atomics and a const thread-local.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTED.with(Cell::get) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
            BYTES.fetch_add(layout.size() as u64, Ordering::Relaxed);
        }
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new: usize) -> *mut u8 {
        if COUNTED.with(Cell::get) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
            BYTES.fetch_add(new as u64, Ordering::Relaxed);
        }
        unsafe { System.realloc(ptr, layout, new) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

fn body() -> Bytes {
    let filler = "The quick brown fox jumps over the lazy dog. ".repeat(24);
    Bytes::from(format!(
        "{{\"model\":\"gpt-4o-mini\",\"max_tokens\":16,\"messages\":[\
         {{\"role\":\"system\",\"content\":\"You are a terse benchmark assistant.\"}},\
         {{\"role\":\"user\",\"content\":\"{filler}\"}}]}}"
    ))
}

/// One request of `key` through `stack` (polled ready, called in place), read to its end.
async fn send<S>(stack: &mut S, key: &str, body: &Bytes)
where
    S: tower::Service<
        http::Request<Full<Bytes>>,
        Response = http::Response<fairgate::response::ResponseBody>,
    >,
    S::Error: std::fmt::Debug,
{
    let req = http::Request::post("/v1/chat/completions")
        .header("content-type", "application/json")
        .header("authorization", format!("Bearer {key}"))
        .body(Full::new(body.clone()))
        .unwrap();
    let res = stack.ready().await.unwrap().call(req).await.unwrap();
    assert_eq!(res.status(), 200);
    res.into_body().collect().await.unwrap();
}

fn main() {
    let n: u64 = std::env::var("N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    // The mock upstream on a runtime of its own, on other threads.
    let mock_rt = tokio::runtime::Runtime::new().unwrap();
    let mock = mock_rt
        .block_on(fairgate_mock::MockServer::start(
            "127.0.0.1:0".parse().unwrap(),
            fairgate_mock::MockConfig {
                record_requests: false,
                ..Default::default()
            },
        ))
        .unwrap();
    let config = fairgate::config::Config::from_toml_str(&format!(
        "[server]\nworkers = 1\n\
         [[upstreams]]\nname = \"mock\"\nbase_url = \"{}\"\nmax_concurrency = 1024\nmodels = [\"*\"]\n\
         [[tenants]]\nid = \"free\"\napi_keys = [\"fg-free\"]\n\
         [[tenants]]\nid = \"limited\"\napi_keys = [\"fg-limited\"]\nrequests_per_minute = 100000000\n",
        mock.base_url()
    ))
    .unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let body = body();
    rt.block_on(async {
        let state = fairgate::server::State::new(config).unwrap();
        // Called in place, as `server::live` calls each thread's cached stack.
        let mut stack = fairgate::server::stack::<Full<Bytes>>(&state);
        for key in ["fg-free", "fg-limited"] {
            for _ in 0..200 {
                send(&mut stack, key, &body).await;
            }
            let (a0, b0) = (
                ALLOCS.load(Ordering::Relaxed),
                BYTES.load(Ordering::Relaxed),
            );
            COUNTED.with(|c| c.set(true));
            for _ in 0..n {
                send(&mut stack, key, &body).await;
            }
            COUNTED.with(|c| c.set(false));
            let (a, b) = (
                ALLOCS.load(Ordering::Relaxed) - a0,
                BYTES.load(Ordering::Relaxed) - b0,
            );
            println!(
                "tenant {key}: {n} requests, {:.2} allocs/request, {:.0} bytes/request",
                a as f64 / n as f64,
                b as f64 / n as f64
            );
        }
    });
    drop(mock_rt);
}
