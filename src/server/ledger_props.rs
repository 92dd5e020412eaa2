//! Exactly-once accounting, as a property: random sequences of requests and endings driven
//! through the real stages that charge and settle (admission and its `MemoryStore` ledger, the
//! usage observer, the fair queue's permit, the retry stage) over a fake provider, without
//! sockets. After every request, what the tenant's token ledger was charged minus what it was
//! refunded equals the reconciled usage of what reached the provider (plus one charge per
//! retried attempt), the fair queue's served tokens equal the same cost in credit, and each
//! admission is settled at most once (the store's corrections are counted). The tenant also has
//! a (never reached) day budget: the usage ledger's totals equal the sum of the usage of every
//! request that reached the provider, whatever its ending, and nothing stays reserved.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body::Frame;
use http_body_util::{BodyExt, Full, StreamBody};
use proptest::prelude::*;
use tokio::sync::Notify;
use tower::{ServiceBuilder, ServiceExt};

use super::State;
use crate::admission::{self, Admission};
use crate::config::{Config, TenantLimits};
use crate::context::Ctx;
use crate::domain::{Charge, TenantId};
use crate::ratelimit::{MemoryStore, RateState, RateStore, Refusal};
use crate::response::ResponseBody;
use crate::{body, estimate, queue, render, route, tenant, usage};

/// The real in-memory store, with every charge and correction recorded per tenant.
struct Recorder {
    inner: MemoryStore,
    /// Per tenant: (net tokens charged to the all-tokens budget, corrections made: settlements
    /// and retry charges; a running stream's steps are charges, not corrections).
    net: Mutex<HashMap<TenantId, (i64, u32)>>,
}

impl Recorder {
    fn net(&self, t: &TenantId) -> (i64, u32) {
        self.net.lock().unwrap().get(t).copied().unwrap_or_default()
    }
}

impl RateStore for Recorder {
    fn limited(&self, tenant: &TenantId) -> bool {
        self.inner.limited(tenant)
    }
    fn state(&self, tenant: &TenantId) -> RateState {
        self.inner.state(tenant)
    }
    fn admit(&self, tenant: &TenantId, cost: Charge) -> Result<RateState, Refusal> {
        let r = self.inner.admit(tenant, cost);
        if r.is_ok() {
            let mut net = self.net.lock().unwrap();
            net.entry(tenant.clone()).or_default().0 += cost.total().signed();
        }
        r
    }
    /// A running stream's step: a charge, not a settlement (not counted as a correction).
    fn charge_streamed(&self, tenant: &TenantId, extra: Charge) -> bool {
        let ok = self.inner.charge_streamed(tenant, extra);
        let mut net = self.net.lock().unwrap();
        net.entry(tenant.clone()).or_default().0 += extra.total().signed();
        ok
    }
    fn adjust(&self, tenant: &TenantId, input: i64, output: i64) {
        self.inner.adjust(tenant, input, output);
        let mut net = self.net.lock().unwrap();
        let e = net.entry(tenant.clone()).or_default();
        e.0 -= input + output;
        e.1 += 1;
    }
}

/// How the provider answers.
#[derive(Clone, Copy, Debug)]
enum Answer {
    /// 200 JSON with usage (prompt, completion).
    Json(u64, u64),
    /// 200 SSE of `chunks` text deltas, with usage (prompt, completion) or without.
    Sse(u32, Option<(u64, u64)>),
    /// 200 SSE without usage and over 64 KiB of text: counted on the blocking pool.
    Long,
    /// 500.
    Error,
    /// 503, then (the retry) 200 JSON with usage.
    RetryThenJson(u64, u64),
    /// Never answers.
    Hang,
}

/// How the client ends.
#[derive(Clone, Copy, Debug)]
enum Ending {
    /// Reads the whole body.
    Read,
    /// Drops the body after this many frames.
    DropAfter(u8),
    /// Goes away while queued behind another tenant's request.
    GoneQueued,
    /// Goes away while the provider has the request.
    GoneInFlight,
}

fn answer() -> impl Strategy<Value = Answer> {
    prop_oneof![
        (1..500u64, 1..2000u64).prop_map(|(i, o)| Answer::Json(i, o)),
        (1..40u32, proptest::option::of((1..500u64, 1..2000u64)))
            .prop_map(|(c, u)| Answer::Sse(c, u)),
        Just(Answer::Long),
        Just(Answer::Error),
        (1..500u64, 1..2000u64).prop_map(|(i, o)| Answer::RetryThenJson(i, o)),
    ]
}

fn case() -> impl Strategy<Value = (Answer, Ending, u64)> {
    let ending = prop_oneof![
        3 => Just(Ending::Read),
        2 => (0..6u8).prop_map(Ending::DropAfter),
        1 => Just(Ending::GoneQueued),
        1 => Just(Ending::GoneInFlight),
    ];
    (answer(), ending, 1..3000u64)
}

/// The fake provider: answers by the request's `x-answer` (an index into `answers`).
#[derive(Default)]
struct Provider {
    answers: Mutex<HashMap<usize, Answer>>,
    /// The context of each request that reached it, by answer index.
    seen: Mutex<HashMap<usize, Ctx>>,
    release: Notify,
}

fn sse(chunks: u32, text: &str, usage: Option<(u64, u64)>) -> ResponseBody {
    let mut frames: Vec<Result<Frame<Bytes>, Infallible>> = (0..chunks)
        .map(|_| {
            let ev = format!(
                "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":{text:?}}}}}]}}\n\n"
            );
            Ok(Frame::data(Bytes::from(ev)))
        })
        .collect();
    if let Some((i, o)) = usage {
        let ev = format!(
            "data: {{\"choices\":[],\"usage\":{{\"prompt_tokens\":{i},\"completion_tokens\":{o},\"total_tokens\":{}}}}}\n\n",
            i + o
        );
        frames.push(Ok(Frame::data(Bytes::from(ev))));
    }
    frames.push(Ok(Frame::data(Bytes::from_static(b"data: [DONE]\n\n"))));
    ResponseBody::boxed(StreamBody::new(futures_util::stream::iter(frames)))
}

fn json(i: u64, o: u64) -> ResponseBody {
    ResponseBody::full(format!(
        "{{\"choices\":[{{\"message\":{{\"content\":\"hi\"}}}}],\"usage\":{{\"prompt_tokens\":{i},\"completion_tokens\":{o},\"total_tokens\":{}}}}}",
        i + o
    ))
}

impl Provider {
    async fn answer(
        self: Arc<Self>,
        req: Request<Bytes>,
    ) -> Result<Response<ResponseBody>, crate::Error> {
        let ctx = crate::context::of(&req)?;
        let idx: usize = req.headers()["x-answer"].to_str().unwrap().parse().unwrap();
        self.seen.lock().unwrap().insert(idx, ctx.clone());
        let hold = req.headers().contains_key("x-hold");
        let answer = self.answers.lock().unwrap()[&idx];
        if hold {
            self.release.notified().await;
        }
        let (status, ct, body) = match answer {
            Answer::Json(i, o) => (200, "application/json", json(i, o)),
            Answer::Sse(c, u) => (200, "text/event-stream", sse(c, "hello there ", u)),
            Answer::Long => (
                200,
                "text/event-stream",
                sse(1200, &"lorem ipsum ".repeat(6), None),
            ),
            Answer::Error => (
                500,
                "application/json",
                ResponseBody::full("{\"error\":{}}"),
            ),
            Answer::RetryThenJson(..) if ctx.retries() == 0 => (
                503,
                "application/json",
                ResponseBody::full("{\"error\":{}}"),
            ),
            Answer::RetryThenJson(i, o) => (200, "application/json", json(i, o)),
            Answer::Hang => std::future::pending().await,
        };
        Ok(Response::builder()
            .status(status)
            .header("content-type", ct)
            .body(body)
            .unwrap())
    }
}

struct Rig {
    state: State,
    store: Arc<Recorder>,
    provider: Arc<Provider>,
}

fn rig() -> Rig {
    let config = Config::from_toml_str(
        "[admission]\nmax_retries = 1\nretry_backoff_ms = 1\nretry_backoff_max_ms = 1\n\
         [[upstreams]]\nname = \"u\"\nbase_url = \"http://127.0.0.1:9/v1\"\nmodels = [\"m\"]\n\
         max_concurrency = 1\n\
         [[tenants]]\nid = \"a\"\napi_keys = [\"ka\"]\ntokens_per_minute = 2000000000\n\
         budgets = [{ period = \"day\", tokens = 1000000000000 }]\n\
         [[tenants]]\nid = \"b\"\napi_keys = [\"kb\"]\n",
    )
    .unwrap();
    let mut state = State::new(config.clone()).unwrap();
    let limits = TenantLimits {
        tokens_per_minute: Some(2_000_000_000),
        burst: 1.0,
        max_debt_minutes: 10,
        ..TenantLimits::default()
    };
    let store = Arc::new(Recorder {
        inner: MemoryStore::new([(TenantId::new("a"), &limits)]),
        net: Mutex::default(),
    });
    state.admission = Admission::with_store(&config, state.pools.clone(), Some(store.clone()));
    state.pools[0].attach_cluster(Arc::new(Notify::new()));
    Rig {
        state,
        store,
        provider: Arc::new(Provider::default()),
    }
}

impl Rig {
    fn stack(
        &self,
    ) -> impl tower::Service<
        Request<Full<Bytes>>,
        Response = Response<ResponseBody>,
        Error = Infallible,
        Future: Send + 'static,
    > + Clone
           + Send
           + 'static {
        let s = &self.state;
        let provider = self.provider.clone();
        ServiceBuilder::new()
            .layer(render::Layer)
            .layer(tenant::Layer(s.tenants.clone()))
            .layer(body::Layer::new(body::Reading {
                max_body_bytes: 1 << 20,
                budget: s.tenant_bytes.clone(),
            }))
            .layer(route::Layer::new(s.router.clone()))
            .layer(estimate::Layer::new(s.estimator.clone()))
            .layer(admission::Layer::new(s.admission.clone()))
            .layer(usage::Layer(s.estimator.clone()))
            .layer(queue::Layer::new(queue::Queueing {
                pools: s.pools.clone(),
                observer: s.metrics.clone(),
            }))
            .layer(s.admission.retry_layer())
            .service(tower::service_fn(move |req| provider.clone().answer(req)))
    }

    fn request(
        &self,
        key: &str,
        idx: usize,
        stream: bool,
        max_tokens: u64,
        hold: bool,
    ) -> Request<Full<Bytes>> {
        let body = format!(
            "{{\"model\":\"m\",\"stream\":{stream},\"max_tokens\":{max_tokens},\"messages\":[{{\"role\":\"user\",\"content\":\"count to ten\"}}]}}"
        );
        let mut b = Request::post("/v1/chat/completions")
            .header("authorization", format!("Bearer {key}"))
            .header("content-type", "application/json")
            .header("x-answer", idx.to_string());
        if hold {
            b = b.header("x-hold", "1");
        }
        b.body(Full::new(Bytes::from(body))).unwrap()
    }

    /// Served tokens of tenant `a` in the fair queue since the last call.
    fn served(&self) -> u64 {
        self.state.pools[0]
            .take_served()
            .into_iter()
            .filter(|(t, _, _)| t.as_str() == "a")
            .map(|(_, _, n)| n)
            .sum()
    }

    /// Waits (bounded in count) until request `idx` reached the provider.
    async fn entered(&self, idx: usize) {
        for _ in 0..5000 {
            if self.provider.seen.lock().unwrap().contains_key(&idx) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        panic!("request {idx} never reached the provider");
    }

    /// Tenant `a`'s usage ledger: (requests, input + output tokens), and what its budget holds
    /// reserved.
    async fn ledger(&self) -> ((u64, u64), u64) {
        let spending = self.state.admission.budgets.spending();
        let q = crate::budget::ledger::Query {
            tenant: Some("a".to_owned()),
            from: "0000-01-01".to_owned(),
            to: "9999-12-31".to_owned(),
        };
        let rows = spending.usage(q).await.unwrap();
        let sum = rows.iter().fold((0, 0), |(n, t), (_, r)| {
            (n + r.requests, t + r.input_tokens + r.output_tokens)
        });
        (sum, spending.reserved(&TenantId::new("a")).tokens)
    }

    /// Runs one request of tenant `a` ending as `ending`; returns what it must have cost:
    /// (net tokens charged to its ledger, fair-queue tokens served, corrections made), and
    /// what it adds to the usage ledger (requests, tokens).
    async fn run(
        &self,
        idx: usize,
        answer: Answer,
        ending: Ending,
        max_tokens: u64,
    ) -> ((i64, u64, u32), (u64, u64)) {
        let stream = matches!(answer, Answer::Sse(..) | Answer::Long);
        let answer = match ending {
            Ending::GoneInFlight => Answer::Hang,
            _ => answer,
        };
        self.provider.answers.lock().unwrap().insert(idx, answer);
        let svc = self.stack();
        match ending {
            Ending::Read | Ending::DropAfter(_) => {
                let res = svc
                    .oneshot(self.request("ka", idx, stream, max_tokens, false))
                    .await
                    .unwrap();
                let mut body = Box::pin(res.into_body());
                let limit = match ending {
                    Ending::DropAfter(n) => usize::from(n),
                    _ => usize::MAX,
                };
                let mut frames = 0;
                while frames < limit {
                    match body.frame().await {
                        Some(Ok(_)) => frames += 1,
                        _ => break,
                    }
                }
            }
            Ending::GoneInFlight => {
                let task =
                    tokio::spawn(svc.oneshot(self.request("ka", idx, stream, max_tokens, false)));
                self.entered(idx).await;
                task.abort();
                let _ = task.await;
            }
            Ending::GoneQueued => {
                // Tenant b holds the pool's only slot.
                self.provider
                    .answers
                    .lock()
                    .unwrap()
                    .insert(idx + 1, Answer::Json(1, 1));
                let blocker = tokio::spawn(self.stack().oneshot(self.request(
                    "kb",
                    idx + 1,
                    false,
                    10,
                    true,
                )));
                self.entered(idx + 1).await;
                let task =
                    tokio::spawn(svc.oneshot(self.request("ka", idx, stream, max_tokens, false)));
                for _ in 0..5000 {
                    if self.state.pools[0].load() == (1, 1) {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                assert_eq!(self.state.pools[0].load(), (1, 1), "a is queued behind b");
                task.abort();
                let _ = task.await;
                self.provider.release.notify_one();
                let res = blocker.await.unwrap().unwrap();
                res.into_body().collect().await.unwrap();
            }
        }
        let ctx = self.provider.seen.lock().unwrap().get(&idx).cloned();
        let Some(ctx) = ctx.filter(|_| !matches!(ending, Ending::GoneQueued)) else {
            // Never reached the provider: charged, then refunded once; nothing in the ledger.
            return ((0, 0, 1), (0, 0));
        };
        // Reached the provider: settled from the usage once it is written, off-thread too.
        if !matches!(answer, Answer::Error | Answer::Hang) {
            for _ in 0..5000 {
                if ctx.usage().is_some() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
        let charge = ctx.admitted().unwrap().charged.unwrap().total().0;
        let retries = ctx.retries();
        let d = *ctx.dispatch().unwrap();
        let usage = ctx.usage();
        if let (Some(u), Answer::Json(i, o) | Answer::RetryThenJson(i, o), Ending::Read) =
            (usage, answer, ending)
        {
            assert_eq!(
                (u.tokens.input, u.tokens.output),
                (i, o),
                "the provider's usage"
            );
        }
        let base = usage.map_or(charge, |u| u.tokens.total().0);
        let rate = base + u64::from(retries) * charge;
        let served = usage.map_or(d.charged.0, |u| u.cost.0) + u64::from(retries) * d.charged.0;
        let corrections = retries + u32::from(usage.is_some());
        let billed = usage.map_or((0, 0), |u| (1, u.tokens.total().0));
        ((i64::try_from(rate).unwrap(), served, corrections), billed)
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn every_charge_is_settled_exactly_once(cases in proptest::collection::vec(case(), 1..7)) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let rig = rig();
            let a = TenantId::new("a");
            let (mut want_net, mut want_corr) = (0i64, 0u32);
            let mut want_bill = (0u64, 0u64);
            for (n, (answer, ending, max_tokens)) in cases.into_iter().enumerate() {
                let ((net, want_served, corr), billed) =
                    rig.run(2 * n, answer, ending, max_tokens).await;
                want_net += net;
                want_corr += corr;
                want_bill = (want_bill.0 + billed.0, want_bill.1 + billed.1);
                // Guards still finishing (off-thread counting): a bounded number of looks.
                let mut got_served = rig.served();
                for _ in 0..2000 {
                    if rig.store.net(&a) == (want_net, want_corr)
                        && got_served == want_served
                        && rig.ledger().await == (want_bill, 0)
                    {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    got_served += rig.served();
                }
                prop_assert_eq!(
                    rig.store.net(&a),
                    (want_net, want_corr),
                    "token ledger (net, corrections) after {:?} / {:?}",
                    answer,
                    ending
                );
                prop_assert_eq!(
                    got_served,
                    want_served,
                    "fair-queue credit after {:?} / {:?}",
                    answer,
                    ending
                );
                prop_assert_eq!(rig.state.pools[0].load(), (0, 0), "the permit came back");
                prop_assert_eq!(
                    rig.ledger().await,
                    (want_bill, 0),
                    "usage ledger (requests, tokens) and budget reserved after {:?} / {:?}",
                    answer,
                    ending
                );
            }
            Ok(())
        })?;
    }
}
