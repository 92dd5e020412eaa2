//! The spans of one finished, recorded request, as the SDK's `SpanData`, built from the
//! timestamps its context already holds, named and attributed by OpenTelemetry's GenAI
//! semantic conventions (`semconv`):
//!
//! - the request span (SERVER; the client's span as its remote parent when it sent a
//!   `traceparent`), named `{gen_ai.operation.name} {gen_ai.request.model}` (a request to no
//!   GenAI endpoint: its HTTP method), from arrival to the end of the response body;
//! - for the stages it reached: `fairgate.estimate` and `fairgate.queue` (INTERNAL), and the
//!   upstream call (CLIENT, the same name; its id is the parent the provider is sent), from
//!   dispatch to the end of the body, retries included, with `server.address` / `server.port`.
//!
//! GenAI attributes on both: `gen_ai.operation.name`, `gen_ai.provider.name`,
//! `gen_ai.request.model` (its bounded label), `gen_ai.response.model`, `gen_ai.response.id`,
//! `gen_ai.response.finish_reasons`, `gen_ai.usage.input_tokens` / `output_tokens` (the
//! provider's reported usage, only when it reported one), `error.type`; plus
//! `http.request.method`, `http.response.status_code` and fairgate's own (`fairgate.tenant`,
//! `fairgate.tokens.*`, `fairgate.limit`, `fairgate.refused`, `fairgate.queue_ms`,
//! `fairgate.retries`). Ids, counts and names only: never a key, a header value, a prompt or a
//! completion.

use std::borrow::Cow;
use std::time::{Duration, UNIX_EPOCH};

use opentelemetry::trace::{
    SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState,
};
use opentelemetry::{Array, InstrumentationScope, KeyValue, StringValue, Value};
use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanLinks};
use tokio::time::Instant;

use super::{semconv, Ending};
use crate::context::Context;

fn int(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn random_id() -> SpanId {
    SpanId::from_bytes(rand::random::<u64>().max(1).to_be_bytes())
}

/// `{operation} {model}`, `{operation}` without a model, the method without an operation.
fn name(end: &Ending<'_>) -> Cow<'static, str> {
    match (end.endpoint.map(semconv::operation), end.model) {
        (Some(op), Some(m)) => Cow::Owned(format!("{op} {m}")),
        (Some(op), None) => Cow::Borrowed(op),
        (None, _) => Cow::Owned(end.method.as_str().to_owned()),
    }
}

/// The GenAI attributes both the request span and the client span carry.
fn genai(ctx: &Context, end: &Ending<'_>, out: &mut Vec<KeyValue>) {
    if let Some(e) = end.endpoint {
        out.push(KeyValue::new(
            "gen_ai.operation.name",
            semconv::operation(e),
        ));
        out.push(KeyValue::new(
            "gen_ai.provider.name",
            end.peer.map_or("openai", |p| p.provider),
        ));
    }
    if let Some(m) = end.model {
        out.push(KeyValue::new("gen_ai.request.model", m.to_owned()));
    }
    if let Some(r) = ctx.response() {
        if let Some(m) = &r.model {
            out.push(KeyValue::new("gen_ai.response.model", m.clone()));
        }
        if let Some(id) = &r.id {
            out.push(KeyValue::new("gen_ai.response.id", id.clone()));
        }
        if !r.finish_reasons.is_empty() {
            let reasons: Vec<StringValue> =
                r.finish_reasons.iter().map(|s| s.clone().into()).collect();
            out.push(KeyValue::new(
                "gen_ai.response.finish_reasons",
                Value::Array(Array::String(reasons)),
            ));
        }
    }
    if let Some(u) = ctx.usage().filter(|u| u.reported) {
        out.push(KeyValue::new(
            "gen_ai.usage.input_tokens",
            int(u.tokens.input),
        ));
        out.push(KeyValue::new(
            "gen_ai.usage.output_tokens",
            int(u.tokens.output),
        ));
    }
    if let Some(e) = end.error {
        out.push(KeyValue::new("error.type", e));
    }
    out.push(KeyValue::new(
        "http.request.method",
        end.method.as_str().to_owned(),
    ));
    out.push(KeyValue::new(
        "http.response.status_code",
        i64::from(end.status),
    ));
}

/// The spans of one request: the request span last, after whichever stages it reached.
/// Empty when the request is not recorded (the sampler's decision, `Ctx::recorded`).
pub fn spans(ctx: &Context, end: &Ending<'_>, scope: &InstrumentationScope) -> Vec<SpanData> {
    let trace = ctx.trace();
    if !ctx.recorded() {
        return Vec::new();
    }
    let started = ctx.started();
    let at = |i: Instant| UNIX_EPOCH + Duration::from_nanos(trace.unix_nanos(started, i));
    let trace_id = TraceId::from_bytes(trace.trace_id);
    let request_id = SpanId::from_bytes(trace.span);
    let span =
        |name: Cow<'static, str>, kind, id, parent, (start, stop): (Instant, Instant)| SpanData {
            span_context: SpanContext::new(
                trace_id,
                id,
                TraceFlags::SAMPLED,
                false,
                TraceState::NONE,
            ),
            parent_span_id: parent,
            parent_span_is_remote: false,
            span_kind: kind,
            name,
            start_time: at(start),
            end_time: at(stop.max(start)),
            attributes: Vec::new(),
            dropped_attributes_count: 0,
            events: SpanEvents::default(),
            links: SpanLinks::default(),
            status: Status::Unset,
            instrumentation_scope: scope.clone(),
        };
    let status = if let Some(why) = end.refused {
        Status::error(why)
    } else if end.status >= 500 {
        Status::error(format!("status {}", end.status))
    } else {
        Status::Unset
    };
    let name = name(end);
    let mut out = Vec::with_capacity(4);
    if let Some(stage) = ctx.estimated_span() {
        let mut s = span(
            Cow::Borrowed("fairgate.estimate"),
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
            Cow::Borrowed("fairgate.queue"),
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
            name.clone(),
            SpanKind::Client,
            upstream_id,
            request_id,
            (d.at, end.at),
        );
        genai(ctx, end, &mut u.attributes);
        if let Some(p) = end.peer {
            u.attributes
                .push(KeyValue::new("server.address", p.address.clone()));
            u.attributes
                .push(KeyValue::new("server.port", i64::from(p.port)));
        }
        u.attributes
            .push(KeyValue::new("fairgate.retries", i64::from(ctx.retries())));
        if let Some(to) = ctx.endpoint() {
            u.attributes
                .push(KeyValue::new("fairgate.endpoint", to.name.to_string()));
        }
        if end.status >= 400 {
            u.status = status.clone();
        }
        out.push(u);
    }
    let parent = trace.parent.map_or(SpanId::INVALID, SpanId::from_bytes);
    let mut r = span(
        name,
        SpanKind::Server,
        request_id,
        parent,
        (started, end.at),
    );
    r.parent_span_is_remote = trace.parent.is_some();
    genai(ctx, end, &mut r.attributes);
    fairgate(ctx, end, &mut r.attributes);
    r.status = status;
    out.push(r);
    out
}

/// fairgate's own attributes of the request span.
fn fairgate(ctx: &Context, end: &Ending<'_>, a: &mut Vec<KeyValue>) {
    if let Some(id) = ctx.identity_if_known() {
        a.push(KeyValue::new(
            "fairgate.tenant",
            id.tenant.id.as_str().to_owned(),
        ));
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
}
