//! `[otel]`: OpenTelemetry trace export over OTLP/HTTP (JSON, the `opentelemetry-otlp`
//! exporter on fairgate's HTTP client; see `crate::otel`). Absent or without `endpoint`: off.

use serde::Deserialize;

use super::ConfigError;

/// `[otel]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OtelConfig {
    /// The collector's OTLP/HTTP base URL (`http://collector:4318`); spans are POSTed to
    /// `endpoint + /v1/traces`. `None`: no export.
    pub endpoint: Option<String>,
    /// `service.name` of the exported resource.
    pub service_name: String,
    /// Finished requests waiting for export at most; beyond, a request's spans are dropped
    /// (and counted in `fairgate_otel_dropped_total`).
    pub max_queued: usize,
    /// Requests per export call at most.
    pub max_batch: usize,
    /// How often queued spans are exported, ms.
    pub export_interval_ms: u64,
    /// Timeout of one export call, ms, the collector's answer included (no retry: a failed
    /// call drops its batch, counted).
    pub timeout_ms: u64,
}

impl Default for OtelConfig {
    fn default() -> Self {
        Self {
            endpoint: None,
            service_name: "fairgate".to_owned(),
            max_queued: 2048,
            max_batch: 256,
            export_interval_ms: 1000,
            timeout_ms: 5000,
        }
    }
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
        let ok = (e.starts_with("http://") || e.starts_with("https://"))
            && e.parse::<http::Uri>()
                .is_ok_and(|u| u.authority().is_some());
        if !ok {
            return Err(invalid("endpoint", "must be an http:// or https:// URL"));
        }
    }
    for (k, v) in [
        ("max_queued", c.max_queued as u64),
        ("max_batch", c.max_batch as u64),
        ("export_interval_ms", c.export_interval_ms),
        ("timeout_ms", c.timeout_ms),
    ] {
        if v == 0 {
            return Err(invalid(k, "must be > 0"));
        }
    }
    if c.service_name.is_empty() {
        return Err(invalid("service_name", "must not be empty"));
    }
    Ok(())
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
        assert_eq!(on.otel.max_queued, 2048);
        for (toml, key) in [
            ("endpoint = \"c:4318\"", "otel.endpoint"),
            (
                "endpoint = \"http://c:4318\"\nmax_queued = 0",
                "otel.max_queued",
            ),
            ("timeout_ms = 0", "otel.timeout_ms"),
        ] {
            let e = Config::from_toml_str(&format!("{BASE}[otel]\n{toml}\n"))
                .unwrap_err()
                .to_string();
            assert!(e.starts_with(key), "{toml}: {e}");
        }
    }
}
