//! Metrics: the Prometheus families of the contract, served on `GET /metrics`.
//!
//! Each server owns its own registry (a [`PrometheusRecorder`] that is never installed
//! globally), so many servers in one process (tests) never share series. Per-request series are
//! registered once per tenant at startup and reload ([`TenantMetrics`]) and recorded through
//! handles: no label strings are built per request (a status code or a reason seen for the
//! first time by a tenant registers its series once). Gauges (queue depth, in flight, oldest queued, share
//! ratio and Jain's index over the last 30 s of served tokens, learned upstream limit) and the
//! admission counters are computed at scrape time from the pools' and admission's state.
//!
//! With `[metrics] per_tenant_labels = false` the `tenant` label carries the tenant's plan
//! cohort instead of its id (tenants without a plan: `none`), bounding cardinality.

mod fairness;
mod jobs;
mod layer;
mod scrape;
mod tenant;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::time::Instant;

use metrics::{Counter, Gauge, Key, Label, Metadata, Recorder, SharedString};
use metrics_exporter_prometheus::{
    Matcher, PrometheusBuilder, PrometheusHandle, PrometheusRecorder,
};

pub use layer::{Layer, Service};
pub use scrape::{Scrape, ScrapeService};
pub use tenant::{Outcome, TenantMetrics};

use crate::admission::Admission;
use crate::config::Config;
use crate::domain::TenantId;
use crate::queue::FairQueue;

/// Bucket bounds of the seconds histograms.
const SECONDS: [f64; 14] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];
/// Bucket bounds of `fairgate_estimate_error_ratio` (actual ÷ estimated).
const RATIO: [f64; 9] = [0.1, 0.25, 0.5, 0.75, 0.9, 1.1, 1.5, 2.0, 4.0];
pub(crate) static META: Metadata<'static> =
    Metadata::new(module_path!(), metrics::Level::INFO, None);

/// One tenant's tokens dispatched in one pool: since start, and over the rolling window.
#[derive(Default)]
struct Served {
    total: AtomicU64,
    window: Mutex<fairness::Window>,
}

/// A server's metrics: registry, per-tenant handles, scrape-time computations.
///
/// One per configuration generation: a reload builds a new one ([`Metrics::reloaded`]) that
/// shares the registry, the series of labels it keeps and the served counters of the
/// (pool, tenant) pairs it keeps, so nothing restarts from zero and requests of the previous
/// generation still count.
pub struct Metrics {
    recorder: Arc<PrometheusRecorder>,
    handle: PrometheusHandle,
    epoch: Instant,
    per_tenant_labels: bool,
    tenants: crate::domain::FastMap<TenantId, (usize, Arc<TenantMetrics>)>,
    labels: Vec<SharedString>,
    pools: Vec<(String, crate::domain::FastMap<TenantId, Arc<Served>>)>,
    /// OpenTelemetry export (`[otel] endpoint`; kept across reloads).
    otel: Option<Arc<crate::otel::Exporter>>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Metrics {
    /// A registry with every configured tenant's series.
    pub fn new(config: &Config) -> Arc<Self> {
        let builder = PrometheusBuilder::new();
        let with = |b: PrometheusBuilder, name: &str, buckets: &[f64]| {
            b.set_buckets_for_metric(Matcher::Full(name.to_owned()), buckets)
                .expect("non-empty buckets")
        };
        let mut builder = with(builder, "fairgate_estimate_error_ratio", &RATIO);
        for name in [
            "fairgate_queue_wait_seconds",
            "fairgate_request_duration_seconds",
            "fairgate_time_to_first_byte_seconds",
        ] {
            builder = with(builder, name, &SECONDS);
        }
        let recorder = Arc::new(builder.build_recorder());
        let handle = recorder.handle();
        let empty = Self {
            recorder,
            handle,
            epoch: Instant::now(),
            per_tenant_labels: config.metrics.per_tenant_labels,
            tenants: Default::default(),
            labels: Vec::new(),
            pools: Vec::new(),
            otel: None,
        };
        let counters = crate::otel::Counters {
            dropped: empty.plain_counter("fairgate_otel_dropped_total"),
            exported: empty.plain_counter("fairgate_otel_exported_total"),
            failed: empty.plain_counter("fairgate_otel_failed_total"),
        };
        let empty = Self {
            otel: crate::otel::Exporter::new(&config.otel, counters),
            ..empty
        };
        empty.reloaded(config)
    }

    /// The metrics of a reloaded `config`, sharing this registry (see the type's docs). The
    /// label mode (`per_tenant_labels`) stays the one the server started with.
    pub fn reloaded(&self, config: &Config) -> Arc<Self> {
        let mut labels: Vec<SharedString> = Vec::new();
        let mut by_label: HashMap<String, (usize, Arc<TenantMetrics>)> = HashMap::new();
        let mut tenants = crate::domain::FastMap::default();
        for t in &config.tenants {
            let label = if self.per_tenant_labels {
                t.id.clone()
            } else {
                t.plan.clone().unwrap_or_else(|| "none".to_owned())
            };
            let entry = by_label
                .entry(label.clone())
                .or_insert_with(|| {
                    labels.push(label.clone().into());
                    let series = self
                        .tenants
                        .values()
                        .find(|(i, _)| self.labels[*i].as_ref() == label.as_str())
                        .map(|(_, m)| m.clone())
                        .unwrap_or_else(|| Arc::new(TenantMetrics::new(&self.recorder, &label)));
                    (labels.len() - 1, series)
                })
                .clone();
            tenants.insert(TenantId::new(t.id.as_str()), entry);
        }
        let pools = config
            .upstreams
            .iter()
            .map(|u| {
                let old = self.pools.iter().find(|(n, _)| *n == u.name).map(|p| &p.1);
                let served = tenants
                    .keys()
                    .map(|id| {
                        let kept = old.and_then(|o| o.get(id)).cloned();
                        (id.clone(), kept.unwrap_or_default())
                    })
                    .collect();
                (u.name.clone(), served)
            })
            .collect();
        Arc::new(Self {
            recorder: self.recorder.clone(),
            handle: self.handle.clone(),
            epoch: self.epoch,
            per_tenant_labels: self.per_tenant_labels,
            tenants,
            labels,
            pools,
            otel: self.otel.clone(),
        })
    }

    /// The OpenTelemetry exporter, if `[otel] endpoint` is set.
    pub fn otel(&self) -> Option<&Arc<crate::otel::Exporter>> {
        self.otel.as_ref()
    }

    fn second(&self) -> u64 {
        self.epoch.elapsed().as_secs()
    }

    /// The series of `tenant` (`None`: not configured).
    pub fn tenant(&self, tenant: &TenantId) -> Option<&Arc<TenantMetrics>> {
        self.tenants.get(tenant).map(|(_, m)| m)
    }

    /// Counts tokens dispatched for `tenant` in pool `pool` (share ratio, Jain's index).
    pub fn served(&self, pool: usize, tenant: &TenantId, tokens: u64) {
        if let Some(c) = self.pools.get(pool).and_then(|p| p.1.get(tenant)) {
            c.total.fetch_add(tokens, Ordering::Relaxed);
            let sec = self.second();
            c.window
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .add(sec, tokens);
        }
    }

    /// Tokens dispatched for `tenant` in pool `pool` since start.
    pub fn served_total(&self, pool: usize, tenant: &TenantId) -> u64 {
        self.pools
            .get(pool)
            .and_then(|p| p.1.get(tenant))
            .map_or(0, |c| c.total.load(Ordering::Relaxed))
    }

    /// A gauge without labels in this registry (e.g. `fairgate_cluster_degraded`), set by its
    /// owner rather than at scrape time.
    pub fn plain_gauge(&self, name: &'static str) -> Gauge {
        self.recorder.register_gauge(&Key::from_name(name), &META)
    }

    /// A counter without labels in this registry, incremented by its owner (e.g.
    /// `fairgate_untrusted_tenant_header_total`). Registering a name again returns the same
    /// series (a reload keeps counting).
    pub fn plain_counter(&self, name: &'static str) -> metrics::Counter {
        self.recorder.register_counter(&Key::from_name(name), &META)
    }

    /// A gauge with one label in this registry, set by its owner (e.g.
    /// `fairgate_connections{state}`).
    pub fn labeled_gauge(
        &self,
        name: &'static str,
        key: &'static str,
        value: &'static str,
    ) -> Gauge {
        self.gauge(name, key, SharedString::const_str(value))
    }

    /// A counter with one label in this registry, counted by its owner (e.g.
    /// `fairgate_connections_refused_total{reason}`).
    pub fn labeled_counter(
        &self,
        name: &'static str,
        key: &'static str,
        value: &'static str,
    ) -> Counter {
        self.counter(name, key, SharedString::const_str(value))
    }

    fn gauge(&self, name: &'static str, key: &'static str, value: SharedString) -> Gauge {
        let key = Key::from_parts(name, vec![Label::new(key, value)]);
        self.recorder.register_gauge(&key, &META)
    }

    fn counter(&self, name: &'static str, key: &'static str, value: SharedString) -> Counter {
        let key = Key::from_parts(name, vec![Label::new(key, value)]);
        self.recorder.register_counter(&key, &META)
    }

    /// Updates the scrape-time gauges from `pools` and `admission`, then renders the registry in
    /// the Prometheus text format.
    pub fn render(&self, pools: &[Arc<FairQueue>], admission: &Admission) -> String {
        let n = self.labels.len();
        let (mut queued, mut inflight, mut oldest) =
            (vec![0usize; n], vec![0u32; n], vec![0f64; n]);
        let mut all = Vec::new();
        let sec = self.second();
        for (i, pool) in pools.iter().enumerate() {
            let Some((name, served)) = self.pools.get(i) else {
                continue;
            };
            let mut samples = Vec::new();
            for (t, age) in pool.snapshot() {
                let Some(&(label, _)) = self.tenants.get(&t.id) else {
                    continue;
                };
                queued[label] += t.queued;
                inflight[label] += t.in_flight;
                oldest[label] = oldest[label].max(age.unwrap_or_default().as_secs_f64());
                let in_window = served.get(&t.id).map_or(0, |c| {
                    c.window.lock().unwrap_or_else(|p| p.into_inner()).sum(sec)
                });
                samples.push(fairness::Sample {
                    label,
                    weight: t.weight.get(),
                    served: in_window,
                    backlogged: t.queued > 0,
                });
            }
            if let Some(j) = fairness::jain(&samples) {
                self.gauge("fairgate_jain_index", "pool", name.clone().into())
                    .set(j);
            }
            all.extend(samples);
        }
        for (l, ratio) in fairness::share_ratios(&all, n).into_iter().enumerate() {
            let label = &self.labels[l];
            self.gauge("fairgate_queue_depth", "tenant", label.clone())
                .set(queued[l] as f64);
            self.gauge("fairgate_inflight", "tenant", label.clone())
                .set(f64::from(inflight[l]));
            self.gauge("fairgate_oldest_queued_seconds", "tenant", label.clone())
                .set(oldest[l]);
            if let Some(r) = ratio {
                self.gauge("fairgate_share_ratio", "tenant", label.clone())
                    .set(r);
            }
        }
        for ((name, _), cap) in self.pools.iter().zip(admission.capacity.iter()) {
            let name: SharedString = name.clone().into();
            self.gauge("fairgate_upstream_limit", "upstream", name.clone())
                .set(f64::from(cap.limit()));
            self.counter("fairgate_upstream_429_total", "upstream", name)
                .absolute(cap.throttled());
        }
        let r = &admission.retries;
        let plain =
            |name: &'static str| self.recorder.register_counter(&Key::from_name(name), &META);
        plain("fairgate_upstream_retries_total").absolute(r.retries.load(Ordering::Relaxed));
        plain("fairgate_upstream_retries_exhausted_total")
            .absolute(r.exhausted.load(Ordering::Relaxed));
        self.handle.render()
    }
}
