//! The server: assembles the tower stack ([`stack`], one function, top to bottom) and runs the
//! listener (HTTP/1.1, h2 and h2c via hyper-util's auto builder, optional rustls TLS) with
//! graceful shutdown and live config reload (`live`, `reload`, `diff`).
//!
//! Invariants: all per-request state is shared through `Arc`s built once per configuration
//! generation, at startup and at each reload (nothing is cloned from the config per request);
//! on shutdown the server stops accepting, `/readyz` turns 503, in-flight requests and streams
//! get up to `shutdown_grace_ms` to finish, and whatever is left after that is aborted.

mod connection;
pub mod connections;
pub mod diff;
pub mod live;
pub mod ops;
mod reload;
pub mod stall;
mod tenants;
mod tls;
pub mod workers;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use http::{HeaderName, Request, Response};
use hyper_util::rt::{TokioExecutor, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tower::ServiceBuilder;

use crate::admission::{self, Admission};
use crate::config::{Config, ConfigError};
use crate::estimate::Estimator;
use crate::metrics::{self, Metrics};
use crate::queue::FairQueue;
use crate::response::{BoxError, ResponseBody};
use crate::route::Router;
use crate::tenant::Directory;
use crate::upstream::Upstream;
use crate::{body, estimate, health, queue, ratelimit, render, route, tenant, upstream, usage};
pub use diff::Changes;
pub use live::Live;
pub use reload::ReloadError;

/// Everything the stack shares, built once from a validated [`Config`].
#[derive(Debug, Clone)]
pub struct State {
    /// The configuration.
    pub config: Arc<Config>,
    /// Tenants by key digest and id.
    pub tenants: Arc<Directory>,
    /// Upstream pools in config order.
    pub upstreams: Vec<Arc<Upstream>>,
    /// Model → upstream routing.
    pub router: Arc<Router>,
    /// One fair queue per upstream pool, indexed like `upstreams`.
    pub pools: Arc<[Arc<FairQueue>]>,
    /// Admission: rate stores, learned pool capacity, retry counters.
    pub admission: Arc<Admission>,
    /// Counts input tokens, prices requests at dispatch, learns output lengths, keeps the
    /// estimate-error statistics (`estimator.stats()`).
    pub estimator: Arc<Estimator>,
    /// `/readyz` flag.
    pub ready: Arc<AtomicBool>,
    /// The metrics registry (`/metrics`).
    pub metrics: Arc<Metrics>,
    /// The admin API's bearer token (`[admin] token_env`); `None`: the admin API is off.
    pub admin_token: Option<Arc<str>>,
    /// What `POST /admin/reload` calls (set by [`Live`]; `None`: reload is unavailable).
    pub reloader: Option<Weak<dyn crate::admin::Reload>>,
    /// Cluster mode (`[cluster]`): shared capacity, fairness and rate limits.
    pub cluster: Option<Arc<crate::cluster::Cluster>>,
    /// Request bytes held per tenant, all pools (`max_queued_bytes`; kept across reloads).
    pub tenant_bytes: queue::bytes::TenantBudget,
    /// Where the `*_env` settings are read from (at startup and at each reload).
    pub env: Env,
    /// Async jobs and batches (`[jobs]`; opened at startup, kept across reloads).
    pub jobs: Option<crate::jobs::Jobs>,
    /// Tenants and keys made through the admin API (`[store]` or `[cluster]`; opened at
    /// startup, kept across reloads, merged into every generation's config).
    pub runtime: Option<Arc<tenant::runtime::Registry>>,
}

/// Where `*_env` settings (provider keys, the admin token) are read from: the process
/// environment, or — for tests and embedding, which must not `set_var` in a process that runs
/// other threads — a map of its own.
#[derive(Clone, Default)]
pub struct Env(Option<Arc<std::collections::HashMap<String, String>>>);

impl Env {
    /// The process environment.
    pub fn process() -> Self {
        Self(None)
    }

    /// Exactly `vars` (the process environment is not read).
    pub fn vars<K: Into<String>, V: Into<String>>(vars: impl IntoIterator<Item = (K, V)>) -> Self {
        Self(Some(Arc::new(
            vars.into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
        )))
    }

    /// The value of `var`, if set.
    pub fn get(&self, var: &str) -> Option<String> {
        match &self.0 {
            None => std::env::var(var).ok(),
            Some(map) => map.get(var).cloned(),
        }
    }
}

impl std::fmt::Debug for Env {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Names only: values are secrets.
        match &self.0 {
            None => f.write_str("Env(process)"),
            Some(map) => f.debug_set().entries(map.keys()).finish(),
        }
    }
}

impl State {
    /// Builds the shared state, reading `*_env` variables from the process environment (unset
    /// → error naming the key).
    pub fn new(config: Config) -> Result<Self, ConfigError> {
        Self::with_env(config, Env::process())
    }

    /// As [`State::new`], reading `*_env` variables from `env`.
    pub fn with_env(config: Config, env_source: Env) -> Result<Self, ConfigError> {
        let env = |var: &str| env_source.get(var);
        let metrics = Metrics::with_env(&config, &env);
        let linked = crate::cluster::connect(
            &config,
            metrics.plain_gauge("fairgate_cluster_degraded"),
            env,
        )?;
        let redis = linked.as_ref().map(|(l, _)| l.clone() as _);
        let runtime = tenant::runtime::open(&config, redis, tenants::counters(&metrics))?;
        let config = tenants::merged(&runtime, config);
        let tenants = Arc::new(
            Directory::from_config(&config, env)?
                .with_runtime(runtime.clone())
                .count_untrusted_on(metrics.plain_counter(UNTRUSTED_HEADER)),
        );
        let lanes = workers::count(&config.server);
        let upstreams = config
            .upstreams
            .iter()
            .enumerate()
            .map(|(i, u)| Upstream::from_config(u, i, lanes, env).map(Arc::new))
            .collect::<Result<Vec<_>, _>>()?;
        let admin_token = Self::admin_token(&config, env)?;
        let estimator = Arc::new(Estimator::new(&config.estimate, &config.models));
        let pools = queue::pools(&config, tenants.tenants(), &estimator);
        // Cluster mode: the shared rate store replaces the in-memory one, and a lease gate per
        // pool bounds its dispatch by the slots leased in Redis.
        let store = linked
            .as_ref()
            .map(|(_, s)| s.clone() as Arc<dyn crate::ratelimit::RateStore>);
        let spending = crate::budget::Spending::for_config(&config).map_err(|message| {
            ConfigError::Invalid {
                key: "store.path".to_owned(),
                message,
            }
        })?;
        let admission = Admission::with_spending(&config, pools.clone(), store, spending);
        let cluster = linked.map(|(link, store)| {
            let unapplied = metrics.plain_counter("fairgate_cluster_sync_unapplied_total");
            crate::cluster::Cluster::new(link, store, &config, &pools, &admission, unapplied)
        });
        let meter = || Some(metrics.clone() as Arc<dyn crate::jobs::Meter>);
        let jobs = match (&config.jobs, &cluster) {
            // With `[cluster]`, jobs live in the shared Redis (`path` is not used).
            (Some(j), Some(c)) => Some(crate::jobs::Jobs::shared(c.link.clone(), j, meter())),
            (Some(j), None) => {
                Some(
                    crate::jobs::Jobs::open(j, meter()).map_err(|e| ConfigError::Invalid {
                        key: "jobs.path".to_owned(),
                        message: format!("cannot open {}: {e}", j.path.display()),
                    })?,
                )
            }
            (None, _) => None,
        };
        let jobs = jobs.map(|j| j.with_max_line(config.server.max_body_bytes));
        Ok(Self {
            jobs,
            runtime,
            tenant_bytes: queue::bytes::TenantBudget {
                bytes: queue::bytes::ByteBudget::new(u64::MAX),
                pools: pools.clone(),
            },
            cluster,
            metrics,
            admin_token,
            admission,
            estimator,
            router: Arc::new(Router::new(upstreams.clone())),
            pools,
            config: Arc::new(config),
            tenants,
            upstreams,
            ready: Arc::new(AtomicBool::new(false)),
            reloader: None,
            env: env_source,
        })
    }

    fn admin_token(
        config: &Config,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<Arc<str>>, ConfigError> {
        let Some(var) = &config.admin.token_env else {
            return Ok(None);
        };
        let token = env(var).ok_or_else(|| ConfigError::MissingEnv {
            key: "admin.token_env".to_owned(),
            var: var.clone(),
        })?;
        // An empty token would open the admin API to `Authorization: Bearer ` (and a blank one
        // to anyone who guesses whitespace): refused, never echoed.
        if token.trim().is_empty() {
            return Err(ConfigError::Invalid {
                key: "admin.token_env".to_owned(),
                message: format!("{var} is empty: the admin token must not be empty"),
            });
        }
        Ok(Some(Arc::from(token)))
    }
}

/// Requests that carried the sidecar tenant header from a peer outside `trusted_sources`.
pub const UNTRUSTED_HEADER: &str = "fairgate_untrusted_tenant_header_total";

/// The whole request path, outermost first.
///
/// Every stage below `render` reads and writes the one per-request context (`crate::context`)
/// that `render` creates; a stage placed above the writer of a field it needs answers 500
/// (tested). Permits (the fair queue's grant, a rate admission) are taken in the stage's `call`
/// future, not in `poll_ready`: what they cost and which pool they come from depend on the
/// request — its tenant, model and estimate — which `poll_ready` cannot see; and a grant made
/// in `poll_ready` would be held by an idle connection that sends nothing. The stages keep
/// `poll_ready` a pass-through, and the permit lives in the response body, released on `Drop`.
pub fn stack<B>(
    state: &State,
) -> impl tower::Service<
    Request<B>,
    Response = Response<ResponseBody>,
    Error = Infallible,
    Future: Send + 'static,
> + Clone
       + Send
       + 'static
where
    B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let tenant_header: Option<HeaderName> = state.tenants.tenant_header().cloned();
    let on_main = state.config.admin.listen.is_none();
    let upstreams: Arc<[Arc<Upstream>]> = state.upstreams.iter().cloned().collect();
    ServiceBuilder::new()
        // Outermost: creates the request context, and renders every stage error (in OpenAI's
        // shape) and any panic once; writes x-fairgate-queue-ms on every response.
        .layer(render::Layer)
        // Before authentication: probes carry no key, and must not cost a body read.
        .layer(health::Layer(state.ready.clone()))
        // `/metrics` and the admin API, also before authentication (a scraper carries no tenant
        // key; the admin API has its own token), unless they have their own listener. Here,
        // where tenants connect, a scrape needs the admin token or a trusted peer.
        .option_layer(on_main.then(|| ops::scrape(state, true)))
        .option_layer(on_main.then(|| ops::admin(state)))
        // Who is calling, before reading a byte of the body: unknown callers cost a header hash.
        .layer(tenant::Layer(state.tenants.clone()))
        // The tenant's x-ratelimit-* headers, on every outcome of a limited tenant: right below
        // `tenant` so that every refusal of every stage below (413 body, 400, 429, 504) and every
        // upstream answer passes through it.
        .layer(ratelimit::headers::Layer(state.admission.store.clone()))
        // Request metrics and the per-request log line, as soon as the tenant is known: every
        // outcome below (success or refusal, with its reason) is counted under its tenant.
        .layer(metrics::Layer(state.metrics.clone()))
        // Read the (bounded) body once and parse it once; estimation and routing need it.
        .layer(body::Layer {
            max_body_bytes: state.config.server.max_body_bytes,
            budget: state.tenant_bytes.clone(),
        })
        // Jobs: the identity is known and the body read and parsed, so a `respond-async`
        // request is stored here as a job (202) before admission could refuse it; the jobs and
        // batches endpoints are answered here; a job re-entering the stack from the runner
        // passes through to every stage below, in its tenant's batch class.
        .layer(crate::jobs::Layer(state.jobs.clone()))
        // Pick the upstream pool from the model: the fair queue below is per pool.
        .layer(route::Layer(state.router.clone()))
        // Memory bounded in bytes: as soon as the pool is known (the body is read and parsed),
        // before any counting, the request's bytes are reserved against the pool's and the
        // tenant's `max_queued_bytes`; the reservation lives in the response body.
        .layer(queue::bytes::Layer(state.pools.clone()))
        // Count input tokens (after routing: an unroutable model costs no counting) and ask for
        // usage on a stream's behalf; admission and the queue below price the request from it.
        .layer(estimate::Layer::new(state.estimator.clone()))
        // Admission: size caps, deadline feasibility and the tenant's rate limits, after routing
        // (the wait is predicted from the routed pool's queue) and estimation (the charge is the
        // estimate), before queueing, so nothing that must be refused takes a queue slot.
        .layer(admission::Layer(state.admission.clone()))
        // Reconcile: observes a 2xx body for `usage` and writes the actual cost to the context
        // when it ends or is dropped. Above the queue, so its body wraps the one the permit is
        // attached to: the usage is known before the permit (and admission's ledger) settles.
        .layer(usage::Layer(state.estimator.clone()))
        // The fair queue of the routed pool: waits for a permit (weighted DRR in tokens) and
        // ties it to the response body so the pool slot lives exactly as long as the stream.
        // After routing (queues are per pool), before upstream.
        .layer(queue::Layer {
            pools: state.pools.clone(),
            observer: state.metrics.clone(),
        })
        // Which of the provider's answer headers reach the tenant (an allowlist: never the
        // operator's organization, project, cookies or the shared key's x-ratelimit-*): right
        // above feedback, which reads them all, so it applies to the answer finally passed on.
        .layer(upstream::answer::Layer)
        // Upstream feedback and retries, inside the permit: every answer teaches the pool's
        // learned capacity, and a 429/502/503 with nothing yet sent to the client is retried
        // while the request keeps its slot (so a retry never jumps the fair queue).
        .layer(state.admission.retry_layer())
        // Innermost: forward to the provider and stream the answer back.
        .service(
            upstream::Service::new(upstreams, tenant_header)
                .propagate_trace(state.metrics.otel().is_some()),
        )
}

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The configuration is unusable (e.g. an env var is missing).
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The TLS certificate or key cannot be loaded.
    #[error("{0}")]
    Tls(String),
    /// The listener failed.
    #[error("listener: {0}")]
    Io(#[from] std::io::Error),
}

/// A running server. Dropping the handle shuts the server down as [`ServerHandle::shutdown`] does.
#[derive(Debug)]
pub struct ServerHandle {
    /// The bound address.
    pub addr: SocketAddr,
    /// The operations listener's address (`[admin] listen`), if any.
    pub admin_addr: Option<SocketAddr>,
    /// The pools' fair queues at startup (for introspection: loads, tests; after a reload see
    /// [`ServerHandle::state`]).
    pub pools: Arc<[Arc<FairQueue>]>,
    /// Admission state at startup (learned capacity, retry counters; for introspection).
    pub admission: Arc<Admission>,
    /// The estimator (learned history, estimate-error statistics).
    pub estimator: Arc<Estimator>,
    live: Arc<Live>,
    stop: watch::Sender<bool>,
    join: JoinHandle<()>,
}

impl ServerHandle {
    /// Starts graceful shutdown (idempotent).
    pub fn shutdown(&self) {
        self.stop.send_replace(true);
    }

    /// The state of the configuration generation in force.
    pub fn state(&self) -> State {
        self.live.current().state.clone()
    }

    /// Re-reads the config file and applies it: what SIGHUP does (see [`Live::reload`]).
    /// Blocking.
    pub fn reload(&self) -> Result<Changes, ReloadError> {
        self.live.reload()
    }

    /// Waits until the server has drained (or the grace period has passed).
    pub async fn join(self) -> Result<(), tokio::task::JoinError> {
        self.join.await
    }
}

/// Starts serving `config` on `listener` in the background. Such a server has no file to
/// reload from: `POST /admin/reload` answers 409 (see [`start_from_file`]).
pub async fn start(config: Config, listener: TcpListener) -> Result<ServerHandle, StartError> {
    start_with(config, None, listener, Env::process()).await
}

/// As [`start`], reading `*_env` settings from `env` instead of the process environment.
pub async fn start_with_env(
    config: Config,
    listener: TcpListener,
    env: Env,
) -> Result<ServerHandle, StartError> {
    start_with(config, None, listener, env).await
}

/// Starts serving the config file at `path` on `listener`; SIGHUP (under `serve`) and
/// `POST /admin/reload` re-read that file.
pub async fn start_from_file(
    path: impl Into<PathBuf>,
    listener: TcpListener,
) -> Result<ServerHandle, StartError> {
    start_from_file_with_env(path, listener, Env::process()).await
}

/// As [`start_from_file`], reading `*_env` settings from `env` (at start and at each reload).
pub async fn start_from_file_with_env(
    path: impl Into<PathBuf>,
    listener: TcpListener,
    env: Env,
) -> Result<ServerHandle, StartError> {
    let path = path.into();
    let config = Config::load(&path)?;
    start_with(config, Some(path), listener, env).await
}

async fn start_with(
    config: Config,
    path: Option<PathBuf>,
    listener: TcpListener,
    env: Env,
) -> Result<ServerHandle, StartError> {
    let n = workers::count(&config.server);
    start_on(config, path, workers::share(listener, n)?, env).await
}

/// Samples every pool's timeline of shares each [`crate::metrics::SAMPLE_SECS`] until `stop`,
/// so the console shows the last minutes when it is opened, not only while someone reads.
async fn sample_timeline(live: Arc<Live>, mut stop: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(Duration::from_secs(crate::metrics::SAMPLE_SECS));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return,
        }
        if *stop.borrow() {
            return;
        }
        let generation = live.current();
        let state = &generation.state;
        state.metrics.sample(&state.pools, &state.admission);
    }
}

/// Starts the server on `listeners` (one per connection worker, all on one address).
async fn start_on(
    config: Config,
    path: Option<PathBuf>,
    listeners: Vec<std::net::TcpListener>,
    env: Env,
) -> Result<ServerHandle, StartError> {
    let addr = listeners
        .first()
        .ok_or_else(|| std::io::Error::other("no listener"))?
        .local_addr()?;
    let tls = match &config.server.tls {
        Some(t) => Some(tls::acceptor(t).map_err(StartError::Tls)?),
        None => None,
    };
    let admin_listener = match config.admin.listen {
        Some(a) => Some(TcpListener::bind(a).await?),
        None => None,
    };
    let state = tenants::synced(State::with_env(config, env)?).await?;
    // Cluster mode: a replica id already live in the cluster is refused before serving.
    let claim = match &state.cluster {
        Some(cluster) => Some(cluster.claim().await?),
        None => None,
    };
    let pools = state.pools.clone();
    let admission = state.admission.clone();
    let estimator = state.estimator.clone();
    let live = Live::new(state.clone(), path);
    let conns = workers::Conns {
        tls,
        ..connection_limits(&state, live.clone(), listeners.len())
    };
    let (stop, stopped) = watch::channel(false);
    let done = workers::spawn(listeners, &conns, &stopped)?;
    if let (Some(cluster), Some(claim)) = (&state.cluster, claim) {
        cluster.spawn(claim, stop.subscribe());
    }
    tenants::spawn_sync(&state, live.clone(), stop.subscribe());
    if let Some(otel) = state.metrics.otel() {
        tokio::spawn(otel.clone().run(stop.subscribe()));
    }
    tokio::spawn(sample_timeline(live.clone(), stop.subscribe()));
    if let Some(jobs) = state.jobs.clone() {
        tokio::spawn(crate::jobs::runner::run(
            jobs,
            dispatch(live.clone()),
            stop.subscribe(),
        ));
    }
    let admin_addr = match admin_listener {
        Some(l) => {
            let addr = l.local_addr()?;
            ops::spawn(live.clone(), l, stop.subscribe());
            Some(addr)
        }
        None => None,
    };
    // The usage ledger: this month's spend from before a restart counts again, before the
    // first request; then rows are written in batches off the request path, and once more
    // after the last request has drained.
    let spending = state.admission.budgets.spending().clone();
    spending
        .restore()
        .await
        .map_err(|message| ConfigError::Invalid {
            key: "store.path".to_owned(),
            message,
        })?;
    let (every, retention) = state
        .config
        .store
        .as_ref()
        .map_or((1000, 400), |s| (s.flush_ms, s.usage_retention_days));
    tokio::spawn(crate::budget::run_flusher(
        spending.clone(),
        Duration::from_millis(every),
        retention,
        stop.subscribe(),
    ));
    state.ready.store(true, Ordering::Release);
    let join = tokio::spawn(async move {
        for worker in done {
            let _ = worker.await;
        }
        if let Err(e) = spending.flush().await {
            tracing::error!(error = %e, "usage ledger not written at shutdown");
        }
    });
    Ok(ServerHandle {
        addr,
        admin_addr,
        pools,
        admission,
        estimator,
        live,
        stop,
        join,
    })
}

/// How the jobs runner re-enters the stack: through the generation in force, as a request
/// read from no socket (its `context::JobRun` identifies it).
fn dispatch(live: Arc<Live>) -> crate::jobs::Dispatch {
    use tower::ServiceExt;
    Arc::new(move |req| {
        let state = live.current().state.clone();
        Box::pin(async move {
            match stack(&state).oneshot(req).await {
                Ok(res) => res,
                Err(never) => match never {},
            }
        })
    })
}

/// How the workers serve connections: hyper's HTTP/1.1 + h2 settings and the connection caps.
fn connection_limits(state: &State, live: Arc<Live>, workers: usize) -> workers::Conns {
    let server = &state.config.server;
    let keepalive = Duration::from_millis(server.keepalive_timeout_ms);
    let ping = Duration::from_millis(server.http2_keepalive_interval_ms);
    let mut builder = auto::Builder::new(TokioExecutor::new());
    // hyper's header-read timer also runs while an HTTP/1.1 connection waits for its next
    // request: one timer bounds both the keep-alive wait and a slow request head.
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(keepalive);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(ping)
        .keep_alive_timeout(ping)
        .max_concurrent_streams(server.http2_max_concurrent_streams);
    let nofile = crate::fdlimit::current().map_or(1024, |n| n.soft);
    let max = server
        .max_connections
        .unwrap_or_else(|| crate::fdlimit::default_max_connections(&state.config, workers, nofile));
    tracing::info!(
        max_connections = max,
        max_connections_per_ip = ?server.max_connections_per_ip,
        descriptors = nofile,
        "connection limits"
    );
    let handles = connections::Handles::register(&state.metrics);
    workers::Conns {
        builder,
        service: live::LiveService::new(live, false),
        tls: None,
        grace: Duration::from_millis(server.shutdown_grace_ms),
        ready: state.ready.clone(),
        registry: connections::Registry::new(max, server.max_connections_per_ip, handles),
        keepalive,
    }
}

/// `fairgate serve`: binds `[server] listen`, serves until SIGTERM/SIGINT, then drains. With
/// `path` (the file `config` was loaded from), SIGHUP reloads it.
pub async fn run(config: Config, path: Option<PathBuf>) -> Result<(), StartError> {
    crate::fdlimit::raise();
    let listeners = workers::bind(config.server.listen, workers::count(&config.server)).await?;
    let reloadable = path.is_some();
    let handle = start_on(config, path, listeners, Env::process()).await?;
    tracing::info!(addr = %handle.addr, admin = ?handle.admin_addr, "fairgate listening");
    if reloadable {
        reload_on_sighup(handle.live.clone());
    }
    shutdown_signal().await;
    tracing::info!("signal received");
    handle.shutdown();
    let _ = handle.join().await;
    Ok(())
}

/// Reloads the config file on every SIGHUP ([`Live::reload`] logs the outcome), one at a time.
fn reload_on_sighup(live: Arc<Live>) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut hup = match signal(SignalKind::hangup()) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGHUP: reload via the admin API");
                return;
            }
        };
        tokio::spawn(async move {
            while hup.recv().await.is_some() {
                let live = live.clone();
                let _ = tokio::task::spawn_blocking(move || live.reload()).await;
            }
        });
    }
    #[cfg(not(unix))]
    drop(live);
}

async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

#[cfg(test)]
mod ledger_props;

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use http_body_util::Full;
    use tower::ServiceExt;

    fn state() -> State {
        let config = Config::from_toml_str(
            "[[upstreams]]\nname = \"u\"\nbase_url = \"http://127.0.0.1:9/v1\"\nmodels = [\"m\"]\n\
             [[tenants]]\nid = \"a\"\napi_keys = [\"k\"]\n",
        )
        .unwrap();
        State::new(config).unwrap()
    }

    #[test]
    fn an_empty_admin_token_is_refused_without_echoing_one() {
        let config = Config::from_toml_str(
            "[admin]\ntoken_env = \"ADMIN_T\"\n\
             [[upstreams]]\nname = \"u\"\nbase_url = \"http://127.0.0.1:9/v1\"\n",
        )
        .unwrap();
        for empty in ["", "  ", "\t"] {
            let e = State::admin_token(&config, |_| Some(empty.to_owned()))
                .unwrap_err()
                .to_string();
            assert!(
                e.starts_with("admin.token_env") && e.contains("empty"),
                "{e}"
            );
        }
        let t = State::admin_token(&config, |_| Some("s3cret".to_owned())).unwrap();
        assert_eq!(t.as_deref(), Some("s3cret"));
        let e = State::admin_token(&config, |_| None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("ADMIN_T"), "{e}");
    }

    async fn status(state: &State, req: Request<Full<Bytes>>) -> u16 {
        let res = stack(state).oneshot(req).await.unwrap();
        assert!(res.headers().contains_key(render::QUEUE_MS_HEADER));
        res.status().as_u16()
    }

    #[tokio::test]
    async fn stack_order_health_then_tenant_then_body_then_route() {
        let s = state();
        let get = |p: &str| Request::get(p).body(Full::default()).unwrap();
        // Health answers before authentication; readiness follows the flag.
        assert_eq!(status(&s, get("/healthz")).await, 200);
        assert_eq!(status(&s, get("/readyz")).await, 503);
        s.ready.store(true, Ordering::Release);
        assert_eq!(status(&s, get("/readyz")).await, 200);
        // Authentication comes before path handling: unknown paths without a key are 401.
        assert_eq!(status(&s, get("/v1/nope")).await, 401);
        let authed = |b: http::request::Builder| b.header("authorization", "Bearer k");
        let req = authed(Request::get("/v1/nope"))
            .body(Full::default())
            .unwrap();
        assert_eq!(status(&s, req).await, 404);
        let req = authed(Request::get("/v1/models"))
            .body(Full::default())
            .unwrap();
        assert_eq!(status(&s, req).await, 200);
        let req = authed(Request::post("/v1/chat/completions"))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from_static(b"{\"model\":\"other\"}")))
            .unwrap();
        assert_eq!(status(&s, req).await, 404);
        let req = authed(Request::get("/v1/chat/completions"))
            .body(Full::default())
            .unwrap();
        assert_eq!(status(&s, req).await, 405);
    }

    /// A stack whose stages are out of order fails loudly (500 naming the missing field), never
    /// passes the request through with a limit skipped.
    #[tokio::test]
    async fn a_misordered_stack_answers_500_instead_of_skipping_a_stage() {
        use http_body_util::BodyExt;
        use tower::Layer as _;
        let s = state();
        let ok = || {
            tower::service_fn(|_: Request<Bytes>| async {
                Ok::<_, crate::Error>(Response::new(ResponseBody::empty()))
            })
        };
        let chat = || {
            Request::post("/v1/chat/completions")
                .header("authorization", "Bearer k")
                .header("content-type", "application/json")
                .body(Full::new(Bytes::from_static(
                    b"{\"model\":\"m\",\"messages\":[]}",
                )))
                .unwrap()
        };
        let message = |res: Response<ResponseBody>| async move {
            assert_eq!(res.status(), 500);
            let body = res.into_body().collect().await.unwrap().to_bytes();
            let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(v["error"]["code"], "internal_error");
            v["error"]["message"].as_str().unwrap().to_owned()
        };
        // The stages above the two under test, in order.
        let top = || {
            ServiceBuilder::new()
                .layer(render::Layer)
                .layer(tenant::Layer(s.tenants.clone()))
                .layer(body::Layer {
                    max_body_bytes: 1 << 20,
                    budget: s.tenant_bytes.clone(),
                })
                .layer(route::Layer(s.router.clone()))
        };
        // Admission above estimation: the estimate it charges is not there yet.
        let misordered = top()
            .layer(admission::Layer(s.admission.clone()))
            .layer(estimate::Layer::new(s.estimator.clone()))
            .service(ok());
        let m = message(misordered.oneshot(chat()).await.unwrap()).await;
        assert!(m.contains("`estimate` must run"), "{m}");
        // The queue without admission: no deadline decision to honour.
        let unadmitted = top()
            .layer(estimate::Layer::new(s.estimator.clone()))
            .layer(queue::Layer {
                pools: s.pools.clone(),
                observer: s.metrics.clone(),
            })
            .service(ok());
        let m = message(unadmitted.oneshot(chat()).await.unwrap()).await;
        assert!(m.contains("`admission` must run"), "{m}");
        assert_eq!(s.pools[0].load(), (0, 0), "nothing was queued");
        // No render layer on top: there is no context, and the first stage says so.
        let headless = tenant::Layer(s.tenants.clone()).layer(ok());
        let (head, _) = chat().into_parts();
        let e = headless
            .oneshot(Request::from_parts(head, Bytes::new()))
            .await
            .unwrap_err();
        assert_eq!(e.status(), 500);
        assert!(e.to_string().contains("render"), "{e}");
        // In order, the same request passes every stage.
        let res = stack(&s).oneshot(chat()).await.unwrap();
        assert_ne!(res.status(), 500);
    }
}
