//! `State::reloaded`: what is kept, what is rebuilt, and that a rejected config touches nothing.

use std::sync::Arc;

use super::*;
use crate::domain::TenantId;

fn config(upstreams: &[(&str, usize)], tenants: &str) -> Config {
    let mut toml = String::new();
    for (name, size) in upstreams {
        toml.push_str(&format!(
            "[[upstreams]]\nname = \"{name}\"\nbase_url = \"http://127.0.0.1:9/v1\"\n\
             max_concurrency = {size}\nmodels = [\"{name}-*\"]\n"
        ));
    }
    Config::from_toml_str(&(toml + tenants)).unwrap()
}

const AB: &str = "[[tenants]]\nid = \"a\"\napi_keys = [\"ka\"]\n\
                  [[tenants]]\nid = \"b\"\napi_keys = [\"kb\"]\n";

fn weight(state: &State, pool: usize, tenant: &str) -> Option<f64> {
    state.pools[pool]
        .snapshot()
        .into_iter()
        .find(|(t, _)| t.id.as_str() == tenant)
        .map(|(t, _)| t.weight.get())
}

#[tokio::test]
async fn pools_are_kept_by_name_and_reconfigured_in_place() {
    let old = State::new(config(&[("u", 4), ("v", 4)], AB)).unwrap();
    // v is gone, w is new and first, u grows; a is re-weighted, b removed, c added.
    let new = config(
        &[("w", 2), ("u", 8)],
        "[[tenants]]\nid = \"a\"\napi_keys = [\"ka\"]\nweight = 3.0\n\
         [[tenants]]\nid = \"c\"\napi_keys = [\"kc\"]\n",
    );
    let (state, changes) = old.reloaded(new).unwrap();
    assert_eq!(changes.tenants_changed, ["a"]);
    assert_eq!(changes.tenants_removed, ["b"]);
    assert_eq!(changes.tenants_added, ["c"]);
    assert_eq!(changes.upstreams_added, ["w"]);
    assert_eq!(changes.upstreams_removed, ["v"]);
    assert_eq!(changes.upstreams_changed, ["u"]);
    assert!(
        Arc::ptr_eq(&state.pools[1], &old.pools[0]),
        "u's queue is kept"
    );
    assert!(!Arc::ptr_eq(&state.pools[0], &old.pools[1]));
    assert!(Arc::ptr_eq(
        &state.admission.capacity[1],
        &old.admission.capacity[0]
    ));
    assert_eq!(state.admission.capacity[1].configured(), 8);
    assert_eq!(state.admission.capacity[0].configured(), 2);
    assert_eq!(weight(&state, 1, "a"), Some(3.0));
    assert_eq!(weight(&state, 1, "c"), Some(1.0));
    // The removed tenant stays in the queue (to drain) but not in the directory.
    assert_eq!(weight(&state, 1, "b"), Some(1.0));
    assert!(state.tenants.tenants().all(|t| t.id != TenantId::new("b")));
    // Routing follows the new order and names.
    assert_eq!(state.router.route("u-x").unwrap().pool, 1);
    assert_eq!(state.router.route("w-x").unwrap().pool, 0);
    assert!(state.router.route("v-x").is_none());
    // Learned state is shared.
    assert!(Arc::ptr_eq(&state.estimator, &old.estimator));
    assert!(Arc::ptr_eq(&state.ready, &old.ready));
    assert!(Arc::ptr_eq(
        &state.admission.retries,
        &old.admission.retries
    ));
}

#[tokio::test]
async fn an_unchanged_upstream_keeps_its_client() {
    let old = State::new(config(&[("u", 4), ("v", 4)], AB)).unwrap();
    let (state, changes) = old.reloaded(config(&[("v", 4), ("u", 5)], AB)).unwrap();
    assert!(
        Arc::ptr_eq(&state.upstreams[0], &old.upstreams[1]),
        "v unchanged"
    );
    assert!(
        !Arc::ptr_eq(&state.upstreams[1], &old.upstreams[0]),
        "u resized"
    );
    assert_eq!(changes.settings_changed, ["upstreams (routing order)"]);
}

#[tokio::test]
async fn a_rejected_config_changes_nothing() {
    let old = State::new(config(&[("u", 4)], AB)).unwrap();
    // Valid TOML, but an env var it names is unset: refused after parsing.
    let bad = config(
        &[("u", 9)],
        "[[tenants]]\nid = \"a\"\napi_keys = [\"ka\"]\nweight = 5.0\n\
         upstream_api_key_env = \"FAIRGATE_TEST_SURELY_UNSET_RELOAD\"\n",
    );
    let e = old.reloaded(bad).unwrap_err().to_string();
    assert!(e.starts_with("tenants[0].upstream_api_key_env"), "{e}");
    assert_eq!(weight(&old, 0, "a"), Some(1.0));
    assert_eq!(old.admission.capacity[0].configured(), 4);
}

#[tokio::test]
async fn restart_only_keys_stay_as_they_were() {
    let old = State::new(config(&[("u", 4)], AB)).unwrap();
    let mut new = config(&[("u", 4)], AB);
    new.scheduler.policy = crate::config::Policy::Fifo;
    new.scheduler.quantum = 77;
    let (state, changes) = old.reloaded(new).unwrap();
    assert_eq!(changes.restart_required, ["scheduler.policy"]);
    assert_eq!(state.config.scheduler.policy, crate::config::Policy::Drr);
    assert_eq!(state.config.scheduler.quantum, 77);
}

/// Startup is a reload from empty: the first generation has every pool, tenant and client of
/// the config, and reloading the same config from it keeps them all.
#[tokio::test]
async fn startup_is_a_reload_from_empty_and_a_same_config_reload_keeps_everything() {
    let cfg = config(&[("u", 4), ("v", 2)], AB);
    let first = State::new(cfg.clone()).unwrap();
    assert_eq!(first.pools.len(), 2);
    assert_eq!(first.upstreams.len(), 2);
    assert_eq!(first.admission.capacity.len(), 2);
    assert!(first.tenants.tenants().any(|t| t.id == TenantId::new("b")));
    assert_eq!(weight(&first, 1, "a"), Some(1.0));
    assert!(first.workers >= 1);
    let (again, changes) = first.reloaded(cfg).unwrap();
    assert!(changes.tenants_added.is_empty() && changes.upstreams_added.is_empty());
    for i in 0..2 {
        assert!(Arc::ptr_eq(&first.pools[i], &again.pools[i]));
        assert!(Arc::ptr_eq(&first.upstreams[i], &again.upstreams[i]));
    }
    assert_eq!(again.workers, first.workers);
}
