//! OpenTelemetry's GenAI conventions end to end, against the OTLP/HTTP receiver of `otel`:
//! (a) for a JSON answer and an SSE stream, the server and client spans carry
//! `gen_ai.operation.name`, `gen_ai.provider.name`, `gen_ai.request.model`,
//! `gen_ai.response.model`, `gen_ai.response.id`, `gen_ai.response.finish_reasons` and
//! `gen_ai.usage.input_tokens` / `output_tokens` equal to what the provider reported (read
//! here from the answer the client got), and the client span `server.address`, `server.port`
//! and `http.request.method`; an upstream error has `error.type`; (b) with no `[otel]`, the
//! standard `OTEL_*` variables start the export (`OTEL_EXPORTER_OTLP_ENDPOINT`,
//! `OTEL_SERVICE_NAME`, `OTEL_BSP_SCHEDULE_DELAY`), and a key set in `[otel]` wins over its
//! variable; (c) `sample_ratio = 0.0` exports no new trace (and sends the provider an unsampled
//! `traceparent`) while a client's sampled trace is still exported. Bounded loops, no wall time.

use std::time::Duration;

use serde_json::Value;

use super::otel::{attr, find, find_kind, int, receiver, spans, CLIENT_KIND, NAME};
use crate::support::*;

/// Waits (bounded) until `n` server spans of `trace` prefixes have arrived.
async fn wait_for(got: &std::sync::Mutex<Vec<Value>>, traces: &[&str]) -> Vec<Value> {
    for _ in 0..500 {
        let all = spans(got);
        if traces.iter().all(|t| find(&all, t, NAME).is_some()) {
            return all;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    spans(got)
}

fn string<'a>(span: &'a Value, key: &str) -> Option<&'a str> {
    attr(span, key)?["stringValue"].as_str()
}

fn traceparent(trace: &str) -> String {
    format!("00-{trace}-00f067aa0ba902b7-01")
}

const JSON_TRACE: &str = "11111111111111111111111111111111";
const SSE_TRACE: &str = "22222222222222222222222222222222";
const ERR_TRACE: &str = "33333333333333333333333333333333";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_carry_the_genai_attributes_and_the_providers_usage() {
    let (collector, got) = receiver().await;
    let mock = mock().await;
    let proxy = Conf::new(&mock.base_url())
        .set("otel.endpoint", format!("http://{collector}"))
        .set("otel.export_interval_ms", 20)
        .start()
        .await;
    let json = send(post(
        proxy.addr,
        "/v1/chat/completions",
        Some(KEY_A),
        &chat("gpt-4o-mini"),
        &[("traceparent", &traceparent(JSON_TRACE))],
    ))
    .await;
    assert_eq!(json.status, 200);
    let answer = json.json();
    let stream = r#"{"model":"gpt-4o-mini","stream":true,"stream_options":{"include_usage":true},"max_tokens":5,"messages":[{"role":"user","content":"hi"}]}"#;
    let sse = send(post(
        proxy.addr,
        "/v1/chat/completions",
        Some(KEY_A),
        stream,
        &[("traceparent", &traceparent(SSE_TRACE))],
    ))
    .await;
    assert_eq!(sse.status, 200);
    let failed = send(post(
        proxy.addr,
        "/v1/chat/completions",
        Some(KEY_B),
        &chat("gpt-4o-mini"),
        &[
            ("traceparent", &traceparent(ERR_TRACE)),
            ("x-mock-status", "500"),
        ],
    ))
    .await;
    assert_eq!(failed.status, 500);
    let all = wait_for(&got, &[JSON_TRACE, SSE_TRACE, ERR_TRACE]).await;

    // (a) JSON: both spans say what the provider said.
    let usage = &answer["usage"];
    for span in [
        find(&all, JSON_TRACE, NAME).expect("the server span"),
        find_kind(&all, JSON_TRACE, NAME, CLIENT_KIND).expect("the client span"),
    ] {
        assert_eq!(string(span, "gen_ai.operation.name"), Some("chat"));
        assert_eq!(string(span, "gen_ai.provider.name"), Some("openai"));
        assert_eq!(string(span, "gen_ai.request.model"), Some("gpt-4o-mini"));
        assert_eq!(
            string(span, "gen_ai.response.model"),
            answer["model"].as_str()
        );
        assert_eq!(string(span, "gen_ai.response.id"), answer["id"].as_str());
        let reasons =
            &attr(span, "gen_ai.response.finish_reasons").unwrap()["arrayValue"]["values"];
        assert_eq!(
            reasons[0]["stringValue"],
            answer["choices"][0]["finish_reason"]
        );
        assert_eq!(
            int(span, "gen_ai.usage.input_tokens"),
            usage["prompt_tokens"].as_u64()
        );
        assert_eq!(
            int(span, "gen_ai.usage.output_tokens"),
            usage["completion_tokens"].as_u64()
        );
        assert_eq!(string(span, "http.request.method"), Some("POST"));
        assert!(attr(span, "error.type").is_none());
    }
    let client = find_kind(&all, JSON_TRACE, NAME, CLIENT_KIND).unwrap();
    let upstream: std::net::SocketAddr = mock.addr;
    assert_eq!(string(client, "server.address"), Some("127.0.0.1"));
    assert_eq!(int(client, "server.port"), Some(u64::from(upstream.port())));

    // SSE: the usage of the last event, the id and model of the chunks, the finish reason.
    let text = String::from_utf8(sse.body.to_vec()).unwrap();
    let events: Vec<Value> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str(d).ok())
        .collect();
    let last_usage = events
        .iter()
        .rev()
        .find_map(|e| e.get("usage").filter(|u| !u.is_null()))
        .unwrap();
    let reason = events
        .iter()
        .find_map(|e| e["choices"][0]["finish_reason"].as_str())
        .unwrap();
    let span = find(&all, SSE_TRACE, NAME).expect("the stream's server span");
    assert_eq!(
        int(span, "gen_ai.usage.input_tokens"),
        last_usage["prompt_tokens"].as_u64()
    );
    assert_eq!(
        int(span, "gen_ai.usage.output_tokens"),
        last_usage["completion_tokens"].as_u64()
    );
    assert_eq!(string(span, "gen_ai.response.id"), events[0]["id"].as_str());
    assert_eq!(
        string(span, "gen_ai.response.model"),
        events[0]["model"].as_str()
    );
    let reasons = &attr(span, "gen_ai.response.finish_reasons").unwrap()["arrayValue"]["values"];
    assert_eq!(reasons[0]["stringValue"], reason);

    // An upstream error: error.type on both, an error status.
    let span = find_kind(&all, ERR_TRACE, NAME, CLIENT_KIND).expect("the failed call's span");
    assert!(string(span, "error.type").is_some(), "{span}");
    assert_eq!(span["status"]["code"], 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_standard_otel_variables_start_the_export_and_the_config_wins() {
    let (collector, got) = receiver().await;
    let mock = mock().await;
    let endpoint = format!("http://{collector}");
    let env = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
        ("OTEL_SERVICE_NAME", "gateway-from-env"),
        ("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=test"),
        ("OTEL_BSP_SCHEDULE_DELAY", "20"),
    ];
    let proxy = Conf::new(&mock.base_url()).start_with_env(&env).await;
    let r = send(post(
        proxy.addr,
        "/v1/chat/completions",
        Some(KEY_A),
        &chat("gpt-4o-mini"),
        &[("traceparent", &traceparent(JSON_TRACE))],
    ))
    .await;
    assert_eq!(r.status, 200);
    wait_for(&got, &[JSON_TRACE]).await;
    let resource = got.lock().unwrap()[0]["resourceSpans"][0]["resource"].clone();
    let value = |key: &str| {
        resource["attributes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["key"] == key)
            .map(|a| a["value"]["stringValue"].clone())
    };
    assert_eq!(value("service.name"), Some("gateway-from-env".into()));
    assert_eq!(value("deployment.environment"), Some("test".into()));

    // [otel] service_name wins over OTEL_SERVICE_NAME.
    let (collector2, got2) = receiver().await;
    let proxy = Conf::new(&mock.base_url())
        .set("otel.endpoint", format!("http://{collector2}"))
        .set("otel.service_name", "from-config")
        .start_with_env(&env)
        .await;
    let r = send(post(
        proxy.addr,
        "/v1/chat/completions",
        Some(KEY_A),
        &chat("gpt-4o-mini"),
        &[("traceparent", &traceparent(SSE_TRACE))],
    ))
    .await;
    assert_eq!(r.status, 200);
    wait_for(&got2, &[SSE_TRACE]).await;
    assert!(
        got.lock()
            .unwrap()
            .iter()
            .all(|b| !b.to_string().contains(SSE_TRACE)),
        "the config's endpoint wins"
    );
    let resource = got2.lock().unwrap()[0]["resourceSpans"][0]["resource"].clone();
    assert!(resource.to_string().contains("from-config"), "{resource}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zero_sample_ratio_exports_only_the_traces_a_client_sampled() {
    let (collector, got) = receiver().await;
    let mock = mock().await;
    let proxy = Conf::new(&mock.base_url())
        .set("otel.endpoint", format!("http://{collector}"))
        .set("otel.export_interval_ms", 20)
        .set("otel.sample_ratio", 0.0)
        .start()
        .await;
    for _ in 0..3 {
        let r = send(post(
            proxy.addr,
            "/v1/chat/completions",
            Some(KEY_A),
            &chat("gpt-4o-mini"),
            &[],
        ))
        .await;
        assert_eq!(r.status, 200);
    }
    let r = send(post(
        proxy.addr,
        "/v1/chat/completions",
        Some(KEY_A),
        &chat("gpt-4o-mini"),
        &[("traceparent", &traceparent(JSON_TRACE))],
    ))
    .await;
    assert_eq!(r.status, 200);
    let all = wait_for(&got, &[JSON_TRACE]).await;
    assert!(
        find(&all, JSON_TRACE, NAME).is_some(),
        "the client's sampled trace"
    );
    assert!(
        all.iter().all(|s| s["traceId"] == JSON_TRACE),
        "no new trace exported"
    );
    // The provider is told the unsampled traces are unsampled.
    let seen = mock.stats.seen_headers();
    let flags: Vec<&str> = seen
        .iter()
        .map(|h| &h["traceparent"].to_str().unwrap()[53..])
        .collect();
    assert_eq!(flags, ["00", "00", "00", "01"]);
}
