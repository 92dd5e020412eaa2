//! The `# HELP` text of every family recorded through the registry (the families written as
//! text at scrape time carry their own). Described once per registry, when it is built: the
//! exporter then writes `# HELP` before each family's `# TYPE`, whether or not it has series yet.
//! `tests/metrics_format.rs` parses a full scrape and fails on any family without HELP or TYPE.

use metrics::{KeyName, Recorder, SharedString, Unit};
use metrics_exporter_prometheus::PrometheusRecorder;

/// (family, unit, help) of the counters.
const COUNTERS: &[(&str, Option<Unit>, &str)] = &[
    (
        "fairgate_upstream_429_total",
        None,
        "429 answers from the upstream pool's provider (learned capacity feedback), by upstream.",
    ),
    (
        "fairgate_upstream_retries_total",
        None,
        "Upstream attempts retried after a 429, 502 or 503 that reached no client byte.",
    ),
    (
        "fairgate_upstream_retries_exhausted_total",
        None,
        "Requests whose upstream retries ran out (the last answer was passed on).",
    ),
    (
        "fairgate_upstream_failovers_total",
        None,
        "Attempts sent on to another endpoint after one refused or failed them (not charged).",
    ),
    (
        "fairgate_endpoint_ejections_total",
        None,
        "Times an endpoint was taken out of its pool (consecutive failures or error rate).",
    ),
    (
        "fairgate_endpoint_failovers_total",
        None,
        "Requests an endpoint refused or failed that were sent on to another endpoint.",
    ),
    (
        "fairgate_endpoint_overloads_total",
        None,
        "429 and 503 answers of an endpoint (its learned limit's feedback).",
    ),
    (
        "fairgate_tenant_changes_total",
        None,
        "Changes of tenants and keys made through the admin API on this replica, by op.",
    ),
    (
        "fairgate_tenant_sync_failures_total",
        None,
        "Reads of the runtime tenants' change log that failed (cluster mode; the last known \
         tenants keep serving).",
    ),
    (
        "fairgate_untrusted_tenant_header_total",
        None,
        "Requests carrying the tenant header from outside [server] trusted_sources (ignored).",
    ),
    (
        "fairgate_connections_refused_total",
        None,
        "Connections closed as soon as accepted, by the limit that refused them.",
    ),
    (
        "fairgate_connections_shed_total",
        None,
        "Idle connections closed to make room, by reason.",
    ),
    (
        "fairgate_cluster_sync_unapplied_total",
        None,
        "Cluster sync batches Redis did not apply (renumbered and sent again).",
    ),
    (
        "fairgate_otel_dropped_total",
        None,
        "Requests whose spans were dropped because the export queue was full.",
    ),
    (
        "fairgate_otel_exported_total",
        None,
        "Spans accepted by the OpenTelemetry collector.",
    ),
    (
        "fairgate_otel_failed_total",
        None,
        "Spans lost to a failed export call.",
    ),
    (
        "fairgate_batch_lines_total",
        None,
        "Batch lines finished, by outcome (completed, failed, retried).",
    ),
    (
        "fairgate_jobs_late_total",
        None,
        "Job answers discarded because the replica's claim had expired.",
    ),
];

/// (family, unit, help) of the gauges.
const GAUGES: &[(&str, Option<Unit>, &str)] = &[
    ("fairgate_upstream_limit", None, "The upstream pool's learned concurrency limit (lowered by the provider's 429s)."),
    ("fairgate_endpoint_in_flight", None, "Requests on an endpoint's wire."),
    ("fairgate_endpoint_limit", None, "An endpoint's learned concurrency limit (1 while it is probed)."),
    ("fairgate_endpoint_state", None, "1 for the state an endpoint is in (in_service, paused, probing, ejected), 0 for the others."),
    ("fairgate_jain_index", None, "Jain's fairness index of the weighted service of backlogged tenants over the last 30 s, by pool."),
    ("fairgate_cluster_degraded", None, "1 while Redis is unreachable and the replica runs on its local allowance (cluster mode)."),
    ("fairgate_connections", None, "Client connections open, by state (active: a request in flight; idle)."),
    ("fairgate_jobs", None, "Jobs by state (queued, running, completed, failed, cancelled)."),
    ("fairgate_jobs_oldest_queued_seconds", Some(Unit::Seconds), "Age of the oldest queued job."),
];

/// (family, unit, help) of the histograms.
const HISTOGRAMS: &[(&str, Option<Unit>, &str)] = &[
    ("fairgate_queue_wait_seconds", Some(Unit::Seconds), "Time a request waited in the fair queue before dispatch, by class."),
    ("fairgate_request_duration_seconds", Some(Unit::Seconds), "Time from a request's arrival to the end of its response body."),
    ("fairgate_time_to_first_byte_seconds", Some(Unit::Seconds), "Time from a request's arrival to the first byte of its response body."),
    ("fairgate_estimate_error_ratio", None, "Actual tokens / estimated tokens of a reconciled request."),
    ("gen_ai_client_token_usage", None, "Number of input and output tokens used (the provider's reported usage), per request (OpenTelemetry gen_ai.client.token.usage)."),
    ("gen_ai_client_operation_duration_seconds", Some(Unit::Seconds), "GenAI operation duration: arrival to the end of the response body (OpenTelemetry gen_ai.client.operation.duration)."),
];

/// Describes every registry family in `recorder`.
pub(super) fn describe(recorder: &PrometheusRecorder) {
    let text = |s: &'static str| SharedString::const_str(s);
    for &(name, unit, help) in COUNTERS {
        recorder.describe_counter(KeyName::from_const_str(name), unit, text(help));
    }
    for &(name, unit, help) in GAUGES {
        recorder.describe_gauge(KeyName::from_const_str(name), unit, text(help));
    }
    for &(name, unit, help) in HISTOGRAMS {
        recorder.describe_histogram(KeyName::from_const_str(name), unit, text(help));
    }
}
