//! One tenant's (or plan cohort's) request-level series, registered once at startup and recorded
//! through handles: a status code, reason or model seen for the first time registers its series
//! once; after that, recording builds no label strings. Status 200 and the tenant's first model
//! (nearly every request) are recorded without taking the maps' locks, which both connection
//! workers would otherwise contend for on every request.
//!
//! Labels and logs bounded: a model name is client-chosen, so the `model` label (and the model
//! in the request log line, through [`TenantMetrics::model_label`]) is cut to [`MAX_LABEL`] bytes
//! and, past [`MAX_MODELS`] distinct names per tenant, folded into `other`.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use metrics::{Counter, Histogram, Key, Label, Recorder, SharedString};
use metrics_exporter_prometheus::PrometheusRecorder;

use super::META;
use crate::domain::Class;

/// Distinct models counted per tenant before the rest is counted as `other`.
pub const MAX_MODELS: usize = 32;
/// Longest model label (bytes; cut on a character boundary).
pub const MAX_LABEL: usize = 64;

/// `model` cut to [`MAX_LABEL`] bytes on a character boundary.
fn cut(model: &str) -> &str {
    let mut end = model.len().min(MAX_LABEL);
    while !model.is_char_boundary(end) {
        end -= 1;
    }
    &model[..end]
}

/// What became of a request's estimated cost (`fairgate_cost_tokens_total{outcome}`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Dispatched to the upstream.
    Admitted = 0,
    /// Dispatched after waiting in the queue for at least 1 ms (also counted as admitted).
    Deferred = 1,
    /// Refused (admission or a full queue).
    Rejected = 2,
}

/// The histograms of one label (a tenant, or a plan cohort: `[metrics] histograms`), shared
/// by every tenant counted under it.
pub struct Histograms {
    queue_wait: [Histogram; 2],
    duration: Histogram,
    ttfb: Histogram,
    error_ratio: Histogram,
}

impl Histograms {
    /// Registers (or finds again) the histograms labelled `key="value"`.
    pub(super) fn new(recorder: &PrometheusRecorder, key: &'static str, value: &str) -> Self {
        let value: SharedString = value.to_owned().into();
        let h = |name: &'static str, extra: Option<(&'static str, &'static str)>| {
            let mut labels = vec![Label::new(key, value.clone())];
            if let Some((k, v)) = extra {
                labels.push(Label::new(k, v));
            }
            recorder.register_histogram(&Key::from_parts(name, labels), &META)
        };
        Self {
            queue_wait: [
                h(
                    "fairgate_queue_wait_seconds",
                    Some(("class", "interactive")),
                ),
                h("fairgate_queue_wait_seconds", Some(("class", "batch"))),
            ],
            duration: h("fairgate_request_duration_seconds", None),
            ttfb: h("fairgate_time_to_first_byte_seconds", None),
            error_ratio: h("fairgate_estimate_error_ratio", None),
        }
    }
}

/// One tenant's (or cohort's) series: counters registered when first counted (a tenant that
/// never missed a deadline has no `fairgate_deadline_misses_total` line), histograms shared by
/// its histogram label.
pub struct TenantMetrics {
    label: SharedString,
    recorder: Arc<PrometheusRecorder>,
    histograms: Arc<Histograms>,
    deadline_misses: OnceLock<Counter>,
    costs: [OnceLock<Counter>; 3],
    statuses: Mutex<crate::domain::FastMap<u16, Counter>>,
    /// `statuses[200]`, once registered.
    ok: OnceLock<Counter>,
    /// The first model seen and its (estimated, actual) counters, also in `models`.
    first_model: OnceLock<(String, Counter, Counter)>,
    rejected: Mutex<crate::domain::FastMap<&'static str, Counter>>,
    unread: Mutex<crate::domain::FastMap<&'static str, Counter>>,
    models: Mutex<crate::domain::FastMap<String, (Counter, Counter)>>,
}

impl TenantMetrics {
    pub(super) fn new(
        recorder: &Arc<PrometheusRecorder>,
        label: &str,
        histograms: Arc<Histograms>,
    ) -> Self {
        Self {
            label: label.to_owned().into(),
            recorder: recorder.clone(),
            histograms,
            deadline_misses: OnceLock::new(),
            costs: Default::default(),
            statuses: Mutex::default(),
            ok: OnceLock::new(),
            first_model: OnceLock::new(),
            rejected: Mutex::default(),
            unread: Mutex::default(),
            models: Mutex::default(),
        }
    }

    fn counter(&self, name: &'static str, key: &'static str, value: SharedString) -> Counter {
        let labels = vec![
            Label::new("tenant", self.label.clone()),
            Label::new(key, value),
        ];
        self.recorder
            .register_counter(&Key::from_parts(name, labels), &META)
    }

    /// Counts one answered request by status.
    pub fn request(&self, status: u16) {
        if let Some(ok) = self.ok.get().filter(|_| status == 200) {
            ok.increment(1);
            return;
        }
        let mut map = self.statuses.lock().unwrap_or_else(|p| p.into_inner());
        let counter = map.entry(status).or_insert_with(|| {
            self.counter(
                "fairgate_requests_total",
                "status",
                status.to_string().into(),
            )
        });
        counter.increment(1);
        if status == 200 {
            let _ = self.ok.set(counter.clone());
        }
    }

    /// Counts estimated tokens by what became of them.
    pub fn cost(&self, outcome: Outcome, tokens: u64) {
        const NAMES: [&str; 3] = ["admitted", "deferred", "rejected"];
        let i = outcome as usize;
        self.costs[i]
            .get_or_init(|| self.counter("fairgate_cost_tokens_total", "outcome", NAMES[i].into()))
            .increment(tokens);
    }

    /// Counts one 2xx body whose usage could not be read, by reason
    /// (`fairgate_usage_unread_total`).
    pub fn usage_unread(&self, reason: &'static str) {
        let mut map = self.unread.lock().unwrap_or_else(|p| p.into_inner());
        map.entry(reason)
            .or_insert_with(|| self.counter("fairgate_usage_unread_total", "reason", reason.into()))
            .increment(1);
    }

    /// Counts one refusal by reason.
    pub fn rejected(&self, reason: &'static str) {
        if matches!(reason, "deadline_exceeded" | "deadline_infeasible") {
            self.deadline_misses
                .get_or_init(|| {
                    let labels = vec![Label::new("tenant", self.label.clone())];
                    self.recorder.register_counter(
                        &Key::from_parts("fairgate_deadline_misses_total", labels),
                        &META,
                    )
                })
                .increment(1);
        }
        let mut map = self.rejected.lock().unwrap_or_else(|p| p.into_inner());
        map.entry(reason)
            .or_insert_with(|| self.counter("fairgate_rejected_total", "reason", reason.into()))
            .increment(1);
    }

    /// Records the time a request spent queued.
    pub fn queue_wait(&self, class: Class, waited: Duration) {
        let i = usize::from(class == Class::Batch);
        self.histograms.queue_wait[i].record(waited.as_secs_f64());
    }

    /// Records a finished request's timings.
    pub fn timings(&self, total: Duration, ttfb: Option<Duration>) {
        self.histograms.duration.record(total.as_secs_f64());
        if let Some(t) = ttfb {
            self.histograms.ttfb.record(t.as_secs_f64());
        }
    }

    /// Counts a request's estimated and (when known) actual tokens for `model`.
    pub fn tokens(&self, model: &str, estimated: u64, actual: Option<u64>) {
        if let Some((_, e, a)) = self.first_model.get().filter(|(m, ..)| m == model) {
            return self.add_tokens(e, a, estimated, actual);
        }
        let (_, e, a) = self.model_series(model);
        self.add_tokens(&e, &a, estimated, actual);
    }

    /// The name `model` is shown under, in its label and in the request log line: cut to
    /// [`MAX_LABEL`] bytes, or `other` once the tenant has [`MAX_MODELS`] others (registers it).
    pub fn model_label(&self, model: &str) -> String {
        match self.first_model.get().filter(|(m, ..)| m == model) {
            Some((m, ..)) => m.clone(),
            None => self.model_series(model).0,
        }
    }

    /// The label and (estimated, actual) counters `model` is counted under, registered once.
    fn model_series(&self, model: &str) -> (String, Counter, Counter) {
        let model = cut(model);
        let mut map = self.models.lock().unwrap_or_else(|p| p.into_inner());
        let model = if map.contains_key(model) || map.len() < MAX_MODELS {
            model
        } else {
            "other"
        };
        if !map.contains_key(model) {
            let pair = |name| {
                let labels = vec![
                    Label::new("tenant", self.label.clone()),
                    Label::new("model", model.to_owned()),
                ];
                self.recorder
                    .register_counter(&Key::from_parts(name, labels), &META)
            };
            let v = (
                pair("fairgate_tokens_estimated_total"),
                pair("fairgate_tokens_actual_total"),
            );
            if map.is_empty() {
                let _ = self
                    .first_model
                    .set((model.to_owned(), v.0.clone(), v.1.clone()));
            }
            map.insert(model.to_owned(), v);
        }
        let (e, a) = &map[model];
        (model.to_owned(), e.clone(), a.clone())
    }

    fn add_tokens(&self, e: &Counter, a: &Counter, estimated: u64, actual: Option<u64>) {
        e.increment(estimated);
        if let Some(actual) = actual {
            a.increment(actual);
            self.histograms
                .error_ratio
                .record(actual as f64 / estimated.max(1) as f64);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use metrics_exporter_prometheus::PrometheusBuilder;

    fn line<'a>(text: &'a str, prefix: &str) -> Option<&'a str> {
        text.lines().find(|l| l.starts_with(prefix))
    }

    #[test]
    fn lock_free_paths_count_like_the_maps() {
        let recorder = Arc::new(PrometheusBuilder::new().build_recorder());
        let t = TenantMetrics::new(
            &recorder,
            "t",
            Arc::new(Histograms::new(&recorder, "tenant", "t")),
        );
        for status in [200, 200, 404, 200] {
            t.request(status);
        }
        t.tokens("m1", 10, Some(20));
        t.tokens("m1", 5, None);
        t.tokens("m2", 7, Some(1));
        t.tokens("m1", 1, Some(2));
        let text = recorder.handle().render();
        let value = |prefix: &str| {
            line(&text, prefix)
                .unwrap_or_else(|| panic!("no {prefix} in\n{text}"))
                .rsplit(' ')
                .next()
                .unwrap()
                .to_owned()
        };
        assert_eq!(
            value(r#"fairgate_requests_total{tenant="t",status="200"}"#),
            "3"
        );
        assert_eq!(
            value(r#"fairgate_requests_total{tenant="t",status="404"}"#),
            "1"
        );
        let est = r#"fairgate_tokens_estimated_total{tenant="t",model="#;
        assert_eq!(value(&format!(r#"{est}"m1"}}"#)), "16");
        assert_eq!(value(&format!(r#"{est}"m2"}}"#)), "7");
        let act = r#"fairgate_tokens_actual_total{tenant="t",model="#;
        assert_eq!(value(&format!(r#"{act}"m1"}}"#)), "22");
        assert_eq!(value(&format!(r#"{act}"m2"}}"#)), "1");
    }

    #[test]
    fn client_chosen_model_names_are_cut_and_folded_into_other() {
        let recorder = Arc::new(PrometheusBuilder::new().build_recorder());
        let t = TenantMetrics::new(
            &recorder,
            "t",
            Arc::new(Histograms::new(&recorder, "tenant", "t")),
        );
        let long = format!("{}é", "m".repeat(MAX_LABEL - 1));
        assert_eq!(
            t.model_label(&long),
            "m".repeat(MAX_LABEL - 1),
            "cut on a char"
        );
        for i in 0..500 {
            let model = format!("invented-{i}-{}", "x".repeat(10_000));
            t.tokens(&model, 1, Some(1));
            let label = t.model_label(&model);
            assert!(label.len() <= MAX_LABEL);
            if i >= MAX_MODELS {
                assert_eq!(label, "other");
            }
        }
        let text = recorder.handle().render();
        let series = text
            .lines()
            .filter(|l| l.starts_with("fairgate_tokens_estimated_total{"))
            .count();
        assert_eq!(series, MAX_MODELS + 1, "{MAX_MODELS} names and `other`");
        assert!(text.lines().all(|l| l.len() < 200), "no long label");
        assert!(text.contains(r#"model="other"} 469"#), "{text}");
        // A known model keeps its name.
        assert_eq!(t.model_label(&long), "m".repeat(MAX_LABEL - 1));
    }
}
