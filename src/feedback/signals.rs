//! What an upstream answer says, in the words of the provider's headers: how long it asked us
//! to wait (`retry-after-ms`, `Retry-After`, `x-ratelimit-reset-*`), whether a budget is spent
//! (`x-ratelimit-remaining-*: 0`), whether the limit is one model's
//! (`x-ratelimit-remaining-{requests,tokens}-MODEL: 0`), and so which [`Signal`] an answer is for
//! the endpoint that gave it. Pure functions of the status and headers.

use std::time::Duration;

use http::{HeaderMap, HeaderName, StatusCode};

use super::endpoints::Signal;

/// The pause of a model limit that names no wait.
pub const DEFAULT_MODEL_PAUSE: Duration = Duration::from_secs(1);

/// What `status` and `headers`, answered to a request for `model` (as sent), say about the
/// endpoint: see [`Signal`]. 429/503 are overloads (a 503 naming no wait is also a failure);
/// either, or a success, naming `model` as spent is that model's limit; other 5xx are failures;
/// the rest say the endpoint is alive.
pub fn classify(status: StatusCode, headers: &HeaderMap, model: &str) -> Signal {
    let overload =
        status == StatusCode::TOO_MANY_REQUESTS || status == StatusCode::SERVICE_UNAVAILABLE;
    if (overload || status.is_success()) && !model.is_empty() && model_spent(headers, model) {
        return Signal::ModelLimited {
            model: model.into(),
            wait: upstream_wait(headers).unwrap_or(DEFAULT_MODEL_PAUSE),
        };
    }
    if overload {
        let wait = upstream_wait(headers);
        return Signal::Overload {
            wait,
            failed: status == StatusCode::SERVICE_UNAVAILABLE && wait.is_none(),
        };
    }
    if status.is_success() {
        Signal::Success {
            spent: spent_until(headers),
        }
    } else if status.is_server_error() {
        Signal::Failure
    } else {
        Signal::Alive
    }
}

/// Whether a per-model limit header for `model` says it is spent (the header suffix is the
/// model name lowercased, every character but `a-z0-9.-` written `-`). Read on every answer:
/// one pass over the headers, nothing allocated.
fn model_spent(h: &HeaderMap, model: &str) -> bool {
    h.iter().any(|(name, v)| {
        let Some(rest) = name.as_str().strip_prefix("x-ratelimit-remaining-") else {
            return false;
        };
        let Some(slug) = rest
            .strip_prefix("requests-")
            .or_else(|| rest.strip_prefix("tokens-"))
        else {
            return false;
        };
        is_slug_of(slug, model) && v.to_str().is_ok_and(|v| v.trim() == "0")
    })
}

/// Whether `slug` is `model` written as a header suffix: one byte per character of `model`,
/// lowercased, every character but `a-z0-9.-` written `-`.
fn is_slug_of(slug: &str, model: &str) -> bool {
    let mut slug = slug.bytes();
    model.chars().all(|c| {
        let want = match c.to_ascii_lowercase() {
            c @ ('a'..='z' | '0'..='9' | '.' | '-') => c as u8,
            _ => b'-',
        };
        slug.next() == Some(want)
    }) && slug.next().is_none()
}

const RETRY_AFTER_MS: HeaderName = HeaderName::from_static("retry-after-ms");
const RESET_REQUESTS: HeaderName = HeaderName::from_static("x-ratelimit-reset-requests");
const RESET_TOKENS: HeaderName = HeaderName::from_static("x-ratelimit-reset-tokens");
const REMAINING_REQUESTS: HeaderName = HeaderName::from_static("x-ratelimit-remaining-requests");
const REMAINING_TOKENS: HeaderName = HeaderName::from_static("x-ratelimit-remaining-tokens");

/// A header's trimmed text (names are constants: looked up without parsing a name per call).
fn text<'h>(h: &'h HeaderMap, name: &HeaderName) -> Option<&'h str> {
    h.get(name).and_then(|v| v.to_str().ok()).map(str::trim)
}

/// How long the upstream asked us to wait: `retry-after-ms`, `Retry-After` (seconds), else the
/// shortest `x-ratelimit-reset-*`.
pub fn upstream_wait(h: &HeaderMap) -> Option<Duration> {
    if let Some(ms) = text(h, &RETRY_AFTER_MS).and_then(|v| v.parse::<f64>().ok()) {
        if ms.is_finite() && ms >= 0.0 {
            return Some(Duration::from_secs_f64(ms.min(3.6e6) / 1000.0));
        }
    }
    if let Some(s) = text(h, &http::header::RETRY_AFTER).and_then(|v| v.parse::<u64>().ok()) {
        return Some(Duration::from_secs(s.min(3600)));
    }
    [RESET_REQUESTS, RESET_TOKENS]
        .iter()
        .filter_map(|n| text(h, n).and_then(parse_go_duration))
        .min()
}

/// The reset of a budget the upstream reports as spent (`x-ratelimit-remaining-*: 0`).
pub(crate) fn spent_until(h: &HeaderMap) -> Option<Duration> {
    [
        (REMAINING_REQUESTS, RESET_REQUESTS),
        (REMAINING_TOKENS, RESET_TOKENS),
    ]
    .iter()
    .filter(|(remaining, _)| text(h, remaining) == Some("0"))
    .filter_map(|(_, reset)| text(h, reset).and_then(parse_go_duration))
    .max()
}

/// Parses OpenAI's reset format (Go durations: `1s`, `6m0s`, `20ms`, `1.5s`); plain numbers are
/// seconds.
pub fn parse_go_duration(s: &str) -> Option<Duration> {
    if let Ok(secs) = s.parse::<f64>() {
        return (secs.is_finite() && secs >= 0.0)
            .then(|| Duration::from_secs_f64(secs.min(3600.0)));
    }
    let mut total = 0.0;
    let mut rest = s;
    while !rest.is_empty() {
        let split = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .filter(|&i| i > 0)?;
        let value: f64 = rest[..split].parse().ok()?;
        rest = &rest[split..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_len] {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 1e-3,
            "us" | "µs" => 1e-6,
            "ns" => 1e-9,
            _ => return None,
        };
        total += value * scale;
        rest = &rest[unit_len..];
    }
    Some(Duration::from_secs_f64(total.min(3600.0)))
}

/// A header map of static pairs (the feedback tests' answers).
#[cfg(test)]
pub(crate) fn header_map(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.insert(*k, http::HeaderValue::from_static(v));
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    use super::header_map as headers;

    #[test]
    fn a_model_limit_header_names_the_model_as_a_slug() {
        let h = |name: &'static str, v: &'static str| headers(&[(name, v)]);
        let spent = |hm: &HeaderMap, model| model_spent(hm, model);
        let hm = h("x-ratelimit-remaining-tokens-org-model_1", "0");
        assert!(!spent(&hm, "Org/Model_1"), "`_` is written `-`");
        let hm = h("x-ratelimit-remaining-tokens-org-model-1", " 0 ");
        assert!(spent(&hm, "Org/Model_1"));
        assert!(!spent(&hm, "Org/Model_12"));
        assert!(!spent(&hm, "Org/Model"));
        assert!(spent(
            &h("x-ratelimit-remaining-requests-gpt-4o", "0"),
            "gpt-4o"
        ));
        assert!(!spent(
            &h("x-ratelimit-remaining-requests-gpt-4o", "3"),
            "gpt-4o"
        ));
        assert!(!spent(&h("x-ratelimit-remaining-requests", "0"), "gpt-4o"));
        assert!(!spent(
            &h("x-ratelimit-remaining-bytes-gpt-4o", "0"),
            "gpt-4o"
        ));
        // Each character is one byte of the slug, whatever its UTF-8 length.
        assert!(spent(
            &h("x-ratelimit-remaining-tokens-m-del", "0"),
            "mödel"
        ));
        assert!(!spent(
            &h("x-ratelimit-remaining-tokens-m--del", "0"),
            "mödel"
        ));
    }

    #[test]
    fn waits_are_parsed_in_order_of_precision() {
        let ms = |m| Some(Duration::from_millis(m));
        assert_eq!(
            upstream_wait(&headers(&[("retry-after", "2"), ("retry-after-ms", "150")])),
            ms(150)
        );
        assert_eq!(upstream_wait(&headers(&[("retry-after", "2")])), ms(2000));
        assert_eq!(
            upstream_wait(&headers(&[
                ("x-ratelimit-reset-requests", "6m0s"),
                ("x-ratelimit-reset-tokens", "1.5s")
            ])),
            ms(1500)
        );
        assert_eq!(upstream_wait(&headers(&[])), None);
        assert_eq!(parse_go_duration("20ms"), ms(20));
        assert_eq!(parse_go_duration("1m30s"), ms(90_000));
        assert_eq!(parse_go_duration("abc"), None);
    }

    #[test]
    fn answers_are_classified_for_the_endpoint() {
        let ms = Duration::from_millis;
        let s = |status: u16, h: &[(&'static str, &'static str)]| {
            classify(
                StatusCode::from_u16(status).unwrap(),
                &headers(h),
                "Org/Model_1",
            )
        };
        assert_eq!(s(200, &[]), Signal::Success { spent: None });
        assert_eq!(
            s(429, &[("retry-after-ms", "20")]),
            Signal::Overload {
                wait: Some(ms(20)),
                failed: false
            }
        );
        assert_eq!(
            s(503, &[]),
            Signal::Overload {
                wait: None,
                failed: true
            }
        );
        assert_eq!(s(500, &[]), Signal::Failure);
        assert_eq!(s(504, &[]), Signal::Failure);
        assert_eq!(s(400, &[]), Signal::Alive);
        assert_eq!(
            s(
                429,
                &[
                    ("x-ratelimit-remaining-requests-org-model-1", "0"),
                    ("retry-after", "2")
                ]
            ),
            Signal::ModelLimited {
                model: "Org/Model_1".into(),
                wait: ms(2000)
            }
        );
        assert_eq!(
            s(
                200,
                &[
                    ("x-ratelimit-remaining-tokens-org-model-1", "0"),
                    ("x-ratelimit-reset-tokens", "3s")
                ]
            ),
            Signal::ModelLimited {
                model: "Org/Model_1".into(),
                wait: ms(3000)
            }
        );
        assert_eq!(
            s(200, &[("x-ratelimit-remaining-tokens-other", "0")]),
            Signal::Success { spent: None },
            "another model's limit"
        );
    }
}
