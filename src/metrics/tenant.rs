//! One tenant's (or plan cohort's) request-level series: counters as plain atomics written at
//! scrape time (a status code, reason or model seen for the first time adds its line; recording
//! builds no label strings), histograms through the registry's handles. Status 200 and the
//! tenant's first model (nearly every request) are recorded without taking a lock, which both
//! connection workers would otherwise contend for on every request.
//!
//! Labels and logs bounded: a model name is client-chosen, so the `model` label (and the model
//! in the request log line, through [`TenantMetrics::model_label`]) is cut to [`MAX_LABEL`] bytes
//! and, past [`MAX_MODELS`] distinct names per tenant, folded into `other`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use metrics::{Histogram, Key, Label, Recorder, SharedString};
use metrics_exporter_prometheus::PrometheusRecorder;

use super::META;
use crate::domain::{Charge, Class};
use crate::error::Reason;

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
    /// Registers (or finds again) the histograms labelled `labels` (`plan`; or `tenant` and
    /// `plan`).
    pub(super) fn new(recorder: &PrometheusRecorder, labels: &[(&'static str, String)]) -> Self {
        let base: Vec<Label> = labels
            .iter()
            .map(|(k, v)| Label::new(*k, SharedString::from(v.clone())))
            .collect();
        let h = |name: &'static str, extra: Option<(&'static str, &'static str)>| {
            let mut labels = base.clone();
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

/// One tenant's (or cohort's) series: counters kept as plain atomics and written by
/// [`TenantMetrics::write`] at scrape time — only those counted at least once, so a tenant that
/// sent one successful request has ~4 lines — and the histograms of its histogram label.
///
/// Not in the registry on purpose: 10,000 tenants × a few counters as registry series cost a
/// `Key` with owned labels each and a render that groups and sorts every series into temporary
/// maps on each scrape (BENCHMARKS.md, "Observability at 10,000 tenants").
pub struct TenantMetrics {
    /// The label's name: `tenant` (an id), or `plan` (a cohort, without `per_tenant_labels`).
    key: &'static str,
    label: SharedString,
    histograms: Arc<Histograms>,
    /// Status 200 (nearly every request): lock-free.
    ok: AtomicU64,
    statuses: Mutex<Vec<(u16, u64)>>,
    costs: [AtomicU64; 3],
    deadline_misses: AtomicU64,
    rejected: Mutex<Vec<(&'static str, u64)>>,
    unread: Mutex<Vec<(&'static str, u64)>>,
    /// The first model seen and its counts: lock-free.
    first_model: OnceLock<(String, ModelCounts)>,
    /// The other models (at most [`MAX_MODELS`] in all, then `other`).
    models: Mutex<Vec<(String, ModelCounts)>>,
}

/// One model's token counters: estimated (input and output together), and actual, input
/// and output apart.
#[derive(Default)]
struct ModelCounts {
    estimated: AtomicU64,
    actual: [AtomicU64; 2],
}

impl ModelCounts {
    fn add(&self, estimated: Charge, actual: Option<Charge>) {
        self.estimated
            .fetch_add(estimated.total().0, Ordering::Relaxed);
        if let Some(a) = actual {
            self.actual[0].fetch_add(a.input, Ordering::Relaxed);
            self.actual[1].fetch_add(a.output, Ordering::Relaxed);
        }
    }
}

/// The values of the `type` label of the token families, indexed like [`ModelCounts`]'s.
const TOKEN_TYPES: [&str; 2] = ["input", "output"];

/// The per-tenant counter families, each written contiguously (Prometheus text format).
#[derive(Default)]
pub(super) struct Families {
    requests: String,
    estimated: String,
    actual: String,
    costs: String,
    deadline: String,
    rejected: String,
    unread: String,
}

impl Families {
    /// Families sized for `labels` labels with one line each in the common families, so that a
    /// scrape allocates each once instead of through a chain of doublings.
    pub(super) fn with_capacity(labels: usize) -> Self {
        let line = |name: &str| labels * (name.len() + 48);
        Self {
            requests: String::with_capacity(line("fairgate_requests_total")),
            estimated: String::with_capacity(line("fairgate_tokens_estimated_total")),
            actual: String::with_capacity(line("fairgate_tokens_actual_total")),
            costs: String::with_capacity(line("fairgate_cost_tokens_total")),
            ..Self::default()
        }
    }

    /// Bytes written so far.
    pub(super) fn len(&self) -> usize {
        [
            &self.requests,
            &self.estimated,
            &self.actual,
            &self.costs,
            &self.deadline,
            &self.rejected,
            &self.unread,
        ]
        .iter()
        .map(|s| s.len() + 200)
        .sum()
    }

    /// Appends every family, with its `# TYPE` line, to `out`.
    pub(super) fn finish(self, out: &mut String) {
        for (name, help, body) in [
            (
                "fairgate_requests_total",
                "Answered requests by status.",
                self.requests,
            ),
            (
                "fairgate_tokens_estimated_total",
                "Tokens charged at admission (counted input plus estimated output) of dispatched requests, by model.",
                self.estimated,
            ),
            (
                "fairgate_tokens_actual_total",
                "Tokens reconciled by model and type: the provider's usage, else the stated fallback count.",
                self.actual,
            ),
            (
                "fairgate_cost_tokens_total",
                "Estimated tokens admitted, deferred (>= 1 ms queued) or rejected.",
                self.costs,
            ),
            (
                "fairgate_deadline_misses_total",
                "Requests refused for their deadline.",
                self.deadline,
            ),
            (
                "fairgate_rejected_total",
                "Refusals by reason.",
                self.rejected,
            ),
            (
                "fairgate_usage_unread_total",
                "2xx bodies charged by the fallback, by reason.",
                self.unread,
            ),
        ] {
            if body.is_empty() {
                continue;
            }
            out.push_str("# HELP ");
            out.push_str(name);
            out.push(' ');
            out.push_str(help);
            out.push_str("\n# TYPE ");
            out.push_str(name);
            out.push_str(" counter\n");
            out.push_str(&body);
            out.push('\n');
        }
    }
}

/// The label of a series: `(tenant|plan, value)`.
type Who<'a> = (&'static str, &'a str);

/// Writes `name{tenant="label",k="v",…} n` (the first label is `who`'s).
fn line(out: &mut String, name: &str, who: Who<'_>, extra: &[(&str, &str)], n: u64) {
    out.push_str(name);
    out.push('{');
    out.push_str(who.0);
    out.push_str("=\"");
    out.push_str(&super::escape(who.1));
    for (k, v) in extra {
        out.push_str("\",");
        out.push_str(k);
        out.push_str("=\"");
        out.push_str(&super::escape(v));
    }
    out.push_str("\"} ");
    out.push_str(itoa::Buffer::new().format(n));
    out.push('\n');
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn bump<K: PartialEq + Copy>(v: &mut Vec<(K, u64)>, k: K, n: u64) {
    match v.iter_mut().find(|(x, _)| *x == k) {
        Some((_, c)) => *c += n,
        None => v.push((k, n)),
    }
}

impl TenantMetrics {
    pub(super) fn new(key: &'static str, label: &str, histograms: Arc<Histograms>) -> Self {
        Self {
            key,
            label: label.to_owned().into(),
            histograms,
            ok: AtomicU64::new(0),
            statuses: Mutex::default(),
            costs: Default::default(),
            deadline_misses: AtomicU64::new(0),
            rejected: Mutex::default(),
            unread: Mutex::default(),
            first_model: OnceLock::new(),
            models: Mutex::default(),
        }
    }

    /// Writes this label's counters (those counted at least once) into `f`.
    pub(super) fn write(&self, f: &mut Families) {
        let t: Who<'_> = (self.key, &self.label);
        let ok = self.ok.load(Ordering::Relaxed);
        if ok > 0 {
            line(
                &mut f.requests,
                "fairgate_requests_total",
                t,
                &[("status", "200")],
                ok,
            );
        }
        for (status, n) in lock(&self.statuses).iter() {
            let status = itoa::Buffer::new().format(*status).to_owned();
            line(
                &mut f.requests,
                "fairgate_requests_total",
                t,
                &[("status", &status)],
                *n,
            );
        }
        let mut model = |m: &str, c: &ModelCounts| {
            let e = c.estimated.load(Ordering::Relaxed);
            line(
                &mut f.estimated,
                "fairgate_tokens_estimated_total",
                t,
                &[("model", m)],
                e,
            );
            for (i, kind) in TOKEN_TYPES.into_iter().enumerate() {
                let labels = [("model", m), ("type", kind)];
                let a = c.actual[i].load(Ordering::Relaxed);
                line(&mut f.actual, "fairgate_tokens_actual_total", t, &labels, a);
            }
        };
        if let Some((m, c)) = self.first_model.get() {
            model(m, c);
        }
        for (m, c) in lock(&self.models).iter() {
            model(m, c);
        }
        for (i, outcome) in ["admitted", "deferred", "rejected"].into_iter().enumerate() {
            let n = self.costs[i].load(Ordering::Relaxed);
            if n > 0 {
                line(
                    &mut f.costs,
                    "fairgate_cost_tokens_total",
                    t,
                    &[("outcome", outcome)],
                    n,
                );
            }
        }
        let misses = self.deadline_misses.load(Ordering::Relaxed);
        if misses > 0 {
            line(
                &mut f.deadline,
                "fairgate_deadline_misses_total",
                t,
                &[],
                misses,
            );
        }
        for (reason, n) in lock(&self.rejected).iter() {
            line(
                &mut f.rejected,
                "fairgate_rejected_total",
                t,
                &[("reason", reason)],
                *n,
            );
        }
        for (reason, n) in lock(&self.unread).iter() {
            line(
                &mut f.unread,
                "fairgate_usage_unread_total",
                t,
                &[("reason", reason)],
                *n,
            );
        }
    }

    /// Counts one answered request by status.
    pub fn request(&self, status: u16) {
        if status == 200 {
            self.ok.fetch_add(1, Ordering::Relaxed);
        } else {
            bump(&mut lock(&self.statuses), status, 1);
        }
    }

    /// Counts estimated tokens by what became of them.
    pub fn cost(&self, outcome: Outcome, tokens: u64) {
        self.costs[outcome as usize].fetch_add(tokens, Ordering::Relaxed);
    }

    /// Counts one 2xx body whose usage could not be read, by reason
    /// (`fairgate_usage_unread_total`).
    pub fn usage_unread(&self, reason: &'static str) {
        bump(&mut lock(&self.unread), reason, 1);
    }

    /// Counts one refusal by reason.
    pub fn rejected(&self, reason: Reason) {
        if reason.deadline_miss() {
            self.deadline_misses.fetch_add(1, Ordering::Relaxed);
        }
        bump(&mut lock(&self.rejected), reason.as_str(), 1);
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

    /// Counts a request's estimated and (when known) actual tokens for `model`, input and
    /// output apart.
    pub fn tokens(&self, model: &str, estimated: Charge, actual: Option<Charge>) {
        if let Some(actual) = actual {
            self.histograms
                .error_ratio
                .record(actual.total().0 as f64 / estimated.total().0.max(1) as f64);
        }
        let first = self
            .first_model
            .get_or_init(|| (cut(model).to_owned(), ModelCounts::default()));
        if first.0 == cut(model) {
            first.1.add(estimated, actual);
            return;
        }
        let mut models = lock(&self.models);
        let i = self.model_index(&mut models, model);
        models[i].1.add(estimated, actual);
    }

    /// The index in `models` of `model`'s series (registered now if new).
    fn model_index(&self, models: &mut Vec<(String, ModelCounts)>, model: &str) -> usize {
        let model = cut(model);
        if let Some(i) = models.iter().position(|(m, ..)| m == model) {
            return i;
        }
        // The first model counts towards MAX_MODELS; `other` does not.
        let named = 1 + models.iter().filter(|(m, ..)| m != "other").count();
        let name = if named < MAX_MODELS { model } else { "other" };
        match models.iter().position(|(m, ..)| m == name) {
            Some(i) => i,
            None => {
                models.push((name.to_owned(), ModelCounts::default()));
                models.len() - 1
            }
        }
    }

    /// The name `model` is shown under, in its label and in the request log line: cut to
    /// [`MAX_LABEL`] bytes, or `other` once the tenant has [`MAX_MODELS`] others (registers it).
    pub fn model_label(&self, model: &str) -> std::borrow::Cow<'_, str> {
        let first = self
            .first_model
            .get_or_init(|| (cut(model).to_owned(), ModelCounts::default()));
        if first.0 == cut(model) {
            // The tenant's first model (nearly every request): borrowed, not copied.
            return std::borrow::Cow::Borrowed(&first.0);
        }
        let mut models = lock(&self.models);
        let i = self.model_index(&mut models, model);
        std::borrow::Cow::Owned(models[i].0.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use metrics_exporter_prometheus::PrometheusBuilder;

    fn render(t: &TenantMetrics) -> String {
        let mut f = Families::default();
        t.write(&mut f);
        let mut out = String::new();
        f.finish(&mut out);
        out
    }

    fn line<'a>(text: &'a str, prefix: &str) -> Option<&'a str> {
        text.lines().find(|l| l.starts_with(prefix))
    }

    #[test]
    fn lock_free_paths_count_like_the_maps() {
        let recorder = Arc::new(PrometheusBuilder::new().build_recorder());
        let t = TenantMetrics::new(
            "tenant",
            "t",
            Arc::new(Histograms::new(&recorder, &[("tenant", "t".into())])),
        );
        for status in [200, 200, 404, 200] {
            t.request(status);
        }
        let c = |input, output| Charge { input, output };
        t.tokens("m1", c(4, 6), Some(c(5, 15)));
        t.tokens("m1", c(5, 0), None);
        t.tokens("m2", c(3, 4), Some(c(1, 0)));
        t.tokens("m1", c(1, 0), Some(c(1, 1)));
        let text = render(&t);
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
        assert_eq!(value(&format!(r#"{act}"m1",type="input"}}"#)), "6");
        assert_eq!(value(&format!(r#"{act}"m1",type="output"}}"#)), "16");
        assert_eq!(value(&format!(r#"{act}"m2",type="input"}}"#)), "1");
    }

    #[test]
    fn client_chosen_model_names_are_cut_and_folded_into_other() {
        let recorder = Arc::new(PrometheusBuilder::new().build_recorder());
        let t = TenantMetrics::new(
            "tenant",
            "t",
            Arc::new(Histograms::new(&recorder, &[("tenant", "t".into())])),
        );
        let long = format!("{}é", "m".repeat(MAX_LABEL - 1));
        assert_eq!(
            t.model_label(&long),
            "m".repeat(MAX_LABEL - 1),
            "cut on a char"
        );
        for i in 0..500 {
            let model = format!("invented-{i}-{}", "x".repeat(10_000));
            let one = Charge {
                input: 1,
                output: 0,
            };
            t.tokens(&model, one, Some(one));
            let label = t.model_label(&model);
            assert!(label.len() <= MAX_LABEL);
            if i >= MAX_MODELS {
                assert_eq!(label, "other");
            }
        }
        let text = render(&t);
        let series = text
            .lines()
            .filter(|l| l.starts_with("fairgate_tokens_estimated_total{"))
            .count();
        assert_eq!(series, MAX_MODELS + 1, "{MAX_MODELS} names and `other`");
        assert!(text.lines().all(|l| l.len() < 200), "no long label");
        assert!(
            text.contains(r#"model="other",type="input"} 469"#),
            "{text}"
        );
        // A known model keeps its name.
        assert_eq!(t.model_label(&long), "m".repeat(MAX_LABEL - 1));
    }
}
