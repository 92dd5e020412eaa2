//! Cluster mode over TLS: a real `redis-server` listening only on its TLS port (Debian's build
//! has TLS), with the self-signed `localhost` fixture as its certificate and `requirepass`.
//!
//! (a) `rediss://` + `tls_ca_file` + `password_env` (the password only in the environment):
//! the replica stays out of degraded mode and writes its state into that Redis; (b) the same
//! without `tls_ca_file` (system roots do not trust the fixture) and (c) with a wrong password:
//! the replica cannot use Redis and enters degraded mode, and neither the config error nor
//! `/metrics` ever shows the password.
//!
//! Without `redis-server` on PATH the tests fail, naming the package to install, unless
//! `FAIRGATE_SKIP_REDIS=1`. Loops are bounded; no assertion is on wall-clock time.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::support::redis_server::{free_port, missing, wait_until_listening};
use crate::support::*;

const PASSWORD: &str = "fg-redis-SECRET-pw";

/// A TLS-only `redis-server` child process; killed on drop.
struct TlsRedis {
    child: Child,
    port: u16,
    _dir: TempDir,
}

/// A scratch directory for redis-server's working dir; removed on drop.
struct TempDir(std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl TlsRedis {
    fn start() -> Option<Self> {
        let port = free_port();
        let dir = std::env::temp_dir().join(format!(
            "fairgate-redis-tls-{}-{}",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let (cert, key) = (fixture("localhost.crt"), fixture("localhost.key"));
        let child = Command::new("redis-server")
            .args(["--port", "0", "--bind", "127.0.0.1"])
            .args(["--tls-port", &port.to_string()])
            .args(["--tls-cert-file", &cert, "--tls-key-file", &key])
            .args(["--tls-ca-cert-file", &cert, "--tls-auth-clients", "no"])
            .args(["--requirepass", PASSWORD])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        let Ok(child) = child else {
            missing();
            return None;
        };
        let mut r = TlsRedis {
            child,
            port,
            _dir: TempDir(dir),
        };
        wait_until_listening(port, &mut r.child, ": does this build have TLS?");
        Some(r)
    }

    /// A test's own client (TLS with the fixture as CA, the password).
    async fn conn(&self) -> redis::aio::MultiplexedConnection {
        use redis::IntoConnectionInfo;
        let info = format!("rediss://localhost:{}", self.port)
            .into_connection_info()
            .unwrap();
        let settings = info.redis_settings().clone().set_password(PASSWORD);
        let certs = redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(std::fs::read(fixture("localhost.crt")).unwrap()),
        };
        redis::Client::build_with_tls(info.set_redis_settings(settings), certs)
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap()
    }
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The default test config with one connection worker, in cluster mode on the TLS Redis at
/// `port` under `key_prefix = prefix`.
fn config(base_url: &str, port: u16, prefix: &str) -> Conf {
    Conf::new(base_url)
        .server("workers", 1)
        .set("cluster.redis_url", format!("rediss://localhost:{port}"))
        .set("cluster.key_prefix", prefix)
        .set("cluster.lease_ttl_ms", 1500)
        .set("cluster.degrade_after_ms", 300)
        .set("cluster.sync_interval_ms", 50)
}

async fn degraded(addr: std::net::SocketAddr) -> Option<f64> {
    value(&scrape(addr).await, "fairgate_cluster_degraded", &[])
}

/// Polls `degraded` every 20 ms, at most 150 times, until it equals `want`.
async fn until_degraded(addr: std::net::SocketAddr, want: f64) -> bool {
    for _ in 0..150 {
        if degraded(addr).await == Some(want) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_with_a_private_ca_and_the_password_from_env() {
    let Some(redis) = TlsRedis::start() else {
        return;
    };
    let mock = mock().await;
    let var = unique_env("REDIS_PW");
    let ca = fixture("localhost.crt");
    let proxy = config(&mock.base_url(), redis.port, "tlsok")
        .set("cluster.tls_ca_file", &ca)
        .set("cluster.password_env", &var)
        .start_with_env(&[(var.as_str(), PASSWORD)])
        .await;
    for _ in 0..3 {
        let r = send(post(
            proxy.addr,
            "/v1/chat/completions",
            Some(KEY_A),
            &chat("m"),
            &[],
        ))
        .await;
        assert_eq!(r.status, 200, "{:?}", r.body);
    }
    // The replica wrote its state into this Redis, over TLS, authenticated.
    let mut conn = redis.conn().await;
    let mut keys: Vec<String> = Vec::new();
    for _ in 0..150 {
        keys = redis::cmd("KEYS")
            .arg("{tlsok}:*")
            .query_async(&mut conn)
            .await
            .unwrap();
        if !keys.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        !keys.is_empty(),
        "nothing written to Redis under {{tlsok}}:*"
    );
    assert_eq!(degraded(proxy.addr).await, Some(0.0));
    let text = scrape(proxy.addr).await;
    assert!(!text.contains(PASSWORD));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_refuses_an_untrusted_server_and_a_wrong_password() {
    let Some(redis) = TlsRedis::start() else {
        return;
    };
    let mock = mock().await;
    let ca = fixture("localhost.crt");
    let var = unique_env("REDIS_PW");
    // (b) No private CA: the system roots do not trust the self-signed fixture.
    let untrusted = config(&mock.base_url(), redis.port, "tlsnoca")
        .set("cluster.password_env", &var)
        .start_with_env(&[(var.as_str(), PASSWORD)])
        .await;
    // (c) The right CA, the wrong password.
    let wrong = config(&mock.base_url(), redis.port, "tlsbadpw")
        .set("cluster.tls_ca_file", &ca)
        .set("cluster.password_env", &var)
        .start_with_env(&[(var.as_str(), "not-the-password")])
        .await;
    assert!(
        until_degraded(untrusted.addr, 1.0).await,
        "a server the roots do not trust was used"
    );
    assert!(
        until_degraded(wrong.addr, 1.0).await,
        "a wrong password was accepted"
    );
    let mut conn = redis.conn().await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("{tlsnoca}:*")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(keys.is_empty(), "{keys:?}");
    // A missing variable is a config error naming the key, never a value.
    let unset = config(&mock.base_url(), redis.port, "x")
        .set("cluster.password_env", "FG_SURELY_UNSET_REDIS_PW")
        .config();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let started = fairgate::server::start_with_env(
        unset,
        listener,
        fairgate::server::Env::vars([("OTHER", PASSWORD)]),
    )
    .await;
    let Err(e) = started else {
        panic!("an unset password_env is refused");
    };
    let e = e.to_string();
    assert!(e.contains("cluster.password_env"), "{e}");
    assert!(!e.contains(PASSWORD), "{e}");
}
