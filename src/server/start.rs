//! Starting and running the server: the listeners (one per connection worker), the
//! background tasks of a running server (cluster, tenant sync, span export, the console's
//! timeline, the jobs runner), graceful shutdown and SIGHUP.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::{
    connections, live, ops, tenants, tls, workers, Changes, Env, Live, ReloadError, State,
};
use crate::admission::Admission;
use crate::config::{Config, ConfigError};
use crate::estimate::Estimator;
use crate::queue::FairQueue;

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
    start_on(config, path, Listen::Share(listener), env).await
}

/// Where the connection workers listen: one socket per worker, made once the state knows how
/// many workers there are ([`State::workers`]).
enum Listen {
    /// A bound listener, shared by the workers.
    Share(TcpListener),
    /// An address to bind, one `SO_REUSEPORT` socket per worker.
    Bind(SocketAddr),
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

/// Starts the server on `listen` (one socket per connection worker, all on one address).
async fn start_on(
    config: Config,
    path: Option<PathBuf>,
    listen: Listen,
    env: Env,
) -> Result<ServerHandle, StartError> {
    let tls = match &config.server.tls {
        Some(t) => Some(tls::acceptor(t).map_err(StartError::Tls)?),
        None => None,
    };
    let admin_listener = match config.admin.listen {
        Some(a) => Some(TcpListener::bind(a).await?),
        None => None,
    };
    let state = tenants::synced(State::with_env(config, env)?).await?;
    let listeners = match listen {
        Listen::Share(listener) => workers::share(listener, state.workers)?,
        Listen::Bind(addr) => workers::bind(addr, state.workers).await?,
    };
    let addr = listeners
        .first()
        .ok_or_else(|| std::io::Error::other("no listener"))?
        .local_addr()?;
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
    let workers::Spawned {
        done,
        jobs: to_workers,
    } = workers::spawn(listeners, &conns, &stopped)?;
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
            super::jobs::dispatch(live.clone(), to_workers),
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
        http1: builder.clone().http1_only(),
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
    let listen = Listen::Bind(config.server.listen);
    let reloadable = path.is_some();
    let handle = start_on(config, path, listen, Env::process()).await?;
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
