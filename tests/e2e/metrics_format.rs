//! A full `/metrics` scrape — after successes, a refusal, a stream and an upstream error, with
//! OpenTelemetry on — parsed by a real exposition-format parser (the official Python client's,
//! `tests/prometheus/check_scrape.py`): every family has `# HELP` and `# TYPE`, once. Needs
//! `pip install prometheus-client` (`support::needs::PROMETHEUS_PARSER`).
//! Also: `fairgate_build_info`, the `process_*` families, the input/output split of tokens and
//! the GenAI client metrics, and one meaning per label (`plan`, never `tenant`, carries a plan).

use std::process::Command;

use crate::support::needs::PROMETHEUS_PARSER;
use crate::support::{self as common, chat, post, send, Conf, KEY_A, KEY_B};

/// Runs the parser on `text`: `Some(report)` on success, `None` when skipped.
fn parse(text: &str) -> Option<String> {
    let dir = std::env::temp_dir().join(format!("fairgate-scrape-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join(format!("{}.txt", rand_suffix()));
    std::fs::write(&file, text).unwrap();
    let out = Command::new("python3")
        .arg("tests/prometheus/check_scrape.py")
        .arg(&file)
        .output();
    let _ = std::fs::remove_file(&file);
    let stderr = |o: &std::process::Output| String::from_utf8_lossy(&o.stderr).into_owned();
    // No python3, or check_scrape.py's exit 2: the parser package is missing.
    let out = match out {
        Ok(o) if o.status.code() != Some(2) => o,
        Ok(o) => {
            PROMETHEUS_PARSER.missing_because(&stderr(&o));
            return None;
        }
        Err(e) => {
            PROMETHEUS_PARSER.missing_because(&format!("python3: {e}"));
            return None;
        }
    };
    let stderr = stderr(&out);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "the scrape does not parse clean:\n{stderr}\n{stdout}\n{text}"
    );
    Some(stdout)
}

fn rand_suffix() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(1);
    h.finish()
}

async fn traffic(addr: std::net::SocketAddr) {
    for key in [KEY_A, KEY_B] {
        let r = send(post(
            addr,
            "/v1/chat/completions",
            Some(key),
            &chat("gpt-4o"),
            &[],
        ))
        .await;
        assert_eq!(r.status, 200);
    }
    let stream = r#"{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    let r = send(post(addr, "/v1/chat/completions", Some(KEY_A), stream, &[])).await;
    assert_eq!(r.status, 200);
    // An upstream error passed on, and a refusal.
    let r = send(post(
        addr,
        "/v1/chat/completions",
        Some(KEY_A),
        &chat("gpt-4o"),
        &[("x-mock-status", "500")],
    ))
    .await;
    assert!(r.status >= 500, "{}", r.status);
    let too_big = r#"{"model":"gpt-4o","max_tokens":99999999,"messages":[]}"#;
    let r = send(post(
        addr,
        "/v1/chat/completions",
        Some(KEY_B),
        too_big,
        &[],
    ))
    .await;
    assert_eq!(r.status, 400);
}

#[tokio::test]
async fn a_full_scrape_parses_with_help_and_type_on_every_family() {
    let mock = common::mock().await;
    let proxy = Conf::new(&mock.base_url())
        .set("otel.endpoint", "http://127.0.0.1:9")
        .start()
        .await;
    traffic(proxy.addr).await;
    let text = common::scrape(proxy.addr).await;
    let value = |name: &str, labels: &[(&str, &str)]| common::value(&text, name, labels);
    assert_eq!(
        value(
            "fairgate_build_info",
            &[("version", env!("CARGO_PKG_VERSION"))]
        ),
        Some(1.0)
    );
    assert!(value("process_resident_memory_bytes", &[]).unwrap() > 0.0);
    assert!(value("process_cpu_seconds_total", &[]).is_some());
    // Tokens split by type: the mock's usage is prompt 2-ish, completion 16.
    let input = value(
        "fairgate_tokens_actual_total",
        &[("tenant", "b"), ("type", "input")],
    );
    let output = value(
        "fairgate_tokens_actual_total",
        &[("tenant", "b"), ("type", "output")],
    );
    assert!(
        input.unwrap() > 0.0 && output.unwrap() > input.unwrap(),
        "{text}"
    );
    // GenAI client metrics: the provider's usage per request, the call's duration.
    let usage = |kind| {
        value(
            "gen_ai_client_token_usage_sum",
            &[
                ("gen_ai_token_type", kind),
                ("gen_ai_operation_name", "chat"),
            ],
        )
    };
    assert!(usage("output").unwrap() >= 3.0 * 16.0 - 0.5, "{text}");
    assert!(text.contains("gen_ai_client_operation_duration_seconds_bucket{"));
    assert!(
        text.contains(r#"error_type="500""#),
        "an upstream error has its error_type"
    );
    assert!(text.contains(r#"server_address="127.0.0.1""#));
    let Some(report) = parse(&text) else { return };
    for family in [
        "fairgate_requests",
        "fairgate_tokens_actual",
        "fairgate_queue_wait_seconds",
        "fairgate_rejected",
        "fairgate_otel_dropped",
        "fairgate_build_info",
        "process_cpu_seconds",
        "gen_ai_client_token_usage",
        "gen_ai_client_operation_duration_seconds",
    ] {
        assert!(
            report.lines().any(|l| l.starts_with(&format!("{family} "))),
            "{family} not in the parsed scrape:\n{report}"
        );
    }
}

#[tokio::test]
async fn without_per_tenant_labels_the_plan_is_a_plan_label_never_a_tenant_one() {
    let mock = common::mock().await;
    let proxy = Conf::new(&mock.base_url())
        .tenant("b", "plan", "gold")
        .set("plans.gold.weight", 2.0)
        .set("metrics.per_tenant_labels", false)
        .start()
        .await;
    traffic(proxy.addr).await;
    let text = common::scrape(proxy.addr).await;
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        assert!(
            !line.contains("tenant=\""),
            "a tenant label without per_tenant_labels: {line}"
        );
    }
    assert!(common::value(&text, "fairgate_requests_total", &[("plan", "gold")]).is_some());
    assert!(common::value(&text, "fairgate_requests_total", &[("plan", "none")]).is_some());
    parse(&text);
}
