//! [`Link`]: this replica's connection to Redis (the redis crate's `ConnectionManager`, which
//! reconnects by itself) with a hard timeout on every call, and the degraded-mode flag.
//!
//! Invariants: no call waits longer than `timeout_ms` (connect or response); a call that fails
//! for lack of Redis (I/O, timeout, refused, dropped) fails that call only — its caller falls
//! back for that one call (see each component) — until failures have lasted: at least
//! [`FAILURES_TO_DEGRADE`] in a row spanning at least `degrade_after_ms` put the replica in
//! degraded mode (`fairgate_cluster_degraded` = 1 and one `error` log line on entering). So a
//! call merely slower than the timeout (a replica starved of CPU, a Redis fork) no longer flips
//! a replica, while a dead Redis is declared so within `degrade_after_ms` plus one call. The
//! first call that succeeds leaves it (`info` line, gauge 0) and bumps [`Link::epoch`], by which
//! every component knows to rejoin from fresh state (no service baseline is carried over; leases
//! still held are renewed if Redis still has them, else reported lost).
//! A Redis *answer* that is an error (a script bug) is logged and fails that call only.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{ErrorKind, FromRedisValue, RedisError, ScriptInvocation};

/// Response timeout of the job store's calls (`jobs::store::Redis`): they carry whole files
/// and batches, so `timeout_ms` (sized for the hot path) is too tight for them.
pub const JOBS_TIMEOUT: Duration = Duration::from_secs(5);

/// Consecutive failed calls (spanning `degrade_after_ms`) that enter degraded mode.
pub const FAILURES_TO_DEGRADE: u32 = 3;

/// The current run of failed calls.
#[derive(Default)]
struct Streak {
    failures: u32,
    since: Option<Instant>,
}

/// The connection, its timeout and the degraded flag; see the module docs.
pub struct Link {
    conn: ConnectionManager,
    timeout: Duration,
    degrade_after: Duration,
    /// Whether the last call failed (the success path touches only this atomic).
    failing: AtomicBool,
    streak: Mutex<Streak>,
    degraded: AtomicBool,
    epoch: AtomicU64,
    gauge: metrics::Gauge,
    /// This replica's id (member prefix of its leases).
    pub replica: String,
    /// Prefix of every key.
    pub prefix: String,
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link")
            .field("replica", &self.replica)
            .field("degraded", &self.degraded())
            .finish_non_exhaustive()
    }
}

/// Why the link could not be set up. Neither variant carries the URL or a credential.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    /// The URL (or the TLS settings) refused by the client.
    #[error("cluster.redis_url: {0}")]
    Redis(#[from] RedisError),
    /// `tls_ca_file` unreadable.
    #[error("cluster.tls_ca_file: {path}: {source}")]
    CaFile {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
}

impl LinkError {
    /// The config key this error is about.
    pub fn key(&self) -> &'static str {
        match self {
            Self::Redis(_) => "cluster.redis_url",
            Self::CaFile { .. } => "cluster.tls_ca_file",
        }
    }

    /// The message without the key.
    pub fn message(&self) -> String {
        match self {
            Self::Redis(e) => e.to_string(),
            Self::CaFile { path, source } => format!("{path}: {source}"),
        }
    }
}

/// The secrets a link authenticates with, read from `password_env` / `username_env` (never
/// from the URL). `Debug` prints neither.
#[derive(Default, Clone)]
pub struct Credentials {
    /// ACL user name (Redis 6+).
    pub username: Option<String>,
    /// `AUTH` password.
    pub password: Option<String>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &self.username.as_ref().map(|_| "<set>"))
            .field("password", &self.password.as_ref().map(|_| "<set>"))
            .finish()
    }
}

/// The redis client for `cfg`: URL, credentials from the environment, and for `rediss://`
/// rustls with the system trust store or, with `tls_ca_file`, that PEM bundle alone.
pub fn client(
    cfg: &crate::config::ClusterConfig,
    creds: &Credentials,
) -> Result<redis::Client, LinkError> {
    use redis::IntoConnectionInfo;
    let mut info = cfg.redis_url.as_str().into_connection_info()?;
    let mut settings = info.redis_settings().clone();
    if let Some(user) = &creds.username {
        settings = settings.set_username(user);
    }
    if let Some(password) = &creds.password {
        settings = settings.set_password(password);
    }
    info = info.set_redis_settings(settings);
    match &cfg.tls_ca_file {
        Some(path) => {
            let pem = std::fs::read(path).map_err(|source| LinkError::CaFile {
                path: path.display().to_string(),
                source,
            })?;
            let certs = redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(pem),
            };
            Ok(redis::Client::build_with_tls(info, certs)?)
        }
        None => Ok(redis::Client::open(info)?),
    }
}

impl Link {
    /// A lazy connection (nothing is dialled until the first call, so a replica starts even
    /// while Redis is down — degraded). Must run inside a tokio runtime.
    pub fn new(
        cfg: &crate::config::ClusterConfig,
        creds: &Credentials,
        replica: String,
        gauge: metrics::Gauge,
    ) -> Result<Self, LinkError> {
        let client = client(cfg, creds)?;
        let timeout = Duration::from_millis(cfg.timeout_ms);
        // No response timeout on the connection itself: every call is bounded by its own
        // (`run_within`: `timeout_ms` on the hot path, `JOBS_TIMEOUT` for the job store, whose
        // calls move whole files). One on the connection capped the job store at `timeout_ms`,
        // so a loaded replica answered job reads 503.
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(None)
            .set_number_of_retries(1)
            .set_min_delay(Duration::from_millis(20))
            .set_max_delay(Duration::from_millis(200));
        let conn = ConnectionManager::new_lazy_with_config(client, config)?;
        gauge.set(0.0);
        Ok(Self {
            conn,
            timeout,
            degrade_after: Duration::from_millis(cfg.degrade_after_ms),
            failing: AtomicBool::new(false),
            streak: Mutex::default(),
            degraded: AtomicBool::new(false),
            epoch: AtomicU64::new(0),
            gauge,
            replica,
            prefix: cfg.key_prefix.clone(),
        })
    }

    /// A key under the configured prefix, which is a Redis Cluster hash tag (`{fairgate}:…`,
    /// unless the prefix already holds one): every key fairgate uses lives in one slot, so
    /// every multi-key script runs on a Redis Cluster too.
    pub fn key(&self, parts: &[&str]) -> String {
        let mut k = if self.prefix.contains('{') && self.prefix.contains('}') {
            self.prefix.clone()
        } else {
            format!("{{{}}}", self.prefix)
        };
        for p in parts {
            k.push(':');
            k.push_str(p);
        }
        k
    }

    /// Runs a script invocation within the timeout. `None`: failed (see the module docs).
    pub async fn run<T: FromRedisValue>(&self, inv: &ScriptInvocation<'_>) -> Option<T> {
        self.run_within(inv, self.timeout).await
    }

    /// [`Link::run`] with another response timeout (the job store moves whole files).
    pub async fn run_within<T: FromRedisValue>(
        &self,
        inv: &ScriptInvocation<'_>,
        timeout: Duration,
    ) -> Option<T> {
        let mut conn = self.conn.clone();
        match tokio::time::timeout(timeout, inv.invoke_async::<T>(&mut conn)).await {
            Ok(Ok(v)) => {
                self.up();
                Some(v)
            }
            Ok(Err(e)) if matches!(e.kind(), ErrorKind::Server(_)) && !e.is_timeout() => {
                tracing::warn!(error = %e, "cluster: Redis refused a script call");
                None
            }
            Ok(Err(e)) => {
                self.down(&e.to_string());
                None
            }
            Err(_) => {
                self.down("timed out");
                None
            }
        }
    }

    /// Whether Redis is currently unreachable.
    pub fn degraded(&self) -> bool {
        self.degraded.load(Ordering::Acquire)
    }

    /// Bumped at every recovery: state from before it must not be reused.
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    fn down(&self, why: &str) {
        self.failing.store(true, Ordering::Release);
        let lasting = {
            let mut s = self.streak.lock().unwrap_or_else(|p| p.into_inner());
            s.failures = s.failures.saturating_add(1);
            let since = *s.since.get_or_insert_with(Instant::now);
            s.failures >= FAILURES_TO_DEGRADE && since.elapsed() >= self.degrade_after
        };
        if !lasting {
            tracing::debug!(replica = %self.replica, error = why, "cluster: a Redis call failed");
            return;
        }
        if !self.degraded.swap(true, Ordering::AcqRel) {
            self.gauge.set(1.0);
            tracing::error!(
                replica = %self.replica,
                error = why,
                "cluster: Redis unreachable, degraded mode (local allowance for capacity and \
                 request rates, token budgets closed)"
            );
        }
    }

    fn up(&self) {
        if self.failing.swap(false, Ordering::AcqRel) {
            *self.streak.lock().unwrap_or_else(|p| p.into_inner()) = Streak::default();
        }
        if self.degraded.swap(false, Ordering::AcqRel) {
            self.epoch.fetch_add(1, Ordering::AcqRel);
            self.gauge.set(0.0);
            tracing::info!(replica = %self.replica, "cluster: Redis reachable again, rejoined");
        }
    }
}

/// The job store's (and the budgets') connection: the same link (one connection, one degraded
/// flag), with [`JOBS_TIMEOUT`]; `eval_fast` (a budget reservation, on the request path) within
/// `timeout_ms`.
impl crate::jobs::store::Redis for Link {
    fn key(&self, parts: &[&str]) -> String {
        Link::key(self, parts)
    }

    fn eval<'a>(
        &'a self,
        inv: &'a ScriptInvocation<'a>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Option<redis::Value>> + Send + 'a>>
    {
        Box::pin(self.run_within(inv, JOBS_TIMEOUT))
    }

    fn eval_fast<'a>(
        &'a self,
        inv: &'a ScriptInvocation<'a>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Option<redis::Value>> + Send + 'a>>
    {
        Box::pin(self.run(inv))
    }
}
