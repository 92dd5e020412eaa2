//! Config reload: the [`State`] of a newly loaded configuration, built from the one in force
//! so that everything stateful carries over.
//!
//! Invariants:
//! - Nothing in force is touched until every fallible step has passed (tenant directory, env
//!   variables, upstream clients, admin token): an invalid configuration leaves the server
//!   exactly as it was.
//! - Queued and in-flight requests survive: a pool whose upstream keeps its name keeps its
//!   [`FairQueue`](crate::queue::FairQueue) and learned capacity, re-weighted and resized in
//!   place; permits keep returning to the queue they came from. A pool whose upstream is gone
//!   (or renamed) is dropped from the new state and drains: the requests that hold it finish
//!   through the stack they entered. Pools are matched by name, so reordering, adding and
//!   removing upstreams are all live.
//! - A removed tenant's key is refused (401) by the new state's directory as soon as it is
//!   published; its requests already queued are still served (the queues keep the tenant).
//! - Learned state is kept: estimator history, rate buckets of tenants whose rates did not
//!   change, retry counters, metric series and served counters.

use std::sync::Arc;

use super::diff::{self, Changes};
use super::State;
use crate::config::{Config, ConfigError};
use crate::feedback::capacity::PoolCapacity;
use crate::queue::{self, FairQueue};
use crate::route::Router;
use crate::tenant::Directory;
use crate::upstream::Upstream;

pub use crate::admin::ReloadError;

impl State {
    /// The state of `config`, carried over from this one (see the module docs), and what
    /// changed. Mutates the kept pools and capacity controllers only once nothing can fail.
    pub fn reloaded(&self, config: Config) -> Result<(State, Changes), ConfigError> {
        self.rebuilt(config, false)
    }

    /// As [`State::reloaded`] for a change of the API tenants alone (`config`: the file's, as
    /// in force), which cluster mode takes too: pools, leases and the shared stores stay.
    pub fn reloaded_tenants(&self, config: Config) -> Result<(State, Changes), ConfigError> {
        self.rebuilt(config, true)
    }

    fn rebuilt(&self, config: Config, tenants_only: bool) -> Result<(State, Changes), ConfigError> {
        let mut config = super::tenants::merged(&self.runtime, config);
        if self.cluster.is_some() && !tenants_only {
            // The lease gates, the shared rate store and the service sync are built per pool
            // and per tenant at startup; replicas are restarted one at a time instead.
            return Err(ConfigError::Invalid {
                key: "cluster".to_owned(),
                message: "hot reload is not available in cluster mode: restart the replicas one \
                          at a time (their leases are returned or expire, nothing is lost)"
                    .to_owned(),
            });
        }
        let restart_required = diff::pin_restart_only(&self.config, &mut config);
        let changes = Changes {
            restart_required,
            ..diff::diff(&self.config, &config)
        };
        let env = |var: &str| self.env.get(var);
        let tenants = Arc::new(
            Directory::from_config(&config, env)?
                .with_runtime(self.runtime.clone())
                .count_untrusted_on(self.metrics.plain_counter(super::UNTRUSTED_HEADER)),
        );
        let admin_token = Self::admin_token(&config, env)?;
        // Which old pool each new upstream continues (matched by name).
        let old_index: Vec<Option<usize>> = config
            .upstreams
            .iter()
            .map(|u| self.config.upstreams.iter().position(|o| o.name == u.name))
            .collect();
        let mut upstreams = Vec::with_capacity(config.upstreams.len());
        for (i, u) in config.upstreams.iter().enumerate() {
            let fresh = Upstream::from_config(u, i, self.workers, env)?;
            // An unchanged upstream keeps its client (and pooled connections).
            let kept = old_index[i]
                .filter(|&j| format!("{:?}", self.config.upstreams[j]) == format!("{u:?}"))
                .map(|j| &self.upstreams[j])
                .filter(|old| old.same_key(&fresh));
            upstreams.push(kept.cloned().unwrap_or_else(|| Arc::new(fresh)));
        }

        // Nothing can fail from here on: apply in place.
        let specs = queue::tenant_settings(tenants.tenants());
        let reserved = u32::try_from(config.scheduler.reserved_slots).unwrap_or(u32::MAX);
        let mut pools: Vec<Arc<FairQueue>> = Vec::with_capacity(upstreams.len());
        let mut capacity: Vec<Arc<PoolCapacity>> = Vec::with_capacity(upstreams.len());
        for (u, old) in config.upstreams.iter().zip(&old_index) {
            let kept =
                old.and_then(|j| Some((self.pools.get(j)?, self.admission.capacity.get(j)?)));
            let (pool, cap) = match kept {
                Some((pool, cap)) => {
                    let settings = queue::scheduler_config(&config.scheduler, u.max_concurrency);
                    pool.reconfigure(settings, &specs);
                    pool.bytes().set_pool_max(config.scheduler.max_queued_bytes);
                    cap.reconfigure(u, reserved);
                    (pool.clone(), cap.clone())
                }
                None => {
                    let pool = queue::pool(&config, u, &specs, &self.estimator);
                    let cap = PoolCapacity::for_upstream(pool.clone(), u, reserved);
                    (pool, cap)
                }
            };
            pools.push(pool);
            capacity.push(cap);
        }
        let pools: Arc<[Arc<FairQueue>]> = pools.into();
        let admission = self
            .admission
            .reloaded(&config, pools.clone(), capacity.into());
        let state = State {
            tenant_bytes: crate::queue::bytes::TenantBudget {
                bytes: self.tenant_bytes.bytes.clone(),
                pools: pools.clone(),
            },
            metrics: self.metrics.reloaded(&config),
            admin_token,
            admission,
            estimator: self.estimator.clone(),
            router: Arc::new(Router::new(upstreams.clone())),
            pools,
            config: Arc::new(config),
            tenants,
            upstreams,
            ready: self.ready.clone(),
            reloader: self.reloader.clone(),
            env: self.env.clone(),
            workers: self.workers,
            cluster: self.cluster.clone(),
            jobs: self.jobs.clone(),
            runtime: self.runtime.clone(),
        };
        Ok((state, changes))
    }
}

#[cfg(test)]
mod tests;
