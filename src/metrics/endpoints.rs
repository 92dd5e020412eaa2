//! The `fairgate_endpoint_*` families: one series per endpoint of every pool (labels
//! `upstream`, `endpoint`), set at scrape time from the pools' capacity controllers.
//!
//! - `fairgate_endpoint_in_flight` (gauge): requests on the endpoint's wire.
//! - `fairgate_endpoint_limit` (gauge): its learned concurrency limit (1 while due a probe).
//! - `fairgate_endpoint_state` (gauge, label `state`): 1 for the state it is in
//!   (`in_service`, `paused`, `probing`, `ejected`), 0 for the others.
//! - `fairgate_endpoint_ejections_total`: times it was ejected.
//! - `fairgate_endpoint_failovers_total`: requests it refused or failed that were sent on to
//!   another endpoint.
//! - `fairgate_endpoint_overloads_total`: its 429/503 answers.
//!
//! Invariant: the label set is bounded by the configuration (pools × endpoints × 4 states).

use metrics::{Key, Label, Recorder, SharedString};
use metrics_exporter_prometheus::PrometheusRecorder;

use super::META;
use crate::feedback::capacity::PoolCapacity;

const STATES: [&str; 4] = ["in_service", "paused", "probing", "ejected"];

/// Sets every endpoint's series of the pools `names` (indexed like `capacity`).
pub(super) fn render(
    recorder: &PrometheusRecorder,
    names: &[SharedString],
    capacity: &[std::sync::Arc<PoolCapacity>],
) {
    for (pool, cap) in names.iter().zip(capacity) {
        for v in cap.views() {
            let labels = || {
                vec![
                    Label::new("upstream", pool.clone()),
                    Label::new("endpoint", SharedString::from(v.name.to_string())),
                ]
            };
            let gauge = |name: &'static str, value: f64| {
                recorder
                    .register_gauge(&Key::from_parts(name, labels()), &META)
                    .set(value);
            };
            gauge("fairgate_endpoint_in_flight", f64::from(v.in_flight));
            gauge("fairgate_endpoint_limit", f64::from(v.limit));
            for s in STATES {
                let mut l = labels();
                l.push(Label::new("state", SharedString::const_str(s)));
                recorder
                    .register_gauge(&Key::from_parts("fairgate_endpoint_state", l), &META)
                    .set(if v.state == s { 1.0 } else { 0.0 });
            }
            let counter = |name: &'static str, value: u64| {
                recorder
                    .register_counter(&Key::from_parts(name, labels()), &META)
                    .absolute(value);
            };
            counter("fairgate_endpoint_ejections_total", v.ejections);
            counter("fairgate_endpoint_failovers_total", v.failovers);
            counter("fairgate_endpoint_overloads_total", v.throttled);
        }
    }
}
