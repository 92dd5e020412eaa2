//! The files in `deploy/` stay in step with the code: the Kubernetes example's config validates,
//! the Grafana dashboard is valid JSON that queries the metric families of the contract, and the
//! cluster example (three replicas + Redis) mounts a config that validates.

use fairgate::config::Config;

#[test]
fn sidecar_configmap_config_is_valid() {
    let yaml = std::fs::read_to_string("deploy/k8s/sidecar.yaml").unwrap();
    let block = yaml
        .split("config.toml: |\n")
        .nth(1)
        .and_then(|rest| rest.split("\n---").next())
        .expect("a config.toml block");
    let toml: String = block
        .lines()
        .map(|l| l.strip_prefix("    ").unwrap_or(l.trim()))
        .collect::<Vec<_>>()
        .join("\n");
    let config = Config::from_toml_str(&toml).expect("the sidecar config validates");
    assert_eq!(config.server.tenant_header.as_deref(), Some("x-tenant-id"));
    // Safe by default: the proxy on loopback, the header trusted from loopback only, metrics
    // and admin on their own port.
    assert!(
        config.server.listen.ip().is_loopback(),
        "{}",
        config.server.listen
    );
    assert_eq!(
        config.server.trusted_sources,
        vec!["127.0.0.1/32", "::1/128"]
    );
    let admin = config.admin.listen.expect("an admin listener");
    assert!(!admin.ip().is_loopback());
    assert!(yaml.contains(&format!("containerPort: {}", admin.port())));
    assert!(yaml.contains(&format!("prometheus.io/port: \"{}\"", admin.port())));
}

#[test]
fn grafana_dashboard_queries_the_contract_families() {
    let text = std::fs::read_to_string("deploy/grafana/fairgate.json").unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
    assert!(!v["panels"].as_array().unwrap().is_empty());
    for family in [
        "fairgate_queue_wait_seconds",
        "fairgate_requests_total",
        "fairgate_request_duration_seconds",
        "fairgate_time_to_first_byte_seconds",
        "fairgate_tokens_estimated_total",
        "fairgate_tokens_actual_total",
        "fairgate_estimate_error_ratio",
        "fairgate_rejected_total",
        "fairgate_queue_depth",
        "fairgate_inflight",
        "fairgate_oldest_queued_seconds",
        "fairgate_share_ratio",
        "fairgate_jain_index",
        "fairgate_upstream_limit",
        "fairgate_upstream_429_total",
        "fairgate_upstream_retries_total",
        "fairgate_deadline_misses_total",
        "fairgate_cost_tokens_total",
        "fairgate_cluster_degraded",
    ] {
        assert!(text.contains(family), "dashboard lacks {family}");
    }
    // Histograms are labelled by plan by default ([metrics] histograms): the dashboard groups
    // them by plan, never by a tenant label they do not carry.
    for p in v["panels"].as_array().unwrap() {
        for t in p["targets"].as_array().unwrap() {
            let expr = t["expr"].as_str().unwrap();
            if expr.contains("_bucket") || expr.contains("_ratio_sum") {
                assert!(expr.contains("plan") && !expr.contains("tenant"), "{expr}");
            }
        }
    }
}

#[test]
fn cluster_example_config_is_valid_and_the_compose_file_mounts_it() {
    let config =
        Config::load("deploy/cluster/fairgate.toml").expect("the cluster config validates");
    let cluster = config.cluster.expect("cluster mode is on");
    assert_eq!(cluster.redis_url, "redis://redis:6379");
    let compose = std::fs::read_to_string("deploy/cluster/compose.yaml").unwrap();
    assert!(compose.contains("./fairgate.toml:/etc/fairgate/config.toml"));
    assert_eq!(compose.matches("<<: *replica").count(), 3, "three replicas");
}
