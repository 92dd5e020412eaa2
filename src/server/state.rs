//! The shared state of one configuration generation ([`State`]) and where its `*_env`
//! settings are read from ([`Env`]). Built one way: startup opens what lives as long as the
//! process, then builds the first generation as a reload of an empty one (`reload`).

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Weak};

use crate::admission::Admission;
use crate::config::{Config, ConfigError};
use crate::estimate::Estimator;
use crate::metrics::Metrics;
use crate::queue::{self, FairQueue};
use crate::route::Router;
use crate::tenant::{self, Directory};
use crate::upstream::Upstream;

/// Everything the stack shares, built once from a validated [`Config`].
#[derive(Debug, Clone)]
pub struct State {
    /// The configuration.
    pub config: Arc<Config>,
    /// Tenants by key digest and id.
    pub tenants: Arc<Directory>,
    /// Upstream pools in config order.
    pub upstreams: Vec<Arc<Upstream>>,
    /// Model → upstream routing.
    pub router: Arc<Router>,
    /// One fair queue per upstream pool, indexed like `upstreams`.
    pub pools: Arc<[Arc<FairQueue>]>,
    /// Admission: rate stores, learned pool capacity, retry counters.
    pub admission: Arc<Admission>,
    /// Counts input tokens, prices requests at dispatch, learns output lengths, keeps the
    /// estimate-error statistics (`estimator.stats()`).
    pub estimator: Arc<Estimator>,
    /// `/readyz` flag.
    pub ready: Arc<AtomicBool>,
    /// The metrics registry (`/metrics`).
    pub metrics: Arc<Metrics>,
    /// The admin API's bearer token (`[admin] token_env`); `None`: the admin API is off.
    pub admin_token: Option<Arc<str>>,
    /// What `POST /admin/reload` calls (set by [`Live`]; `None`: reload is unavailable).
    pub reloader: Option<Weak<dyn crate::admin::Reload>>,
    /// Cluster mode (`[cluster]`): shared capacity, fairness and rate limits.
    pub cluster: Option<Arc<crate::cluster::Cluster>>,
    /// Request bytes held per tenant, all pools (`max_queued_bytes`; kept across reloads).
    pub tenant_bytes: queue::bytes::TenantBudget,
    /// Where the `*_env` settings are read from (at startup and at each reload).
    pub env: Env,
    /// Connection workers, and so each upstream endpoint's client lanes (`[server] workers`,
    /// else one per core; counted once, at startup: the setting needs a restart).
    pub workers: usize,
    /// Async jobs and batches (`[jobs]`; opened at startup, kept across reloads).
    pub jobs: Option<crate::jobs::Jobs>,
    /// Tenants and keys made through the admin API (`[store]` or `[cluster]`; opened at
    /// startup, kept across reloads, merged into every generation's config).
    pub runtime: Option<Arc<tenant::runtime::Registry>>,
}

/// Where `*_env` settings (provider keys, the admin token) are read from: the process
/// environment, or — for tests and embedding, which must not `set_var` in a process that runs
/// other threads — a map of its own.
#[derive(Clone, Default)]
pub struct Env(Option<Arc<std::collections::HashMap<String, String>>>);

impl Env {
    /// The process environment.
    pub fn process() -> Self {
        Self(None)
    }

    /// Exactly `vars` (the process environment is not read).
    pub fn vars<K: Into<String>, V: Into<String>>(vars: impl IntoIterator<Item = (K, V)>) -> Self {
        Self(Some(Arc::new(
            vars.into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
        )))
    }

    /// The value of `var`, if set.
    pub fn get(&self, var: &str) -> Option<String> {
        match &self.0 {
            None => std::env::var(var).ok(),
            Some(map) => map.get(var).cloned(),
        }
    }
}

impl std::fmt::Debug for Env {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Names only: values are secrets.
        match &self.0 {
            None => f.write_str("Env(process)"),
            Some(map) => f.debug_set().entries(map.keys()).finish(),
        }
    }
}

impl State {
    /// Builds the shared state, reading `*_env` variables from the process environment (unset
    /// → error naming the key).
    pub fn new(config: Config) -> Result<Self, ConfigError> {
        Self::with_env(config, Env::process())
    }

    /// As [`State::new`], reading `*_env` variables from `env`.
    ///
    /// Startup is a reload from empty: what lives as long as the process is opened here (the
    /// metrics registry, the cluster link, the tenant and job stores, the estimator, the ready
    /// flag, the byte budget, the worker count), and the first generation is built from an
    /// empty one by [`State::reloaded`] — the same code every reload runs.
    pub fn with_env(config: Config, env_source: Env) -> Result<Self, ConfigError> {
        let env = |var: &str| env_source.get(var);
        let metrics = Metrics::with_env(&config, &env);
        let linked = crate::cluster::connect(
            &config,
            metrics.plain_gauge("fairgate_cluster_degraded"),
            env,
        )?;
        let redis = linked.as_ref().map(|(l, _)| l.clone() as _);
        let runtime = tenant::runtime::open(&config, redis, super::tenants::counters(&metrics))?;
        let meter = || Some(metrics.clone() as Arc<dyn crate::jobs::Meter>);
        let jobs = match (&config.jobs, &linked) {
            // With `[cluster]`, jobs live in the shared Redis (`path` is not used).
            (Some(j), Some((link, _))) => Some(crate::jobs::Jobs::shared(link.clone(), j, meter())),
            (Some(j), None) => {
                Some(
                    crate::jobs::Jobs::open(j, meter()).map_err(|e| ConfigError::Invalid {
                        key: "jobs.path".to_owned(),
                        message: format!("cannot open {}: {e}", j.path.display()),
                    })?,
                )
            }
            (None, _) => None,
        };
        let jobs = jobs.map(|j| j.with_max_line(config.server.max_body_bytes));
        // The budgets and the usage ledger, kept across reloads: in Redis with `[cluster]`
        // (shared by the replicas; a reservation lives while its replica's holder key does,
        // renewed by every flush), else `[store]`.
        let shared = linked.as_ref().map(|(link, _)| {
            let store = config.store.clone().unwrap_or_default();
            let ttl = config
                .cluster
                .as_ref()
                .map_or(0, |c| c.lease_ttl_ms)
                .max(store.flush_ms.saturating_mul(3));
            Arc::new(crate::budget::redis::Shared::new(
                link.clone(),
                &link.replica,
                ttl,
                store.usage_retention_days,
            ))
        });
        let spending = crate::budget::Spending::for_config(&config, shared).map_err(|message| {
            ConfigError::Invalid {
                key: "store.path".to_owned(),
                message,
            }
        })?;
        // Cluster mode: the shared rate store replaces the in-memory one (a reload keeps it).
        let store = linked
            .as_ref()
            .map(|(_, s)| s.clone() as Arc<dyn crate::ratelimit::RateStore>);
        // The settings a reload may not change, with no tenant and no upstream.
        let blank = Config {
            tenants: Vec::new(),
            upstreams: Vec::new(),
            ..config.clone()
        };
        let no_pools: Arc<[Arc<FairQueue>]> = Arc::from([]);
        let empty = State {
            admission: Admission::with_spending(&blank, no_pools.clone(), store, spending),
            estimator: Arc::new(Estimator::new(&config.estimate, &config.models)),
            tenants: Arc::new(Directory::default()),
            upstreams: Vec::new(),
            router: Arc::new(Router::new(Vec::new())),
            tenant_bytes: queue::bytes::TenantBudget {
                bytes: queue::bytes::ByteBudget::new(u64::MAX),
                pools: no_pools.clone(),
            },
            pools: no_pools,
            workers: super::workers::count(&config.server),
            config: Arc::new(blank),
            metrics,
            admin_token: None,
            ready: Arc::new(AtomicBool::new(false)),
            reloader: None,
            cluster: None,
            env: env_source,
            jobs,
            runtime,
        };
        let (mut state, _) = empty.reloaded(config)?;
        // Cluster mode: a lease gate per pool bounds its dispatch by the slots leased in Redis
        // (built on the first generation's pools; a reload is refused in cluster mode).
        state.cluster = linked.map(|(link, store)| {
            let unapplied = state
                .metrics
                .plain_counter("fairgate_cluster_sync_unapplied_total");
            crate::cluster::Cluster::new(
                link,
                store,
                &state.config,
                &state.pools,
                &state.admission,
                unapplied,
            )
        });
        Ok(state)
    }

    pub(super) fn admin_token(
        config: &Config,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<Arc<str>>, ConfigError> {
        let Some(var) = &config.admin.token_env else {
            return Ok(None);
        };
        let token = env(var).ok_or_else(|| ConfigError::MissingEnv {
            key: "admin.token_env".to_owned(),
            var: var.clone(),
        })?;
        // An empty token would open the admin API to `Authorization: Bearer ` (and a blank one
        // to anyone who guesses whitespace): refused, never echoed.
        if token.trim().is_empty() {
            return Err(ConfigError::Invalid {
                key: "admin.token_env".to_owned(),
                message: format!("{var} is empty: the admin token must not be empty"),
            });
        }
        Ok(Some(Arc::from(token)))
    }
}

/// Requests that carried the sidecar tenant header from a peer outside `trusted_sources`.
pub const UNTRUSTED_HEADER: &str = "fairgate_untrusted_tenant_header_total";
