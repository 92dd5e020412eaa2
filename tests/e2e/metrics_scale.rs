//! `/metrics` holds at many tenants with the default `[metrics]` settings: after 2,000 tenants
//! each sent one request, the scrape is at most 5 lines per tenant (requests by status,
//! estimated tokens, actual input and output tokens, admitted cost) plus at most
//! `FIXED_LINES` that do not grow with tenants (HELP/TYPE, histograms by plan, the top tenants'
//! gauges, process and GenAI families); histograms carry the plan cohort, not the tenant; the scrape-time gauges are
//! written for the `top_tenants` with the most backlog only. And `GET /admin/state` stays bounded:
//! its `top` rows whatever the number of tenants, sorted by who is furthest below their
//! entitlement. Counts only, never wall time (the 10,000-tenant timings are in BENCHMARKS.md,
//! `bench/tenants10k.sh`). With the default `histograms = "auto"`, those 2,000 tenants get
//! histograms by plan, and a deployment of at most `AUTO_TENANT_HISTOGRAMS` (200) tenants gets
//! them per tenant (with the plan label too), within ~100 lines per tenant.

use std::sync::Arc;

use crate::support::*;
use bytes::Bytes;
use fairgate_mock::MockConfig;
use http::Request;
use http_body_util::Full;

const TENANTS: usize = 2_000;
const CONCURRENCY: usize = 16;

/// The admin API on (token in `var`), a pool of 64, `tenants` tenants `tNNNNN` (key
/// `key-NNNNN`), every other one on plan `gold` (weight 2).
fn config(base_url: &str, var: &str, tenants: usize) -> Conf {
    let conf = Conf::pool(base_url, 64)
        .set("admin.token_env", var)
        .set("plans.gold.weight", 2.0);
    (0..tenants).fold(conf, |c, i| {
        let tenant = entry("id", format!("t{i:05}")).with("api_keys", [format!("key-{i:05}")]);
        c.push(
            "tenants",
            if i % 2 == 0 {
                tenant.with("plan", "gold")
            } else {
                tenant
            },
        )
    })
}

/// Sends one request for each of the first `n` tenants of [`config`], 16 at a time.
async fn serve_each(addr: std::net::SocketAddr, n: usize) -> usize {
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut workers = Vec::new();
    for _ in 0..CONCURRENCY {
        let next = next.clone();
        workers.push(tokio::spawn(async move {
            let mut ok = 0usize;
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= n {
                    return ok;
                }
                let key = format!("key-{i:05}");
                let r = send(post(addr, "/v1/chat/completions", Some(&key), &body(), &[])).await;
                ok += usize::from(r.status == 200);
            }
        }));
    }
    let mut ok = 0;
    for w in workers {
        ok += w.await.unwrap();
    }
    ok
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_deployment_gets_per_tenant_histograms_by_default() {
    const SMALL: usize = fairgate::config::AUTO_TENANT_HISTOGRAMS;
    let mock = mock_with(MockConfig::default()).await;
    let var = unique_env("SMALL");
    let proxy = config(&mock.base_url(), &var, SMALL)
        .start_with_env(&[(&var, "t")])
        .await;
    assert_eq!(serve_each(proxy.addr, SMALL).await, SMALL);
    let text = scrape(proxy.addr).await;
    let lines = text.lines().count();
    println!("/metrics at {SMALL} tenants, histograms = \"auto\" (per tenant): {lines} lines");
    for i in [0, SMALL - 1] {
        let plan = if i % 2 == 0 { "gold" } else { "none" };
        let labels = [
            ("tenant", format!("t{i:05}")),
            ("plan", plan.to_owned()),
            ("class", "interactive".to_owned()),
        ];
        let labels: Vec<(&str, &str)> = labels.iter().map(|(k, v)| (*k, v.as_str())).collect();
        assert_eq!(
            value(&text, "fairgate_queue_wait_seconds_count", &labels),
            Some(1.0),
            "t{i:05}'s own queue wait, with its plan"
        );
    }
    assert!(
        lines <= 100 * SMALL + 1200,
        "/metrics has {lines} lines for {SMALL} tenants"
    );
}

fn body() -> String {
    r#"{"model":"gpt-4o-mini","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}"#
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_stay_within_five_lines_per_tenant_at_two_thousand_tenants() {
    // The families that do not grow with tenants (the top 100's four gauges are 400 of them).
    const FIXED_LINES: usize = 1200;
    let mock = mock_with(MockConfig::default()).await;
    let var = unique_env("SCALE");
    let token = "scale-token";
    let proxy = config(&mock.base_url(), &var, TENANTS)
        .start_with_env(&[(&var, token)])
        .await;
    let addr = proxy.addr;
    // One request per tenant, CONCURRENCY at a time (bounded in count).
    let ok = serve_each(addr, TENANTS).await;
    assert_eq!(ok, TENANTS, "every tenant was served");

    let text = scrape(addr).await;
    let lines = text.lines().count();
    assert!(
        lines <= 5 * TENANTS + FIXED_LINES,
        "/metrics has {lines} lines for {TENANTS} tenants (bound {})",
        5 * TENANTS + FIXED_LINES
    );
    // Every tenant is still counted by id...
    for i in [0, 777, TENANTS - 1] {
        let labels = [("tenant", format!("t{i:05}")), ("status", "200".to_owned())];
        let labels: Vec<(&str, &str)> = labels.iter().map(|(k, v)| (*k, v.as_str())).collect();
        assert_eq!(
            value(&text, "fairgate_requests_total", &labels),
            Some(1.0),
            "t{i:05}"
        );
    }
    // ...histograms by plan cohort only...
    let gold = [("plan", "gold"), ("class", "interactive")];
    let none = [("plan", "none"), ("class", "interactive")];
    let waits = value(&text, "fairgate_queue_wait_seconds_count", &gold).unwrap()
        + value(&text, "fairgate_queue_wait_seconds_count", &none).unwrap();
    assert_eq!(waits, TENANTS as f64);
    assert!(!text
        .lines()
        .any(|l| l.starts_with("fairgate_queue_wait_seconds") && l.contains("tenant=")));
    // ...and the scrape-time gauges for the default top 100 only.
    let depth = text
        .lines()
        .filter(|l| l.starts_with("fairgate_queue_depth{"))
        .count();
    assert_eq!(depth, 100);

    // The console's read is bounded by `top`, whatever the number of tenants.
    let get = |path: String| {
        Request::get(format!("http://{addr}{path}"))
            .header("authorization", format!("Bearer {token}"))
            .body(Full::<Bytes>::default())
            .unwrap()
    };
    let r = send(get("/admin/state?top=50&timeline=1".into())).await;
    assert_eq!(r.status, 200);
    let v = r.json();
    assert_eq!(v["tenants_total"], TENANTS);
    assert_eq!(v["tenants"].as_array().unwrap().len(), 50);
    assert!(
        r.body.len() < 64 * 1024,
        "/admin/state?top=50 is {} bytes",
        r.body.len()
    );
    let r = send(get("/admin/state?top=100000".into())).await;
    assert_eq!(r.json()["tenants"].as_array().unwrap().len(), 500);
    // Sorted by entitled − served share, largest first.
    let rows = v["tenants"].as_array().unwrap();
    let gap = |r: &serde_json::Value| {
        r["entitled_share"].as_f64().unwrap() - r["served_share"].as_f64().unwrap()
    };
    assert!(rows.windows(2).all(|w| gap(&w[0]) >= gap(&w[1])));
    // Search: a substring of the id.
    let v = send(get("/admin/state?q=T0177".into())).await.json();
    let found: Vec<&str> = v["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["tenant"].as_str().unwrap())
        .collect();
    assert_eq!(found.len(), 10, "{found:?}");
    assert!(found.iter().all(|t| t.starts_with("t0177")));
    assert_eq!(v["matched"], 10);
}
