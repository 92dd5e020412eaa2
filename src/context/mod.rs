//! The per-request context: what the stages of one request learn about it, each field written
//! by exactly one stage and read by the stages after it (below it on the way in, above it on the
//! way out).
//!
//! The outermost layer (`render`) creates one [`Context`] per request and puts the only handle,
//! a [`Ctx`], in the request's extensions; every stage below reads it with [`of`]. Each field is
//! a [`OnceLock`] with one writer, named beside it; the first write wins and a second write is a
//! bug (asserted in debug builds). A stage that needs a field that is not there was placed above
//! its writer: it gets [`Error::internal`] (a 500 and a log line), never a silent pass-through.
//!
//! Invariants: this module imports only `domain` and `error` (every stage imports it, so it can
//! import no stage); the context holds no lock, no permit and no body: what must be released
//! when a request ends is an RAII guard owned by the stage that took it.

mod outcome;
mod request;
mod tenant;
mod trace;

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};

use tokio::time::Instant;

use crate::error::{Error, Reason};
pub use outcome::{Admitted, BucketState, Deadline, Dispatch, RateState, ResponseMeta, Usage};
pub use request::{Document, Endpoint, Estimate, Input, Parsed, Route};
pub use tenant::{Identity, OwnKeys, ProviderKey, Tenant};
pub use trace::{Trace, TRACEPARENT};

/// What one request's stages learn about it; see the module docs for the rules.
#[derive(Debug)]
pub struct Context {
    /// When the request arrived. Writer: `render`, at creation.
    started: Instant,
    /// The client's `x-request-id` (visible ASCII, at most 128 bytes), else one generated here.
    /// Writer: `render`, at creation.
    request_id: RequestId,
    /// The request's trace: the client's `traceparent` continued, else a new one. Writer:
    /// `render`, at creation.
    trace: Trace,
    /// When estimation began and ended (the `fairgate.estimate` span). Writer: `estimate`.
    estimated_span: OnceLock<(Instant, Instant)>,
    /// The provider's `x-request-id`. Writer: `upstream`.
    upstream_request_id: OnceLock<http::HeaderValue>,
    /// Who is calling. Writer: `tenant`.
    identity: OnceLock<Identity>,
    /// The parsed JSON body of a JSON endpoint. Writer: `body`.
    request: OnceLock<Parsed>,
    /// The upstream pool. Writer: `route`.
    route: OnceLock<Route>,
    /// The counted input and admission-time charge. Writer: `estimate`.
    estimate: OnceLock<Estimate>,
    /// The tenant's rate-limit buckets as admission charged (or refused) the request with.
    /// Writer: `admission`.
    rate: OnceLock<RateState>,
    /// Admitted: the charge and deadline. Writer: `admission`.
    admitted: OnceLock<Admitted>,
    /// The fair queue's grant: time queued, cost charged. Writer: `queue`.
    dispatch: OnceLock<Dispatch>,
    /// Upstream attempts beyond the first. Writer: `feedback` (the retry stage).
    retries: AtomicU32,
    /// The pool's endpoint the current (at the end: the last) attempt went to. Writer:
    /// `feedback` (the retry stage), once per attempt.
    endpoint: arc_swap::ArcSwapOption<SentTo>,
    /// What the request actually cost, from the provider's usage (or the stated fallback).
    /// Writer: `usage`.
    usage: OnceLock<Usage>,
    /// The client accepted no bytes of the response for `[server] client_write_timeout_ms`
    /// and the response was aborted. Writer: the connection's write watchdog
    /// (`server::stall`), before it drops the body (so the log line sees it).
    stalled: AtomicBool,
    /// The response stream was ended by fairgate for this reason ([`Reason::StreamBudget`]:
    /// the tenant's `max_stream_output_tokens` or remaining token budget was passed). Writer:
    /// `usage`.
    cut: OnceLock<Reason>,
    /// The request's spans are recorded and exported (the sampler's decision, made once the
    /// tenant is known; false without `[otel]`). Writer: `metrics`.
    recorded: AtomicBool,
    /// What the provider's answer said about itself (id, model, finish reasons), read only for
    /// recorded requests. Writer: `usage`.
    response: OnceLock<ResponseMeta>,
}

/// The client connection's peer address, put in each request's extensions by the connection
/// that read it (`server::connection`); the tenant stage trusts a sidecar header only from
/// `[server] trusted_sources`. Absent (a request not read from a socket): trusted nowhere.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerAddr(pub std::net::IpAddr);

/// A request body handed on unread: `POST /v1/files`, whose body (up to `[jobs]
/// max_file_bytes`, far over `max_body_bytes`) the `jobs` stage parses as a stream. Put in the
/// request's extensions by `body` (the request itself goes on with an empty body); taken once.
#[derive(Clone)]
pub struct Upload(Arc<std::sync::Mutex<Option<UploadBody>>>);

/// The body of an [`Upload`].
pub type UploadBody = http_body_util::combinators::UnsyncBoxBody<
    bytes::Bytes,
    Box<dyn std::error::Error + Send + Sync>,
>;

impl Upload {
    /// Hands `body` on.
    pub fn new(body: UploadBody) -> Self {
        Self(Arc::new(std::sync::Mutex::new(Some(body))))
    }

    /// The body, once.
    pub fn take(&self) -> Option<UploadBody> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

impl std::fmt::Debug for Upload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upload").finish_non_exhaustive()
    }
}

/// A job re-entering the stack (`jobs::runner`): put in the request's extensions by the runner,
/// never by a connection (extensions do not come from the wire). The tenant stage identifies
/// the request as `tenant` in the batch class without a key; `refused` receives fairgate's own
/// refusal (status, metrics reason) so the runner can tell "try again later" from a final answer.
#[derive(Clone, Debug)]
pub struct JobRun {
    /// Whose job it is.
    pub tenant: crate::domain::TenantId,
    /// A refusal by a stage (never sent to the provider): written by the `jobs` stage.
    pub refused: Arc<OnceLock<(http::StatusCode, Reason)>>,
}

/// The endpoint of the routed pool an attempt is sent to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SentTo {
    /// Its index in the pool's `[[upstreams.endpoints]]`.
    pub index: usize,
    /// Its name.
    pub name: Arc<str>,
}

/// The handle to a request's [`Context`] (cheap to clone; in the request's extensions).
#[derive(Clone, Debug)]
pub struct Ctx(Arc<Context>);

impl std::ops::Deref for Ctx {
    type Target = Context;
    fn deref(&self) -> &Context {
        &self.0
    }
}

/// A request's own id and where it came from.
#[derive(Debug)]
struct RequestId {
    value: http::HeaderValue,
    from_client: bool,
}

/// Response and request header: the request id.
pub const REQUEST_ID_HEADER: http::HeaderName = http::HeaderName::from_static("x-request-id");

/// Longest client request id kept (a longer or non-printable one is replaced).
const MAX_REQUEST_ID: usize = 128;

impl Ctx {
    /// A new, empty context for a request arriving now.
    pub fn new() -> Self {
        Self::with_request_id(None)
    }

    /// A new context for a request that carried `client_id` as its `x-request-id` (kept if it
    /// is visible ASCII of at most 128 bytes, else a fresh id is generated).
    pub fn with_request_id(client_id: Option<&http::HeaderValue>) -> Self {
        Self::with_ids(client_id, None)
    }

    /// As [`Ctx::with_request_id`], continuing the client's `traceparent` if valid.
    pub fn with_ids(
        client_id: Option<&http::HeaderValue>,
        traceparent: Option<&http::HeaderValue>,
    ) -> Self {
        let kept = client_id.filter(|v| {
            !v.is_empty()
                && v.len() <= MAX_REQUEST_ID
                && v.as_bytes().iter().all(|b| b.is_ascii_graphic())
        });
        let request_id = match kept {
            Some(v) => RequestId {
                value: v.clone(),
                from_client: true,
            },
            None => RequestId {
                value: generated_id(rand::random::<u128>()),
                from_client: false,
            },
        };
        Self(Arc::new(Context {
            started: Instant::now(),
            request_id,
            trace: Trace::from_header(traceparent),
            estimated_span: OnceLock::new(),
            upstream_request_id: OnceLock::new(),
            identity: OnceLock::new(),
            request: OnceLock::new(),
            route: OnceLock::new(),
            estimate: OnceLock::new(),
            rate: OnceLock::new(),
            admitted: OnceLock::new(),
            dispatch: OnceLock::new(),
            retries: AtomicU32::new(0),
            endpoint: arc_swap::ArcSwapOption::empty(),
            usage: OnceLock::new(),
            stalled: AtomicBool::new(false),
            cut: OnceLock::new(),
            recorded: AtomicBool::new(false),
            response: OnceLock::new(),
        }))
    }
}

/// `fg-` and `n` in 32 lowercase hex digits (a request id of fairgate's own), written without
/// the formatting machinery: one per request.
fn generated_id(n: u128) -> http::HeaderValue {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = [0u8; 35];
    out[..3].copy_from_slice(b"fg-");
    for (i, b) in out[3..].iter_mut().enumerate() {
        *b = HEX[(n >> (124 - 4 * i) & 0xf) as usize];
    }
    http::HeaderValue::from_bytes(&out).expect("hex is a valid header value")
}

impl Default for Ctx {
    fn default() -> Self {
        Self::new()
    }
}

/// The context of `req`; its absence means `render` is not the outermost layer (a bug).
pub fn of<B>(req: &http::Request<B>) -> Result<Ctx, Error> {
    req.extensions()
        .get::<Ctx>()
        .cloned()
        .ok_or_else(|| Error::internal("request context missing: `render` must be outermost"))
}

fn set<T: std::fmt::Debug>(cell: &OnceLock<T>, value: T, field: &'static str) {
    let fresh = cell.set(value).is_ok();
    debug_assert!(fresh, "context field `{field}` written twice");
}

/// Reads of a field; `Err` names the field and the stage that should have written it.
macro_rules! required {
    ($name:ident, $ty:ty, $writer:literal) => {
        #[doc = concat!("The `", stringify!($name), "` field (written by `", $writer, "`); `Err` (a bug) if that stage has not run.")]
        pub fn $name(&self) -> Result<&$ty, Error> {
            self.$name.get().ok_or_else(|| {
                Error::internal(concat!(
                    "context field `", stringify!($name), "` missing: `", $writer,
                    "` must run before this stage"
                ))
            })
        }
    };
}

impl Context {
    required!(identity, Identity, "tenant");
    required!(request, Parsed, "body");
    required!(route, Route, "route");
    required!(estimate, Estimate, "estimate");
    required!(admitted, Admitted, "admission");

    /// When the request arrived.
    pub fn started(&self) -> Instant {
        self.started
    }

    /// The request's trace ids.
    pub fn trace(&self) -> &Trace {
        &self.trace
    }

    /// When estimation began and ended, if it ran.
    pub fn estimated_span(&self) -> Option<(Instant, Instant)> {
        self.estimated_span.get().copied()
    }

    /// Writer: `estimate`.
    pub fn set_estimated_span(&self, began: Instant, ended: Instant) {
        set(&self.estimated_span, (began, ended), "estimated_span");
    }

    /// The request's id as the client sees it: the client's own, else the provider's, else
    /// the one generated at arrival.
    pub fn request_id(&self) -> &http::HeaderValue {
        match self.upstream_request_id.get() {
            Some(up) if !self.request_id.from_client => up,
            _ => &self.request_id.value,
        }
    }

    /// The id fairgate forwards upstream when the client sent none (the generated one).
    pub fn own_request_id(&self) -> &http::HeaderValue {
        &self.request_id.value
    }

    /// Writer: `upstream` (the provider's `x-request-id` of the answer passed on; the first
    /// write wins).
    pub fn set_upstream_request_id_once(&self, v: http::HeaderValue) {
        let _ = self.upstream_request_id.set(v);
    }

    /// The identity, if `tenant` has run.
    pub fn identity_if_known(&self) -> Option<&Identity> {
        self.identity.get()
    }

    /// The parsed body, if this is a JSON endpoint and `body` has run.
    pub fn request_if_parsed(&self) -> Option<&Parsed> {
        self.request.get()
    }

    /// The estimate, if `estimate` has run.
    pub fn estimate_if_counted(&self) -> Option<&Estimate> {
        self.estimate.get()
    }

    /// The rate-limit state admission charged or refused the request with, if it did.
    pub fn rate(&self) -> Option<RateState> {
        self.rate.get().copied()
    }

    /// The fair queue's grant, once dispatched.
    pub fn dispatch(&self) -> Option<&Dispatch> {
        self.dispatch.get()
    }

    /// Upstream attempts beyond the first, so far.
    pub fn retries(&self) -> u32 {
        self.retries.load(Ordering::Relaxed)
    }

    /// The endpoint the current (after the response: the last) attempt went to.
    pub fn endpoint(&self) -> Option<Arc<SentTo>> {
        self.endpoint.load_full()
    }

    /// The actual cost, once `usage` has reconciled the response.
    pub fn usage(&self) -> Option<Usage> {
        self.usage.get().copied()
    }

    /// Whether the response was aborted because the client stopped reading it.
    pub fn stalled(&self) -> bool {
        self.stalled.load(Ordering::Relaxed)
    }

    /// Why fairgate ended the response stream early, if it did.
    pub fn cut(&self) -> Option<Reason> {
        self.cut.get().copied()
    }

    /// Writer: `usage` (the stream was cut for `reason`).
    pub fn set_cut(&self, reason: Reason) {
        set(&self.cut, reason, "cut");
    }

    /// Writer: the connection's write watchdog (`server::stall`).
    pub fn set_stalled(&self) {
        self.stalled.store(true, Ordering::Relaxed);
    }

    /// Writer: `tenant`.
    pub fn set_identity(&self, v: Identity) {
        set(&self.identity, v, "identity");
    }

    /// Writer: `body`.
    pub fn set_request(&self, v: Parsed) {
        set(&self.request, v, "request");
    }

    /// Writer: `route`.
    pub fn set_route(&self, v: Route) {
        set(&self.route, v, "route");
    }

    /// Writer: `estimate`.
    pub fn set_estimate(&self, v: Estimate) {
        set(&self.estimate, v, "estimate");
    }

    /// Writer: `admission`.
    pub fn set_rate(&self, v: RateState) {
        set(&self.rate, v, "rate");
    }

    /// Writer: `admission`.
    pub fn set_admitted(&self, v: Admitted) {
        set(&self.admitted, v, "admitted");
    }

    /// Writer: `queue`.
    pub fn set_dispatch(&self, v: Dispatch) {
        set(&self.dispatch, v, "dispatch");
    }

    /// Writer: `feedback` (the endpoint of the attempt about to be sent).
    pub fn set_endpoint(&self, to: SentTo) {
        self.endpoint.store(Some(Arc::new(to)));
    }

    /// Writer: `feedback` (one more upstream attempt).
    pub fn add_retry(&self) {
        self.retries.fetch_add(1, Ordering::Relaxed);
    }

    /// Writer: `usage`.
    pub fn set_usage(&self, v: Usage) {
        set(&self.usage, v, "usage");
    }

    /// Whether the request's spans are recorded (see the field).
    pub fn recorded(&self) -> bool {
        self.recorded.load(Ordering::Relaxed)
    }

    /// Writer: `metrics` (the sampler's decision).
    pub fn set_recorded(&self, on: bool) {
        self.recorded.store(on, Ordering::Relaxed);
    }

    /// What the provider's answer said about itself, when read (recorded requests).
    pub fn response(&self) -> Option<&ResponseMeta> {
        self.response.get()
    }

    /// Writer: `usage`.
    pub fn set_response(&self, v: ResponseMeta) {
        set(&self.response, v, "response");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_field_is_an_internal_error_naming_its_writer() {
        let ctx = Ctx::new();
        let e = ctx.route().unwrap_err();
        assert_eq!(e.status(), 500);
        assert!(e.to_string().contains("`route` must run"), "{e}");
        ctx.set_route(Route { pool: 2 });
        assert_eq!(ctx.route().unwrap().pool, 2);
    }

    #[test]
    fn the_request_id_is_the_clients_else_the_providers_else_generated() {
        let generated = Ctx::new();
        let own = generated.request_id().clone();
        assert!(own.to_str().unwrap().starts_with("fg-"));
        generated.set_upstream_request_id_once(http::HeaderValue::from_static("req_up"));
        assert_eq!(generated.request_id(), "req_up");
        assert_eq!(generated.own_request_id(), &own);
        let client = Ctx::with_request_id(Some(&http::HeaderValue::from_static("abc-1")));
        client.set_upstream_request_id_once(http::HeaderValue::from_static("req_up"));
        assert_eq!(client.request_id(), "abc-1");
        let long = http::HeaderValue::try_from("x".repeat(200)).unwrap();
        let replaced = Ctx::with_request_id(Some(&long));
        assert!(replaced.request_id().to_str().unwrap().starts_with("fg-"));
        let spaced = Ctx::with_request_id(Some(&http::HeaderValue::from_static("a b")));
        assert!(spaced.request_id().to_str().unwrap().starts_with("fg-"));
    }

    #[test]
    fn a_generated_id_is_the_number_in_32_hex_digits() {
        for n in [0u128, 1, 0xdead_beef, u128::MAX, rand::random()] {
            assert_eq!(generated_id(n), format!("fg-{n:032x}").as_str());
        }
    }

    #[test]
    fn a_request_without_context_is_an_internal_error() {
        let req = http::Request::new(());
        assert_eq!(of(&req).unwrap_err().status(), 500);
        let mut req = http::Request::new(());
        req.extensions_mut().insert(Ctx::new());
        assert!(of(&req).is_ok());
    }
}
