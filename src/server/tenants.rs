//! The runtime tenants in the server (`tenant::runtime`): merged into every generation's
//! config, read from Redis before serving in cluster mode, and kept in sync with the other
//! replicas by one task that polls the change log every `[cluster] sync_interval_ms` and
//! rebuilds the generation when the set of tenants changed (a key change needs no rebuild).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::live::Live;
use super::State;
use crate::config::Config;
use crate::metrics::Metrics;
use crate::tenant::runtime::{Counters, Op, Registry};

/// `fairgate_tenant_changes_total{op}` and `fairgate_tenant_sync_failures_total` on `metrics`.
pub(super) fn counters(metrics: &Metrics) -> Counters {
    Counters {
        ops: (Op::ALL.iter())
            .map(|op| metrics.labeled_counter("fairgate_tenant_changes_total", "op", op.label()))
            .collect(),
        sync_failures: Some(metrics.plain_counter("fairgate_tenant_sync_failures_total")),
    }
}

/// The file's `config` with the API tenants of `runtime` appended.
pub(super) fn merged(runtime: &Option<Arc<Registry>>, config: Config) -> Config {
    match runtime {
        Some(r) => r.merge(config),
        None => config,
    }
}

/// `state`, with the API tenants Redis holds (cluster mode: read once before serving; if
/// Redis cannot be reached, the sync task reads them as soon as it can).
pub(super) async fn synced(state: State) -> Result<State, crate::config::ConfigError> {
    let Some(r) = state.runtime.clone().filter(|_| state.cluster.is_some()) else {
        return Ok(state);
    };
    let mut changed = false;
    // A full catch-up may take several batches of the change log.
    for _ in 0..1000 {
        match r.sync().await {
            Ok(c) => changed |= c,
            Err(e) => {
                tracing::warn!(error = %e, "runtime tenants: not read from Redis at startup");
                break;
            }
        }
        if !r.behind() {
            break;
        }
    }
    if !changed {
        return Ok(state);
    }
    let file = r.file_config(&state.config);
    Ok(state.reloaded_tenants(file)?.0)
}

/// Starts the sync with the other replicas (cluster mode), until `stop`.
pub(super) fn spawn_sync(state: &State, live: Arc<Live>, mut stop: watch::Receiver<bool>) {
    let (Some(r), Some(c)) = (state.runtime.clone(), &state.config.cluster) else {
        return;
    };
    let every = Duration::from_millis(c.sync_interval_ms);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.changed() => return,
            }
            if *stop.borrow() {
                return;
            }
            match r.sync().await {
                Ok(true) => {
                    let live = live.clone();
                    let _ = tokio::task::spawn_blocking(move || live.apply_tenants()).await;
                }
                Ok(false) => {}
                Err(e) => tracing::debug!(error = %e, "runtime tenants: sync failed"),
            }
        }
    });
}
