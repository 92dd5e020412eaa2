//! The files in `deploy/` stay in step with the code: every Kubernetes manifest validates
//! strictly against the Kubernetes schemas (and the ServiceMonitor against its CRD's) and every
//! config it ships passes `fairgate check` (`tests/k8s/validate.py`, which needs
//! `pip install kubernetes-validate`: without it this test fails, unless `FAIRGATE_SKIP_DEPLOY=1`);
//! the Helm chart lints strictly and renders manifests that pass the same checks
//! (`tests/k8s/helm.py`, `pip install helm-python-sdk`); the sidecar's config is safe by default;
//! the Grafana dashboard is valid JSON that queries the metric families of the contract; the
//! cluster example (three replicas + Redis), the README's quickstart and endpoint examples and
//! docs/endpoints.md's examples are configs that validate; `fairgate health` answers for a
//! running server.

use std::process::Command;

use fairgate::config::Config;

use crate::support::needs::{Need, HADOLINT, HELM, KUBERNETES_VALIDATE};

/// The `config.toml: |` block of a manifest, unindented.
fn configmap_toml(yaml: &str) -> String {
    let block = yaml
        .split("config.toml: |\n")
        .nth(1)
        .and_then(|rest| rest.split("\n---").next())
        .expect("a config.toml block");
    block
        .lines()
        .map(|l| l.strip_prefix("    ").unwrap_or(l.trim()))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Runs a checker of `tests/k8s/` on `target` with the fairgate binary; its summary line, or None
/// when the tool it needs is missing (its exit 2, or no python3: `need` then reports it).
fn python_check(script: &str, target: &str, need: &Need) -> Option<String> {
    let out = Command::new("python3")
        .arg(script)
        .arg("--fairgate")
        .arg(env!("CARGO_BIN_EXE_fairgate"))
        .arg(target)
        .output();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    let out = match out {
        Ok(out) if out.status.code() != Some(2) => out,
        Ok(out) => {
            need.missing_because(&text(&out.stderr));
            return None;
        }
        Err(e) => {
            need.missing_because(&format!("python3: {e}"));
            return None;
        }
    };
    assert!(
        out.status.success(),
        "{target} does not pass {script}:\n{}{}",
        text(&out.stderr),
        text(&out.stdout)
    );
    Some(text(&out.stdout))
}

#[test]
fn kubernetes_manifests_validate_and_their_configs_pass_check() {
    let Some(summary) = python_check("tests/k8s/validate.py", "deploy/k8s", &KUBERNETES_VALIDATE)
    else {
        return;
    };
    let checked: usize = summary
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(checked >= 15, "every manifest was read: {summary}");
}

#[test]
fn helm_chart_lints_and_renders_manifests_that_validate() {
    let Some(summary) = python_check("tests/k8s/helm.py", "deploy/helm/fairgate", &HELM) else {
        return;
    };
    assert!(
        summary.contains("2 shapes rendered") && summary.contains(" 0 failed"),
        "{summary}"
    );
}

#[test]
fn dockerfile_lints_clean_and_runs_the_binary_as_its_own_health_check() {
    let dockerfile = std::fs::read_to_string("Dockerfile").unwrap();
    let code: Vec<&str> = dockerfile.lines().filter(|l| !l.starts_with('#')).collect();
    assert!(
        code.iter().all(|l| !l.contains("curl")),
        "the runtime image has no curl"
    );
    assert!(dockerfile.contains(r#"CMD ["/usr/local/bin/fairgate", "health""#));
    for from in dockerfile
        .lines()
        .filter(|l| l.starts_with("ARG ") && l.contains("_IMAGE="))
    {
        assert!(
            from.contains("@sha256:"),
            "base images are pinned by digest: {from}"
        );
    }
    match Command::new("hadolint").arg("Dockerfile").output() {
        Ok(out) => assert!(
            out.status.success(),
            "hadolint:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
        Err(e) => HADOLINT.missing_because(&e.to_string()),
    }
}

#[test]
fn standalone_configmap_is_cluster_mode_with_the_probes_on_its_listener() {
    let yaml = std::fs::read_to_string("deploy/k8s/standalone/configmap.yaml").unwrap();
    let config = Config::from_toml_str(&configmap_toml(&yaml)).expect("the config validates");
    let cluster = config.cluster.expect("cluster mode");
    assert!(cluster.redis_url.contains("fairgate-redis"));
    let deployment = std::fs::read_to_string("deploy/k8s/standalone/deployment.yaml").unwrap();
    assert!(deployment.contains(&format!("containerPort: {}", config.server.listen.port())));
    let admin = config.admin.listen.expect("an admin listener");
    assert!(deployment.contains(&format!("containerPort: {}", admin.port())));
}

#[test]
fn readme_quickstart_config_validates() {
    let readme = std::fs::read_to_string("README.md").unwrap();
    let toml = readme
        .split("```toml\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("the README has a toml block");
    let config = Config::from_toml_str(toml).expect("the README's config validates");
    assert!(!config.tenants.is_empty());
}

/// An Azure OpenAI and a vLLM-fleet example, each a pool of three or more endpoints that
/// validates with one tenant added.
fn assert_endpoint_examples(blocks: &[&str]) {
    assert_eq!(blocks.len(), 2, "an Azure OpenAI and a vLLM-fleet example");
    for block in blocks {
        let text = format!("{block}\n[[tenants]]\nid = \"t\"\napi_keys = [\"k\"]\n");
        let config = Config::from_toml_str(&text).unwrap_or_else(|e| panic!("{e}\n{block}"));
        assert!(config.upstreams[0].endpoints.len() >= 3, "{block}");
    }
}

#[test]
fn readme_endpoint_examples_validate() {
    let readme = std::fs::read_to_string("README.md").unwrap();
    let section = readme
        .split("## Several endpoints and failover\n")
        .nth(1)
        .and_then(|rest| rest.split("\n## ").next())
        .expect("the README has the section Several endpoints and failover");
    let blocks: Vec<&str> = section
        .split("```toml\n")
        .skip(1)
        .filter_map(|rest| rest.split("```").next())
        .collect();
    assert_endpoint_examples(&blocks);
}

#[test]
fn endpoint_examples_in_the_docs_validate() {
    let doc = std::fs::read_to_string("docs/endpoints.md").unwrap();
    let blocks: Vec<&str> = doc
        .split("\n## Example")
        .skip(1)
        .filter_map(|section| section.split("```toml\n").nth(1))
        .filter_map(|rest| rest.split("```").next())
        .collect();
    assert_endpoint_examples(&blocks);
}

#[test]
fn health_answers_0_for_a_ready_server_and_1_otherwise() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (_mock, proxy) = rt.block_on(crate::support::pair());
    let health = |url: String| {
        Command::new(env!("CARGO_BIN_EXE_fairgate"))
            .args(["health", "--timeout-ms", "5000", "--url", &url])
            .output()
            .unwrap()
    };
    let ok = health(format!("http://{}/readyz", proxy.addr));
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    // A non-2xx answer (no key: 401) and a closed port are unhealthy.
    let refused = health(format!("http://{}/v1/models", proxy.addr));
    assert_eq!(refused.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("401"));
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = closed.local_addr().unwrap();
    drop(closed);
    let down = health(format!("http://{addr}/readyz"));
    assert_eq!(down.status.code(), Some(1));
    let bad = health("ftp://example/readyz".to_owned());
    assert_eq!(bad.status.code(), Some(1));
}

#[test]
fn sidecar_configmap_config_is_valid() {
    let yaml = std::fs::read_to_string("deploy/k8s/sidecar/sidecar.yaml").unwrap();
    let toml = configmap_toml(&yaml);
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
    assert!(
        yaml.contains(&format!("port: {}\n", admin.port())),
        "the NetworkPolicy opens it"
    );
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
