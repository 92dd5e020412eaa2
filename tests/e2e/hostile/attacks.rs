//! The other attacks of issue 13, each with a victim served beside it and the attacker's effect
//! printed as a figure and asserted as a bound.

use std::time::Duration;

use fairgate_mock::MockConfig;

use super::support::{figure, scrape, throughput_ratio, value, victim_run};
use crate::support::{chat, mock_with, post, scrape_with, send, unique_env, Conf, KEY_A, KEY_B};

const VICTIM: usize = 6;

/// Starts `n` attacker requests (tenant A) with `body` and `headers`, each resent when it ends,
/// until `stop` is set or each has been sent `rounds` times (bounded in count).
fn flood(
    addr: std::net::SocketAddr,
    n: usize,
    rounds: usize,
    body: String,
    headers: Vec<(&'static str, &'static str)>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> Vec<tokio::task::JoinHandle<Vec<u16>>> {
    flood_as(addr, KEY_A, n, rounds, body, headers, stop)
}

/// [`flood`] as the tenant of `key`.
fn flood_as(
    addr: std::net::SocketAddr,
    key: &'static str,
    n: usize,
    rounds: usize,
    body: String,
    headers: Vec<(&'static str, &'static str)>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> Vec<tokio::task::JoinHandle<Vec<u16>>> {
    (0..n)
        .map(|_| {
            let (body, headers, stop) = (body.clone(), headers.clone(), stop.clone());
            tokio::spawn(async move {
                let mut statuses = Vec::new();
                for _ in 0..rounds {
                    if stop.load(std::sync::atomic::Ordering::Relaxed) {
                        break;
                    }
                    let r = send(post(
                        addr,
                        "/v1/chat/completions",
                        Some(key),
                        &body,
                        &headers,
                    ))
                    .await;
                    statuses.push(r.status);
                }
                statuses
            })
        })
        .collect()
}

async fn stop_all(
    stop: &std::sync::Arc<std::sync::atomic::AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<Vec<u16>>>,
) -> Vec<u16> {
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    all
}

fn slow_mock() -> MockConfig {
    MockConfig {
        base_latency: Duration::from_millis(20),
        retry_after: Duration::from_millis(100),
        ..MockConfig::default()
    }
}

#[tokio::test]
async fn a_tenant_flooding_maximum_size_requests() {
    let mock = mock_with(slow_mock()).await;
    let proxy = Conf::new(&mock.base_url())
        .server("max_body_bytes", 262144)
        .upstream("max_concurrency", 2)
        .start()
        .await;
    let alone = victim_run(proxy.addr, &mock.stats, KEY_B, VICTIM, &[]).await;
    // 16 concurrent requests at the body cap (a 250 KiB prompt) asking for the most output.
    let content = "lorem ipsum ".repeat(250 * 1024 / 12);
    let body = format!(
        r#"{{"model":"gpt-4o-mini","max_tokens":4096,"mock_output_tokens":64,"messages":[{{"role":"user","content":"{content}"}}]}}"#
    );
    let stop = std::sync::Arc::default();
    let tasks = flood(
        proxy.addr,
        16,
        20,
        body,
        vec![],
        std::sync::Arc::clone(&stop),
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    let attacked = victim_run(proxy.addr, &mock.stats, KEY_B, VICTIM, &[]).await;
    let statuses = stop_all(&stop, tasks).await;
    let ratio = throughput_ratio(&alone, &attacked);
    figure(
        "flood of maximum-size requests (16 concurrent, 250 KiB, max_tokens 4096; pool of 2)",
        "victim throughput under attack / alone",
        ratio,
        &format!(
            "victim waited behind at most {} upstream requests; attacker sent {}",
            attacked.behind_max - 1,
            statuses.len()
        ),
    );
    assert_eq!(attacked.ok, VICTIM);
    // Fair queueing: the victim waits for slots to free, not behind the attacker's backlog
    // (16 queued; FIFO measures 17): its own request, the pool's two slots freeing (one of
    // them possibly to the attacker, whose turn may come first), and up to two attacker
    // requests already dispatched but still in transit to the mock (250 KiB each) when the
    // count was sampled — seen once on a loaded machine.
    assert!(
        attacked.behind_max <= 1 + 2 * 2 + 2,
        "{}",
        attacked.behind_max
    );
}

#[tokio::test]
async fn a_retry_storm_and_an_exhausted_key() {
    // Tenant b brings its own provider key, and that key is exhausted: the provider answers
    // every request made with it 429 (played by `x-mock-status` on b's requests). Its pause is
    // b's alone: the pool's learned limit stays, b is refused at once without retries holding
    // slots, and the victim (tenant a, on the pool key) keeps its throughput.
    let mock = mock_with(slow_mock()).await;
    let proxy = Conf::new(&mock.base_url())
        .upstream("max_concurrency", 2)
        .tenant("b", "upstream_api_key_env", "FG_HOSTILE_OWN_KEY")
        .start_with_env(&[("FG_HOSTILE_OWN_KEY", "sk-exhausted")])
        .await;
    let alone = victim_run(proxy.addr, &mock.stats, KEY_A, VICTIM, &[]).await;
    let stop = std::sync::Arc::default();
    let tasks = flood_as(
        proxy.addr,
        KEY_B,
        8,
        10,
        chat("gpt-4o-mini"),
        vec![("x-mock-status", "429")],
        std::sync::Arc::clone(&stop),
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    let attacked = victim_run(proxy.addr, &mock.stats, KEY_A, VICTIM, &[]).await;
    let statuses = stop_all(&stop, tasks).await;
    let metrics = scrape(proxy.addr).await;
    let limit = value(&metrics, "fairgate_upstream_limit", &[]);
    let ratio = throughput_ratio(&alone, &attacked);
    let own_key_requests = mock
        .stats
        .seen_authorization()
        .iter()
        .flatten()
        .filter(|a| a.contains("sk-exhausted"))
        .count();
    figure(
        "own provider key exhausted (every answer to it 429; 8 clients; pool of 2)",
        "victim throughput under attack / alone",
        ratio,
        &format!(
            "learned pool limit after: {limit}; attacker got {} answers, all 429; {own_key_requests} \
             of them reached the provider",
            statuses.len(),
        ),
    );
    assert_eq!(attacked.ok, VICTIM, "the victim is served during the storm");
    assert!(statuses.iter().all(|s| *s == 429), "{statuses:?}");
    assert_eq!(
        limit, 2.0,
        "the pool's learned limit is the pool key's alone"
    );
    assert!(
        ratio >= 0.6,
        "victim throughput under attack / alone = {ratio:.2}"
    );
    assert!(
        own_key_requests * 4 <= statuses.len(),
        "the paused key is refused by fairgate, not retried at the provider: \
         {own_key_requests} of {} reached it",
        statuses.len()
    );
}

#[tokio::test]
async fn spoofed_operator_headers() {
    // Header stripping (issue 13 point 6) lands on another branch: here the figure counts what
    // reached the provider. After merge: re-run, expect 0.
    let mock = mock_with(MockConfig {
        record_requests: true,
        ..slow_mock()
    })
    .await;
    let proxy = Conf::new(&mock.base_url())
        .upstream("max_concurrency", 2)
        .start()
        .await;
    let spoof = [
        ("openai-organization", "org-operator"),
        ("openai-project", "proj-operator"),
        ("x-api-key", "sk-stolen"),
        ("api-key", "sk-stolen"),
        ("x-fairgate-priority", "interactive"),
    ];
    let attacker = victim_run(proxy.addr, &mock.stats, KEY_A, 3, &spoof).await;
    let victim = victim_run(proxy.addr, &mock.stats, KEY_B, VICTIM, &[]).await;
    let reached: usize = mock
        .stats
        .seen_headers()
        .iter()
        .map(|h| spoof.iter().filter(|(k, _)| h.contains_key(*k)).count())
        .sum();
    figure(
        "spoofed operator headers (openai-organization, openai-project, x-api-key, api-key, x-fairgate-*)",
        "spoofed headers that reached the provider",
        reached as f64,
        "3 attacker requests × 5 headers",
    );
    assert_eq!(attacker.ok, 3);
    assert_eq!(victim.ok, VICTIM);
    assert_eq!(reached, 0, "spoofed operator headers reached the provider");
    // The tenant's own key never reaches the provider, whatever it sends.
    assert!(mock
        .stats
        .seen_authorization()
        .iter()
        .flatten()
        .all(|a| !a.contains(KEY_A) && !a.contains(KEY_B)));
}

#[tokio::test]
async fn spoofed_sidecar_header() {
    // Sidecar mode: `tenant_header` names the tenant, trusted only from `trusted_sources` —
    // here a range the test's loopback clients are not in, so the header is ignored and a key
    // is required: the attacker's requests are its own (tenant a), none is charged to b.
    let mock = mock_with(slow_mock()).await;
    let var = unique_env("SPOOF_ADMIN");
    let proxy = Conf::new(&mock.base_url())
        .server("tenant_header", "x-tenant-id")
        .server("trusted_sources", ["10.0.0.0/8"])
        .upstream("max_concurrency", 2)
        .set("admin.token_env", &var)
        .start_with_env(&[(&var, "tok-spoof")])
        .await;
    let victim = victim_run(
        proxy.addr,
        &mock.stats,
        KEY_B,
        VICTIM,
        &[("x-tenant-id", "b")],
    )
    .await;
    // The attacker reaches the proxy directly and names the victim's tenant.
    let spoofed = victim_run(proxy.addr, &mock.stats, KEY_A, 3, &[("x-tenant-id", "b")]).await;
    // Loopback is not trusted here: the operator scrapes with the admin token.
    let metrics = scrape_with(proxy.addr, "tok-spoof").await;
    let charged_b = value(
        &metrics,
        "fairgate_requests_total",
        &[("tenant", "b"), ("status", "200")],
    );
    let spoofed_share = (charged_b - VICTIM as f64) / 3.0;
    figure(
        "spoofed sidecar header (x-tenant-id naming the victim, from an untrusted address)",
        "spoofed requests charged to the victim / sent",
        spoofed_share,
        &format!(
            "{} spoofed requests answered (as the attacker's own)",
            spoofed.ok
        ),
    );
    assert_eq!(victim.ok, VICTIM);
    assert_eq!(spoofed_share, 0.0, "a spoofed header charged the victim");
}

#[tokio::test]
async fn a_label_flood() {
    let mock = mock_with(slow_mock()).await;
    let proxy = Conf::new(&mock.base_url())
        .upstream("max_concurrency", 2)
        .start()
        .await;
    let victim_before = victim_run(proxy.addr, &mock.stats, KEY_B, 2, &[]).await;
    let base = scrape(proxy.addr).await.len();
    // 300 distinct long model names: every one is a candidate metrics label and log field.
    for i in 0..300 {
        let model = format!("model-{i}-{}", "x".repeat(200));
        let _ = send(post(
            proxy.addr,
            "/v1/chat/completions",
            Some(KEY_A),
            &chat(&model),
            &[],
        ))
        .await;
    }
    let victim = victim_run(proxy.addr, &mock.stats, KEY_B, VICTIM, &[]).await;
    let text = scrape(proxy.addr).await;
    let series_a = text
        .lines()
        .filter(|l| !l.starts_with('#') && l.contains("tenant=\"a\"") && l.contains("model="))
        .count();
    figure(
        "label flood (300 distinct 200-byte model names)",
        "/metrics size after ÷ before",
        text.len() as f64 / base as f64,
        &format!("{series_a} series of tenant a carry a model label"),
    );
    assert_eq!(victim_before.ok + victim.ok, 2 + VICTIM);
    // Past the per-tenant cap (32 models), models fold into `other`: three token series per
    // model (estimated; actual input and output), so the series stay bounded whatever the
    // attacker sends.
    assert!(series_a <= 3 * (32 + 1), "{series_a}");
}
