//! The export settings in force: `[otel]`, else the standard OpenTelemetry environment
//! variables, else the defaults — a key set in the config wins over its variable.
//!
//! | setting | `[otel]` | environment (first set wins) | default |
//! |---|---|---|---|
//! | traces URL | `endpoint` + `/v1/traces` | `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (as is), `OTEL_EXPORTER_OTLP_ENDPOINT` + `/v1/traces` | off |
//! | `service.name` | `service_name` | `OTEL_SERVICE_NAME`, `service.name` in `OTEL_RESOURCE_ATTRIBUTES` | `fairgate` |
//! | other resource attributes | — | `OTEL_RESOURCE_ATTRIBUTES` (`k=v,k=v`, percent-decoded) | — |
//! | export timeout, ms | `timeout_ms` | `OTEL_EXPORTER_OTLP_TRACES_TIMEOUT`, `OTEL_EXPORTER_OTLP_TIMEOUT`, `OTEL_BSP_EXPORT_TIMEOUT` | 5000 |
//! | export interval, ms | `export_interval_ms` | `OTEL_BSP_SCHEDULE_DELAY` | 1000 |
//! | queue, requests | `max_queued` | `OTEL_BSP_MAX_QUEUE_SIZE` | 2048 |
//! | batch, requests | `max_batch` | `OTEL_BSP_MAX_EXPORT_BATCH_SIZE` | 256 |
//! | sampler | `sample_ratio` (parent-based, ratio of new traces) | `OTEL_TRACES_SAMPLER` (+ `OTEL_TRACES_SAMPLER_ARG`) | `parentbased_always_on` |
//!
//! `OTEL_SDK_DISABLED=true` turns off an export the environment alone would start;
//! `OTEL_EXPORTER_OTLP_HEADERS` / `_TRACES_HEADERS` are read by the OTLP exporter itself. Only
//! `http/json` is sent: an `OTEL_EXPORTER_OTLP_PROTOCOL` of `grpc` or `http/protobuf` is warned
//! about once. A variable that does not parse is ignored with a warning (as the SDKs do).

use crate::config::OtelConfig;
use crate::context::Trace;

/// Which traces are recorded.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampler {
    /// A client's `traceparent` decides for its own trace (its sampled flag).
    pub parent_based: bool,
    /// Share of the other traces recorded, by trace id (1.0: all, 0.0: none).
    pub ratio: f64,
}

impl Sampler {
    /// Whether `trace` is recorded: the client's flag when parent-based and it sent one, else
    /// the trace id's lower 63 bits against the ratio (the SDKs' `TraceIdRatioBased`, so every
    /// service sampling by ratio keeps the same traces).
    pub fn sample(&self, trace: &Trace) -> bool {
        if self.parent_based && trace.parent.is_some() {
            return trace.sampled;
        }
        if self.ratio >= 1.0 {
            return true;
        }
        if self.ratio <= 0.0 {
            return false;
        }
        let low = u64::from_be_bytes(trace.trace_id[8..].try_into().expect("8 bytes")) >> 1;
        (low as f64) < self.ratio * (1u64 << 63) as f64
    }
}

/// The settings in force; see the module docs.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// Where spans are POSTed (OTLP/HTTP JSON).
    pub url: String,
    /// `service.name`.
    pub service_name: String,
    /// The other resource attributes.
    pub resource: Vec<(String, String)>,
    /// Finished requests queued at most.
    pub max_queued: usize,
    /// Requests per export call at most.
    pub max_batch: usize,
    /// Export interval, ms.
    pub export_interval_ms: u64,
    /// One export call's timeout, ms.
    pub timeout_ms: u64,
    /// Which traces are recorded.
    pub sampler: Sampler,
}

impl Settings {
    /// The settings of `cfg` and `env` (a variable's value, if set); `None`: no export.
    pub fn resolve(cfg: &OtelConfig, env: &dyn Fn(&str) -> Option<String>) -> Option<Self> {
        let var = |name: &str| {
            env(name)
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        };
        let disabled = var("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true"));
        let url = match &cfg.endpoint {
            Some(e) => traces_url(e),
            None if disabled => return None,
            None => {
                let url = var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
                    .filter(|u| valid("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", u))
                    .or_else(|| {
                        var("OTEL_EXPORTER_OTLP_ENDPOINT")
                            .filter(|u| valid("OTEL_EXPORTER_OTLP_ENDPOINT", u))
                            .map(|u| traces_url(&u))
                    });
                url?
            }
        };
        if let Some(p) =
            var("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL").or_else(|| var("OTEL_EXPORTER_OTLP_PROTOCOL"))
        {
            if p != "http/json" {
                tracing::warn!(protocol = %p, "otel: only http/json is sent (OTLP/HTTP JSON)");
            }
        }
        let resource = var("OTEL_RESOURCE_ATTRIBUTES")
            .map(|v| resource_attributes(&v))
            .unwrap_or_default();
        let service_name = cfg
            .service_name
            .clone()
            .or_else(|| var("OTEL_SERVICE_NAME"))
            .or_else(|| {
                resource
                    .iter()
                    .find(|(k, _)| k == "service.name")
                    .map(|(_, v)| v.clone())
            })
            .unwrap_or_else(|| "fairgate".to_owned());
        let number = |names: &[&str]| {
            names.iter().find_map(|n| {
                let v = var(n)?;
                match v.parse::<u64>() {
                    Ok(x) if x > 0 => Some(x),
                    _ => {
                        tracing::warn!(variable = n, value = %v, "otel: not a positive integer; ignored");
                        None
                    }
                }
            })
        };
        Some(Self {
            url,
            service_name,
            resource: resource
                .into_iter()
                .filter(|(k, _)| k != "service.name")
                .collect(),
            max_queued: cfg
                .max_queued
                .or_else(|| number(&["OTEL_BSP_MAX_QUEUE_SIZE"]).map(|v| v as usize))
                .unwrap_or(2048),
            max_batch: cfg
                .max_batch
                .or_else(|| number(&["OTEL_BSP_MAX_EXPORT_BATCH_SIZE"]).map(|v| v as usize))
                .unwrap_or(256),
            export_interval_ms: cfg
                .export_interval_ms
                .or_else(|| number(&["OTEL_BSP_SCHEDULE_DELAY"]))
                .unwrap_or(1000),
            timeout_ms: cfg
                .timeout_ms
                .or_else(|| {
                    number(&[
                        "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
                        "OTEL_EXPORTER_OTLP_TIMEOUT",
                        "OTEL_BSP_EXPORT_TIMEOUT",
                    ])
                })
                .unwrap_or(5000),
            sampler: match cfg.sample_ratio {
                Some(ratio) => Sampler {
                    parent_based: true,
                    ratio,
                },
                None => sampler_of_env(var("OTEL_TRACES_SAMPLER"), var("OTEL_TRACES_SAMPLER_ARG")),
            },
        })
    }
}

fn traces_url(base: &str) -> String {
    format!("{}/v1/traces", base.trim_end_matches('/'))
}

fn valid(name: &str, url: &str) -> bool {
    let ok = crate::config::is_otel_url(url);
    if !ok {
        tracing::warn!(
            variable = name,
            "otel: not an http:// or https:// URL; ignored"
        );
    }
    ok
}

/// The sampler `OTEL_TRACES_SAMPLER` names (with its ratio argument); the spec's default,
/// `parentbased_always_on`, when unset or unknown.
fn sampler_of_env(name: Option<String>, arg: Option<String>) -> Sampler {
    let ratio = || match arg.as_deref().map(str::parse::<f64>) {
        Some(Ok(r)) if (0.0..=1.0).contains(&r) => r,
        None => 1.0,
        Some(_) => {
            tracing::warn!("otel: OTEL_TRACES_SAMPLER_ARG is not a ratio in 0..1; using 1.0");
            1.0
        }
    };
    let (parent_based, ratio) = match name.as_deref() {
        None | Some("parentbased_always_on") => (true, 1.0),
        Some("always_on") => (false, 1.0),
        Some("always_off") => (false, 0.0),
        Some("parentbased_always_off") => (true, 0.0),
        Some("traceidratio") => (false, ratio()),
        Some("parentbased_traceidratio") => (true, ratio()),
        Some(other) => {
            tracing::warn!(
                sampler = other,
                "otel: unknown OTEL_TRACES_SAMPLER; using parentbased_always_on"
            );
            (true, 1.0)
        }
    };
    Sampler {
        parent_based,
        ratio,
    }
}

/// `k=v,k=v` with percent-encoded values (the W3C Baggage octets the spec allows).
fn resource_attributes(v: &str) -> Vec<(String, String)> {
    v.split(',')
        .filter_map(|pair| {
            let (k, v) = pair.split_once('=')?;
            let (k, v) = (k.trim(), v.trim());
            (!k.is_empty()).then(|| (k.to_owned(), percent_decode(v)))
        })
        .collect()
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            let hex = std::str::from_utf8(&b[i + 1..i + 3]).ok();
            if let Some(x) = hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                out.push(x);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests;
