//! The accounting table: for each request shape and provider answer, what fairgate estimated,
//! what it reconciled, and what the provider reported — fairgate in front of the mock's
//! `openai` profile (which compresses whenever `Accept-Encoding` allows), over real sockets.
//!
//! Rerun and print the table (BENCHMARKS.md, "Accounting"):
//! `cargo test --test e2e accounting:: -- --nocapture`
//!
//! Asserts, per row: the client got a 2xx in a coding it accepts that decodes; where the
//! provider reported usage, reconciled == reported; where it did not (omitted, cut, error event),
//! reconciled output > 0 (the stated fallback) and the reason is counted in
//! `fairgate_usage_unread_total`; the estimate multiplies `n` and array prompts.

use std::net::SocketAddr;
use std::time::Duration;

use crate::support::*;
use bytes::Bytes;
use fairgate_mock::Profile;
use http::{HeaderMap, Request};
use http_body_util::{BodyExt, Full};
use serde_json::Value;

/// One row of the table.
struct Row {
    name: &'static str,
    path: &'static str,
    body: String,
    headers: Vec<(&'static str, &'static str)>,
    /// Output tokens per choice the estimate charges (the cap).
    output_estimate: u64,
    /// The provider reports usage for it (else the reason fairgate counts it unread under).
    unread: Option<&'static str>,
}

fn chat(model: &str, extra: &str) -> String {
    format!(
        r#"{{"model":"{model}",{extra}"messages":[{{"role":"user","content":"Summarise the incident report for the on-call engineer, please."}}]}}"#
    )
}

fn rows() -> Vec<Row> {
    let row =
        |name, path, body: String, headers: &[(&'static str, &'static str)], out, unread| Row {
            name,
            path,
            body,
            headers: headers.to_vec(),
            output_estimate: out,
            unread,
        };
    const CHAT: &str = "/v1/chat/completions";
    const USAGE: &str = r#""stream":true,"stream_options":{"include_usage":true},"max_tokens":48,"#;
    vec![
        row("JSON, plain", CHAT, chat("acct-plain", r#""max_tokens":48,"#), &[], 48, None),
        row("JSON, gzip", CHAT, chat("acct-gzip", r#""max_tokens":48,"#), &[("accept-encoding", "gzip")], 48, None),
        row("JSON, br", CHAT, chat("acct-br", r#""max_tokens":48,"#), &[("accept-encoding", "br")], 48, None),
        row("JSON, deflate", CHAT, chat("acct-deflate", r#""max_tokens":48,"#), &[("accept-encoding", "deflate")], 48, None),
        row("JSON, zstd", CHAT, chat("acct-zstd", r#""max_tokens":48,"#), &[("accept-encoding", "zstd")], 48, None),
        row("SSE with usage, plain", CHAT, chat("acct-sse", USAGE), &[], 48, None),
        row("SSE with usage, gzip", CHAT, chat("acct-sse-gzip", USAGE), &[("accept-encoding", "gzip")], 48, None),
        row("SSE with usage, br", CHAT, chat("acct-sse-br", USAGE), &[("accept-encoding", "br")], 48, None),
        row("SSE, usage asked by fairgate, gzip accepted", CHAT, chat("acct-sse-strip", r#""stream":true,"max_tokens":48,"#), &[("accept-encoding", "gzip, br")], 48, None),
        row("SSE without usage, gzip", CHAT, chat("acct-sse-omit", USAGE), &[("accept-encoding", "gzip"), ("x-mock-usage", "omit")], 48, Some("missing")),
        row("SSE cut by an error event", CHAT, chat("acct-sse-error", USAGE), &[("x-mock-error-after", "5")], 48, Some("missing")),
        row("SSE aborted mid-stream, br", CHAT, chat("acct-sse-abort", USAGE), &[("accept-encoding", "br"), ("x-mock-abort-after", "5")], 48, Some("truncated")),
        row("n=8", CHAT, chat("acct-n8", r#""n":8,"max_tokens":48,"#), &[], 8 * 48, None),
        row("max_tokens", CHAT, chat("acct-cap-mt", r#""max_tokens":40,"#), &[], 40, None),
        row("max_completion_tokens", CHAT, chat("acct-cap-mct", r#""max_completion_tokens":40,"#), &[], 40, None),
        row("max_output_tokens", CHAT, chat("acct-cap-mot", r#""max_output_tokens":40,"#), &[], 40, None),
        row("max_tokens 1 + max_completion_tokens 40", CHAT, chat("acct-cap-both", r#""max_tokens":1,"max_completion_tokens":40,"#), &[], 40, None),
        row("completions, 3 prompts", "/v1/completions", r#"{"model":"acct-prompts","max_tokens":16,"prompt":["one prompt","another prompt","a third one"]}"#.into(), &[], 3 * 16, None),
        row("embeddings, 3 inputs, gzip", "/v1/embeddings", r#"{"model":"acct-embed","input":["first text","second text","third text here"]}"#.into(), &[("accept-encoding", "gzip")], 0, None),
    ]
}

/// The body as sent before `content-encoding` was applied (panics if it does not decode,
/// unless the stream was `cut`: then what decodes).
fn decoded(headers: &HeaderMap, body: &[u8], cut: bool) -> Vec<u8> {
    let (out, read) = decode(headers, body);
    if let Err(e) = read {
        assert!(
            cut,
            "{:?} body decodes: {e}",
            headers.get("content-encoding")
        );
    }
    out
}

/// The provider's usage in a JSON body or an SSE stream (the last one), as input + output.
fn reported(body: &[u8]) -> Option<(u64, u64)> {
    let text = String::from_utf8_lossy(body);
    let docs: Vec<Value> = if text.trim_start().starts_with('{') {
        serde_json::from_str(&text).into_iter().collect()
    } else {
        text.lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .filter_map(|d| serde_json::from_str(d).ok())
            .collect()
    };
    docs.iter().rev().find_map(|d| {
        // OpenAI's place, else Groq's (`x_groq.usage` on a stream's last chunk).
        let u = d
            .get("usage")
            .filter(|u| u.is_object())
            .or_else(|| d.get("x_groq")?.get("usage").filter(|u| u.is_object()))?;
        let input = u["prompt_tokens"].as_u64()?;
        Some((input, u["completion_tokens"].as_u64().unwrap_or(0)))
    })
}

/// Sends `req` and collects the response up to its end or a cut (an aborted stream).
async fn send_cut(req: Request<Full<Bytes>>) -> Collected {
    let fut = async {
        let res = client().request(req).await.expect("response");
        let (parts, mut body) = res.into_parts();
        let mut bytes = Vec::new();
        while let Some(Ok(frame)) = body.frame().await {
            if let Some(d) = frame.data_ref() {
                bytes.extend_from_slice(d);
            }
        }
        Collected {
            status: parts.status.as_u16(),
            headers: parts.headers,
            body: bytes.into(),
        }
    };
    tokio::time::timeout(Duration::from_secs(20), fut)
        .await
        .expect("response within the safety timeout")
}

/// The value of the series `name` whose labels include every `k="v"` of `labels`, as a count.
fn value(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<u64> {
    crate::support::value(text, name, labels).map(|v| v as u64)
}

/// The model's (estimated, reconciled) token counters, once the request's body is done.
async fn counters(addr: SocketAddr, model: &str) -> (u64, u64) {
    for _ in 0..500 {
        let text = scrape(addr).await;
        let labels = [("tenant", "a"), ("model", model)];
        let est = value(&text, "fairgate_tokens_estimated_total", &labels);
        // Actual input and output are counted apart: the reconciled total is their sum.
        let part = |kind| {
            let labels = [("tenant", "a"), ("model", model), ("type", kind)];
            value(&text, "fairgate_tokens_actual_total", &labels)
        };
        let act = part("input").zip(part("output")).map(|(i, o)| i + o);
        if let (Some(e), Some(a)) = (est, act) {
            if a > 0 {
                return (e, a);
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("no reconciled tokens for {model}");
}

fn accepts(accept: Option<&str>, coding: Option<&str>) -> bool {
    match coding {
        None => true,
        Some(c) => accept.is_some_and(|a| a.split(',').any(|t| t.trim() == c)),
    }
}

#[tokio::test]
async fn every_shape_and_answer_is_reconciled_to_the_provider_or_a_stated_fallback() {
    let mock = mock_profile(Profile::Openai).await;
    let proxy = Conf::new(&mock.base_url()).start().await;
    let mut table = String::from(
        "| request shape, provider answer | estimated | reconciled | provider-reported | usage read |\n|---|---|---|---|---|\n",
    );
    let mut unread_expected: Vec<&str> = Vec::new();
    for r in rows() {
        let model = serde_json::from_str::<Value>(&r.body).unwrap()["model"]
            .as_str()
            .unwrap()
            .to_owned();
        let res = send_cut(post(proxy.addr, r.path, Some(KEY_A), &r.body, &r.headers)).await;
        assert_eq!(res.status, 200, "{}: {:?}", r.name, res.body);
        let accept = r
            .headers
            .iter()
            .find(|(k, _)| *k == "accept-encoding")
            .map(|(_, v)| *v);
        let coding = res
            .headers
            .get("content-encoding")
            .map(|v| v.to_str().unwrap().to_owned());
        assert!(
            accepts(accept, coding.as_deref()),
            "{}: answered {coding:?} to Accept-Encoding {accept:?}",
            r.name
        );
        let body = decoded(&res.headers, &res.body, r.unread == Some("truncated"));
        let (estimated, reconciled) = counters(proxy.addr, &model).await;
        // What the provider reports for this request (the stripped row: asked directly).
        let provider = match r.name {
            "SSE, usage asked by fairgate, gzip accepted" => {
                assert!(
                    reported(&body).is_none(),
                    "the usage chunk fairgate asked for is removed"
                );
                let direct = r.body.replace(
                    r#""stream":true,"#,
                    r#""stream":true,"stream_options":{"include_usage":true},"#,
                );
                let d = send(post(mock.addr, r.path, None, &direct, &[])).await;
                reported(&d.body)
            }
            _ => reported(&body),
        };
        let input_estimate = estimated - r.output_estimate;
        match (provider, r.unread) {
            (Some((i, o)), None) => {
                assert_eq!(
                    reconciled,
                    i + o,
                    "{}: reconciled == provider-reported",
                    r.name
                )
            }
            (None, Some(reason)) => {
                assert!(
                    reconciled > input_estimate,
                    "{}: output charged by the fallback, never 0 ({reconciled} ≤ {input_estimate})",
                    r.name
                );
                unread_expected.push(reason);
            }
            other => panic!("{}: unexpected provider usage {other:?}", r.name),
        }
        table.push_str(&format!(
            "| {} | {estimated} | {reconciled} | {} | {} |\n",
            r.name,
            provider.map_or("—".into(), |(i, o)| format!(
                "{} ({i} in + {o} out)",
                i + o
            )),
            r.unread
                .map_or("yes".into(), |reason| format!("no: `{reason}`, fallback"))
        ));
        if r.name == "n=8" {
            assert!(
                estimated >= input_estimate + 8 * 48,
                "n multiplies the estimate"
            );
        }
    }
    let text = scrape(proxy.addr).await;
    for reason in ["missing", "truncated"] {
        let want = unread_expected.iter().filter(|r| **r == reason).count() as u64;
        let got = value(
            &text,
            "fairgate_usage_unread_total",
            &[("tenant", "a"), ("reason", reason)],
        );
        assert_eq!(
            got,
            Some(want),
            "fairgate_usage_unread_total{{reason={reason}}}"
        );
    }
    println!("\n{table}");
}

#[tokio::test]
async fn a_compressed_stream_reaches_the_client_event_by_event() {
    let mock = mock_profile(Profile::Openai).await;
    let proxy = Conf::new(&mock.base_url()).start().await;
    let body = chat(
        "acct-live",
        r#""stream":true,"stream_options":{"include_usage":true},"max_tokens":20,"#,
    );
    let req = post(
        proxy.addr,
        "/v1/chat/completions",
        Some(KEY_A),
        &body,
        &[
            ("accept-encoding", "gzip"),
            ("x-mock-token-delay-ms", "100"),
        ],
    );
    let res = tokio::time::timeout(Duration::from_secs(20), client().request(req))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(res.headers()["content-encoding"], "gzip");
    let mut body = res.into_body();
    let mut d = flate2::write::GzDecoder::new(Vec::new());
    // The first event decodes while the provider is still generating the rest.
    loop {
        let frame = tokio::time::timeout(Duration::from_secs(20), body.frame())
            .await
            .unwrap()
            .expect("a frame before the end")
            .unwrap();
        if let Some(data) = frame.data_ref() {
            std::io::Write::write_all(&mut d, data).unwrap();
            std::io::Write::flush(&mut d).unwrap();
        }
        if String::from_utf8_lossy(d.get_ref()).contains("data: ") {
            break;
        }
    }
    assert_eq!(
        mock.stats.completed(),
        0,
        "the stream is still being generated"
    );
    assert_eq!(mock.stats.in_flight(), 1);
    while let Some(Ok(_)) = body.frame().await {}
    let (_, reconciled) = counters(proxy.addr, "acct-live").await;
    assert!(reconciled > 20, "usage read after the stream: {reconciled}");
}

/// The same accounting, table-driven across every provider profile of the mock (the idealised
/// dialect, OpenAI's compressing one, vLLM's usage-on-the-last-content-chunk, Groq's
/// `x_groq.usage`, and the rough one with CRLF, keep-alive comments and usage details): a JSON
/// answer, a stream whose client asked for usage, and a stream fairgate asked usage for on the
/// client's behalf. Each is reconciled to exactly what that provider reported.
#[tokio::test]
async fn every_provider_profile_is_reconciled_to_what_it_reported() {
    const USAGE: &str = r#""stream":true,"stream_options":{"include_usage":true},"max_tokens":24,"#;
    const PLAIN_STREAM: &str = r#""stream":true,"max_tokens":24,"#;
    let profiles = [
        Profile::Ideal,
        Profile::Openai,
        Profile::Vllm,
        Profile::Groq,
        Profile::Rough,
    ];
    let mut table =
        String::from("| profile | answer | reconciled | provider-reported |\n|---|---|---|---|\n");
    for profile in profiles {
        let mock = mock_profile(profile).await;
        let proxy = Conf::new(&mock.base_url()).start().await;
        let rows = [
            (
                "JSON",
                chat("prof-json", r#""max_tokens":24,"#),
                vec![("accept-encoding", "gzip, br")],
            ),
            (
                "SSE, usage asked by the client",
                chat("prof-sse", USAGE),
                vec![("accept-encoding", "gzip")],
            ),
            (
                "SSE, usage asked by fairgate",
                chat("prof-sse-ours", PLAIN_STREAM),
                vec![],
            ),
        ];
        for (name, body, headers) in rows {
            let model = serde_json::from_str::<Value>(&body).unwrap()["model"]
                .as_str()
                .unwrap()
                .to_owned();
            let res = send_cut(post(
                proxy.addr,
                "/v1/chat/completions",
                Some(KEY_A),
                &body,
                &headers,
            ))
            .await;
            assert_eq!(res.status, 200, "{profile:?} {name}: {:?}", res.body);
            let seen = decoded(&res.headers, &res.body, false);
            // What the provider reports: from the answer, or — when fairgate asked for usage
            // and removed it (or the provider sends usage only when asked) — asked directly.
            let provider = match reported(&seen) {
                Some(u) if name != "SSE, usage asked by fairgate" => Some(u),
                _ => {
                    let direct = body.replace(
                        r#""stream":true,"#,
                        r#""stream":true,"stream_options":{"include_usage":true},"#,
                    );
                    let d = send(post(mock.addr, "/v1/chat/completions", None, &direct, &[])).await;
                    reported(&decoded(&d.headers, &d.body, false))
                }
            };
            let (i, o) =
                provider.unwrap_or_else(|| panic!("{profile:?} {name}: no usage reported"));
            let (_, reconciled) = counters(proxy.addr, &model).await;
            table.push_str(&format!(
                "| {profile:?} | {name} | {reconciled} | {} ({i} in + {o} out) |\n",
                i + o
            ));
            assert_eq!(
                reconciled,
                i + o,
                "{profile:?} {name}: reconciled == provider-reported"
            );
        }
    }
    println!("\n{table}");
}
