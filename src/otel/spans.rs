//! The spans of one finished request, as the SDK's `SpanData`, built from the timestamps its
//! context already holds: `fairgate.request` (server; the client's span as its remote parent
//! when it sent a `traceparent`) and, for the stages it reached, `fairgate.estimate`,
//! `fairgate.queue` (internal) and `fairgate.upstream` (client; its id is the parent the
//! provider is sent). Attributes are ids, counts and static names only: never a key, a header
//! value, a prompt or a completion.

use std::borrow::Cow;
use std::time::{Duration, UNIX_EPOCH};

use opentelemetry::trace::{
    SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState,
};
use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanLinks};
use tokio::time::Instant;

use super::Ending;
use crate::context::Context;

fn int(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn random_id() -> SpanId {
    SpanId::from_bytes(rand::random::<u64>().max(1).to_be_bytes())
}

/// The spans of one request: the request span last, after whichever stages it reached.
/// Empty when the client's trace is not sampled.
pub fn spans(ctx: &Context, end: &Ending<'_>, scope: &InstrumentationScope) -> Vec<SpanData> {
    let trace = ctx.trace();
    if !trace.sampled {
        return Vec::new();
    }
    let started = ctx.started();
    let at = |i: Instant| UNIX_EPOCH + Duration::from_nanos(trace.unix_nanos(started, i));
    let trace_id = TraceId::from_bytes(trace.trace_id);
    let request_id = SpanId::from_bytes(trace.span);
    let span = |name: &'static str, kind, id, parent, (start, stop): (Instant, Instant)| SpanData {
        span_context: SpanContext::new(trace_id, id, TraceFlags::SAMPLED, false, TraceState::NONE),
        parent_span_id: parent,
        parent_span_is_remote: false,
        span_kind: kind,
        name: Cow::Borrowed(name),
        start_time: at(start),
        end_time: at(stop.max(start)),
        attributes: Vec::new(),
        dropped_attributes_count: 0,
        events: SpanEvents::default(),
        links: SpanLinks::default(),
        status: Status::Unset,
        instrumentation_scope: scope.clone(),
    };
    let mut out = Vec::with_capacity(4);
    if let Some(stage) = ctx.estimated_span() {
        let mut s = span(
            "fairgate.estimate",
            SpanKind::Internal,
            random_id(),
            request_id,
            stage,
        );
        if let Some(e) = ctx.estimate_if_counted() {
            s.attributes
                .push(KeyValue::new("fairgate.tokens.input", int(e.input.tokens)));
        }
        out.push(s);
    }
    if let Some(d) = ctx.dispatch() {
        let queued = d.at.checked_sub(d.waited).unwrap_or(d.at);
        let mut q = span(
            "fairgate.queue",
            SpanKind::Internal,
            random_id(),
            request_id,
            (queued, d.at),
        );
        let waited = u64::try_from(d.waited.as_millis()).unwrap_or(u64::MAX);
        q.attributes
            .push(KeyValue::new("fairgate.queue_ms", int(waited)));
        out.push(q);
        let upstream_id = SpanId::from_bytes(trace.upstream_span);
        let mut u = span(
            "fairgate.upstream",
            SpanKind::Client,
            upstream_id,
            request_id,
            (d.at, end.at),
        );
        u.attributes
            .push(KeyValue::new("fairgate.retries", i64::from(ctx.retries())));
        if let Some(to) = ctx.endpoint() {
            u.attributes
                .push(KeyValue::new("fairgate.endpoint", to.name.to_string()));
        }
        out.push(u);
    }
    let parent = trace.parent.map_or(SpanId::INVALID, SpanId::from_bytes);
    let mut r = span(
        "fairgate.request",
        SpanKind::Server,
        request_id,
        parent,
        (started, end.at),
    );
    r.parent_span_is_remote = trace.parent.is_some();
    r.attributes = request_attributes(ctx, end);
    if let Some(why) = end.refused {
        r.status = Status::error(why);
    } else if end.status >= 500 {
        r.status = Status::error(format!("status {}", end.status));
    }
    out.push(r);
    out
}

fn request_attributes(ctx: &Context, end: &Ending<'_>) -> Vec<KeyValue> {
    let mut a = vec![KeyValue::new(
        "http.response.status_code",
        i64::from(end.status),
    )];
    if let Some(id) = ctx.identity_if_known() {
        a.push(KeyValue::new(
            "fairgate.tenant",
            id.tenant.id.as_str().to_owned(),
        ));
    }
    if let Some(m) = end.model {
        a.push(KeyValue::new("gen_ai.request.model", m.to_owned()));
    }
    if let Some(e) = end.estimated {
        a.push(KeyValue::new("fairgate.tokens.estimated", int(e)));
    }
    if let Some(t) = end.actual {
        a.push(KeyValue::new("fairgate.tokens.actual", int(t)));
    }
    if let Some(l) = end.limit {
        a.push(KeyValue::new("fairgate.limit", l));
    }
    if let Some(r) = end.refused {
        a.push(KeyValue::new("fairgate.refused", r));
    }
    a
}
