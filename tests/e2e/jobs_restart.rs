//! Durability: `fairgate serve` killed with SIGKILL in the middle of a batch and restarted on
//! the same SQLite file finishes the batch; finished lines are not sent again (at most the
//! lines in flight at the kill — `max_inflight_per_tenant` — are sent twice), and the output
//! file holds every `custom_id` exactly once. The same with `[cluster]`: a replica killed
//! mid-batch, its claimed lines run by another replica after their leases expire.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::{chat, mock_with, Conf, KEY_A};
use async_openai::config::OpenAIConfig;
use async_openai::types::batches::{
    BatchCompletionWindow, BatchEndpoint, BatchRequest, BatchStatus,
};
use async_openai::types::files::{CreateFileRequest, FileInput, FilePurpose};
use async_openai::Client;
use fairgate_mock::MockConfig;

const LINES: usize = 60;
const INFLIGHT: u64 = 2;

/// A child process killed (SIGKILL) and reaped when dropped, so a failing test leaves none.
struct Proc(Child);

impl Proc {
    fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Starts `fairgate serve --config path`; its address from the "fairgate listening" line.
fn spawn(path: &std::path::Path) -> (Proc, std::net::SocketAddr) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_fairgate"))
        .args(["serve", "--config", path.to_str().unwrap()])
        .env("FAIRGATE_LOG", "info,fairgate::request=off")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let child = Proc(child);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            // The runner's lease warnings (leases expired, lost, late answers) say why a
            // count is off when the test fails.
            if line.contains("jobs:") {
                eprintln!("{line}");
            }
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let line = rx
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .expect("a listening line within 20 s");
        if let Some(rest) = line.split("addr=").nth(1) {
            let addr = rest.split_whitespace().next().unwrap().parse().unwrap();
            return (child, addr);
        }
    }
}

fn openai(addr: std::net::SocketAddr) -> Client<OpenAIConfig> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    Client::with_config(
        OpenAIConfig::new()
            .with_api_base(format!("http://{addr}/v1"))
            .with_api_key(KEY_A),
    )
}

/// Uploads the `LINES`-line input and creates its batch through `c`; the batch id.
async fn submit(c: &Client<OpenAIConfig>) -> String {
    let input: String = (0..LINES)
        .map(|i| {
            format!(
                "{{\"custom_id\":\"req-{i}\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{}}}\n",
                chat("gpt-4o-mini")
            )
        })
        .collect();
    let file = c
        .files()
        .create(CreateFileRequest {
            file: FileInput::from_vec_u8("in.jsonl".into(), input.into_bytes()),
            purpose: FilePurpose::Batch,
            expires_after: None,
        })
        .await
        .unwrap();
    c.batches()
        .create(BatchRequest {
            input_file_id: file.id,
            endpoint: BatchEndpoint::V1ChatCompletions,
            completion_window: BatchCompletionWindow::W24H,
            metadata: None,
            output_expires_after: None,
        })
        .await
        .unwrap()
        .id
}

/// Waits (bounded) until `mock` saw 10 requests, then SIGKILLs `first`; requests sent by then.
async fn kill_mid_way(mock: &fairgate_mock::MockServer, first: &mut Proc) -> u64 {
    let mut waited = 0;
    while mock.stats.requests() < 10 && waited < 1000 {
        tokio::time::sleep(Duration::from_millis(10)).await;
        waited += 1;
    }
    first.kill(); // SIGKILL
    let at_kill = mock.stats.requests();
    assert!(
        (10..LINES as u64).contains(&at_kill),
        "killed mid-way: {at_kill} sent"
    );
    at_kill
}

/// Waits (bounded) for batch `id` to complete through `c`; its output file's custom ids, sorted.
async fn completed_ids(c: &Client<OpenAIConfig>, id: &str) -> Vec<String> {
    let mut done = None;
    for _ in 0..1000 {
        let b = c.batches().retrieve(id).await.unwrap();
        if b.status == BatchStatus::Completed {
            done = Some(b);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let done = done.expect("the batch completes after the kill");
    let out = c
        .files()
        .content(done.output_file_id.as_deref().unwrap())
        .await
        .unwrap();
    crate::support::custom_ids(&crate::support::jsonl(&out))
}

/// Every custom id once, and no finished line sent again (`sent` requests for `LINES` lines;
/// at most the `INFLIGHT` lines in flight at the kill run twice).
fn assert_once(ids: &[String], sent: u64) {
    let mut want: Vec<String> = (0..LINES).map(|i| format!("req-{i}")).collect();
    want.sort();
    assert_eq!(ids, want, "every custom_id exactly once");
    assert!(
        (LINES as u64..=LINES as u64 + INFLIGHT).contains(&sent),
        "finished lines are not sent again: {sent} sent for {LINES} lines"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_survives_kill_9_and_its_output_holds_every_custom_id_once() {
    let mock = mock_with(MockConfig {
        base_latency: Duration::from_millis(25),
        ..MockConfig::default()
    })
    .await;
    let dir = std::env::temp_dir().join(format!("fg-restart-{:x}", rand::random::<u64>()));
    std::fs::create_dir_all(&dir).unwrap();
    let db = dir.join("jobs.sqlite");
    let conf = Conf::new(&mock.base_url())
        .server("workers", 1)
        .set("jobs.path", db.display().to_string())
        .set("jobs.max_inflight_per_tenant", INFLIGHT);
    let path = dir.join("fairgate.toml");
    std::fs::write(&path, conf.toml()).unwrap();

    let (mut first, addr) = spawn(&path);
    let batch = submit(&openai(addr)).await;
    let at_kill = kill_mid_way(&mock, &mut first).await;

    let (mut second, addr) = spawn(&path);
    let ids = completed_ids(&openai(addr), &batch).await;
    second.kill();
    let sent = mock.stats.requests();
    println!("restart: {at_kill} sent before kill -9, {sent} in all for {LINES} lines");
    assert_once(&ids, sent);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Cluster mode: replica A (a `fairgate serve` process) is killed with SIGKILL mid-batch; the
/// lines it had claimed are reclaimed by replica B once their leases (`lease_ms`) expire, and
/// the batch completes with every custom id once — a replica that died, not one shut down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_killed_mid_batch_has_its_lines_reclaimed_by_another() {
    let Some(redis) = crate::support::redis_server::Redis::start() else {
        return;
    };
    let mock = mock_with(MockConfig {
        base_latency: Duration::from_millis(25),
        ..MockConfig::default()
    })
    .await;
    let dir = std::env::temp_dir().join(format!("fg-reclaim-{:x}", rand::random::<u64>()));
    std::fs::create_dir_all(&dir).unwrap();
    let replica = |name: &str| {
        let path = dir.join(format!("{name}.toml"));
        let conf = Conf::new(&mock.base_url())
            .server("workers", 1)
            .set("cluster.redis_url", redis.url())
            .set("cluster.replica_id", name)
            .set("jobs.max_inflight_per_tenant", INFLIGHT)
            // Short, so the kill frees A's lines soon. A loaded machine that stalls B past
            // its leases does not make B send its own lines twice: a replica's reclaim renews
            // its own claims first (`jobs::store::redis::scripts::RECLAIM`).
            .set("jobs.lease_ms", 500);
        std::fs::write(&path, conf.toml()).unwrap();
        path
    };
    let (mut a, addr_a) = spawn(&replica("a"));
    let batch = submit(&openai(addr_a)).await;
    let at_kill = kill_mid_way(&mock, &mut a).await;

    let (mut b, addr_b) = spawn(&replica("b"));
    let ids = completed_ids(&openai(addr_b), &batch).await;
    b.kill();
    let sent = mock.stats.requests();
    println!(
        "cluster kill -9: {at_kill} sent before A was killed, {sent} in all for {LINES} lines"
    );
    assert_once(&ids, sent);
    let _ = std::fs::remove_dir_all(&dir);
}
