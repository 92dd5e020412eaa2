//! Cluster mode (`[cluster] redis_url`): several fairgate replicas in front of one provider
//! share pool capacity, fairness and rate limits through Redis, each scheduling locally.
//!
//! - [`lease`]: a pool's `max_concurrency` (and the limit learned from 429s) holds across all
//!   replicas — slots are leases with a TTL in a sorted set, leased in blocks, renewed in one
//!   call per tick, reclaimed when a replica dies.
//! - [`endpoints`]: the same for each endpoint of a pool (`[[upstreams.endpoints]]`): its
//!   capacity, learned limit and ejections hold across the replicas.
//! - [`service`]: per-tenant weighted service in a shared hash; each replica charges a tenant's
//!   DRR credit for what it received elsewhere (global fairness, with the bound stated there).
//! - [`rate`]: per-tenant requests/tokens per minute as GCRA in Lua, corrected at reconcile;
//!   retuned in place by every generation (its file and API tenants).
//! - [`link`]: the connection (tight timeouts) and degraded mode (`fairgate_cluster_degraded`).
//! - [`replica`]: one live replica per `replica_id` (a duplicate is refused at startup).
//! - The job store's Redis backend (`jobs::store::redis`) runs its scripts over the same
//!   [`Link`] (`impl jobs::store::Redis for Link`, with a longer response timeout).
//!
//! Not shared: what a tenant's own provider key learned (`feedback::keys`) stays local to each
//! replica; only the pool's and its endpoints' learned limits are published through the leases.
//!
//! The pure scheduler is untouched by I/O: the queue only sees a slot count
//! (`FairQueue::set_cluster_slots`) and debts (`FairQueue::charge_remote`). Every shared update
//! is one atomic Lua script ([`scripts`]). Hot path: a limited tenant's admission costs one
//! round trip; a request waits for a lease round trip only when its replica held no spare slot.
//! Absent `[cluster]`, none of this exists and a replica is exactly the single process.

pub mod endpoints;
pub mod lease;
pub mod link;
pub mod rate;
pub mod replica;
pub mod scripts;
pub mod service;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::admission::Admission;
use crate::config::{ClusterConfig, Config, ConfigError};
use crate::queue::FairQueue;
pub use lease::LeaseGate;
pub use link::Link;
pub use rate::RedisStore;

/// A replica's cluster state: the link, the rate store, one lease gate per pool, the syncer's
/// inputs. Background tasks start with [`Cluster::spawn`].
#[derive(Debug)]
pub struct Cluster {
    /// The Redis connection and degraded flag.
    pub link: Arc<Link>,
    /// One lease gate per pool, indexed like `[[upstreams]]`.
    pub gates: Vec<Arc<LeaseGate>>,
    store: Arc<RedisStore>,
    pools: Vec<(String, Arc<FairQueue>)>,
    config: ClusterConfig,
    /// `fairgate_cluster_sync_unapplied_total`: sync batches Redis did not apply (see
    /// [`service`]).
    unapplied: metrics::Counter,
}

/// This replica's id: configured, else host name, pid and a random suffix.
fn replica_id(cfg: &ClusterConfig) -> String {
    cfg.replica_id.clone().unwrap_or_else(|| {
        let host = std::env::var("HOSTNAME")
            .ok()
            .filter(|h| !h.is_empty() && !h.contains(':'))
            .unwrap_or_else(|| "fairgate".to_owned());
        format!(
            "{host}-{}-{:08x}",
            std::process::id(),
            rand::random::<u32>()
        )
    })
}

/// The Redis link and the shared rate store built on it.
pub type Linked = (Arc<Link>, Arc<RedisStore>);

/// The link and the shared rate store, before admission is built (`None`: no `[cluster]`).
/// Builds the Redis client of `[cluster]` as `serve` would (URL, `tls_ca_file` read and
/// parsed; nothing is dialled), for `fairgate check`.
pub fn check(config: &Config) -> Result<(), ConfigError> {
    let Some(cfg) = &config.cluster else {
        return Ok(());
    };
    link::client(cfg, &link::Credentials::default())
        .map(drop)
        .map_err(|e| ConfigError::Invalid {
            key: e.key().to_owned(),
            message: e.message(),
        })
}

/// `env` reads `password_env` / `username_env` (unset → an error naming the key).
pub fn connect(
    config: &Config,
    degraded_gauge: metrics::Gauge,
    env: impl Fn(&str) -> Option<String>,
) -> Result<Option<Linked>, ConfigError> {
    let Some(cfg) = &config.cluster else {
        return Ok(None);
    };
    let read = |key: &str, var: &Option<String>| -> Result<Option<String>, ConfigError> {
        var.as_ref()
            .map(|var| {
                env(var).ok_or_else(|| ConfigError::MissingEnv {
                    key: format!("cluster.{key}"),
                    var: var.clone(),
                })
            })
            .transpose()
    };
    let creds = link::Credentials {
        username: read("username_env", &cfg.username_env)?,
        password: read("password_env", &cfg.password_env)?,
    };
    let link = Link::new(cfg, &creds, replica_id(cfg), degraded_gauge).map_err(|e| {
        ConfigError::Invalid {
            key: e.key().to_owned(),
            message: e.message(),
        }
    })?;
    let link = Arc::new(link);
    let store = Arc::new(RedisStore::new(link.clone(), config, cfg.expected_replicas));
    Ok(Some((link, store)))
}

impl Cluster {
    /// Lease gates for every pool (each attaches to its queue: nothing is dispatched before the
    /// first lease round).
    pub fn new(
        link: Arc<Link>,
        store: Arc<RedisStore>,
        config: &Config,
        pools: &[Arc<FairQueue>],
        admission: &Admission,
        unapplied: metrics::Counter,
    ) -> Arc<Self> {
        let cfg = config.cluster.clone().expect("cluster mode is configured");
        let gates = config
            .upstreams
            .iter()
            .zip(pools)
            .zip(admission.capacity.iter())
            .map(|((u, q), cap)| {
                let max = u32::try_from(u.max_concurrency).unwrap_or(u32::MAX);
                let eps =
                    endpoints::EndpointGates::new(link.clone(), u, q.clone(), cap.clone(), &cfg);
                LeaseGate::new(
                    link.clone(),
                    &u.name,
                    q.clone(),
                    cap.clone(),
                    max,
                    &cfg,
                    eps,
                )
            })
            .collect();
        let pools = config
            .upstreams
            .iter()
            .map(|u| u.name.clone())
            .zip(pools.iter().cloned())
            .collect();
        Arc::new(Self {
            link,
            gates,
            store,
            pools,
            config: cfg,
            unapplied,
        })
    }

    /// (ledger corrections recorded here, of which applied in Redis by a sync flush): equal
    /// once every reconciled estimate has reached the other replicas.
    pub fn corrections(&self) -> (u64, u64) {
        self.store.corrections()
    }

    /// Claims this replica's id in Redis (see [`replica`]): `Err` when another live replica
    /// holds it. Call before serving, and hand the claim to [`Cluster::spawn`].
    pub async fn claim(&self) -> Result<replica::Claim, ConfigError> {
        let ttl = Duration::from_millis(self.config.lease_ttl_ms);
        replica::Claim::take(self.link.clone(), ttl).await
    }

    /// Starts the lease gates, the syncer and the renewal of `claim`; they stop after `stop`
    /// turns true (a gate once its pool has drained, releasing its leases; the claim is
    /// released).
    pub fn spawn(&self, claim: replica::Claim, stop: watch::Receiver<bool>) {
        tokio::spawn(claim.keep(stop.clone()));
        for g in &self.gates {
            tokio::spawn(g.clone().run(stop.clone()));
        }
        let syncer = service::Syncer::new(
            self.link.clone(),
            self.pools.clone(),
            Some(self.store.clone()),
            Duration::from_millis(self.config.sync_interval_ms),
            self.unapplied.clone(),
        );
        tokio::spawn(syncer.run(stop));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Redis URL that passes validation but not the client: the error names the key, never
    /// the URL (it may hold a password).
    #[tokio::test]
    async fn a_bad_redis_url_is_refused_without_echoing_its_password() {
        let mut refused = 0;
        for url in [
            "redis://:sk-SECRET-9@[::1",
            "redis://user:sk-SECRET-9@h:notaport",
            "redis://:sk-SECRET-9@h:6379/notadb",
        ] {
            let text = format!(
                "[[upstreams]]\nname = \"u\"\nbase_url = \"http://h/v1\"\n\
                 [cluster]\nredis_url = \"{url}\"\n"
            );
            let e = match Config::from_toml_str(&text) {
                Err(e) => e.to_string(),
                Ok(config) => match connect(&config, metrics::Gauge::noop(), |_| None) {
                    Err(e) => e.to_string(),
                    Ok(_) => continue,
                },
            };
            assert!(e.starts_with("cluster.redis_url"), "{e}");
            assert!(!e.contains("SECRET"), "{e}");
            refused += 1;
        }
        assert!(refused >= 2, "{refused}");
    }

    #[test]
    fn check_reads_the_redis_ca_file() {
        let text = |ca: &str| {
            format!(
                "[[upstreams]]\nname = \"u\"\nbase_url = \"http://h/v1\"\n\
                 [cluster]\nredis_url = \"rediss://h:6380\"\ntls_ca_file = \"{ca}\"\n"
            )
        };
        let missing = Config::from_toml_str(&text("/nonexistent/ca.pem")).unwrap();
        let e = check(&missing).unwrap_err().to_string();
        assert!(e.starts_with("cluster.tls_ca_file"), "{e}");
        let fixture = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/localhost.crt");
        check(&Config::from_toml_str(&text(fixture)).unwrap()).unwrap();
    }
}
