//! `[otel]`: OpenTelemetry trace export over OTLP/HTTP (JSON, the `opentelemetry-otlp`
//! exporter on fairgate's HTTP client; see `crate::otel`). Absent or without `endpoint`: off.

use serde::Deserialize;

use super::ConfigError;

/// `[otel]`. Every key may also come from the standard `OTEL_*` environment variables
/// (`crate::otel::Settings`); a key set here wins over its variable, so the keys are `Option`s
/// and their defaults apply after both.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OtelConfig {
    /// The collector's OTLP/HTTP base URL (`http://collector:4318`); spans are POSTed to
    /// `endpoint + /v1/traces`. `None` here and in the environment: no export.
    pub endpoint: Option<String>,
    /// `service.name` of the exported resource (default `fairgate`).
    pub service_name: Option<String>,
    /// Finished requests waiting for export at most; beyond, a request's spans are dropped
    /// (and counted in `fairgate_otel_dropped_total`). Default 2048.
    pub max_queued: Option<usize>,
    /// Requests per export call at most. Default 256.
    pub max_batch: Option<usize>,
    /// How often queued spans are exported, ms. Default 1000.
    pub export_interval_ms: Option<u64>,
    /// Timeout of one export call, ms, the collector's answer included (no retry: a failed
    /// call drops its batch, counted). Default 5000.
    pub timeout_ms: Option<u64>,
    /// Share of new traces recorded, 0.0 ..= 1.0, decided by the trace id (a client's
    /// `traceparent` keeps its own sampled flag). Default 1.0.
    pub sample_ratio: Option<f64>,
}

fn invalid(key: &str, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key: format!("otel.{key}"),
        message: message.into(),
    }
}

/// Checks `[otel]`.
pub(super) fn validate(c: &OtelConfig) -> Result<(), ConfigError> {
    if let Some(e) = &c.endpoint {
        if !is_url(e) {
            return Err(invalid("endpoint", "must be an http:// or https:// URL"));
        }
    }
    for (k, v) in [
        ("max_queued", c.max_queued.map(|v| v as u64)),
        ("max_batch", c.max_batch.map(|v| v as u64)),
        ("export_interval_ms", c.export_interval_ms),
        ("timeout_ms", c.timeout_ms),
    ] {
        if v == Some(0) {
            return Err(invalid(k, "must be > 0"));
        }
    }
    if c.service_name.as_deref() == Some("") {
        return Err(invalid("service_name", "must not be empty"));
    }
    if let Some(r) = c.sample_ratio {
        if !(0.0..=1.0).contains(&r) {
            return Err(invalid("sample_ratio", "must be between 0.0 and 1.0"));
        }
    }
    Ok(())
}

/// Whether `e` is an http:// or https:// URL with a host.
pub fn is_url(e: &str) -> bool {
    (e.starts_with("http://") || e.starts_with("https://"))
        && e.parse::<http::Uri>()
            .is_ok_and(|u| u.authority().is_some())
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    const BASE: &str = "[[upstreams]]\nname = \"u\"\nbase_url = \"http://h/v1\"\n";

    #[test]
    fn off_by_default_and_bad_values_name_their_key() {
        let c = Config::from_toml_str(BASE).unwrap();
        assert!(c.otel.endpoint.is_none());
        let on = Config::from_toml_str(&format!("{BASE}[otel]\nendpoint = \"http://c:4318\"\n"))
            .unwrap();
        assert_eq!(
            on.otel.max_queued, None,
            "defaults apply after the environment"
        );
        for (toml, key) in [
            ("endpoint = \"c:4318\"", "otel.endpoint"),
            (
                "endpoint = \"http://c:4318\"\nmax_queued = 0",
                "otel.max_queued",
            ),
            ("timeout_ms = 0", "otel.timeout_ms"),
            ("sample_ratio = 1.5", "otel.sample_ratio"),
        ] {
            let e = Config::from_toml_str(&format!("{BASE}[otel]\n{toml}\n"))
                .unwrap_err()
                .to_string();
            assert!(e.starts_with(key), "{toml}: {e}");
        }
    }
}
