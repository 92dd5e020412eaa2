//! Rate-limit and retry headers as providers write them.
//!
//! - OpenAI (and Groq) send `x-ratelimit-{limit,remaining,reset}-{requests,tokens}` on every
//!   answer; a reset is a Go duration: `1m30s`, `250ms`, `6s`, `6m0s`, `8.64s`
//!   ([`go_duration`]). The mock keeps two continuously refilling per-minute buckets
//!   ([`LIMIT_REQUESTS`], [`LIMIT_TOKENS`]) that only *report*: it refuses by concurrency, never
//!   by these, so the headers never make a test flaky.
//! - The `rough` profile adds the same limits per model (`x-ratelimit-limit-requests-gpt-4o`…),
//!   as providers whose quotas are per model do, so a proxy must not mistake them for the account's.
//! - Refusals: `Retry-After` in seconds (min 1, rounded up) plus `retry-after-ms` (OpenAI, Groq),
//!   seconds only (vLLM), or an HTTP-date (`rough`) no earlier than now + the configured wait.

use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use http::header::{HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};
use http::Response;
use tokio::time::Instant;

use super::body::MockBody;
use super::profile::{LimitHeaders, RetryStyle};

/// Requests per minute advertised in `x-ratelimit-limit-requests`.
pub const LIMIT_REQUESTS: u64 = 10_000;
/// Tokens per minute advertised in `x-ratelimit-limit-tokens`.
pub const LIMIT_TOKENS: u64 = 2_000_000;

/// What an answer served: attached to its response (an extension) for the rate-limit headers.
#[derive(Debug, Clone)]
pub(crate) struct Served {
    pub model: String,
    pub tokens: u64,
}

impl Served {
    /// `resp` carrying this record.
    pub fn tag(self, mut resp: Response<MockBody>) -> Response<MockBody> {
        resp.extensions_mut().insert(self);
        resp
    }
}

/// Two per-minute buckets (requests, tokens) that drain by what was served and refill
/// continuously, like OpenAI's; `reset` is the time until a bucket is full again.
#[derive(Debug, Default)]
pub(crate) struct Buckets(Mutex<Levels>);

#[derive(Debug, Default)]
struct Levels {
    requests: f64,
    tokens: f64,
    at: Option<Instant>,
}

/// What the rate-limit headers of one answer say.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Snapshot {
    pub remaining_requests: u64,
    pub remaining_tokens: u64,
    pub reset_requests: Duration,
    pub reset_tokens: Duration,
}

impl Buckets {
    /// Charges one answer of `tokens` and returns what its headers say.
    pub fn charge(&self, requests: u64, tokens: u64) -> Snapshot {
        let now = Instant::now();
        let mut l = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let elapsed = l.at.map_or(0.0, |at| (now - at).as_secs_f64());
        l.at = Some(now);
        let refill = |level: f64, limit: u64, add: u64| {
            (level - elapsed * limit as f64 / 60.0).max(0.0) + add as f64
        };
        l.requests = refill(l.requests, LIMIT_REQUESTS, requests).min(LIMIT_REQUESTS as f64);
        l.tokens = refill(l.tokens, LIMIT_TOKENS, tokens).min(LIMIT_TOKENS as f64);
        let reset = |level: f64, limit: u64| {
            Duration::from_millis((level * 60_000.0 / limit as f64).round() as u64)
        };
        Snapshot {
            remaining_requests: LIMIT_REQUESTS - l.requests.ceil() as u64,
            remaining_tokens: LIMIT_TOKENS - l.tokens.ceil() as u64,
            reset_requests: reset(l.requests, LIMIT_REQUESTS),
            reset_tokens: reset(l.tokens, LIMIT_TOKENS),
        }
    }
}

/// A duration as Go (and so OpenAI) prints it, to the millisecond: `0s`, `250ms`, `6s`,
/// `8.64s`, `1m30s`, `6m0s`, `1h2m3.004s`. The mock writes its own (it imports nothing of the
/// proxy): it is the provider fairgate's parser is tested against, so it must not share that
/// code.
pub fn go_duration(d: Duration) -> String {
    use std::fmt::Write as _;
    let ms = d.as_millis();
    if ms < 1000 {
        return if ms == 0 {
            "0s".into()
        } else {
            format!("{ms}ms")
        };
    }
    let (h, m, s, frac) = (ms / 3_600_000, ms / 60_000 % 60, ms / 1000 % 60, ms % 1000);
    let mut out = String::new();
    if h > 0 {
        let _ = write!(out, "{h}h");
    }
    if h > 0 || m > 0 {
        let _ = write!(out, "{m}m");
    }
    let _ = write!(out, "{s}");
    if frac > 0 {
        let _ = write!(out, ".{}", format!("{frac:03}").trim_end_matches('0'));
    }
    out.push('s');
    out
}

fn set(h: &mut HeaderMap, name: &str, value: impl AsRef<str>) {
    if let (Ok(n), Ok(v)) = (
        HeaderName::try_from(name),
        HeaderValue::try_from(value.as_ref()),
    ) {
        h.insert(n, v);
    }
}

/// Writes the rate-limit headers of `style` for an answer about `model`.
pub(crate) fn write_limits(h: &mut HeaderMap, style: LimitHeaders, s: &Snapshot, model: &str) {
    if style == LimitHeaders::None {
        return;
    }
    set(h, "x-ratelimit-limit-requests", LIMIT_REQUESTS.to_string());
    set(h, "x-ratelimit-limit-tokens", LIMIT_TOKENS.to_string());
    set(
        h,
        "x-ratelimit-remaining-requests",
        s.remaining_requests.to_string(),
    );
    set(
        h,
        "x-ratelimit-remaining-tokens",
        s.remaining_tokens.to_string(),
    );
    set(
        h,
        "x-ratelimit-reset-requests",
        go_duration(s.reset_requests),
    );
    set(h, "x-ratelimit-reset-tokens", go_duration(s.reset_tokens));
    if style == LimitHeaders::PerModel && !model.is_empty() {
        let model: String = model
            .chars()
            .map(|c| match c.to_ascii_lowercase() {
                c @ ('a'..='z' | '0'..='9' | '.' | '-') => c,
                _ => '-',
            })
            .collect();
        // A model's own quota: a quarter of the account's, and its remaining share of it.
        let (rq, tk) = (LIMIT_REQUESTS / 4, LIMIT_TOKENS / 4);
        let used_rq = LIMIT_REQUESTS - s.remaining_requests;
        let used_tk = LIMIT_TOKENS - s.remaining_tokens;
        set(
            h,
            &format!("x-ratelimit-limit-requests-{model}"),
            rq.to_string(),
        );
        set(
            h,
            &format!("x-ratelimit-limit-tokens-{model}"),
            tk.to_string(),
        );
        let left = |limit: u64, used: u64| limit.saturating_sub(used).to_string();
        set(
            h,
            &format!("x-ratelimit-remaining-requests-{model}"),
            left(rq, used_rq),
        );
        set(
            h,
            &format!("x-ratelimit-remaining-tokens-{model}"),
            left(tk, used_tk),
        );
    }
}

/// Writes the retry headers of a refusal that asks the client to wait `wait`.
pub(crate) fn write_retry(h: &mut HeaderMap, style: RetryStyle, wait: Duration) {
    let secs = wait.as_millis().div_ceil(1000).max(1) as u64;
    match style {
        RetryStyle::SecondsAndMs | RetryStyle::Seconds => {
            h.insert(RETRY_AFTER, HeaderValue::from(secs));
            if style == RetryStyle::SecondsAndMs {
                h.insert("retry-after-ms", HeaderValue::from(wait.as_millis() as u64));
            }
        }
        RetryStyle::HttpDate => {
            // An HTTP-date drops the sub-second part: add a second so it is never early.
            let at = SystemTime::now() + Duration::from_secs(secs + 1);
            set(h, RETRY_AFTER.as_str(), httpdate::fmt_http_date(at));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations_read_like_openai() {
        let ms = Duration::from_millis;
        assert_eq!(go_duration(ms(0)), "0s");
        assert_eq!(go_duration(ms(250)), "250ms");
        assert_eq!(go_duration(ms(6000)), "6s");
        assert_eq!(go_duration(ms(8640)), "8.64s");
        assert_eq!(go_duration(ms(90_000)), "1m30s");
        assert_eq!(go_duration(ms(360_000)), "6m0s");
        assert_eq!(go_duration(ms(3_723_004)), "1h2m3.004s");
    }

    #[tokio::test(start_paused = true)]
    async fn buckets_drain_by_use_and_refill_with_time() {
        let b = Buckets::default();
        let first = b.charge(1, 1000);
        assert_eq!(first.remaining_requests, LIMIT_REQUESTS - 1);
        assert_eq!(first.remaining_tokens, LIMIT_TOKENS - 1000);
        // 1 request of 10 000/min refills in 6 ms; 1000 tokens of 2 000 000/min in 30 ms.
        assert_eq!(first.reset_requests, Duration::from_millis(6));
        assert_eq!(first.reset_tokens, Duration::from_millis(30));
        tokio::time::advance(Duration::from_secs(60)).await;
        let later = b.charge(0, 0);
        assert_eq!(later.remaining_requests, LIMIT_REQUESTS);
        assert_eq!(later.reset_tokens, Duration::ZERO);
    }

    #[test]
    fn limit_headers_per_style() {
        let s = Snapshot {
            remaining_requests: LIMIT_REQUESTS - 2,
            remaining_tokens: LIMIT_TOKENS - 100,
            reset_requests: Duration::from_millis(12),
            reset_tokens: Duration::from_secs(90),
        };
        let mut h = HeaderMap::new();
        write_limits(&mut h, LimitHeaders::None, &s, "gpt-4o");
        assert!(h.is_empty());
        write_limits(&mut h, LimitHeaders::Standard, &s, "gpt-4o");
        assert_eq!(h["x-ratelimit-reset-tokens"], "1m30s");
        assert_eq!(h["x-ratelimit-reset-requests"], "12ms");
        assert_eq!(h["x-ratelimit-remaining-requests"], "9998");
        assert_eq!(h.len(), 6);
        write_limits(&mut h, LimitHeaders::PerModel, &s, "Org/Model_1");
        assert_eq!(h["x-ratelimit-limit-requests-org-model-1"], "2500");
        assert_eq!(h["x-ratelimit-remaining-requests-org-model-1"], "2498");
        assert_eq!(h["x-ratelimit-remaining-tokens-org-model-1"], "499900");
    }

    #[test]
    fn retry_headers_per_style() {
        let wait = Duration::from_millis(1500);
        let mut h = HeaderMap::new();
        write_retry(&mut h, RetryStyle::SecondsAndMs, wait);
        assert_eq!(
            (&h[RETRY_AFTER], &h["retry-after-ms"]),
            (
                &"2".parse::<HeaderValue>().unwrap(),
                &"1500".parse::<HeaderValue>().unwrap()
            )
        );
        let mut h = HeaderMap::new();
        write_retry(&mut h, RetryStyle::Seconds, wait);
        assert_eq!(h[RETRY_AFTER], "2");
        assert!(!h.contains_key("retry-after-ms"));
        let mut h = HeaderMap::new();
        let before = SystemTime::now();
        write_retry(&mut h, RetryStyle::HttpDate, wait);
        let date = h[RETRY_AFTER].to_str().expect("ascii");
        let at = httpdate::parse_http_date(date).expect("an HTTP-date");
        assert!(at >= before + wait, "{date} is no earlier than now + 1.5 s");
    }
}
