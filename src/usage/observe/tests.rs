use std::io::Write;
use std::sync::Arc;

use super::*;
use crate::domain::{TenantId, Weight};
use crate::estimate::Input;

const CHARGED_OUTPUT: u64 = 300;

fn estimate() -> Estimate {
    Estimate {
        endpoint: Endpoint::Chat,
        input: Input {
            tokens: 20,
            ..Input::default()
        },
        max_output_tokens: Some(100),
        choices: 3,
        key: OutputKey::new(TenantId::new("t"), "gpt-4o"),
        model_weight: Weight::ONE,
        encoding: Encoding::O200K,
        stream: false,
        strip_usage: false,
        charge: Charge {
            input: 20,
            output: CHARGED_OUTPUT,
        },
    }
}

/// Feeds `pieces` to an observer and ends it; returns the usage written.
fn run(sse: bool, coding: Option<Coding>, pieces: &[&[u8]], complete: bool) -> Usage {
    let ctx = Ctx::new();
    let est = Arc::new(Estimator::with_defaults());
    let mut obs = Observer::new(&estimate(), est, ctx.clone(), sse, coding);
    for p in pieces {
        let out = obs.see(Bytes::copy_from_slice(p));
        assert_eq!(&out[..], *p, "observe mode forwards bytes untouched");
    }
    let (_, work) = obs.end(complete);
    assert!(work.is_none());
    ctx.usage().expect("usage written")
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), Default::default());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

const JSON: &[u8] = br#"{"choices":[{"message":{"content":"hello there"}}],"usage":{"prompt_tokens":7,"completion_tokens":5}}"#;

#[test]
fn a_compressed_body_is_read_through_its_decoder() {
    let coded = gzip(JSON);
    let (a, b) = coded.split_at(coded.len() / 3);
    let u = run(false, Some(Coding::Gzip), &[a, b], true);
    assert_eq!((u.tokens.input, u.tokens.output, u.unread), (7, 5, None));
    assert!(u.reported);
}

#[test]
fn unreadable_usage_falls_back_and_says_why() {
    // Unknown coding: nothing readable, charged the admission output.
    let u = run(false, None, &[JSON], true);
    assert_eq!((u.tokens.input, u.tokens.output), (20, CHARGED_OUTPUT));
    assert_eq!(u.unread, Some("encoding"));
    // Corrupt gzip.
    let u = run(false, Some(Coding::Gzip), &[b"\x1f\x8b garbage"], true);
    assert_eq!(
        (u.tokens.output, u.unread),
        (CHARGED_OUTPUT, Some("decode"))
    );
    // Cut gzip stream: truncated, not a decode error.
    let coded = gzip(JSON);
    let u = run(
        false,
        Some(Coding::Gzip),
        &[&coded[..coded.len() / 2]],
        false,
    );
    assert_eq!(
        (u.tokens.output, u.unread),
        (CHARGED_OUTPUT, Some("truncated"))
    );
    // Malformed JSON, and JSON without usage but with text (counted).
    let u = run(false, Some(Coding::Identity), &[b"{oops"], true);
    assert_eq!(
        (u.tokens.output, u.unread),
        (CHARGED_OUTPUT, Some("malformed"))
    );
    let u = run(
        false,
        Some(Coding::Identity),
        &[br#"{"choices":[{"message":{"content":"hello there"}}]}"#],
        true,
    );
    assert_eq!((u.tokens.output, u.unread), (2, Some("missing")));
    // An SSE stream cut before usage: its text counted, `truncated`.
    let u = run(
        true,
        Some(Coding::Identity),
        &[b"data: {\"choices\":[{\"delta\":{\"content\":\"hello there\"}}]}\n\n"],
        false,
    );
    assert_eq!((u.tokens.output, u.unread), (2, Some("truncated")));
    // Nothing at all: never 0.
    let u = run(true, Some(Coding::Identity), &[], true);
    assert_eq!(
        (u.tokens.output, u.unread),
        (CHARGED_OUTPUT, Some("missing"))
    );
}

#[test]
fn huge_provider_numbers_saturate() {
    let body = br#"{"usage":{"prompt_tokens":18446744073709551615,"completion_tokens":18446744073709551615}}"#;
    let u = run(false, Some(Coding::Identity), &[body], true);
    assert_eq!((u.tokens.input, u.tokens.output), (u64::MAX, u64::MAX));
    assert_eq!(u.tokens.total().0, u64::MAX);
    assert!(u.cost.0 > 0);
}

/// Feeds `events` (SSE data payloads, one frame each) and collects every progress reported.
fn progress_of(events: &[String], exact: bool) -> Vec<u64> {
    let ctx = Ctx::new();
    let est = Arc::new(Estimator::with_defaults());
    let mut obs = Observer::new(&estimate(), est, ctx, true, Some(Coding::Identity));
    let mut seen = Vec::new();
    for e in events {
        obs.see(Bytes::from(format!("data: {e}\n\n")));
        if let Some(p) = obs.progress(exact) {
            seen.push(p.output);
        }
    }
    seen
}

#[test]
fn progress_is_counted_exactly_only_for_a_limit_and_taken_from_running_usage() {
    let word = |i| format!(r#"{{"choices":[{{"delta":{{"content":" word{i} and more text"}}}}]}}"#);
    let events: Vec<String> = (0..200).map(word).collect();
    let exact = progress_of(&events, true);
    let rough = progress_of(&events, false);
    assert!(!exact.is_empty() && !rough.is_empty());
    // Both grow in steps of at least 64 tokens; the estimate is bytes / 4 of the same text.
    let text_bytes: usize = (0..200)
        .map(|i| format!(" word{i} and more text").len())
        .sum();
    assert!(rough.last().unwrap().abs_diff(text_bytes as u64 / 4) <= 64);
    let exact_total = Estimator::with_defaults()
        .count_text(
            Encoding::O200K,
            &(0..200)
                .map(|i| format!(" word{i} and more text"))
                .collect::<String>(),
        )
        .tokens;
    assert!(
        exact.last().unwrap().abs_diff(exact_total) <= 64,
        "{exact:?} vs {exact_total}"
    );
    // A provider that reports usage on every chunk is taken at its word.
    let events: Vec<String> = (0..200)
        .map(|i| {
            format!(
                r#"{{"choices":[{{"delta":{{"content":"x"}}}}],"usage":{{"prompt_tokens":5,"completion_tokens":{}}}}}"#,
                10 * i
            )
        })
        .collect();
    let told = progress_of(&events, true);
    assert!(told.iter().all(|t| t % 10 == 0), "{told:?}");
    assert!(*told.last().unwrap() > 1990 - 64, "{told:?}");
}
