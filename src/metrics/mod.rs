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
//! One meaning per label: per-tenant series carry `tenant` (the id) — or, with `[metrics]
//! per_tenant_labels = false`, `plan` (the tenant's plan cohort; `none` without one) instead,
//! bounding cardinality; a `tenant` label never holds a plan name. Every family has `# HELP`
//! and `# TYPE` (`help` for the registry's); the scrape also carries `fairgate_build_info` and
//! the standard `process_*` families (`process`), and the OpenTelemetry GenAI client metrics
//! in their Prometheus form (`genai`).

mod budget;
mod endpoints;
mod fairness;
mod genai;
mod help;
mod jobs;
mod layer;
pub mod live;
mod process;
pub mod scrape;
mod tenant;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::time::Instant;

use metrics::{Counter, Gauge, Key, Label, Metadata, Recorder, SharedString};
use metrics_exporter_prometheus::{
    Matcher, PrometheusBuilder, PrometheusHandle, PrometheusRecorder,
};

pub use fairness::WINDOW_SECS;
pub use layer::{Layer, Recording};
pub use live::SAMPLE_SECS;
pub use scrape::{Scrape, ScrapeService};
pub use tenant::{Outcome, TenantMetrics};

use live::{TenantLive, Timeline};
use tenant::Histograms;

use crate::admission::Admission;
use crate::config::{Config, HistogramLabels};
use crate::domain::TenantId;
use crate::queue::FairQueue;

/// Bucket bounds of the seconds histograms.
const SECONDS: [f64; 14] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];
/// Bucket bounds of `fairgate_estimate_error_ratio` (actual ÷ estimated).
const RATIO: [f64; 9] = [0.1, 0.25, 0.5, 0.75, 0.9, 1.1, 1.5, 2.0, 4.0];
/// `fairgate_build_info`'s `revision`: the commit the binary was built from, when the build set
/// `FAIRGATE_REVISION` (the Dockerfile's `REVISION` argument), else `unknown`.
const REVISION: &str = match option_env!("FAIRGATE_REVISION") {
    Some(r) => r,
    None => "unknown",
};
pub(crate) static META: Metadata<'static> =
    Metadata::new(module_path!(), metrics::Level::INFO, None);

/// One tenant's tokens dispatched in one pool: since start, and over the rolling window.
#[derive(Default)]
struct Served {
    total: AtomicU64,
    window: Mutex<fairness::Window>,
}

/// One configured tenant's series and live state.
struct Entry {
    /// Index of its label in `Metrics::labels`.
    label: usize,
    series: Arc<TenantMetrics>,
    live: Arc<TenantLive>,
    plan: Option<Arc<str>>,
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
    /// The per-tenant label's name: `tenant`, or `plan` without `per_tenant_labels`.
    label_key: &'static str,
    /// The GenAI client metrics (`gen_ai_client_*`; the registry's series outlive a reload).
    genai: Arc<genai::GenAi>,
    histograms: HistogramLabels,
    top_tenants: usize,
    tenants: crate::domain::FastMap<TenantId, Entry>,
    labels: Vec<SharedString>,
    /// The series of each label, indexed like `labels`.
    series: Vec<Arc<TenantMetrics>>,
    pools: Vec<(String, crate::domain::FastMap<TenantId, Arc<Served>>)>,
    /// OpenTelemetry export (`[otel] endpoint`; kept across reloads).
    otel: Option<Arc<crate::otel::Exporter>>,
    timeline: Arc<Timeline>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Metrics {
    /// A registry with every configured tenant's series (`OTEL_*` read from the process).
    pub fn new(config: &Config) -> Arc<Self> {
        Self::with_env(config, &|v| std::env::var(v).ok())
    }

    /// As [`Metrics::new`], the `OTEL_*` variables read from `env`.
    pub fn with_env(config: &Config, env: &dyn Fn(&str) -> Option<String>) -> Arc<Self> {
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
        builder = with(builder, genai::TOKEN_USAGE, &genai::TOKEN_BUCKETS);
        builder = with(builder, genai::DURATION, &genai::DURATION_BUCKETS);
        let recorder = Arc::new(builder.build_recorder());
        help::describe(&recorder);
        let handle = recorder.handle();
        let per_tenant_labels = config.metrics.per_tenant_labels;
        let empty = Self {
            genai: Arc::new(genai::GenAi::new(recorder.clone(), config)),
            recorder,
            handle,
            epoch: Instant::now(),
            per_tenant_labels,
            label_key: if per_tenant_labels { "tenant" } else { "plan" },
            histograms: config.metrics.histograms,
            top_tenants: config.metrics.top_tenants,
            tenants: Default::default(),
            labels: Vec::new(),
            series: Vec::new(),
            pools: Vec::new(),
            otel: None,
            timeline: Arc::default(),
        };
        let counters = crate::otel::Counters {
            dropped: empty.plain_counter("fairgate_otel_dropped_total"),
            exported: empty.plain_counter("fairgate_otel_exported_total"),
            failed: empty.plain_counter("fairgate_otel_failed_total"),
        };
        let empty = Self {
            otel: crate::otel::Exporter::new(&config.otel, env, counters),
            ..empty
        };
        empty.reloaded(config)
    }

    /// The metrics of a reloaded `config`, sharing this registry (see the type's docs). The
    /// label mode (`per_tenant_labels`) stays the one the server started with.
    pub fn reloaded(&self, config: &Config) -> Arc<Self> {
        let mut labels: Vec<SharedString> = Vec::new();
        let mut by_label: HashMap<String, (usize, Arc<TenantMetrics>)> = HashMap::new();
        let mut histograms: HashMap<Vec<(&'static str, String)>, Arc<Histograms>> = HashMap::new();
        // Per tenant, or by plan cohort (`[metrics] histograms`; "auto" decides from this
        // generation's number of tenants).
        let tenant_histograms =
            self.per_tenant_labels && self.histograms.per_tenant(config.tenants.len());
        let mut tenants = crate::domain::FastMap::default();
        // The series in force by label, looked up once per label (not a scan per tenant: a
        // reload beside 10,000 tenants with per-tenant labels was 10^8 comparisons).
        let old: HashMap<&str, &Arc<TenantMetrics>> = (self.tenants.values())
            .map(|e| (self.labels[e.label].as_ref(), &e.series))
            .collect();
        for t in &config.tenants {
            let cohort = t.plan.clone().unwrap_or_else(|| "none".to_owned());
            let label = if self.per_tenant_labels {
                t.id.clone()
            } else {
                cohort.clone()
            };
            // Per tenant, they carry the plan too: a dashboard's `by (plan)` works either way.
            let hist_label = if tenant_histograms {
                vec![("tenant", label.clone()), ("plan", cohort)]
            } else {
                vec![("plan", cohort)]
            };
            let (index, series) = by_label
                .entry(label.clone())
                .or_insert_with(|| {
                    labels.push(label.clone().into());
                    let series =
                        (old.get(label.as_str()).map(|s| Arc::clone(s))).unwrap_or_else(|| {
                            let h = histograms
                                .entry(hist_label.clone())
                                .or_insert_with(|| {
                                    Arc::new(Histograms::new(&self.recorder, &hist_label))
                                })
                                .clone();
                            Arc::new(TenantMetrics::new(self.label_key, &label, h))
                        });
                    (labels.len() - 1, series)
                })
                .clone();
            let id = TenantId::new(t.id.as_str());
            let live = self
                .tenants
                .get(&id)
                .map(|e| e.live.clone())
                .unwrap_or_default();
            let entry = Entry {
                label: index,
                series,
                live,
                plan: t.plan.as_deref().map(Arc::from),
            };
            tenants.insert(id, entry);
        }
        let mut series: Vec<Option<Arc<TenantMetrics>>> = vec![None; labels.len()];
        for (i, m) in by_label.into_values() {
            series[i] = Some(m);
        }
        let series: Vec<Arc<TenantMetrics>> = series.into_iter().flatten().collect();
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
            label_key: self.label_key,
            genai: Arc::new(genai::GenAi::new(self.recorder.clone(), config)),
            histograms: self.histograms,
            top_tenants: self.top_tenants,
            tenants,
            labels,
            series,
            pools,
            otel: self.otel.clone(),
            timeline: self.timeline.clone(),
        })
    }

    /// The GenAI client metrics of this generation's pools.
    pub(crate) fn genai(&self) -> &Arc<genai::GenAi> {
        &self.genai
    }

    /// The OpenTelemetry exporter, if `[otel] endpoint` is set.
    pub fn otel(&self) -> Option<&Arc<crate::otel::Exporter>> {
        self.otel.as_ref()
    }

    /// Seconds since the server started (the clock of the rolling window and the timeline).
    pub fn second(&self) -> u64 {
        self.epoch.elapsed().as_secs()
    }

    /// The series of `tenant` (`None`: not configured).
    pub fn tenant(&self, tenant: &TenantId) -> Option<&Arc<TenantMetrics>> {
        self.tenants.get(tenant).map(|e| &e.series)
    }

    /// The live state (recent waits, refusals) of `tenant` (`None`: not configured).
    pub fn live(&self, tenant: &TenantId) -> Option<&Arc<TenantLive>> {
        self.tenants.get(tenant).map(|e| &e.live)
    }

    /// The plan of `tenant` (`None`: no plan, or not configured).
    pub fn plan(&self, tenant: &TenantId) -> Option<&str> {
        self.tenants.get(tenant).and_then(|e| e.plan.as_deref())
    }

    /// Tokens dispatched for `tenant` in pool `pool` over the rolling window ending at `sec`.
    pub fn window_served(&self, pool: usize, tenant: &TenantId, sec: u64) -> u64 {
        self.pools
            .get(pool)
            .and_then(|p| p.1.get(tenant))
            .map_or(0, |c| {
                c.window.lock().unwrap_or_else(|p| p.into_inner()).sum(sec)
            })
    }

    /// The pools' timelines of shares (shared across reloads).
    pub fn timeline(&self) -> &Timeline {
        &self.timeline
    }

    /// Adds a timeline sample of every pool if one is due ([`live::SAMPLE_SECS`]). Called by
    /// the server's sampler task, scrapes and the console's reads.
    pub fn sample(&self, pools: &[Arc<FairQueue>], admission: &Admission) {
        let sec = self.second();
        if !self.timeline.claim(sec) {
            return;
        }
        for (i, pool) in pools.iter().enumerate() {
            let Some((name, _)) = self.pools.get(i) else {
                continue;
            };
            let snap = pool.snapshot();
            let served: Vec<(&str, u64)> = snap
                .iter()
                .map(|(t, _)| (t.id.as_str(), self.window_served(i, &t.id, sec)))
                .collect();
            let throttled = admission.capacity.get(i).map_or(0, |c| c.throttled());
            self.timeline.push(name, sec, &served, throttled);
        }
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
                let Some(label) = self.tenants.get(&t.id).map(|e| e.label) else {
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
        // Scrape-time gauges: written as text for the top tenants by backlog, not registered
        // (a registered series would stay in every later scrape).
        let ratios = fairness::share_ratios(&all, n);
        let mut served = vec![0u64; n];
        for s in &all {
            served[s.label] += s.served;
        }
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_unstable_by(|&a, &b| {
            (queued[b], inflight[b], served[b])
                .cmp(&(queued[a], inflight[a], served[a]))
                .then(a.cmp(&b))
        });
        order.truncate(self.top_tenants);
        let mut gauges = String::new();
        let mut family = |name: &str, help: &str, value: &dyn Fn(usize) -> Option<f64>| {
            use std::fmt::Write as _;
            let _ = writeln!(gauges, "# HELP {name} {help}\n# TYPE {name} gauge");
            for &l in &order {
                if let Some(v) = value(l) {
                    let label = escape(&self.labels[l]);
                    let key = self.label_key;
                    let _ = writeln!(gauges, "{name}{{{key}=\"{label}\"}} {v}");
                }
            }
            gauges.push('\n');
        };
        family(
            "fairgate_queue_depth",
            "Requests queued (top tenants by backlog).",
            &|l| Some(queued[l] as f64),
        );
        family(
            "fairgate_inflight",
            "Requests in flight (top tenants by backlog).",
            &|l| Some(f64::from(inflight[l])),
        );
        family(
            "fairgate_oldest_queued_seconds",
            "Age of the oldest queued request (top tenants by backlog).",
            &|l| Some(oldest[l]),
        );
        family(
            "fairgate_share_ratio",
            "Served share / entitled share over the last 30 s (top tenants by backlog).",
            &|l| ratios[l],
        );
        for ((name, _), cap) in self.pools.iter().zip(admission.capacity.iter()) {
            let name: SharedString = name.clone().into();
            self.gauge("fairgate_upstream_limit", "upstream", name.clone())
                .set(f64::from(cap.limit()));
            self.counter("fairgate_upstream_429_total", "upstream", name)
                .absolute(cap.throttled());
        }
        let names: Vec<SharedString> = self.pools.iter().map(|(n, _)| n.clone().into()).collect();
        endpoints::render(&self.recorder, &names, &admission.capacity);
        let r = &admission.retries;
        let plain =
            |name: &'static str| self.recorder.register_counter(&Key::from_name(name), &META);
        plain("fairgate_upstream_retries_total").absolute(r.retries.load(Ordering::Relaxed));
        plain("fairgate_upstream_retries_exhausted_total")
            .absolute(r.exhausted.load(Ordering::Relaxed));
        plain("fairgate_upstream_failovers_total").absolute(r.failovers.load(Ordering::Relaxed));
        self.sample(pools, admission);
        let mut families = tenant::Families::with_capacity(self.series.len());
        for s in &self.series {
            s.write(&mut families);
        }
        let registry = self.handle.render();
        let mut text = String::with_capacity(registry.len() + families.len() + gauges.len());
        text.push_str(&registry);
        drop(registry);
        families.finish(&mut text);
        text.push_str(&gauges);
        text.push_str(&budget::render(&admission.budgets, self.top_tenants, |v| {
            escape(v).into_owned()
        }));
        {
            use std::fmt::Write as _;
            let _ =
                writeln!(
                text,
                "# HELP fairgate_build_info The running fairgate's version and build (always 1).\n\
                 # TYPE fairgate_build_info gauge\n\
                 fairgate_build_info{{version=\"{}\",revision=\"{}\",profile=\"{}\"}} 1\n",
                env!("CARGO_PKG_VERSION"),
                escape(REVISION),
                if cfg!(debug_assertions) { "debug" } else { "release" },
            );
        }
        process::write(&mut text);
        text
    }
}

/// `value` escaped for a Prometheus label value.
fn escape(value: &str) -> std::borrow::Cow<'_, str> {
    if !value.contains(['\\', '"', '\n']) {
        return value.into();
    }
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
        .into()
}
