//! Connection workers: `[server] workers` threads, each running its own single-threaded tokio
//! runtime and its own accept loop, so a request is read, scheduled, forwarded and answered on
//! one core without cross-thread wake-ups (the shape of a thread-per-core server).
//!
//! Invariants:
//! - A worker serves only the connections it accepted; the upstream client it forwards with is
//!   its own lane ([`crate::worker::current`] indexes [`crate::upstream::Upstream`]'s clients), so connection
//!   tasks, timers and the request future share one runtime. Shared state (tenants, fair queues,
//!   admission, metrics) is `Send + Sync` and crosses workers freely; a fair-queue grant made on
//!   another worker wakes the waiter through its runtime's remote queue. The jobs runner's
//!   requests are handed to the workers in turn ([`Job`], `server::jobs`), so they too run on
//!   the runtime of the lane they use; they are drained and aborted with the connections.
//! - `serve` binds one `SO_REUSEPORT` socket per worker (the kernel spreads connections);
//!   an already bound listener (tests, embedding) is shared by duplicating its descriptor.
//! - On stop every worker stops accepting, drains its connections for at most the grace period,
//!   aborts the rest, and reports done; the server has stopped when every worker has.
//! - Every accepted connection passes [`Registry::admit`] before anything else is done with it,
//!   and holds its place until its task ends; a failed `accept` never spins (see
//!   [`accept_loop`]).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::TokioExecutor;
use hyper_util::server::conn::auto;
use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;

use crate::config::ServerConfig;

use super::connection;
use super::connections::Registry;
use super::live::LiveService;
use crate::fdlimit::{self, AcceptErrors};

/// How many workers `server` asks for (`workers`, else one per CPU core).
pub fn count(server: &ServerConfig) -> usize {
    server.workers.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    })
}

/// Binds `n` listening sockets on `addr` with `SO_REUSEPORT` (one per worker). Call inside a
/// runtime; the sockets are handed to the workers' runtimes by [`spawn`].
pub async fn bind(addr: SocketAddr, n: usize) -> std::io::Result<Vec<std::net::TcpListener>> {
    let mut out = Vec::with_capacity(n);
    // Port 0: the first socket picks the port, the others join it.
    let mut at = addr;
    for _ in 0..n.max(1) {
        let socket = if at.is_ipv4() {
            TcpSocket::new_v4()?
        } else {
            TcpSocket::new_v6()?
        };
        socket.set_reuseaddr(true)?;
        #[cfg(unix)]
        socket.set_reuseport(true)?;
        socket.bind(at)?;
        let listener = socket.listen(1024)?;
        at = listener.local_addr()?;
        out.push(listener.into_std()?);
        #[cfg(not(unix))]
        break;
    }
    Ok(out)
}

/// One listener shared by `n` workers: the first gets it, the others a duplicate descriptor.
pub fn share(listener: TcpListener, n: usize) -> std::io::Result<Vec<std::net::TcpListener>> {
    let first = listener.into_std()?;
    let mut out = Vec::with_capacity(n.max(1));
    for _ in 1..n.max(1) {
        out.push(first.try_clone()?);
    }
    out.insert(0, first);
    Ok(out)
}

/// What every worker serves its connections with.
#[derive(Clone)]
pub struct Conns {
    /// HTTP/1 + HTTP/2 connection builder.
    pub builder: auto::Builder<TokioExecutor>,
    /// The same, HTTP/1 only: for a connection known to speak HTTP/1 (no version sniffing).
    pub http1: auto::Builder<TokioExecutor>,
    /// The request path (follows reloads).
    pub service: LiveService,
    /// Inbound TLS, if configured.
    pub tls: Option<TlsAcceptor>,
    /// Drain time on stop.
    pub grace: Duration,
    /// `/readyz`: cleared when stopping.
    pub ready: Arc<AtomicBool>,
    /// Open connections and their caps (shared by every worker).
    pub registry: Arc<Registry>,
    /// `[server] keepalive_timeout_ms`.
    pub keepalive: Duration,
}

/// Work handed to a connection worker to run on its runtime (the jobs runner's requests,
/// `server::jobs`): spawned beside its connections, drained and aborted with them on stop.
pub type Job = crate::stage::BoxFuture<()>;

/// The workers started by [`spawn`].
pub struct Spawned {
    /// One receiver per worker, answered when it has stopped.
    pub done: Vec<oneshot::Receiver<()>>,
    /// Where to hand each worker a [`Job`] (by index: what [`crate::worker::current`] reads
    /// there); closed once the worker stops accepting.
    pub jobs: Vec<mpsc::UnboundedSender<Job>>,
}

/// Starts one worker thread per listener.
/// Runtimes are built before any thread starts, so a failure leaves nothing running.
pub fn spawn(
    listeners: Vec<std::net::TcpListener>,
    conns: &Conns,
    stop: &watch::Receiver<bool>,
) -> std::io::Result<Spawned> {
    let runtimes = listeners
        .iter()
        .map(|_| {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
        })
        .collect::<std::io::Result<Vec<_>>>()?;
    // Workers log where the server was started from (a scoped subscriber in tests, else the
    // global one); with no subscriber at all they fall back to the global default like any
    // other thread.
    let dispatch = tracing::dispatcher::get_default(|d| d.clone());
    let dispatch = (!dispatch.is::<tracing::subscriber::NoSubscriber>()).then_some(dispatch);
    let mut done = Vec::with_capacity(runtimes.len());
    let mut senders = Vec::with_capacity(runtimes.len());
    for (index, (rt, listener)) in runtimes.into_iter().zip(listeners).enumerate() {
        let (tx, rx) = oneshot::channel();
        let (job_tx, jobs) = mpsc::unbounded_channel();
        senders.push(job_tx);
        let (conns, stop, dispatch) = (conns.clone(), stop.clone(), dispatch.clone());
        std::thread::Builder::new()
            .name(format!("fairgate-w{index}"))
            .spawn(move || {
                crate::worker::set(index);
                let _log = dispatch.as_ref().map(tracing::dispatcher::set_default);
                rt.block_on(async move {
                    match TcpListener::from_std(listener) {
                        Ok(l) => accept_loop(index, l, conns, jobs, stop).await,
                        Err(e) => tracing::error!(worker = index, error = %e, "listener unusable"),
                    }
                });
                // Connection tasks still alive here were aborted by `accept_loop`; dropping the
                // runtime drops the rest (idle upstream connections).
                drop(rt);
                let _ = tx.send(());
            })?;
        done.push(rx);
    }
    Ok(Spawned {
        done,
        jobs: senders,
    })
}

/// Keeps one timer at most [`TICK`] away pending on this worker's runtime, for ever (aborted
/// with the runtime). Why: tokio wakes a time driver through its eventfd whenever a timer is
/// registered earlier than everything pending when it last parked, even from the driver's own
/// thread; with nothing pending, every request's timeouts (header read, first byte, idle) did
/// so — a `write(2)` for ~40% of requests. With this timer pending they are all later, and
/// register silently.
async fn keep_timer_armed() {
    loop {
        tokio::time::sleep(TICK).await;
    }
}

/// See [`keep_timer_armed`]: shorter than every request timeout, long enough to cost nothing.
const TICK: Duration = Duration::from_millis(500);

/// Pause after a failed `accept` (no busy loop while descriptors are short).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(20);

/// Idle connections shed per `accept` that failed for lack of descriptors.
const SHED_ON_EXHAUSTION: usize = 16;

/// Accepts and serves connections, and runs the [`Job`]s handed to it, until `stop` turns true
/// (or its sender is dropped), then drains both for at most `conns.grace`. A connection over a cap is closed as soon as accepted
/// (see [`super::connections`]); when `accept` fails for lack of descriptors the loop sheds
/// the oldest idle connections, pauses, and logs the failures once per interval.
async fn accept_loop(
    worker: usize,
    listener: TcpListener,
    conns: Conns,
    mut jobs: mpsc::UnboundedReceiver<Job>,
    mut stop: watch::Receiver<bool>,
) {
    let mut tasks = JoinSet::new();
    let mut errors = AcceptErrors::default();
    let _tick = tokio::spawn(keep_timer_armed());
    loop {
        tokio::select! {
            biased;
            _ = async { let _ = stop.wait_for(|s| *s).await; } => break,
            Some(_) = tasks.join_next() => {}
            Some(job) = jobs.recv() => {
                tasks.spawn(job);
            }
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        let exhausted = fdlimit::is_exhaustion(&e);
                        let shed = if exhausted {
                            conns.registry.shed_idle(SHED_ON_EXHAUSTION)
                        } else {
                            0
                        };
                        if let Some(count) = errors.note(Instant::now()) {
                            tracing::warn!(worker, error = %e, count, shed, exhausted,
                                open = conns.registry.open(), "accept failed");
                        }
                        tokio::time::sleep(ACCEPT_BACKOFF).await;
                        continue;
                    }
                };
                // Over a cap: closed before a byte is read (counted by the registry).
                let Ok(guard) = conns.registry.admit(peer.ip()) else {
                    drop(stream);
                    continue;
                };
                let shed = guard.shed;
                let _ = stream.set_nodelay(true);
                let (conns, stop) = (conns.clone(), stop.clone());
                tasks.spawn(async move {
                    let entry = guard.entry.clone();
                    let (b, svc, keepalive) = (&conns.builder, conns.service, conns.keepalive);
                    let mut stop = stop;
                    let result = match conns.tls {
                        None => {
                            // HTTP/1 from the first byte unless the client opens with h2's
                            // preface: hyper's read buffer stays 8 KiB (connection docs).
                            // Boxed, as the handshake below: inline, either would size the
                            // task of every connection for as long as it lives.
                            let opening = Box::pin(connection::opening(
                                &stream, keepalive, &entry, &mut stop,
                            ))
                            .await;
                            let b = match opening {
                                connection::Opening::Http1 => &conns.http1,
                                connection::Opening::Unknown => b,
                                connection::Opening::Close => return,
                            };
                            Box::pin(connection::serve(b, stream, svc, entry, keepalive, stop)).await
                        }
                        Some(acceptor) => {
                            let handshake = acceptor.accept(stream);
                            let handshake =
                                Box::pin(tokio::time::timeout(Duration::from_secs(10), handshake));
                            let Ok(Ok(stream)) = handshake.await else {
                                return;
                            };
                            // ALPN said HTTP/1.1: no version sniffing (as above).
                            let b = match stream.get_ref().1.alpn_protocol() {
                                Some(b"http/1.1") => &conns.http1,
                                _ => b,
                            };
                            Box::pin(connection::serve(b, stream, svc, entry, keepalive, stop)).await
                        }
                    };
                    drop(guard);
                    if let Err(e) = result {
                        tracing::debug!(error = %e, "connection ended with an error");
                    }
                });
                if shed {
                    // Let the connection just shed close (its descriptor is freed when its task
                    // runs) before accepting more: a burst must not outrun the shedding.
                    tokio::task::yield_now().await;
                }
            }
        }
    }
    conns.ready.store(false, Ordering::Release);
    drop(listener);
    // No job is taken any more (the runner gets it back); those running drain as connections.
    drop(jobs);
    tracing::info!(worker, connections = tasks.len(), "shutting down: draining");
    // Every connection saw `stop` and is closing gracefully; wait for them, within the grace.
    let drained = async { while tasks.join_next().await.is_some() {} };
    match tokio::time::timeout(conns.grace, drained).await {
        Ok(()) => tracing::info!(worker, "drained"),
        Err(_) => {
            tracing::warn!(
                worker,
                connections = tasks.len(),
                "grace period over: aborting"
            );
        }
    }
    tasks.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn bind_puts_every_worker_on_one_port_and_each_socket_accepts() {
        let listeners = bind(SocketAddr::from(([127, 0, 0, 1], 0)), 3)
            .await
            .unwrap();
        assert_eq!(listeners.len(), 3);
        let addr = listeners[0].local_addr().unwrap();
        assert_ne!(addr.port(), 0);
        assert!(listeners.iter().all(|l| l.local_addr().unwrap() == addr));
        // Connections reach some socket of the group; whichever it is accepts them.
        let clients: Vec<_> = (0..12)
            .map(|_| std::net::TcpStream::connect(addr).unwrap())
            .collect();
        let mut accepted = 0;
        for l in &listeners {
            while l.accept().is_ok() {
                accepted += 1;
            }
        }
        assert_eq!(accepted, clients.len());
    }

    #[tokio::test]
    async fn share_duplicates_one_listener() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let shared = share(l, 2).unwrap();
        assert_eq!(shared.len(), 2);
        assert!(shared.iter().all(|l| l.local_addr().unwrap() == addr));
    }

    #[test]
    fn workers_default_to_the_core_count() {
        let mut c = ServerConfig::default();
        assert!(count(&c) >= 1);
        c.workers = Some(3);
        assert_eq!(count(&c), 3);
    }
}
