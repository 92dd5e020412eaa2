//! `fairgate serve` as a process: several connection workers (`[server] workers`) on one
//! `SO_REUSEPORT` address answer every request, and SIGTERM drains and exits 0.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::{mock, post, send, Conf, KEY_A};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_workers_serve_one_port_and_sigterm_exits_cleanly() {
    let mock = mock().await;
    let dir = std::env::temp_dir().join(format!("fg-serve-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("fairgate.toml");
    std::fs::write(
        &path,
        Conf::new(&mock.base_url()).server("workers", 3).toml(),
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_fairgate"))
        .args(["serve", "--config", path.to_str().unwrap()])
        .env("FAIRGATE_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    // The bound address is in the "fairgate listening" line (port 0 in the config).
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    let addr = loop {
        let line = rx
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .expect("a listening line within 20 s");
        if let Some(rest) = line.split("addr=").nth(1) {
            let addr: std::net::SocketAddr =
                rest.split_whitespace().next().unwrap().parse().unwrap();
            break addr;
        }
    };
    // A fresh connection per request, so the kernel spreads them over the workers' sockets.
    let body =
        r#"{"model":"gpt-4o-mini","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}"#;
    let mut ok = 0;
    for _ in 0..30 {
        let r = send(post(addr, "/v1/chat/completions", Some(KEY_A), body, &[])).await;
        ok += usize::from(r.status == 200);
    }
    assert_eq!(ok, 30);
    let term = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(term.success());
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "no exit within 20 s of SIGTERM");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(status.success(), "{status:?}");
    let rest: Vec<String> = rx.try_iter().collect();
    assert!(
        rest.iter().filter(|l| l.contains("drained")).count() == 3,
        "each of the 3 workers drains: {rest:?}"
    );
    // Every request's log line names the worker that served it: 30 fresh connections spread
    // by the kernel over three sockets land on more than one (all on one: p = 3^-29).
    let workers: std::collections::BTreeSet<&str> = rest
        .iter()
        .filter(|l| l.contains("status=200"))
        .filter_map(|l| l.split("worker=").nth(1))
        .filter_map(|w| w.split_whitespace().next())
        .collect();
    let served = rest.iter().filter(|l| l.contains("status=200")).count();
    assert_eq!(served, 30, "one log line per request: {rest:?}");
    assert!(workers.len() >= 2, "served by workers {workers:?} only");
}
