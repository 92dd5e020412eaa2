//! One live replica per `replica_id`: at startup a replica claims its id in Redis (a key holding
//! a random token of this process, with the lease TTL) and is refused — a readable startup
//! error naming `cluster.replica_id` — when another live replica holds it; then it renews the
//! claim every third of the TTL and deletes it when it stops. Two replicas sharing an id would
//! renew and release each other's leases and merge their service counts.
//!
//! Invariants: a claim is only ever renewed or released by the token that made it (atomic Lua);
//! a dead replica's claim expires within `lease_ttl_ms`, so a restart under the same id waits at
//! most that long; when Redis is unreachable at startup the check cannot be made and the replica
//! starts (degraded mode, logged) rather than refusing to serve.

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use redis::Script;
use tokio::sync::watch;

use super::link::Link;
use crate::config::ConfigError;

/// KEYS: the claim. ARGV: token, ttl ms. 1: held by this token (set or renewed); 0: by another.
static CLAIM: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local v = redis.call('GET', KEYS[1])
if v and v ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', tonumber(ARGV[2]))
return 1
"#,
    )
});

/// KEYS: the claim. ARGV: token. Deletes it if this token holds it.
static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
return 1
"#,
    )
});

/// This replica's claim on its id.
#[derive(Debug)]
pub struct Claim {
    link: Arc<Link>,
    key: String,
    token: String,
    ttl: Duration,
}

impl Claim {
    /// Claims `link.replica`; `Err` when another live replica holds it.
    pub async fn take(link: Arc<Link>, ttl: Duration) -> Result<Self, ConfigError> {
        let claim = Self {
            key: link.key(&["replica", &link.replica]),
            token: format!("{:016x}", rand::random::<u64>()),
            link,
            ttl,
        };
        match claim.renew().await {
            Some(true) => Ok(claim),
            Some(false) => Err(ConfigError::Invalid {
                key: "cluster.replica_id".to_owned(),
                message: format!(
                    "replica id {:?} is already used by another live replica of this cluster \
                     (each replica needs its own; a stopped replica's id frees within \
                     lease_ttl_ms)",
                    claim.link.replica
                ),
            }),
            None => {
                tracing::warn!(
                    replica = %claim.link.replica,
                    "cluster: Redis unreachable at startup, replica id not checked for duplicates"
                );
                Ok(claim)
            }
        }
    }

    /// `Some(true)`: held; `Some(false)`: another replica holds it; `None`: Redis failed.
    async fn renew(&self) -> Option<bool> {
        let mut inv = CLAIM.prepare_invoke();
        inv.key(&self.key)
            .arg(&self.token)
            .arg(u64::try_from(self.ttl.as_millis()).unwrap_or(u64::MAX));
        self.link.run::<i64>(&inv).await.map(|v| v == 1)
    }

    /// Renews every third of the TTL until `stop` turns true, then releases the claim.
    pub async fn keep(self, mut stop: watch::Receiver<bool>) {
        loop {
            tokio::select! {
                _ = async { let _ = stop.wait_for(|s| *s).await; } => break,
                _ = tokio::time::sleep(self.ttl / 3) => {
                    if self.renew().await == Some(false) {
                        tracing::error!(replica = %self.link.replica,
                            "cluster: another replica took this replica id");
                    }
                }
            }
        }
        let mut inv = RELEASE.prepare_invoke();
        inv.key(&self.key).arg(&self.token);
        let _ = self.link.run::<i64>(&inv).await;
    }
}
