//! A real `redis-server` for unit tests (the job store's and the budgets' scripts): started on a
//! free port, killed on drop, and a plain connection standing in for the cluster's link. Without
//! `redis-server` on PATH, [`server`] fails naming the package, unless `FAIRGATE_SKIP_REDIS=1`
//! (then it returns `None` and the test passes as skipped).

use std::fmt::Debug;
use std::future::Future;
use std::pin::Pin;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;

use redis::{ScriptInvocation, Value};

use super::Redis;

/// A `redis-server` child on a free port; killed on drop.
pub(crate) struct Server {
    child: Child,
    pub(crate) port: u16,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) fn server() -> Option<Server> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port");
    let child = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
    let Ok(child) = child else {
        assert!(
            std::env::var_os("FAIRGATE_SKIP_REDIS").is_some_and(|v| v == "1"),
            "redis-server is not on PATH: install it (apt-get install redis-server), or set \
             FAIRGATE_SKIP_REDIS=1"
        );
        eprintln!("SKIPPED (FAIRGATE_SKIP_REDIS=1): redis-server not found on PATH");
        return None;
    };
    let s = Server { child, port };
    for _ in 0..500 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Some(s);
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    panic!("redis-server did not start on port {port}");
}

/// A plain connection standing in for the cluster's link.
struct Plain(redis::aio::MultiplexedConnection);

impl Debug for Plain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Plain")
    }
}

impl Redis for Plain {
    fn key(&self, parts: &[&str]) -> String {
        format!("{{fgtest}}:{}", parts.join(":"))
    }

    fn eval<'a>(
        &'a self,
        inv: &'a ScriptInvocation<'a>,
    ) -> Pin<Box<dyn Future<Output = Option<Value>> + Send + 'a>> {
        let mut conn = self.0.clone();
        Box::pin(async move { inv.invoke_async::<Value>(&mut conn).await.ok() })
    }
}

/// A link to `s` for the stores under test.
pub(crate) async fn plain(s: &Server) -> Arc<dyn Redis> {
    let conn = redis::Client::open(format!("redis://127.0.0.1:{}", s.port))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    Arc::new(Plain(conn))
}
