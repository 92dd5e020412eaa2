//! `[metrics] histograms = "auto"`: per-tenant histograms (labelled with the plan too) up to
//! `AUTO_TENANT_HISTOGRAMS` tenants, plan cohorts beyond; "plan" and "tenant" as they say.

use std::time::Duration;

use super::Metrics;
use crate::config::{Config, AUTO_TENANT_HISTOGRAMS};
use crate::domain::{Class, TenantId};

/// The registry's text after tenant `t0` waited once, with `tenants` tenants and `extra`
/// `[metrics]` lines.
fn scraped(tenants: usize, extra: &str) -> String {
    let mut toml = format!(
        "[metrics]\n{extra}\n[[upstreams]]\nname = \"default\"\nbase_url = \"http://127.0.0.1:9000/v1\"\n"
    );
    for i in 0..tenants {
        toml.push_str(&format!(
            "[[tenants]]\nid = \"t{i}\"\napi_keys = [\"k{i}\"]\n"
        ));
    }
    let m = Metrics::new(&Config::from_toml_str(&toml).unwrap());
    let t = m.tenant(&TenantId::new("t0")).unwrap();
    t.queue_wait(Class::Interactive, Duration::from_millis(3));
    m.handle.render()
}

const PER_TENANT: &str =
    r#"fairgate_queue_wait_seconds_count{tenant="t0",plan="none",class="interactive"} 1"#;
const BY_PLAN: &str = r#"fairgate_queue_wait_seconds_count{plan="none",class="interactive"} 1"#;

#[test]
fn auto_labels_histograms_per_tenant_up_to_the_stated_number_of_tenants_then_by_plan() {
    let small = scraped(AUTO_TENANT_HISTOGRAMS, "");
    assert!(
        small.contains(PER_TENANT),
        "{AUTO_TENANT_HISTOGRAMS} tenants:\n{small}"
    );
    let large = scraped(AUTO_TENANT_HISTOGRAMS + 1, "");
    assert!(
        large.contains(BY_PLAN),
        "{} tenants",
        AUTO_TENANT_HISTOGRAMS + 1
    );
    assert!(!large
        .lines()
        .any(|l| l.starts_with("fairgate_queue_wait_seconds") && l.contains("tenant=")));
}

#[test]
fn plan_and_tenant_say_what_they_label_whatever_the_number_of_tenants() {
    assert!(scraped(2, "histograms = \"plan\"").contains(BY_PLAN));
    assert!(scraped(AUTO_TENANT_HISTOGRAMS + 1, "histograms = \"tenant\"").contains(PER_TENANT));
    assert!(
        scraped(2, "histograms = \"tenant\"\nper_tenant_labels = false").contains(BY_PLAN),
        "without per-tenant labels histograms stay by plan"
    );
}
