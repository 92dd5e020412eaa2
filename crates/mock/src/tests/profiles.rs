//! The wire format of each provider profile, built and read back without sockets: the bodies
//! `handlers.rs` would send, run through the same `MockBody` (and compressor) hyper would poll.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use serde_json::Value;

use crate::body::MockBody;
use crate::dialect::{self, KEEP_ALIVE};
use crate::encoding::{decode, Encoding};
use crate::format::Reply;
use crate::profile::Profile;
use crate::sse::SseStream;

/// A chat reply of `output` tokens to a 10-token prompt, in `profile`'s usage style.
fn reply(profile: Profile, output: u32) -> Reply {
    let mut r = Reply::new(7, "gpt-4o", 10, output, false);
    r.usage_style = profile.usage_style();
    r
}

/// The whole streamed body a client receives, after `encoding` if any.
async fn stream_body(profile: Profile, include_usage: bool, encoding: Option<Encoding>) -> Bytes {
    let r = reply(profile, 3);
    let (first, rest, tail) = r.chat_stream(profile.stream_usage(include_usage));
    let (pre, first, rest, tail) = dialect::frames(profile.rough_sse(), None, first, rest, tail);
    let sse = SseStream::new(pre, first, rest, 3, tail, Duration::ZERO, None);
    let mut body = MockBody::sse(sse, None);
    if let Some(encoding) = encoding {
        assert!(body.encode(encoding));
    }
    body.collect()
        .await
        .expect("mock bodies never fail")
        .to_bytes()
}

/// The JSON of every `data:` event, `[DONE]` as the string "[DONE]".
fn events(text: &str) -> Vec<Value> {
    text.split("\n\n")
        .filter_map(|e| e.lines().find_map(|l| l.strip_prefix("data: ")))
        .map(|d| serde_json::from_str(d).unwrap_or_else(|_| Value::String(d.to_owned())))
        .collect()
}

fn assert_usage(usage: &Value, completion: u64) {
    assert_eq!(usage["prompt_tokens"], 10, "{usage}");
    assert_eq!(usage["completion_tokens"], completion, "{usage}");
    assert_eq!(usage["total_tokens"], 10 + completion, "{usage}");
}

#[tokio::test]
async fn openai_gzip_json_decodes_to_a_completion_with_usage() {
    for encoding in [
        Encoding::Gzip,
        Encoding::Br,
        Encoding::Deflate,
        Encoding::Zstd,
    ] {
        let mut body = MockBody::full(reply(Profile::Openai, 5).chat_json(), None);
        assert!(body.encode(encoding));
        let wire = body.collect().await.expect("body").to_bytes();
        assert!(
            serde_json::from_slice::<Value>(&wire).is_err(),
            "compressed"
        );
        let v: Value = serde_json::from_slice(&decode(encoding, &wire)).expect("JSON");
        assert_usage(&v["usage"], 5);
        assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
        assert_eq!(
            v["usage"]["completion_tokens_details"]["reasoning_tokens"],
            0
        );
    }
}

#[tokio::test]
async fn openai_stream_compressed_ends_with_a_usage_chunk_before_done() {
    let wire = stream_body(Profile::Openai, true, Some(Encoding::Br)).await;
    let plain = stream_body(Profile::Openai, true, None).await;
    assert_eq!(
        decode(Encoding::Br, &wire),
        plain,
        "decodes to the plain stream"
    );
    let ev = events(std::str::from_utf8(&plain).expect("utf-8"));
    assert_eq!(ev.len(), 3 + 1 + 1 + 1, "tokens, finish, usage, [DONE]");
    assert_eq!(ev[5], "[DONE]");
    assert_eq!(ev[4]["choices"], serde_json::json!([]));
    assert_usage(&ev[4]["usage"], 3);
    assert!(ev[..4].iter().all(|e| e["usage"].is_null()));
}

#[tokio::test]
async fn vllm_usage_rides_on_the_final_content_chunk() {
    let plain = stream_body(Profile::Vllm, true, None).await;
    let ev = events(std::str::from_utf8(&plain).expect("utf-8"));
    assert_eq!(
        ev.len(),
        3 + 1 + 1,
        "tokens, finish with usage, [DONE]: no usage chunk"
    );
    assert_eq!(ev[3]["choices"][0]["finish_reason"], "stop");
    assert_usage(&ev[3]["usage"], 3);
    assert!(ev[..3].iter().all(|e| e.get("usage").is_none()));
    let without = stream_body(Profile::Vllm, false, None).await;
    assert!(!String::from_utf8_lossy(&without).contains("usage"));
    assert!(!Profile::Vllm.compresses());
}

#[tokio::test]
async fn groq_usage_is_under_x_groq_in_the_last_chunk_even_unasked() {
    let plain = stream_body(Profile::Groq, false, None).await;
    let ev = events(std::str::from_utf8(&plain).expect("utf-8"));
    assert_eq!(ev.len(), 3 + 1 + 1);
    assert_eq!(ev[0]["x_groq"]["id"], "req_mock_7");
    assert!(ev[0]["x_groq"].get("usage").is_none());
    let last = &ev[3];
    assert_eq!(last["choices"][0]["finish_reason"], "stop");
    assert!(last.get("usage").is_none(), "not at the top level");
    assert_usage(&last["x_groq"]["usage"], 3);
    assert!(last["x_groq"]["usage"]["total_time"].is_f64());
    let json: Value = serde_json::from_str(&reply(Profile::Groq, 2).chat_json()).expect("JSON");
    assert_usage(&json["usage"], 2);
    assert_eq!(json["x_groq"]["id"], "req_mock_7");
}

#[tokio::test]
async fn rough_streams_use_crlf_and_keep_alive_comments() {
    let plain = stream_body(Profile::Rough, true, None).await;
    let text = std::str::from_utf8(&plain).expect("utf-8");
    let lf = text.matches('\n').count();
    assert!(lf > 0);
    assert_eq!(
        text.matches("\r\n").count(),
        lf,
        "every line ends in CRLF: {text:?}"
    );
    assert!(text.starts_with(": keep-alive\r\n\r\n"));
    assert_eq!(text.matches(KEEP_ALIVE.trim_end()).count(), 2);
    let ev = events(&text.replace("\r\n", "\n"));
    assert_eq!(ev.last(), Some(&Value::from("[DONE]")));
    let usage = &ev[ev.len() - 2]["usage"];
    assert_usage(usage, 3);
    assert_eq!(usage["prompt_tokens_details"]["cached_tokens"], 5);
    assert_eq!(usage["completion_tokens_details"]["reasoning_tokens"], 1);
}

#[test]
fn error_events_are_openai_shaped_for_chat_and_responses() {
    let chat = dialect::error_event(false, 2);
    let v: Value =
        serde_json::from_str(chat.strip_prefix("data: ").expect("data").trim()).expect("JSON");
    assert_eq!(v["error"]["type"], "server_error");
    assert!(v["error"]["message"]
        .as_str()
        .is_some_and(|m| m.contains('2')));
    let resp = dialect::error_event(true, 2);
    assert!(resp.starts_with("event: error\ndata: "));
    assert!(resp.ends_with("\n\n"));
}

#[test]
fn profiles_differ_where_providers_do() {
    use crate::profile::{LimitHeaders, RetryStyle};
    assert_eq!(Profile::default(), Profile::Ideal);
    assert_eq!(
        Profile::Vllm.overload_status(),
        http::StatusCode::SERVICE_UNAVAILABLE
    );
    assert_eq!(Profile::Rough.retry_style(), RetryStyle::HttpDate);
    assert_eq!(Profile::Openai.retry_style(), RetryStyle::SecondsAndMs);
    assert_eq!(Profile::Ideal.limit_headers(), LimitHeaders::None);
    assert!(Profile::Rough.slow_refusal().is_some() && Profile::Openai.slow_refusal().is_none());
}
