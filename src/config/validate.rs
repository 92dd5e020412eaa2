//! Semantic validation of a parsed [`Config`]: every message names the offending key path.

use std::collections::HashSet;

use super::{Config, ConfigError};

pub(super) fn invalid(key: impl Into<String>, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key: key.into(),
        message: message.into(),
    }
}

pub(super) fn positive_weight(key: String, w: f64) -> Result<(), ConfigError> {
    if w.is_finite() && w > 0.0 {
        Ok(())
    } else {
        Err(invalid(key, format!("weight must be > 0, got {w}")))
    }
}

pub(super) fn env_name(key: String, var: &Option<String>) -> Result<(), ConfigError> {
    match var {
        Some(v) if v.is_empty() || v.contains('=') || v.contains('\0') => {
            Err(invalid(key, "not a valid environment variable name"))
        }
        _ => Ok(()),
    }
}

/// `[server]` connection limits: every timeout and cap is positive.
fn validate_connections(s: &super::ServerConfig) -> Result<(), ConfigError> {
    for (k, v) in [
        ("client_body_timeout_ms", s.client_body_timeout_ms),
        ("client_write_timeout_ms", s.client_write_timeout_ms),
        ("keepalive_timeout_ms", s.keepalive_timeout_ms),
        ("http2_keepalive_interval_ms", s.http2_keepalive_interval_ms),
        (
            "http2_max_concurrent_streams",
            u64::from(s.http2_max_concurrent_streams),
        ),
        ("max_connections", s.max_connections.map_or(1, |n| n as u64)),
        (
            "max_connections_per_ip",
            s.max_connections_per_ip.map_or(1, u64::from),
        ),
    ] {
        if v == 0 {
            return Err(invalid(format!("server.{k}"), "must be > 0"));
        }
    }
    Ok(())
}

/// Admission limits of one plan or tenant: rates, caps and burst must be > 0 when set.
fn limits(
    prefix: &str,
    rates: [(&str, Option<u64>); 7],
    burst: Option<f64>,
) -> Result<(), ConfigError> {
    for (k, v) in rates {
        if v == Some(0) {
            return Err(invalid(format!("{prefix}.{k}"), "must be > 0"));
        }
    }
    match burst {
        Some(b) if !(b.is_finite() && b > 0.0) => Err(invalid(
            format!("{prefix}.burst"),
            format!("must be > 0, got {b}"),
        )),
        _ => Ok(()),
    }
}

macro_rules! limit_fields {
    ($x:expr) => {
        [
            ("requests_per_minute", $x.requests_per_minute.map(u64::from)),
            ("tokens_per_minute", $x.tokens_per_minute.map(u64::from)),
            (
                "input_tokens_per_minute",
                $x.input_tokens_per_minute.map(u64::from),
            ),
            (
                "output_tokens_per_minute",
                $x.output_tokens_per_minute.map(u64::from),
            ),
            ("max_input_tokens", $x.max_input_tokens),
            ("max_output_tokens", $x.max_output_tokens),
            ("max_queue_wait_ms", $x.max_queue_wait_ms),
        ]
    };
}

fn validate_estimate(c: &Config) -> Result<(), ConfigError> {
    let e = &c.estimate;
    for (k, w) in [
        ("estimate.input_weight", e.input_weight),
        ("estimate.output_weight", e.output_weight),
    ] {
        if !(w.is_finite() && w >= 0.0) {
            return Err(invalid(k, format!("must be a number >= 0, got {w}")));
        }
    }
    if crate::domain::Encoding::parse(&e.default_encoding).is_none() {
        return Err(invalid(
            "estimate.default_encoding",
            format!("unknown encoding {:?}", e.default_encoding),
        ));
    }
    for (name, m) in &c.models {
        positive_weight(format!("models.{name:?}.weight"), m.weight)?;
        if let Some(enc) = &m.encoding {
            if crate::domain::Encoding::parse(enc).is_none() {
                return Err(invalid(
                    format!("models.{name:?}.encoding"),
                    format!("unknown encoding {enc:?}"),
                ));
            }
        }
    }
    Ok(())
}

/// Checks everything the schema cannot express.
pub fn validate(c: &Config) -> Result<(), ConfigError> {
    let a = &c.admission;
    for (k, v) in [
        ("max_input_tokens", Some(a.max_input_tokens)),
        ("max_output_tokens", Some(a.max_output_tokens)),
        ("max_queue_wait_ms", a.max_queue_wait_ms),
        ("retry_backoff_ms", Some(a.retry_backoff_ms)),
    ] {
        if v == Some(0) {
            return Err(invalid(format!("admission.{k}"), "must be > 0"));
        }
    }
    if a.retry_backoff_max_ms < a.retry_backoff_ms {
        return Err(invalid(
            "admission.retry_backoff_max_ms",
            "must be >= admission.retry_backoff_ms",
        ));
    }
    if let Some(h) = &c.server.tenant_header {
        if http::HeaderName::from_bytes(h.as_bytes()).is_err() {
            return Err(invalid("server.tenant_header", "not a valid header name"));
        }
    }
    for (i, s) in c.server.trusted_sources.iter().enumerate() {
        if super::Cidr::parse(s).is_none() {
            return Err(invalid(
                format!("server.trusted_sources[{i}]"),
                format!("{s:?} is not an address range (e.g. \"127.0.0.1/32\", \"::1/128\")"),
            ));
        }
    }
    if c.admin.max_queued_writes == 0 {
        return Err(invalid("admin.max_queued_writes", "must be > 0"));
    }
    if matches!(c.server.workers, Some(n) if n == 0 || n > 256) {
        return Err(invalid("server.workers", "must be between 1 and 256"));
    }
    if c.server.max_body_bytes == 0 {
        return Err(invalid("server.max_body_bytes", "must be > 0"));
    }
    validate_connections(&c.server)?;
    validate_estimate(c)?;
    super::budgets::validate(c)?;
    super::otel::validate(&c.otel)?;
    if let Some(jobs) = &c.jobs {
        if jobs.lease_ms < 100 {
            return Err(invalid(
                "jobs.lease_ms",
                "must be >= 100 (renewed every lease_ms / 3)",
            ));
        }
        if jobs.max_inflight_per_tenant == 0 {
            return Err(invalid("jobs.max_inflight_per_tenant", "must be > 0"));
        }
        for (key, v) in [
            ("jobs.max_file_bytes", jobs.max_file_bytes),
            ("jobs.max_file_lines", jobs.max_file_lines),
            (
                "jobs.max_transfers_per_tenant",
                jobs.max_transfers_per_tenant as u64,
            ),
        ] {
            if v == 0 {
                return Err(invalid(key, "must be > 0"));
            }
        }
        if jobs.path.as_os_str().is_empty() {
            return Err(invalid("jobs.path", "must not be empty"));
        }
    }
    if c.store
        .as_ref()
        .is_some_and(|s| s.path.as_os_str().is_empty())
    {
        return Err(invalid("store.path", "must not be empty"));
    }
    if let Some(cluster) = &c.cluster {
        super::cluster::validate(cluster)?;
        // The shared (Redis) rate store keeps the request and all-tokens buckets only.
        for (i, t) in c.tenants.iter().enumerate() {
            let l = t.effective_limits(c);
            for (name, v) in [
                ("input_tokens_per_minute", l.input_tokens_per_minute),
                ("output_tokens_per_minute", l.output_tokens_per_minute),
            ] {
                if v.is_some() {
                    return Err(invalid(
                        format!("tenants[{i}].{name}"),
                        "not available with [cluster] yet (use tokens_per_minute)",
                    ));
                }
            }
        }
    }
    let s = &c.scheduler;
    if s.quantum == 0 {
        return Err(invalid("scheduler.quantum", "must be > 0"));
    }
    for (k, v) in [
        ("scheduler.max_queued_bytes", s.max_queued_bytes),
        (
            "scheduler.max_queued_bytes_per_tenant",
            s.max_queued_bytes_per_tenant,
        ),
    ] {
        if v == 0 {
            return Err(invalid(k, "must be > 0"));
        }
    }
    if s.classes.interactive == 0 || s.classes.batch == 0 {
        return Err(invalid("scheduler.classes", "class shares must be > 0"));
    }
    if c.upstreams.is_empty() {
        return Err(invalid(
            "upstreams",
            "at least one [[upstreams]] is required",
        ));
    }
    let mut names = HashSet::new();
    for (i, u) in c.upstreams.iter().enumerate() {
        let key = |k: &str| format!("upstreams[{i}].{k}");
        if !names.insert(u.name.as_str()) {
            return Err(invalid(
                key("name"),
                format!("duplicate upstream name {:?}", u.name),
            ));
        }
        super::endpoints::validate(u, i)?;
        if u.max_concurrency == 0 {
            return Err(invalid(key("max_concurrency"), "must be > 0"));
        }
        if c.scheduler.reserved_slots >= u.max_concurrency {
            return Err(invalid(
                "scheduler.reserved_slots",
                format!(
                    "must be below upstreams[{i}].max_concurrency ({}): ordinary traffic needs \
                     at least one slot",
                    u.max_concurrency
                ),
            ));
        }
        if u.models.is_empty() || u.models.iter().any(String::is_empty) {
            return Err(invalid(
                key("models"),
                "needs at least one non-empty pattern",
            ));
        }
        for (k, v) in [
            ("connect_timeout_ms", u.connect_timeout_ms),
            ("first_byte_timeout_ms", u.first_byte_timeout_ms),
            ("idle_timeout_ms", u.idle_timeout_ms),
            ("models_list_timeout_ms", u.models_list_timeout_ms),
            ("models_list_ttl_ms", u.models_list_ttl_ms),
            ("models_list_max", u.models_list_max as u64),
            ("models_list_max_bytes", u.models_list_max_bytes as u64),
        ] {
            if v == 0 {
                return Err(invalid(key(k), "must be > 0"));
            }
        }
        env_name(key("api_key_env"), &u.api_key_env)?;
    }
    for (name, p) in &c.plans {
        positive_weight(format!("plans.{name}.weight"), p.weight)?;
        limits(&format!("plans.{name}"), limit_fields!(p), p.burst)?;
        if p.max_concurrency == Some(0) {
            return Err(invalid(
                format!("plans.{name}.max_concurrency"),
                "must be > 0",
            ));
        }
    }
    let mut ids = HashSet::new();
    let mut digests = HashSet::new();
    for (i, t) in c.tenants.iter().enumerate() {
        let key = |k: &str| format!("tenants[{i}].{k}");
        limits(&format!("tenants[{i}]"), limit_fields!(t), t.burst)?;
        if t.id.is_empty() {
            return Err(invalid(key("id"), "must not be empty"));
        }
        if !ids.insert(t.id.as_str()) {
            return Err(invalid(
                key("id"),
                format!("duplicate tenant id {:?}", t.id),
            ));
        }
        if let Some(w) = t.weight {
            positive_weight(key("weight"), w)?;
        }
        if let Some(p) = &t.plan {
            if !c.plans.contains_key(p) {
                return Err(invalid(
                    key("plan"),
                    format!("unknown plan {p:?} (no [plans.{p}])"),
                ));
            }
        }
        if t.max_concurrency == Some(0) {
            return Err(invalid(key("max_concurrency"), "must be > 0"));
        }
        env_name(key("upstream_api_key_env"), &t.upstream_api_key_env)?;
        for (endpoint, var) in &t.upstream_api_key_envs {
            let k = format!("tenants[{i}].upstream_api_key_envs.{endpoint}");
            env_name(k.clone(), &Some(var.clone()))?;
            let known = c.upstreams.iter().flat_map(|u| &u.endpoints);
            if !known.clone().any(|e| &e.name == endpoint) {
                return Err(invalid(k, format!("no endpoint is named {endpoint:?}")));
            }
        }
        for h in &t.forward_headers {
            let name = http::HeaderName::from_bytes(h.as_bytes()).map_err(|_| {
                invalid(
                    key("forward_headers"),
                    format!("{h:?} is not a header name"),
                )
            })?;
            if name == http::header::AUTHORIZATION || name.as_str().starts_with("x-fairgate-") {
                return Err(invalid(
                    key("forward_headers"),
                    format!("{name} is never forwarded (authorization is fairgate's to set)"),
                ));
            }
        }
        let plain = t.api_keys.iter().map(|k| ("api_keys", k));
        let recovery = t.recovery_api_keys.iter().map(|k| ("recovery_api_keys", k));
        let batch = t.batch_api_keys.iter().map(|k| ("batch_api_keys", k));
        for (j, (field, k)) in plain.chain(recovery).chain(batch).enumerate() {
            if k.is_empty() {
                return Err(invalid(key(field), "keys must not be empty"));
            }
            if !digests.insert(crate::domain::digest(k.as_bytes())) {
                // Never echo the key itself.
                return Err(invalid(
                    key(field),
                    format!("key #{j} is used more than once"),
                ));
            }
        }
        for (j, h) in t.api_key_sha256.iter().enumerate() {
            let d = crate::domain::parse_digest(h).ok_or_else(|| {
                invalid(
                    format!("tenants[{i}].api_key_sha256[{j}]"),
                    "must be 64 hex characters",
                )
            })?;
            if !digests.insert(d) {
                return Err(invalid(
                    format!("tenants[{i}].api_key_sha256[{j}]"),
                    "key is used more than once",
                ));
            }
        }
        let keyless = t.api_keys.is_empty()
            && t.api_key_sha256.is_empty()
            && t.recovery_api_keys.is_empty()
            && t.batch_api_keys.is_empty();
        if keyless && c.server.tenant_header.is_none() {
            return Err(invalid(
                key("api_keys"),
                "tenant has no keys (set api_keys or api_key_sha256, or [server] tenant_header)",
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    const BASE: &str = r#"
[[upstreams]]
name = "default"
base_url = "http://127.0.0.1:9000/v1"
"#;

    fn err(extra: &str) -> String {
        Config::from_toml_str(&format!("{BASE}{extra}"))
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn minimal_config_is_valid() {
        let c = Config::from_toml_str(&format!(
            "{BASE}[[tenants]]\nid = \"a\"\napi_keys = [\"k\"]\n"
        ))
        .unwrap();
        assert_eq!(c.tenants[0].effective_weight(&c).get(), 1.0);
        assert_eq!(c.tenants[0].effective_max_queued(&c), 1000);
        assert_eq!(c.upstreams[0].models, vec!["*"]);
    }

    #[test]
    fn unknown_key_names_path() {
        let e = err("[[tenants]]\nid = \"a\"\napi_keys = [\"k\"]\nwieght = 2.0\n");
        assert!(e.starts_with("tenants[0].wieght"), "{e}");
        assert!(e.contains("unknown field"), "{e}");
    }

    #[test]
    fn workers_must_be_positive() {
        let e = err("[server]\nworkers = 0\n");
        assert!(e.starts_with("server.workers"), "{e}");
        let ok = Config::from_toml_str(&format!("[server]\nworkers = 4\n{BASE}")).unwrap();
        assert_eq!(ok.server.workers, Some(4));
    }

    #[test]
    fn jobs_run_in_cluster_mode_with_a_lease_and_need_an_inflight_slot() {
        let cluster = "[cluster]\nredis_url = \"redis://127.0.0.1:6379\"\n";
        let c =
            Config::from_toml_str(&format!("{BASE}{cluster}[jobs]\npath = \"j.db\"\n")).unwrap();
        assert_eq!(c.jobs.unwrap().lease_ms, 30_000);
        let e = Config::from_toml_str(&format!("{BASE}[jobs]\nlease_ms = 10\n"))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("jobs.lease_ms"), "{e}");
        let e = Config::from_toml_str(&format!("{BASE}[jobs]\nmax_inflight_per_tenant = 0\n"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("jobs.max_inflight_per_tenant"), "{e}");
        let c = Config::from_toml_str(&format!("{BASE}[jobs]\n")).unwrap();
        assert_eq!(c.jobs.unwrap().max_inflight_per_tenant, 4);
    }

    #[test]
    fn split_token_budgets_are_refused_in_cluster_mode() {
        let cluster = "[cluster]\nredis_url = \"redis://127.0.0.1:6379\"\n";
        let e = err(&format!(
            "{cluster}[plans.p]\noutput_tokens_per_minute = 80\n\
             [[tenants]]\nid = \"a\"\napi_keys = [\"k\"]\nplan = \"p\"\n"
        ));
        assert!(e.starts_with("tenants[0].output_tokens_per_minute"), "{e}");
        assert!(e.contains("[cluster]"), "{e}");
        let ok = format!(
            "{BASE}{cluster}[[tenants]]\nid = \"a\"\napi_keys = [\"k\"]\ntokens_per_minute = 80\n"
        );
        assert!(Config::from_toml_str(&ok).is_ok());
    }

    #[test]
    fn admission_limits_are_validated_and_resolved() {
        let e = err("[[tenants]]\nid = \"a\"\napi_keys = [\"k\"]\nrequests_per_minute = 0\n");
        assert!(e.starts_with("tenants[0].requests_per_minute"), "{e}");
        let e = err("[plans.p]\nburst = -1.0\n");
        assert!(e.starts_with("plans.p.burst"), "{e}");
        let e = err("[plans.p]\noutput_tokens_per_minute = 0\n");
        assert!(e.starts_with("plans.p.output_tokens_per_minute"), "{e}");
        let e = err("[admission]\nmax_retries = 2\nretry_backoff_ms = 0\n");
        assert!(e.starts_with("admission.retry_backoff_ms"), "{e}");
        let c = Config::from_toml_str(&format!(
            "{BASE}[admission]\nmax_queue_wait_ms = 900\n[plans.p]\ntokens_per_minute = 500\n\
             requests_per_minute = 9\ninput_tokens_per_minute = 400\n\
             [[tenants]]\nid = \"a\"\napi_keys = [\"k\"]\nplan = \"p\"\n\
             requests_per_minute = 3\nmax_output_tokens = 64\noutput_tokens_per_minute = 80\n"
        ))
        .unwrap();
        let l = c.tenants[0].effective_limits(&c);
        assert_eq!(l.requests_per_minute, Some(3));
        assert_eq!(l.tokens_per_minute, Some(500));
        assert_eq!(l.input_tokens_per_minute, Some(400));
        assert_eq!(l.output_tokens_per_minute, Some(80));
        assert_eq!((l.burst, l.max_output_tokens), (1.0, 64));
        assert_eq!(l.max_input_tokens, 200_000);
        assert_eq!(l.max_queue_wait_ms, Some(900));
    }

    #[test]
    fn bad_weight_names_path() {
        let e = err("[[tenants]]\nid = \"a\"\napi_keys = [\"k\"]\nweight = 0.0\n");
        assert!(e.starts_with("tenants[0].weight"), "{e}");
        let e = err("[plans.p]\nweight = -1.0\n");
        assert!(e.starts_with("plans.p.weight"), "{e}");
    }

    #[test]
    fn wrong_type_names_path() {
        let e = err("[scheduler]\nquantum = \"lots\"\n");
        assert!(e.starts_with("scheduler.quantum"), "{e}");
    }

    #[test]
    fn unknown_plan_names_path() {
        let e = err("[[tenants]]\nid = \"a\"\napi_keys = [\"k\"]\nplan = \"gold\"\n");
        assert!(e.starts_with("tenants[0].plan"), "{e}");
        assert!(e.contains("gold"), "{e}");
    }

    #[test]
    fn plan_values_resolve_and_tenant_overrides() {
        let c = Config::from_toml_str(&format!(
            "{BASE}[plans.pro]\nweight = 2.0\nmax_concurrency = 16\nmax_queued = 500\n\
             [[tenants]]\nid = \"a\"\napi_keys = [\"k\"]\nplan = \"pro\"\nmax_concurrency = 3\n"
        ))
        .unwrap();
        let t = &c.tenants[0];
        assert_eq!(t.effective_weight(&c).get(), 2.0);
        assert_eq!(t.effective_max_concurrency(&c), Some(3));
        assert_eq!(t.effective_max_queued(&c), 500);
    }

    #[test]
    fn duplicates_and_bad_values_rejected() {
        let e = err("[[tenants]]\nid = \"a\"\napi_keys = [\"k\"]\n[[tenants]]\nid = \"a\"\napi_keys = [\"j\"]\n");
        assert!(e.starts_with("tenants[1].id"), "{e}");
        let e = err("[[tenants]]\nid = \"a\"\napi_keys = [\"k\"]\n[[tenants]]\nid = \"b\"\napi_keys = [\"k\"]\n");
        assert!(
            e.starts_with("tenants[1].api_keys") && !e.contains("\"k\""),
            "{e}"
        );
        let e = err("[[tenants]]\nid = \"a\"\napi_key_sha256 = [\"abc\"]\n");
        assert!(e.starts_with("tenants[0].api_key_sha256[0]"), "{e}");
        let e = err("[[upstreams]]\nname = \"default\"\nbase_url = \"http://x/v1\"\n");
        assert!(e.starts_with("upstreams[1].name"), "{e}");
        let e = Config::from_toml_str("[[upstreams]]\nname = \"u\"\nbase_url = \"ftp://x/v1\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("upstreams[0].base_url"), "{e}");
        let e = err("[[tenants]]\nid = \"a\"\n");
        assert!(e.starts_with("tenants[0].api_keys"), "{e}");
    }

    #[test]
    fn forward_headers_must_be_names_and_never_authorization_or_ours() {
        let t = "[[tenants]]\nid = \"a\"\napi_keys = [\"k\"]\n";
        let e = err(&format!("{t}forward_headers = [\"bad header\"]\n"));
        assert!(e.starts_with("tenants[0].forward_headers"), "{e}");
        let e = err(&format!("{t}forward_headers = [\"Authorization\"]\n"));
        assert!(e.starts_with("tenants[0].forward_headers"), "{e}");
        let e = err(&format!("{t}forward_headers = [\"x-fairgate-priority\"]\n"));
        assert!(e.starts_with("tenants[0].forward_headers"), "{e}");
        let ok = format!("{BASE}{t}forward_headers = [\"openai-project\"]\n");
        assert!(Config::from_toml_str(&ok).is_ok());
    }

    #[test]
    fn reserved_slots_must_leave_ordinary_traffic_a_slot() {
        let pool = "max_concurrency = 4\n";
        let e = err(&format!("{pool}[scheduler]\nreserved_slots = 4\n"));
        assert!(e.starts_with("scheduler.reserved_slots"), "{e}");
        assert!(e.contains("upstreams[0].max_concurrency (4)"), "{e}");
        let e = err(&format!("{pool}[scheduler]\nreserved_slots = 9\n"));
        assert!(e.starts_with("scheduler.reserved_slots"), "{e}");
        let ok = format!("{BASE}{pool}[scheduler]\nreserved_slots = 3\n");
        assert!(Config::from_toml_str(&ok).is_ok());
    }

    #[test]
    fn trusted_sources_default_to_loopback_and_must_parse() {
        let c = Config::from_toml_str(BASE).unwrap();
        assert_eq!(c.server.trusted_sources, vec!["127.0.0.1/32", "::1/128"]);
        let e = err("[server]\ntrusted_sources = [\"10.0.0.0/8\", \"10.0.0.0/40\"]\n");
        assert!(e.starts_with("server.trusted_sources[1]"), "{e}");
    }

    #[test]
    fn reference_config_is_valid() {
        let text = include_str!("../../config.toml");
        Config::from_toml_str(text).unwrap();
    }
}
