//! `fairgate serve` as a child process with `RLIMIT_NOFILE` lowered to [`NOFILE`] (soft and
//! hard, so startup cannot raise it), flooded with idle connections held open by this test.

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt as _;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::*;

/// The child's descriptor limit.
const NOFILE: u64 = 256;
/// Idle connections the flood holds open (more than the child has descriptors).
const FLOOD: usize = 400;

struct Serve {
    child: Child,
    addr: SocketAddr,
    lines: mpsc::Receiver<String>,
    /// The log lines read so far.
    seen: Vec<String>,
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `fairgate serve` with `conf` at the lowered limit; waits for its address.
fn serve(tag: &str, conf: &Conf) -> Serve {
    let dir = std::env::temp_dir().join(format!("fg-conn-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("fairgate.toml");
    std::fs::write(&path, conf.toml()).unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_fairgate"));
    cmd.args(["serve", "--config", path.to_str().unwrap()])
        .env("FAIRGATE_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    // SAFETY: only async-signal-safe `setrlimit` runs between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            let rl = libc::rlimit {
                rlim_cur: NOFILE as libc::rlim_t,
                rlim_max: NOFILE as libc::rlim_t,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &rl) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut s = Serve {
        child,
        addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        lines,
        seen: Vec::new(),
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while s.addr.port() == 0 {
        let line = s
            .lines
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .expect("a listening line within 20 s");
        if let Some(rest) = line.split("addr=").nth(1) {
            s.addr = rest.split_whitespace().next().unwrap().parse().unwrap();
        }
        s.seen.push(line);
    }
    s
}

impl Serve {
    fn logged(&mut self, needle: &str) -> usize {
        self.seen.extend(self.lines.try_iter());
        self.seen.iter().filter(|l| l.contains(needle)).count()
    }
}

/// Opens [`FLOOD`] connections from 127.0.0.1 that send nothing (non-blocking, to poll).
fn flood(addr: SocketAddr) -> Vec<std::net::TcpStream> {
    (0..FLOOD)
        .map(|_| {
            let s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap();
            s.set_nonblocking(true).unwrap();
            s
        })
        .collect()
}

/// Victim requests (tenant `b`, from 127.0.0.2), each on a new connection: their statuses.
async fn victim(addr: SocketAddr, n: usize) -> Vec<u16> {
    let mut statuses = Vec::with_capacity(n);
    for _ in 0..n {
        let req = request("/v1/chat/completions", KEY_B, &chat("m"));
        statuses.push(status(&exchange(OTHER, addr, &req).await));
    }
    statuses
}

/// Waits (at most 10 s) until at least `n` flood connections have been closed; how many.
async fn closed_at_least(flood: &[std::net::TcpStream], n: usize) -> usize {
    let mut count = 0;
    for _ in 0..200 {
        count = flood.iter().filter(|s| closed(s)).count();
        if count >= n {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    count
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_derived_cap_idle_connections_are_shed_and_a_victim_is_served() {
    let mock = mock().await;
    let conf = Conf::new(&mock.base_url())
        .server("workers", 1)
        // The scraper at OTHER is the operator's: /metrics answers trusted peers only.
        .server("trusted_sources", ["127.0.0.1/32", "127.0.0.2/32"])
        .upstream("max_concurrency", 4);
    let mut s = serve("derived", &conf);
    // 256 − (64 + (1 worker + 1) × 4 upstream slots) = 184.
    let cap = 184;
    assert_eq!(s.logged("max_connections=184"), 1, "{:#?}", s.seen);
    let held = flood(s.addr);
    let statuses = victim(s.addr, 10).await;
    assert_eq!(statuses, vec![200; 10]);
    // The flood beyond the cap (and one per victim connection) took the oldest idle places.
    let closed = closed_at_least(&held, FLOOD - cap).await;
    assert!(closed >= FLOOD - cap, "{closed} closed");
    assert!(closed < FLOOD, "the newest idle connections are kept");
    assert_eq!(
        s.logged("accept failed"),
        0,
        "the cap is reached before descriptors run out"
    );
    let metrics = exchange(OTHER, s.addr, &request("/metrics", KEY_B, "")).await;
    let shed = metrics
        .lines()
        .find_map(|l| {
            l.strip_prefix("fairgate_connections_shed_total{reason=\"max_connections\"} ")
        })
        .and_then(|v| v.trim().parse::<usize>().ok())
        .unwrap_or(0);
    assert!(shed >= FLOOD - cap, "{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_descriptors_accept_backs_off_sheds_idle_and_keeps_serving() {
    let mock = mock().await;
    // A cap above the descriptor limit: `accept` itself runs out (EMFILE).
    let conf = Conf::new(&mock.base_url())
        .server("workers", 1)
        .server("max_connections", 100000)
        .upstream("max_concurrency", 4);
    let mut s = serve("emfile", &conf);
    // Warm the upstream pool first: a pooled connection needs no new descriptor.
    assert_eq!(victim(s.addr, 1).await, vec![200]);
    let held = flood(s.addr);
    let statuses = victim(s.addr, 10).await;
    // Served; or refused honestly (503 + Retry-After) when the upstream connect found no
    // descriptor; never a hang.
    let ok = statuses.iter().filter(|s| **s == 200).count();
    assert!(
        statuses.iter().all(|s| *s == 200 || *s == 503),
        "{statuses:?}"
    );
    assert!(ok >= 8, "{statuses:?}");
    let closed = closed_at_least(&held, 1).await;
    assert!((1..FLOOD).contains(&closed), "{closed} closed");
    // Logged once per interval with the count, not once per failure.
    let logged = s.logged("accept failed");
    assert!((1..=3).contains(&logged), "{logged} lines: {:#?}", s.seen);
}
