//! Jobs across replicas (`[jobs]` with `[cluster]`): two in-process replicas sharing one real
//! `redis-server` (started on a free port, killed on drop) and the bundled mock upstream.
//!
//! (b) any replica answers any job: an async job created through replica A is answered (status,
//! then the stored answer) by replica B, and not to another tenant; a batch submitted through
//! A completes with every `custom_id` exactly once in the output file read through B, no line
//! sent twice although each answer takes longer than a lease (renewal holds the claims).
//! (c) cluster reclaim: replica A claims every line of a batch, its upstream is
//! slow, A is stopped mid-batch; replica B queues the lines again once A's leases (`lease_ms`
//! = 500) expire and completes the batch, each `custom_id` once, every line recorded from B's
//! answer: A's answers, which arrive while B runs the same lines, are discarded as late.
//!
//! Loops are bounded in count and time; no assertion is on wall-clock time.

use std::net::SocketAddr;
use std::time::Duration;

use crate::support::redis_server::Redis;
use crate::support::*;
use bytes::Bytes;
use http::Request;
use http_body_util::Full;
use serde_json::Value;

/// A replica on `base_url`: tenants `a`, `b`, one connection worker, `[cluster]` on `redis`
/// as `name`, `[jobs]` with leases of 2 s (a loaded machine renews in time).
fn replica(redis: &Redis, base_url: &str, name: &str) -> Conf {
    Conf::new(base_url)
        .server("workers", 1)
        .set("cluster.redis_url", redis.url())
        .set("cluster.replica_id", name)
        .set("jobs.max_inflight_per_tenant", 8)
        .set("jobs.lease_ms", 2000)
}

fn get(addr: SocketAddr, path: &str, key: &str) -> Request<Full<Bytes>> {
    Request::get(format!("http://{addr}{path}"))
        .header("authorization", format!("Bearer {key}"))
        .body(Full::default())
        .unwrap()
}

/// `n` chat lines, `custom_id` `req-0` … `req-{n-1}`.
fn input(n: usize) -> String {
    (0..n)
        .map(|i| {
            format!(
                "{{\"custom_id\":\"req-{i}\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\
                 \"body\":{}}}\n",
                chat("gpt-4o-mini")
            )
        })
        .collect()
}

/// Uploads `content` as a batch input file of tenant `a` through `addr`; its id.
async fn upload(addr: SocketAddr, content: &str) -> String {
    let body = format!(
        "--B\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n--B\r\n\
         Content-Disposition: form-data; name=\"file\"; filename=\"in.jsonl\"\r\n\r\n\
         {content}\r\n--B--\r\n"
    );
    let req = Request::post(format!("http://{addr}/v1/files"))
        .header("authorization", format!("Bearer {KEY_A}"))
        .header("content-type", "multipart/form-data; boundary=B")
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    let r = send(req).await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    r.json()["id"].as_str().unwrap().to_owned()
}

/// Creates a chat batch of tenant `a` over `file` through `addr`; its id.
async fn create_batch(addr: SocketAddr, file: &str) -> String {
    let body = serde_json::json!({"input_file_id": file, "endpoint": "/v1/chat/completions",
        "completion_window": "24h"});
    let r = send(post(
        addr,
        "/v1/batches",
        Some(KEY_A),
        &body.to_string(),
        &[],
    ))
    .await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    r.json()["id"].as_str().unwrap().to_owned()
}

/// Polls the batch through `addr` until it is `completed` (at most 1,500 polls, 20 ms apart).
async fn completed(addr: SocketAddr, batch: &str) -> Value {
    let mut last = Value::Null;
    for _ in 0..1500 {
        last = send(get(addr, &format!("/v1/batches/{batch}"), KEY_A))
            .await
            .json();
        if last["status"] == "completed" {
            return last;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("batch {batch} did not complete: {last}");
}

/// The `custom_id`s of the batch's output file read through `addr`, sorted.
async fn output_ids(addr: SocketAddr, doc: &Value) -> Vec<String> {
    let file = doc["output_file_id"].as_str().expect("an output file");
    let r = send(get(addr, &format!("/v1/files/{file}/content"), KEY_A)).await;
    assert_eq!(r.status, 200);
    let records = jsonl(&r.body);
    for v in &records {
        assert_eq!(v["response"]["status_code"], 200, "{v}");
    }
    custom_ids(&records)
}

fn want(n: usize) -> Vec<String> {
    let mut v: Vec<String> = (0..n).map(|i| format!("req-{i}")).collect();
    v.sort();
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_replica_answers_any_job_and_a_batch_completes_once_across_replicas() {
    const LINES: usize = 12;
    let Some(redis) = Redis::start() else { return };
    // Each answer takes longer than a lease: only renewal (every lease / 3) keeps the other
    // replica from running a line a second time. The lease leaves room for a loaded machine.
    let mock = mock_slow(2500).await;
    let a = replica(&redis, &mock.base_url(), "a").start().await;
    let b = replica(&redis, &mock.base_url(), "b").start().await;

    // One async job: created through A, answered by B.
    let r = send(post(
        a.addr,
        "/v1/chat/completions",
        Some(KEY_A),
        &chat("gpt-4o-mini"),
        &[("prefer", "respond-async")],
    ))
    .await;
    assert_eq!(r.status, 202, "{}", String::from_utf8_lossy(&r.body));
    let location = r.headers["location"].to_str().unwrap().to_owned();
    assert_eq!(send(get(b.addr, &location, KEY_B)).await.status, 404);
    let mut done = None;
    for _ in 0..500 {
        let r = send(get(b.addr, &location, KEY_A)).await;
        if r.status != 202 {
            done = Some(r);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let done = done.expect("the job finishes");
    assert_eq!(done.status, 200, "{}", String::from_utf8_lossy(&done.body));
    assert_eq!(done.headers["x-fairgate-job-status"], "completed");
    assert!(done.json()["choices"].is_array());

    // A batch: submitted through A, its lines run by both replicas, read through B.
    let file = upload(a.addr, &input(LINES)).await;
    let batch = create_batch(a.addr, &file).await;
    let doc = completed(b.addr, &batch).await;
    assert_eq!(
        doc["request_counts"],
        serde_json::json!({"total": LINES, "completed": LINES, "failed": 0})
    );
    assert_eq!(output_ids(b.addr, &doc).await, want(LINES), "each once");
    assert_eq!(
        mock.stats.requests(),
        1 + LINES as u64,
        "no line sent twice"
    );
    println!(
        "across replicas: 1 job + {LINES} lines, each answer 2.5 s > lease 2 s; {} sent",
        mock.stats.requests()
    );
    let listed = send(get(a.addr, "/v1/batches", KEY_A)).await.json();
    assert_eq!(listed["data"][0]["status"], "completed", "A sees B's view");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lines_of_a_stopped_replica_are_reclaimed_after_the_lease_and_run_once_elsewhere() {
    const LINES: usize = 6;
    let Some(redis) = Redis::start() else { return };
    // Leases of 2 s; A's upstream answers after 5 s, B's after 4 s: A's answers come back
    // while B runs the same lines, after A's leases expired (the lease leaves room for a loaded
    // machine to renew while A is alive).
    let slow = mock_slow(5000).await;
    let slower = mock_slow(4000).await;
    let a = replica(&redis, &slow.base_url(), "a").start().await;
    let file = upload(a.addr, &input(LINES)).await;
    let batch = create_batch(a.addr, &file).await;
    for _ in 0..500 {
        if slow.stats.requests() == LINES as u64 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(slow.stats.requests(), LINES as u64, "A claimed every line");
    // A stops: its runner and its lease renewals end; its requests stay in flight.
    a.shutdown();

    let b = replica(&redis, &slower.base_url(), "b").start().await;
    let doc = completed(b.addr, &batch).await;
    assert_eq!(
        doc["request_counts"],
        serde_json::json!({"total": LINES, "completed": LINES, "failed": 0})
    );
    assert_eq!(output_ids(b.addr, &doc).await, want(LINES), "each once");
    assert_eq!(
        slower.stats.requests(),
        LINES as u64,
        "B ran each line once"
    );
    // Every line's recorded answer is B's (none of B's answers was discarded as late): A's
    // answers, which came back first, were refused because A's leases had expired.
    let m = scrape(b.addr).await;
    let lines = [("tenant", "a"), ("outcome", "completed")];
    assert_eq!(
        value(&m, "fairgate_batch_lines_total", &lines),
        Some(LINES as f64),
        "{m}"
    );
    assert_eq!(
        value(&m, "fairgate_jobs_late_total", &[]).unwrap_or(0.0),
        0.0
    );
    assert_eq!(
        slow.stats.completed(),
        LINES as u64,
        "A's answers did come back"
    );
    println!(
        "cluster reclaim: {LINES} lines; A sent {} (answered {}, discarded as late), B sent {} \
         and recorded {LINES}",
        slow.stats.requests(),
        slow.stats.completed(),
        slower.stats.requests()
    );
}

/// A job-store call slower than `[cluster] timeout_ms` (sized for the hot path) is not cut at
/// it: the job store's calls carry whole files and have their own bound. Redis is stalled for
/// 300 ms (`DEBUG SLEEP`) while a replica with `timeout_ms = 100` lists batches: the answer is
/// a 200 after the stall, not a 503 `job_store_unavailable`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_store_call_slower_than_the_hot_path_timeout_still_answers() {
    let Some(redis) = Redis::start() else { return };
    let mock = mock().await;
    let a = replica(&redis, &mock.base_url(), "a")
        .set("cluster.timeout_ms", 100)
        .start()
        .await;
    assert_eq!(send(get(a.addr, "/v1/batches", KEY_A)).await.status, 200);
    let mut conn = redis.conn().await;
    let stall = tokio::spawn(async move {
        let _: () = redis::cmd("DEBUG")
            .arg("SLEEP")
            .arg("0.3")
            .query_async(&mut conn)
            .await
            .unwrap();
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let r = send(get(a.addr, "/v1/batches", KEY_A)).await;
    stall.await.unwrap();
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
}

/// Files in Redis are stored in chunks (`:fc:ID`) and streamed both ways: a 3 MB input (12
/// chunks, 46× `max_body_bytes`) uploaded through replica A reads back byte for byte through
/// replica B, and a batch created through B from it (read line by line from the chunks) holds
/// every line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_far_over_one_chunk_streams_through_redis_both_ways() {
    let Some(redis) = Redis::start() else { return };
    let mock = mock().await;
    let limits = |c: Conf| {
        c.server("max_body_bytes", 64 * 1024)
            .set("jobs.max_file_bytes", 4_000_000)
    };
    let a = limits(replica(&redis, &mock.base_url(), "a")).start().await;
    let b = limits(replica(&redis, &mock.base_url(), "b")).start().await;
    let pad = "x".repeat(900);
    let content: String = (0..3000)
        .map(|i| {
            format!(
                "{{\"custom_id\":\"r-{i}\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\
                 \"body\":{{\"model\":\"gpt-4o-mini\",\"messages\":[{{\"role\":\"user\",\
                 \"content\":\"{pad}\"}}]}}}}\n"
            )
        })
        .collect();
    assert!(content.len() > 11 * 256 * 1024);
    let file = upload(a.addr, &content).await;
    let back = send(get(b.addr, &format!("/v1/files/{file}/content"), KEY_A)).await;
    assert_eq!(back.status, 200);
    assert_eq!(back.body.len(), content.len());
    assert!(back.body == content.as_bytes(), "read back byte for byte");
    let other = send(get(b.addr, &format!("/v1/files/{file}/content"), KEY_B)).await;
    assert_eq!(other.status, 404, "not another tenant's");
    let body = serde_json::json!({"input_file_id": file, "endpoint": "/v1/chat/completions",
        "completion_window": "24h"});
    let r = send(post(
        b.addr,
        "/v1/batches",
        Some(KEY_A),
        &body.to_string(),
        &[],
    ))
    .await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(
        r.json()["request_counts"]["total"],
        3000,
        "every line, across chunks"
    );
    let del = send(
        Request::delete(format!("http://{}/v1/files/{file}", a.addr))
            .header("authorization", format!("Bearer {KEY_A}"))
            .body(Full::default())
            .unwrap(),
    )
    .await;
    assert_eq!(del.status, 200);
    assert_eq!(
        send(get(b.addr, &format!("/v1/files/{file}/content"), KEY_A))
            .await
            .status,
        404
    );
}
