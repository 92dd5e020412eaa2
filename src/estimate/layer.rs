//! The estimate stage in the tower stack: counts input tokens (inline for small bodies, on the
//! bounded blocking pool for large ones), rewrites a stream request to ask for usage when the
//! client did not, and writes the context's [`Estimate`] for admission, the fair queue and the
//! `usage` stage.
//!
//! Bounded work before admission: counting a body stops at `[estimate] max_exact_bytes` (the
//! rest is extrapolated), so each request costs a fixed CPU budget. Large bodies are counted on
//! the blocking pool, at most [`BLOCKING_PERMITS`] at once and at most [`BLOCKING_PER_TENANT`]
//! of one tenant at once: a tenant flooding huge bodies waits for its own turns and holds at
//! most half of the pool's, so another tenant's body finds a free turn (or waits behind at most
//! one turn per other tenant, not behind the flood). Both turns move into the blocking task: a
//! request cancelled while its body is counted keeps them until the counting ends, so
//! cancelling cannot multiply the work in progress.
//!
//! Invariants: runs after routing (an unroutable model costs no counting) and before admission;
//! a request without the context's identity or parsed body is a misordered stack (500); the
//! body is rewritten at most once, and only to set `stream_options.include_usage = true` (that
//! request then asks the provider for `Accept-Encoding: identity`, so the usage chunk can be
//! removed from the stream).

use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response};
use serde_json::Value;
use tokio::sync::Semaphore;

use super::{Endpoint, Error, Estimate, Estimator, OutputKey};
use crate::context::Parsed;
use crate::domain::{Charge, TenantId};
use crate::response::ResponseBody;

/// Bodies up to this size are counted on the runtime worker (well under a millisecond).
pub const INLINE_MAX_BYTES: usize = 64 * 1024;
/// Large bodies counted on the blocking pool at once; more wait for a turn.
pub const BLOCKING_PERMITS: usize = 4;
/// Large bodies of one tenant counted at once (half the turns): a flood leaves the rest free.
pub const BLOCKING_PER_TENANT: usize = BLOCKING_PERMITS / 2;

/// The estimate stage: holds the shared estimator and the blocking-pool semaphores (cloning
/// shares them).
#[derive(Clone)]
pub struct Counting {
    estimator: Arc<Estimator>,
    blocking: Arc<Semaphore>,
    tenants: Arc<TenantTurns>,
    /// Countings finished on the blocking pool (their turns are released right after).
    counted: Arc<std::sync::atomic::AtomicU64>,
}

/// The estimate layer (`Layer::new(estimator)`).
pub type Layer = crate::stage::Layer<Counting>;

impl From<Arc<Estimator>> for Counting {
    fn from(estimator: Arc<Estimator>) -> Self {
        Self::new(estimator)
    }
}

impl Counting {
    /// A stage counting with `estimator`.
    pub fn new(estimator: Arc<Estimator>) -> Self {
        Self {
            estimator,
            blocking: Arc::new(Semaphore::new(BLOCKING_PERMITS)),
            tenants: Arc::default(),
            counted: Arc::default(),
        }
    }

    /// Blocking-pool turns free now.
    pub fn turns_free(&self) -> usize {
        self.blocking.available_permits()
    }

    /// Countings finished on the blocking pool so far.
    pub fn counted(&self) -> u64 {
        self.counted.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// One semaphore of [`BLOCKING_PER_TENANT`] turns per tenant with a large body in counting;
/// an entry goes when its last turn does (the map is bounded by the tenants counting).
#[derive(Default)]
struct TenantTurns(std::sync::Mutex<std::collections::HashMap<TenantId, Arc<Semaphore>>>);

/// A tenant's turn; dropping it removes the tenant's entry once nobody holds or waits for it.
struct TenantTurn {
    turns: Arc<TenantTurns>,
    tenant: TenantId,
    permit: Option<tokio::sync::OwnedSemaphorePermit>,
}

impl TenantTurns {
    async fn acquire(self: &Arc<Self>, tenant: &TenantId) -> Option<TenantTurn> {
        let sem = {
            let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
            map.entry(tenant.clone())
                .or_insert_with(|| Arc::new(Semaphore::new(BLOCKING_PER_TENANT)))
                .clone()
        };
        let mut turn = TenantTurn {
            turns: self.clone(),
            tenant: tenant.clone(),
            permit: None,
        };
        turn.permit = Some(sem.acquire_owned().await.ok()?);
        Some(turn)
    }
}

impl Drop for TenantTurn {
    fn drop(&mut self) {
        drop(self.permit.take());
        let mut map = self.turns.0.lock().unwrap_or_else(|p| p.into_inner());
        // Only the map holds it: nobody counts or waits for this tenant any more.
        if map
            .get(&self.tenant)
            .is_some_and(|s| Arc::strong_count(s) == 1)
        {
            map.remove(&self.tenant);
        }
    }
}

impl<S> crate::stage::Stage<Request<Bytes>, S> for Counting
where
    S: crate::stage::Below<Request<Bytes>, Response<ResponseBody>, crate::Error>,
{
    type Down = Request<Bytes>;

    async fn call(
        self,
        mut req: Request<Bytes>,
        mut inner: S,
    ) -> Result<Response<ResponseBody>, crate::Error> {
        let layer = self;
        let began = tokio::time::Instant::now();
        let ctx = crate::context::of(&req)?;
        let endpoint = Endpoint::of_path(req.uri().path())
            .ok_or_else(|| crate::Error::internal("estimate reached by an unrouted path"))?;
        let tenant = ctx.identity()?.tenant.id.clone();
        let parsed = ctx.request()?;
        // The last reader of the parse: released below, once counted.
        let value = parsed.value.get().ok_or_else(|| {
            crate::Error::internal("the parsed body was released before estimate")
        })?;
        let est = &layer.estimator;
        let input = if req.body().len() <= INLINE_MAX_BYTES {
            est.count(endpoint, &parsed.model, &value)
        } else {
            // The tenant's turn first: a flood queues on its own semaphore, and the pool's
            // queue holds at most a few waiters per tenant.
            let own = layer
                .tenants
                .acquire(&tenant)
                .await
                .ok_or(Error::Counting)?;
            let turn = layer
                .blocking
                .clone()
                .acquire_owned()
                .await
                .map_err(|_| Error::Counting)?;
            let (est, ctx, counted) = (est.clone(), ctx.clone(), layer.counted.clone());
            let value = value.clone();
            // The turns move into the task: a client that goes away while its body is
            // counted does not free them before the counting ends.
            tokio::task::spawn_blocking(move || {
                // Dropped in this order: the pool's turn before the tenant's, so the tenant
                // never holds more pool turns than its own.
                let turns = (turn, own);
                let parsed = ctx.request()?;
                let n = est.count(endpoint, &parsed.model, &value);
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                drop(turns);
                Ok::<_, crate::Error>(n)
            })
            .await
            .map_err(|_| Error::Counting)??
        };
        let input = input?;
        let strip_usage = asks_usage_for_client(endpoint, parsed, &value);
        if strip_usage {
            if let Some(body) = with_include_usage(req.body(), &value) {
                *req.body_mut() = body;
            }
            // The usage chunk is removed from the stream, which needs plain bytes: a coded
            // stream would reach the client with that chunk in it.
            req.headers_mut().insert(
                http::header::ACCEPT_ENCODING,
                http::HeaderValue::from_static("identity"),
            );
        }
        let Output {
            max_output_tokens,
            choices,
            tokens: output,
        } = output(
            endpoint,
            parsed.max_tokens,
            parsed.choices,
            &value,
            est.config().default_output_tokens,
        );
        ctx.set_estimate(Estimate {
            endpoint,
            input,
            max_output_tokens,
            choices,
            key: OutputKey::new(tenant, &parsed.model),
            model_weight: est.model_weight(&parsed.model),
            encoding: est.encoding(&parsed.model),
            stream: parsed.stream,
            strip_usage,
            charge: Charge {
                input: input.tokens,
                output,
            },
        });
        ctx.set_estimated_span(began, tokio::time::Instant::now());
        // Nothing below reads the parse (the scalars of `Parsed` stay): a queued request keeps
        // only its body bytes (issue 25).
        drop(value);
        parsed.value.release();
        inner.call(req).await
    }
}

/// What a request may produce, as estimated before it runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Output {
    /// Its output cap: the request's (`max_tokens` & co), none for embeddings (0).
    max_output_tokens: Option<u64>,
    /// Choices it generates: `n`/`best_of` for chat, times the prompts for completions, one for
    /// embeddings and responses.
    choices: u64,
    /// Output tokens charged: the cap (else `default_output`) times the choices.
    tokens: u64,
}

/// The output side of a request's estimate (`value`: its parsed body, for the prompts of a
/// completions request).
fn output(
    endpoint: Endpoint,
    max_tokens: Option<u64>,
    choices: u64,
    value: &Value,
    default_output: u64,
) -> Output {
    let max_output_tokens = if endpoint == Endpoint::Embeddings {
        Some(0)
    } else {
        max_tokens
    };
    let choices = match endpoint {
        Endpoint::Embeddings | Endpoint::Responses => 1,
        Endpoint::Chat => choices,
        Endpoint::Completions => choices.saturating_mul(super::request::prompts(value)),
    };
    Output {
        max_output_tokens,
        choices,
        tokens: max_output_tokens
            .unwrap_or(default_output)
            .saturating_mul(choices),
    }
}

/// Whether usage must be asked for on the client's behalf: a chat or completions stream whose
/// `stream_options` (absent or an object) does not already ask for it.
fn asks_usage_for_client(endpoint: Endpoint, p: &Parsed, value: &Value) -> bool {
    matches!(endpoint, Endpoint::Chat | Endpoint::Completions)
        && p.stream
        && !p.include_usage
        && value
            .get("stream_options")
            .is_none_or(|o| o.is_object() || o.is_null())
}

/// The body with `stream_options.include_usage = true`. The parsed form keeps only the fields
/// fairgate reads (`body::KEPT_FIELDS`), so the body is rewritten from its bytes: without
/// `stream_options` (the usual case) by inserting the member after the opening brace, every
/// other byte as received; with one (an object or null), by parsing the whole body once more.
fn with_include_usage(body: &Bytes, kept: &Value) -> Option<Bytes> {
    if kept.get("stream_options").is_none() {
        let open = body.iter().position(|b| *b == b'{')?;
        const MEMBER: &[u8] = br#""stream_options":{"include_usage":true},"#;
        let mut out = Vec::with_capacity(body.len() + MEMBER.len());
        out.extend_from_slice(&body[..=open]);
        out.extend_from_slice(MEMBER);
        out.extend_from_slice(&body[open + 1..]);
        return Some(Bytes::from(out));
    }
    let mut v: Value = serde_json::from_slice(body).ok()?;
    let obj = v.as_object_mut()?;
    let opts = obj
        .entry("stream_options")
        .or_insert_with(|| Value::Object(Default::default()));
    if opts.is_null() {
        *opts = Value::Object(Default::default());
    }
    opts.as_object_mut()?
        .insert("include_usage".into(), Value::Bool(true));
    serde_json::to_vec(&v).ok().map(Bytes::from)
}

#[cfg(test)]
mod rewrite_tests {
    use super::*;

    #[test]
    fn the_output_charge_is_the_cap_or_the_default_times_the_choices() {
        let v = serde_json::json!({"prompt": ["a", "b", "c"]});
        let o = |e, cap, n| output(e, cap, n, &v, 256);
        let out = |max_output_tokens, choices, tokens| Output {
            max_output_tokens,
            choices,
            tokens,
        };
        assert_eq!(o(Endpoint::Chat, Some(100), 2), out(Some(100), 2, 200));
        assert_eq!(o(Endpoint::Chat, None, 1), out(None, 1, 256));
        assert_eq!(o(Endpoint::Completions, Some(10), 2), out(Some(10), 6, 60));
        assert_eq!(o(Endpoint::Responses, Some(10), 4), out(Some(10), 1, 10));
        assert_eq!(o(Endpoint::Embeddings, Some(10), 4), out(Some(0), 1, 0));
        assert_eq!(o(Endpoint::Chat, Some(u64::MAX), 2).tokens, u64::MAX);
    }

    #[test]
    fn include_usage_is_added_and_unknown_fields_survive() {
        let body = Bytes::from_static(br#" {"model":"m","stream":true,"blob":"zz","messages":[]}"#);
        // The parsed form keeps no unknown field (`body::KEPT_FIELDS`).
        let kept = serde_json::json!({"model":"m","stream":true,"messages":[]});
        let out = with_include_usage(&body, &kept).unwrap();
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["stream_options"]["include_usage"], true);
        assert_eq!(v["blob"], "zz");
        let body = Bytes::from_static(br#"{"model":"m","stream_options":null,"blob":1}"#);
        let kept = serde_json::json!({"model":"m","stream_options":null});
        let v: Value = serde_json::from_slice(&with_include_usage(&body, &kept).unwrap()).unwrap();
        assert_eq!(v["stream_options"]["include_usage"], true);
        assert_eq!(v["blob"], 1);
    }
}
