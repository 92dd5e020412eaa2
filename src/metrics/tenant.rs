//! One tenant's (or plan cohort's) request-level series, registered once at startup and recorded
//! through handles: a status code, reason or model seen for the first time registers its series
//! once; after that, recording builds no label strings.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use metrics::{Counter, Histogram, Key, Label, Recorder, SharedString};
use metrics_exporter_prometheus::PrometheusRecorder;

use super::META;
use crate::domain::Class;

/// Distinct models counted per tenant before the rest is counted as `other`.
const MAX_MODELS: usize = 32;

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

/// One tenant's (or cohort's) pre-registered series.
pub struct TenantMetrics {
    label: SharedString,
    recorder: Arc<PrometheusRecorder>,
    queue_wait: [Histogram; 2],
    duration: Histogram,
    ttfb: Histogram,
    error_ratio: Histogram,
    deadline_misses: Counter,
    costs: [Counter; 3],
    statuses: Mutex<crate::domain::FastMap<u16, Counter>>,
    rejected: Mutex<crate::domain::FastMap<&'static str, Counter>>,
    models: Mutex<crate::domain::FastMap<String, (Counter, Counter)>>,
}

impl TenantMetrics {
    pub(super) fn new(recorder: &Arc<PrometheusRecorder>, label: &str) -> Self {
        let label: SharedString = label.to_owned().into();
        let h = |name: &'static str, extra: Option<(&'static str, &'static str)>| {
            let mut labels = vec![Label::new("tenant", label.clone())];
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
            deadline_misses: recorder.register_counter(
                &Key::from_parts(
                    "fairgate_deadline_misses_total",
                    vec![Label::new("tenant", label.clone())],
                ),
                &META,
            ),
            costs: ["admitted", "deferred", "rejected"].map(|outcome| {
                let labels = vec![
                    Label::new("tenant", label.clone()),
                    Label::new("outcome", outcome),
                ];
                recorder.register_counter(
                    &Key::from_parts("fairgate_cost_tokens_total", labels),
                    &META,
                )
            }),
            label,
            recorder: recorder.clone(),
            statuses: Mutex::default(),
            rejected: Mutex::default(),
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
        let mut map = self.statuses.lock().unwrap_or_else(|p| p.into_inner());
        map.entry(status)
            .or_insert_with(|| {
                self.counter(
                    "fairgate_requests_total",
                    "status",
                    status.to_string().into(),
                )
            })
            .increment(1);
    }

    /// Counts estimated tokens by what became of them.
    pub fn cost(&self, outcome: Outcome, tokens: u64) {
        self.costs[outcome as usize].increment(tokens);
    }

    /// Counts one refusal by reason.
    pub fn rejected(&self, reason: &'static str) {
        if matches!(reason, "deadline_exceeded" | "deadline_infeasible") {
            self.deadline_misses.increment(1);
        }
        let mut map = self.rejected.lock().unwrap_or_else(|p| p.into_inner());
        map.entry(reason)
            .or_insert_with(|| self.counter("fairgate_rejected_total", "reason", reason.into()))
            .increment(1);
    }

    /// Records the time a request spent queued.
    pub fn queue_wait(&self, class: Class, waited: Duration) {
        let i = usize::from(class == Class::Batch);
        self.queue_wait[i].record(waited.as_secs_f64());
    }

    /// Records a finished request's timings.
    pub fn timings(&self, total: Duration, ttfb: Option<Duration>) {
        self.duration.record(total.as_secs_f64());
        if let Some(t) = ttfb {
            self.ttfb.record(t.as_secs_f64());
        }
    }

    /// Counts a request's estimated and (when known) actual tokens for `model`.
    pub fn tokens(&self, model: &str, estimated: u64, actual: Option<u64>) {
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
            map.insert(model.to_owned(), v);
        }
        let (e, a) = &map[model];
        e.increment(estimated);
        if let Some(actual) = actual {
            a.increment(actual);
            self.error_ratio
                .record(actual as f64 / estimated.max(1) as f64);
        }
    }
}
