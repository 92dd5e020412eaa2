//! `[cluster]`: several replicas sharing pool capacity, fairness and rate limits through Redis
//! (see the `cluster` module). Absent: one process, everything in memory.

use serde::Deserialize;

use super::ConfigError;

/// `[cluster]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    /// `redis://[user@]host[:port][/db]`, or `rediss://…` for TLS (rustls; the system trust
    /// store unless `tls_ca_file`). A password in the URL is refused: use `password_env`.
    pub redis_url: String,
    /// Env var holding the Redis password (`AUTH`); never written in `redis_url`, never logged.
    #[serde(default)]
    pub password_env: Option<String>,
    /// Env var holding the Redis ACL user name (Redis 6+; default: the URL's user, else
    /// `default`).
    #[serde(default)]
    pub username_env: Option<String>,
    /// PEM file of the CA(s) that sign the Redis server's certificate (a managed Redis with a
    /// private CA), used *instead of* the system trust store. Only with `rediss://`.
    #[serde(default)]
    pub tls_ca_file: Option<std::path::PathBuf>,
    /// A capacity lease lives this long unless renewed; a dead replica's slots come back
    /// within it.
    #[serde(default = "default_lease_ttl")]
    pub lease_ttl_ms: u64,
    /// Replicas expected to share the pools: the local allowance of a replica that cannot reach
    /// Redis is a pool's capacity (and a tenant's request rate) divided by this.
    #[serde(default = "default_replicas")]
    pub expected_replicas: u32,
    /// Timeout of every Redis call (connect and response); no request waits longer on Redis.
    #[serde(default = "default_timeout")]
    pub timeout_ms: u64,
    /// Degraded mode starts only once Redis calls have kept failing (at least three in a row)
    /// for this long: a call merely slower than `timeout_ms` (a stalled replica, a Redis fork)
    /// fails that call alone, while the replica keeps running on the leases it holds. Must be
    /// below `lease_ttl_ms`.
    #[serde(default = "default_degrade_after")]
    pub degrade_after_ms: u64,
    /// This replica's name in Redis (default: host name, pid and a random suffix). Must be
    /// unique per running replica.
    #[serde(default)]
    pub replica_id: Option<String>,
    /// Prefix of every Redis key (several fairgate deployments can share one Redis).
    #[serde(default = "default_prefix")]
    pub key_prefix: String,
    /// How often served tokens and rate-limit corrections are flushed to Redis, and other
    /// replicas' service read back.
    #[serde(default = "default_sync")]
    pub sync_interval_ms: u64,
}

fn default_lease_ttl() -> u64 {
    5_000
}
fn default_replicas() -> u32 {
    3
}
fn default_timeout() -> u64 {
    100
}
fn default_degrade_after() -> u64 {
    1_000
}
fn default_prefix() -> String {
    "fairgate".to_owned()
}
fn default_sync() -> u64 {
    100
}

fn invalid(key: &str, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key: format!("cluster.{key}"),
        message: message.into(),
    }
}

/// Whether the authority of a URL (after the scheme) carries `user:password@`.
fn url_has_password(rest: &str) -> bool {
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    match authority.rsplit_once('@') {
        Some((userinfo, _)) => userinfo.contains(':'),
        None => false,
    }
}

/// Checks `[cluster]`.
pub(super) fn validate(c: &ClusterConfig) -> Result<(), ConfigError> {
    let Some(rest) = c
        .redis_url
        .strip_prefix("redis://")
        .or_else(|| c.redis_url.strip_prefix("rediss://"))
    else {
        return Err(invalid(
            "redis_url",
            "must start with redis:// or rediss://",
        ));
    };
    if url_has_password(rest) {
        // Never echoed: the message names the key, not the value.
        return Err(invalid(
            "redis_url",
            "holds a password: put it in an environment variable named by cluster.password_env",
        ));
    }
    if c.tls_ca_file.is_some() && !c.redis_url.starts_with("rediss://") {
        return Err(invalid("tls_ca_file", "needs a rediss:// redis_url"));
    }
    for (key, var) in [
        ("password_env", &c.password_env),
        ("username_env", &c.username_env),
    ] {
        if var.as_deref().is_some_and(str::is_empty) {
            return Err(invalid(key, "must name an environment variable"));
        }
    }
    if c.timeout_ms == 0 {
        return Err(invalid("timeout_ms", "must be > 0"));
    }
    if c.lease_ttl_ms < 3 * c.timeout_ms.max(c.sync_interval_ms) {
        return Err(invalid(
            "lease_ttl_ms",
            "must be at least 3 × max(timeout_ms, sync_interval_ms): leases are renewed every \
             third of it",
        ));
    }
    if c.degrade_after_ms >= c.lease_ttl_ms {
        return Err(invalid(
            "degrade_after_ms",
            "must be below lease_ttl_ms: a replica rides out failures on the leases it holds",
        ));
    }
    if c.expected_replicas == 0 {
        return Err(invalid("expected_replicas", "must be > 0"));
    }
    if c.sync_interval_ms == 0 {
        return Err(invalid("sync_interval_ms", "must be > 0"));
    }
    if let Some(id) = &c.replica_id {
        if id.is_empty() || id.contains(':') || id.chars().any(char::is_whitespace) {
            return Err(invalid(
                "replica_id",
                "must be non-empty, without ':' or whitespace",
            ));
        }
    }
    if c.key_prefix.is_empty() {
        return Err(invalid("key_prefix", "must not be empty"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    const BASE: &str = "[[upstreams]]\nname = \"u\"\nbase_url = \"http://h/v1\"\n";

    fn load(cluster: &str) -> Result<Config, String> {
        Config::from_toml_str(&format!("{BASE}[cluster]\n{cluster}")).map_err(|e| e.to_string())
    }

    #[test]
    fn absent_is_single_process_and_defaults_fill_in() {
        assert!(Config::from_toml_str(BASE).unwrap().cluster.is_none());
        let c = load("redis_url = \"redis://127.0.0.1:6379\"").unwrap();
        let c = c.cluster.unwrap();
        assert_eq!(
            (
                c.lease_ttl_ms,
                c.expected_replicas,
                c.timeout_ms,
                c.degrade_after_ms
            ),
            (5000, 3, 100, 1000)
        );
        assert_eq!(c.replica_id, None);
    }

    #[test]
    fn tls_and_credentials_from_env_are_accepted() {
        let c = load(
            "redis_url = \"rediss://fairgate@redis.internal:6380/2\"\n\
             password_env = \"REDIS_PASSWORD\"\nusername_env = \"REDIS_USER\"\n\
             tls_ca_file = \"/etc/fairgate/redis-ca.pem\"",
        )
        .unwrap()
        .cluster
        .unwrap();
        assert_eq!(c.password_env.as_deref(), Some("REDIS_PASSWORD"));
        assert_eq!(c.username_env.as_deref(), Some("REDIS_USER"));
        assert!(c.tls_ca_file.is_some());
    }

    #[test]
    fn bad_values_name_their_key() {
        let cases = [
            ("redis_url = \"redis://:pw@h\"", "cluster.redis_url"),
            (
                "redis_url = \"rediss://u:pw@h:6380/0\"",
                "cluster.redis_url",
            ),
            (
                "redis_url = \"redis://h\"\ntls_ca_file = \"ca.pem\"",
                "cluster.tls_ca_file",
            ),
            (
                "redis_url = \"redis://h\"\npassword_env = \"\"",
                "cluster.password_env",
            ),
            ("redis_url = \"http://h\"", "cluster.redis_url"),
            (
                "redis_url = \"redis://h\"\nlease_ttl_ms = 200",
                "cluster.lease_ttl_ms",
            ),
            (
                "redis_url = \"redis://h\"\nexpected_replicas = 0",
                "cluster.expected_replicas",
            ),
            (
                "redis_url = \"redis://h\"\nreplica_id = \"a:b\"",
                "cluster.replica_id",
            ),
            (
                "redis_url = \"redis://h\"\ntimeout_ms = 0",
                "cluster.timeout_ms",
            ),
            (
                "redis_url = \"redis://h\"\ndegrade_after_ms = 5000",
                "cluster.degrade_after_ms",
            ),
            ("redis_url = \"redis://h\"\nleases = 3", "cluster.leases"),
            ("lease_ttl_ms = 3000", "cluster"),
        ];
        for (toml, key) in cases {
            let e = load(toml).unwrap_err();
            assert!(e.starts_with(key), "{toml}: {e}");
        }
    }
}
