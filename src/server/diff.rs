//! What a config reload changes: a pure comparison of the configuration in force and the one
//! just loaded, and the split between what applies live and what needs a restart.
//!
//! Invariants: [`pin_restart_only`] leaves in the new configuration only changes that can apply
//! live (every restart-only key gets the value in force back, and is named in the answer), so
//! the `Config` a reloaded server holds is always the one it actually runs; [`diff`] is
//! computed on effective values (a plan's new weight shows up as a change of its tenants).
//! Sections are compared by their `Debug` text: every schema type derives `Debug`, not all
//! derive `PartialEq`, and a new key cannot be forgotten here.

use std::fmt::Debug;

use serde::Serialize;

use crate::config::{Config, TenantConfig};

/// What a reload changed (the body of `POST /admin/reload`'s answer).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Changes {
    /// Tenant ids new in the configuration.
    pub tenants_added: Vec<String>,
    /// Tenant ids gone (their queued and in-flight requests still complete).
    pub tenants_removed: Vec<String>,
    /// Tenants whose keys, weight, plan, caps or limits changed.
    pub tenants_changed: Vec<String>,
    /// Upstream names new in the configuration.
    pub upstreams_added: Vec<String>,
    /// Upstream names gone (their pools drain).
    pub upstreams_removed: Vec<String>,
    /// Upstreams whose address, models, size or timeouts changed.
    pub upstreams_changed: Vec<String>,
    /// Other sections applied live (`scheduler`, `admission`, ...).
    pub settings_changed: Vec<&'static str>,
    /// Keys that changed but only take effect after a restart (the old value stays in force).
    pub restart_required: Vec<&'static str>,
}

impl Changes {
    /// Whether nothing at all changed.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

fn same<T: Debug>(a: &T, b: &T) -> bool {
    format!("{a:?}") == format!("{b:?}")
}

/// Puts back, in `new`, the value in force of every key that cannot change while running, and
/// names those that differed.
pub fn pin_restart_only(old: &Config, new: &mut Config) -> Vec<&'static str> {
    let mut pinned = Vec::new();
    macro_rules! pin {
        ($($field:ident).+, $name:literal) => {
            if !same(&old.$($field).+, &new.$($field).+) {
                new.$($field).+ = old.$($field).+.clone();
                pinned.push($name);
            }
        };
    }
    pin!(server.listen, "server.listen");
    pin!(server.tls, "server.tls");
    pin!(server.shutdown_grace_ms, "server.shutdown_grace_ms");
    pin!(server.workers, "server.workers");
    pin!(server.keepalive_timeout_ms, "server.keepalive_timeout_ms");
    pin!(server.max_connections, "server.max_connections");
    pin!(
        server.max_connections_per_ip,
        "server.max_connections_per_ip"
    );
    pin!(
        server.http2_max_concurrent_streams,
        "server.http2_max_concurrent_streams"
    );
    pin!(
        server.http2_keepalive_interval_ms,
        "server.http2_keepalive_interval_ms"
    );
    pin!(admin.listen, "admin.listen");
    pin!(scheduler.policy, "scheduler.policy");
    pin!(estimate, "estimate");
    pin!(models, "models");
    pin!(metrics, "metrics");
    pin!(log, "log");
    pin!(store, "store");
    pinned
}

/// A tenant's effective settings, as compared across reloads.
fn tenant_print(t: &TenantConfig, c: &Config) -> String {
    format!(
        "{t:?} {:?} {:?} {:?} {:?} {:?}",
        t.effective_weight(c),
        t.effective_max_concurrency(c),
        t.effective_max_queued(c),
        t.effective_max_queued_bytes(c),
        t.effective_limits(c)
    )
}

/// What differs between `old` and `new` (call after [`pin_restart_only`]).
pub fn diff(old: &Config, new: &Config) -> Changes {
    let mut c = Changes::default();
    // By id through maps: 10,000 tenants (API tenants included) are two passes, not 10^8 probes.
    let by_id = |cfg: &'_ Config| -> std::collections::HashMap<String, usize> {
        (cfg.tenants.iter().enumerate())
            .map(|(i, t)| (t.id.clone(), i))
            .collect()
    };
    let (old_ids, new_ids) = (by_id(old), by_id(new));
    for t in &new.tenants {
        match old_ids.get(&t.id).map(|&i| &old.tenants[i]) {
            None => c.tenants_added.push(t.id.clone()),
            Some(o) if tenant_print(o, old) != tenant_print(t, new) => {
                c.tenants_changed.push(t.id.clone());
            }
            Some(_) => {}
        }
    }
    c.tenants_removed = old
        .tenants
        .iter()
        .filter(|o| !new_ids.contains_key(&o.id))
        .map(|o| o.id.clone())
        .collect();
    for u in &new.upstreams {
        match old.upstreams.iter().find(|o| o.name == u.name) {
            None => c.upstreams_added.push(u.name.clone()),
            Some(o) if !same(o, u) => c.upstreams_changed.push(u.name.clone()),
            Some(_) => {}
        }
    }
    c.upstreams_removed = old
        .upstreams
        .iter()
        .filter(|o| !new.upstreams.iter().any(|u| u.name == o.name))
        .map(|o| o.name.clone())
        .collect();
    let order = |c: &Config| {
        c.upstreams
            .iter()
            .map(|u| u.name.clone())
            .collect::<Vec<_>>()
    };
    if order(old) != order(new) {
        c.settings_changed.push("upstreams (routing order)");
    }
    let sections: [(&'static str, bool); 5] = [
        ("server", !same(&old.server, &new.server)),
        ("scheduler", !same(&old.scheduler, &new.scheduler)),
        ("admission", !same(&old.admission, &new.admission)),
        ("plans", !same(&old.plans, &new.plans)),
        ("admin", !same(&old.admin, &new.admin)),
    ];
    c.settings_changed
        .extend(sections.into_iter().filter(|s| s.1).map(|s| s.0));
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(extra: &str, tenants: &str) -> Config {
        Config::from_toml_str(&format!(
            "{extra}\n[[upstreams]]\nname = \"u\"\nbase_url = \"http://h/v1\"\n{tenants}"
        ))
        .unwrap()
    }

    const AB: &str = "[[tenants]]\nid = \"a\"\napi_keys = [\"ka\"]\nplan = \"p\"\n\
                      [[tenants]]\nid = \"b\"\napi_keys = [\"kb\"]\n";

    #[test]
    fn tenants_added_removed_and_changed_by_effective_values() {
        let old = config("[plans.p]\nweight = 1.0\n", AB);
        // a's plan weight changes (a changed), b goes, c comes.
        let new = config(
            "[plans.p]\nweight = 3.0\n",
            "[[tenants]]\nid = \"a\"\napi_keys = [\"ka\"]\nplan = \"p\"\n\
             [[tenants]]\nid = \"c\"\napi_keys = [\"kc\"]\n",
        );
        let c = diff(&old, &new);
        assert_eq!(c.tenants_changed, ["a"]);
        assert_eq!(c.tenants_removed, ["b"]);
        assert_eq!(c.tenants_added, ["c"]);
        assert_eq!(c.settings_changed, ["plans"]);
        assert!(c.upstreams_changed.is_empty() && c.restart_required.is_empty());
        assert!(diff(&old, &old).is_empty());
    }

    #[test]
    fn upstream_changes_and_routing_order() {
        let old = Config::from_toml_str(
            "[[upstreams]]\nname = \"u\"\nbase_url = \"http://h/v1\"\n\
             [[upstreams]]\nname = \"v\"\nbase_url = \"http://h/v1\"\n",
        )
        .unwrap();
        let new = Config::from_toml_str(
            "[[upstreams]]\nname = \"w\"\nbase_url = \"http://h/v1\"\n\
             [[upstreams]]\nname = \"u\"\nbase_url = \"http://h/v1\"\nmax_concurrency = 3\n",
        )
        .unwrap();
        let c = diff(&old, &new);
        assert_eq!(c.upstreams_added, ["w"]);
        assert_eq!(c.upstreams_removed, ["v"]);
        assert_eq!(c.upstreams_changed, ["u"]);
        assert_eq!(c.settings_changed, ["upstreams (routing order)"]);
    }

    #[test]
    fn restart_only_keys_keep_the_value_in_force_and_are_named() {
        let old = config("[plans.p]\n", AB);
        let mut new = config(
            "[plans.p]\n[server]\nlisten = \"0.0.0.0:9999\"\nmax_body_bytes = 10\n\
             [scheduler]\npolicy = \"fifo\"\nquantum = 7\n[estimate]\ndefault_output_tokens = 5\n",
            AB,
        );
        let pinned = pin_restart_only(&old, &mut new);
        assert_eq!(pinned, ["server.listen", "scheduler.policy", "estimate"]);
        assert_eq!(new.server.listen, old.server.listen);
        assert_eq!(new.scheduler.policy, old.scheduler.policy);
        assert!(same(&new.estimate, &old.estimate));
        // What can change live is left as loaded.
        assert_eq!(new.server.max_body_bytes, 10);
        assert_eq!(new.scheduler.quantum, 7);
        assert_eq!(diff(&old, &new).settings_changed, ["server", "scheduler"]);
    }
}
