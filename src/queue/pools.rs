//! Builds one [`FairQueue`] per `[[upstreams]]` entry from the configuration.

use std::sync::Arc;
use std::time::Duration;

use super::fair::{FairQueue, QueueSettings, TenantSettings};
use crate::config::{self, Config};
use crate::context::Tenant;
use crate::domain::{TenantId, Tokens, Weight};
use crate::estimate::Estimator;
use crate::scheduler;

/// The scheduler settings of one pool of `max_concurrency` slots.
pub fn scheduler_config(s: &config::SchedulerConfig, max_concurrency: usize) -> scheduler::Config {
    let weight = |w: u32| Weight::new(f64::from(w)).unwrap_or(Weight::ONE);
    scheduler::Config {
        policy: s.policy,
        quantum: Tokens(s.quantum),
        capacity: u32::try_from(max_concurrency).unwrap_or(u32::MAX),
        reserved_slots: u32::try_from(s.reserved_slots).unwrap_or(u32::MAX),
        max_queued: s.max_queued,
        class_weights: (weight(s.classes.interactive), weight(s.classes.batch)),
        batch_max_wait: Duration::from_millis(s.batch_max_wait_ms),
    }
}

/// Every tenant's queue settings.
pub fn tenant_settings<'a>(
    tenants: impl IntoIterator<Item = &'a Arc<Tenant>>,
) -> Vec<(TenantId, TenantSettings)> {
    tenants
        .into_iter()
        .map(|t| {
            let spec = TenantSettings {
                weight: t.weight,
                max_concurrency: t
                    .max_concurrency
                    .map(|c| u32::try_from(c).unwrap_or(u32::MAX)),
                max_queued: t.max_queued,
            };
            (t.id.clone(), spec)
        })
        .collect()
}

/// One queue per upstream pool, each knowing every tenant, all pricing with `estimator`.
pub fn pools<'a>(
    config: &Config,
    tenants: impl IntoIterator<Item = &'a Arc<Tenant>>,
    estimator: &Arc<Estimator>,
) -> Arc<[Arc<FairQueue>]> {
    let specs = tenant_settings(tenants);
    config
        .upstreams
        .iter()
        .map(|u| pool(config, u, &specs, estimator))
        .collect()
}

/// The queue of upstream `u`, knowing `tenants`.
pub fn pool(
    config: &Config,
    u: &config::UpstreamConfig,
    tenants: &[(TenantId, TenantSettings)],
    estimator: &Arc<Estimator>,
) -> Arc<FairQueue> {
    let settings = QueueSettings {
        scheduler: scheduler_config(&config.scheduler, u.max_concurrency),
        estimator: estimator.clone(),
    };
    let queue = FairQueue::new(settings, tenants);
    queue
        .bytes()
        .set_pool_max(config.scheduler.max_queued_bytes);
    queue
}
