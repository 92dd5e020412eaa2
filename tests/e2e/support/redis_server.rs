//! A real `redis-server` for the cluster tests: started on a free port, killed on drop. Without
//! `redis-server` on PATH a test fails naming the package to install; a developer who cannot
//! install it opts out explicitly with `FAIRGATE_SKIP_REDIS=1` (the test then passes as skipped,
//! and `scripts/test` lists it: [`super::needs`]).

use std::net::TcpListener as StdListener;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A free loopback port.
pub fn free_port() -> u16 {
    StdListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `redis-server` could not be started: fails the test naming the package, unless the developer
/// set `FAIRGATE_SKIP_REDIS=1` (then the test is skipped and says so).
pub fn missing() {
    super::needs::REDIS.missing();
}

/// Waits (bounded) until `port` accepts connections; panics if `child` exits first (`hint`
/// says what may be wrong) or the port never opens.
pub fn wait_until_listening(port: u16, child: &mut Child, hint: &str) {
    for _ in 0..500 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("redis-server exited ({status}){hint}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("redis-server did not start on port {port}");
}

/// A `redis-server` child process on its own port; killed on drop.
pub struct Redis {
    child: Option<Child>,
    /// Its port.
    pub port: u16,
}

impl Redis {
    /// Starts one on a free port; `None` (skip) when the binary is missing and the developer set
    /// `FAIRGATE_SKIP_REDIS=1`; panics when it is missing otherwise.
    pub fn start() -> Option<Redis> {
        let mut r = Redis {
            child: None,
            port: free_port(),
        };
        if !r.spawn() {
            missing();
            return None;
        }
        Some(r)
    }

    /// (Re)starts the server on this port and waits until it accepts connections.
    pub fn spawn(&mut self) -> bool {
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            // `DEBUG SLEEP` stalls the server (`cluster::degraded`, `cluster::jobs`).
            .args(["--enable-debug-command", "local"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        let Ok(mut child) = child else {
            return false;
        };
        wait_until_listening(self.port, &mut child, "");
        self.child = Some(child);
        true
    }

    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// A plain client for inspecting keys.
    pub async fn conn(&self) -> redis::aio::MultiplexedConnection {
        redis::Client::open(self.url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap()
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.kill();
    }
}
