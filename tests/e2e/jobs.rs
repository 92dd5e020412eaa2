//! Jobs end to end: `Prefer: respond-async` (202, Location, the stored answer, cross-tenant 404,
//! cancel, `stream` refused), a job instead of a full-queue refusal, the per-tenant in-flight
//! cap and limits, and the Batch API through async-openai's files and batches clients.

use std::time::Duration;

use crate::support::*;
use bytes::Bytes;
use http::Request;
use http_body_util::Full;

/// A fresh SQLite path under the temp dir.
fn db() -> String {
    std::env::temp_dir()
        .join(format!("fg-jobs-{:032x}.sqlite", rand::random::<u128>()))
        .display()
        .to_string()
}

/// The default test config with `[jobs]` at a fresh SQLite path.
fn jobs_config(base_url: &str) -> Conf {
    Conf::new(base_url).set("jobs.path", db())
}

/// A chat of `gpt-4o-mini` as tenant `key` with `headers`, through fairgate at `addr`.
async fn chat_as(addr: std::net::SocketAddr, key: &str, headers: &[(&str, &str)]) -> Collected {
    send(post(
        addr,
        "/v1/chat/completions",
        Some(key),
        &chat("gpt-4o-mini"),
        headers,
    ))
    .await
}

fn get(addr: std::net::SocketAddr, path: &str, key: &str) -> Request<Full<Bytes>> {
    Request::get(format!("http://{addr}{path}"))
        .header("authorization", format!("Bearer {key}"))
        .body(Full::default())
        .unwrap()
}

/// Polls `path` until it stops answering 202 (at most 10 s, 20 ms apart).
async fn wait_done(addr: std::net::SocketAddr, path: &str, key: &str) -> Collected {
    for _ in 0..500 {
        let r = send(get(addr, path, key)).await;
        if r.status != 202 {
            return r;
        }
        assert!(r.headers.contains_key("retry-after"));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("job {path} did not finish");
}

const ASYNC: (&str, &str) = ("prefer", "respond-async");

#[tokio::test]
async fn respond_async_answers_202_then_the_synchronous_answer_to_its_tenant_only() {
    let mock = mock().await;
    let proxy = jobs_config(&mock.base_url())
        .upstream("models", ["gpt-4o-mini"])
        .start()
        .await;
    let r = chat_as(proxy.addr, KEY_A, &[ASYNC]).await;
    assert_eq!(r.status, 202, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.headers["preference-applied"], "respond-async");
    let v = r.json();
    assert_eq!(
        (v["object"].as_str(), v["status"].as_str()),
        (Some("fairgate.job"), Some("queued"))
    );
    let id = v["id"].as_str().unwrap();
    // 128 random bits, in hex, after the prefix.
    let hex = id.strip_prefix("job_").unwrap();
    assert!(
        hex.len() == 32 && hex.bytes().all(|b| b.is_ascii_hexdigit()),
        "{id}"
    );
    let location = r.headers["location"].to_str().unwrap().to_owned();
    assert_eq!(location, format!("/v1/fairgate/jobs/{id}"));
    // Another tenant's key: as if the job did not exist.
    send(get(proxy.addr, &location, KEY_B))
        .await
        .assert_error(404, "not_found");
    let done = wait_done(proxy.addr, &location, KEY_A).await;
    assert_eq!(done.status, 200);
    assert_eq!(done.headers["x-fairgate-job-status"], "completed");
    assert_eq!(done.json()["object"], "chat.completion");
    assert_eq!(mock.stats.requests(), 1, "sent once");
    // Still another tenant's 404 once finished.
    send(get(proxy.addr, &location, KEY_B))
        .await
        .assert_error(404, "not_found");
    // A final error is stored as the synchronous call would have answered it.
    let r = send(post(
        proxy.addr,
        "/v1/chat/completions",
        Some(KEY_A),
        &chat("no-such-model"),
        &[ASYNC],
    ))
    .await;
    assert_eq!(r.status, 202);
    let location = r.headers["location"].to_str().unwrap().to_owned();
    let done = wait_done(proxy.addr, &location, KEY_A).await;
    done.assert_error(404, "model_not_found");
    assert_eq!(done.headers["x-fairgate-job-status"], "failed");
    assert_eq!(
        mock.stats.requests(),
        1,
        "the refused job never reached the provider"
    );
}

/// `[store] path` is the one file for durable state: `[jobs]` without a `path` stores its jobs
/// there, beside the usage ledger (`[jobs] path`, the older spelling, still wins when set).
#[tokio::test]
async fn jobs_without_a_path_live_in_the_store_file_beside_the_usage_ledger() {
    let mock = mock().await;
    let store = db();
    let proxy = Conf::new(&mock.base_url())
        .set("store.path", store.as_str())
        .set("store.flush_ms", 50)
        .set("jobs.max_inflight_per_tenant", 4)
        .start()
        .await;
    let r = chat_as(proxy.addr, KEY_A, &[ASYNC]).await;
    assert_eq!(r.status, 202, "{}", String::from_utf8_lossy(&r.body));
    let location = r.headers["location"].to_str().unwrap().to_owned();
    let done = wait_done(proxy.addr, &location, KEY_A).await;
    assert_eq!(done.status, 200);
    proxy.shutdown();
    proxy.join().await.unwrap();
    let db = rusqlite::Connection::open(&store).unwrap();
    let count = |sql: &str| -> i64 { db.query_row(sql, [], |r| r.get(0)).unwrap() };
    assert_eq!(
        count("SELECT count(*) FROM jobs"),
        1,
        "the job is in [store] path"
    );
    assert_eq!(
        count("SELECT sum(requests) FROM usage_ledger"),
        1,
        "and so is the ledger"
    );
    let _ = std::fs::remove_file(&store);
}

#[tokio::test]
async fn stream_with_respond_async_is_a_400_that_says_why() {
    let mock = mock().await;
    let proxy = jobs_config(&mock.base_url()).start().await;
    let body = r#"{"model":"gpt-4o-mini","stream":true,"messages":[]}"#;
    let r = send(post(
        proxy.addr,
        "/v1/chat/completions",
        Some(KEY_A),
        body,
        &[ASYNC],
    ))
    .await;
    r.assert_error(400, "stream_not_async");
    assert!(r.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("stream"));
    assert_eq!(mock.stats.requests(), 0);
}

#[tokio::test]
async fn without_jobs_configured_respond_async_is_ignored() {
    let (mock, proxy) = pair().await;
    let r = chat_as(proxy.addr, KEY_A, &[ASYNC]).await;
    assert_eq!(r.status, 200);
    assert!(!r.headers.contains_key("preference-applied"));
    assert_eq!(mock.stats.requests(), 1);
}

#[tokio::test]
async fn a_tenant_never_has_more_than_max_inflight_jobs_in_the_stack_and_delete_cancels() {
    let mock = mock_slow(40).await;
    let proxy = jobs_config(&mock.base_url())
        .set("jobs.max_inflight_per_tenant", 2)
        .start()
        .await;
    let mut locations = Vec::new();
    for _ in 0..8 {
        let r = chat_as(proxy.addr, KEY_A, &[ASYNC]).await;
        assert_eq!(r.status, 202);
        locations.push(r.headers["location"].to_str().unwrap().to_owned());
    }
    // The last one is still queued behind the first ones: DELETE cancels it.
    let del = Request::delete(format!("http://{}{}", proxy.addr, locations[7]))
        .header("authorization", format!("Bearer {KEY_A}"))
        .body(Full::default())
        .unwrap();
    let r = send(del).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["status"], "cancelled");
    for l in &locations[..7] {
        let done = wait_done(proxy.addr, l, KEY_A).await;
        assert_eq!(done.headers["x-fairgate-job-status"], "completed");
    }
    let cancelled = send(get(proxy.addr, &locations[7], KEY_A)).await;
    assert_eq!(cancelled.json()["status"], "cancelled");
    assert_eq!(mock.stats.requests(), 7, "the cancelled job never ran");
    let peak = mock.stats.max_in_flight();
    assert!(
        (1..=2).contains(&peak),
        "peak in flight {peak} > max_inflight_per_tenant"
    );
}

#[tokio::test]
async fn a_full_queue_becomes_a_job_with_respond_async_and_stays_a_429_without() {
    let mock = mock_slow(300).await;
    let proxy = jobs_config(&mock.base_url())
        .upstream("max_concurrency", 1)
        .tenant("b", "max_queued", 1)
        .start()
        .await;
    let addr = proxy.addr;
    // Tenant b fills its one queue slot behind a request in flight.
    let first = tokio::spawn(send(post(
        addr,
        "/v1/chat/completions",
        Some(KEY_B),
        &chat("gpt-4o-mini"),
        &[],
    )));
    let pools = proxy.pools.clone();
    assert!(eventually(|| pools[0].load().1 == 1).await, "one in flight");
    let second = tokio::spawn(send(post(
        addr,
        "/v1/chat/completions",
        Some(KEY_B),
        &chat("gpt-4o-mini"),
        &[],
    )));
    assert!(eventually(|| pools[0].load().0 == 1).await, "one queued");
    // Without the header: refused as before.
    let r = chat_as(addr, KEY_B, &[]).await;
    r.assert_error(429, "rate_limit_exceeded");
    assert!(!r.headers.contains_key("preference-applied"));
    // With `respond-async, wait`: tried synchronously, refused, so a job.
    let r = chat_as(addr, KEY_B, &[("prefer", "respond-async, wait=5")]).await;
    assert_eq!(r.status, 202, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.headers["preference-applied"], "respond-async");
    let location = r.headers["location"].to_str().unwrap().to_owned();
    assert_eq!(first.await.unwrap().status, 200);
    assert_eq!(second.await.unwrap().status, 200);
    let done = wait_done(addr, &location, KEY_B).await;
    assert_eq!(done.headers["x-fairgate-job-status"], "completed");
    assert_eq!(mock.stats.requests(), 3);
}

#[tokio::test]
async fn queued_jobs_beyond_the_tenant_limit_are_a_429_tenant() {
    let mock = mock_slow(200).await;
    let proxy = jobs_config(&mock.base_url())
        .set("jobs.max_queued_jobs_per_tenant", 2)
        .start()
        .await;
    for _ in 0..2 {
        let r = chat_as(proxy.addr, KEY_A, &[ASYNC]).await;
        assert_eq!(r.status, 202);
    }
    let r = chat_as(proxy.addr, KEY_A, &[ASYNC]).await;
    r.assert_error(429, "job_limit_exceeded");
    assert_eq!(r.headers["x-fairgate-limit"], "tenant");
    // Another tenant's jobs are not counted against it.
    let r = chat_as(proxy.addr, KEY_B, &[ASYNC]).await;
    assert_eq!(r.status, 202);
}

mod batch_api {
    use super::*;
    use async_openai::config::OpenAIConfig;
    use async_openai::types::batches::{
        BatchCompletionWindow, BatchEndpoint, BatchRequest, BatchStatus,
    };
    use async_openai::types::files::{CreateFileRequest, FileInput, FilePurpose};
    use async_openai::Client;

    fn openai(addr: std::net::SocketAddr, key: &str) -> Client<OpenAIConfig> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        Client::with_config(
            OpenAIConfig::new()
                .with_api_base(format!("http://{addr}/v1"))
                .with_api_key(key),
        )
    }

    /// A JSONL input file of `n` chat lines with custom ids `req-0` … `req-{n-1}`.
    pub fn input(n: usize) -> Vec<u8> {
        (0..n)
            .map(|i| {
                format!(
                    "{{\"custom_id\":\"req-{i}\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{}}}\n",
                    chat("gpt-4o-mini")
                )
            })
            .collect::<String>()
            .into_bytes()
    }

    async fn upload(c: &Client<OpenAIConfig>, content: Vec<u8>) -> String {
        let f = c
            .files()
            .create(CreateFileRequest {
                file: FileInput::from_vec_u8("in.jsonl".into(), content),
                purpose: FilePurpose::Batch,
                expires_after: None,
            })
            .await
            .unwrap();
        f.id
    }

    fn request(file: &str) -> BatchRequest {
        BatchRequest {
            input_file_id: file.to_owned(),
            endpoint: BatchEndpoint::V1ChatCompletions,
            completion_window: BatchCompletionWindow::W24H,
            metadata: None,
            output_expires_after: None,
        }
    }

    #[tokio::test]
    async fn files_and_batches_work_through_the_official_client() {
        let mock = mock().await;
        let proxy = jobs_config(&mock.base_url()).start().await;
        let a = openai(proxy.addr, KEY_A);
        let file = upload(&a, input(20)).await;
        assert_eq!(
            a.files().retrieve(&file).await.unwrap().bytes,
            Some(input(20).len() as u32)
        );
        assert_eq!(
            a.files().content(&file).await.unwrap().as_ref(),
            input(20).as_slice()
        );
        let batch = a.batches().create(request(&file)).await.unwrap();
        assert_eq!(batch.status, BatchStatus::InProgress);
        // Tenant b sees neither the file nor the batch.
        let b = openai(proxy.addr, KEY_B);
        assert!(b.batches().retrieve(&batch.id).await.is_err());
        assert!(b.files().content(&file).await.is_err());
        let mut done = None;
        for _ in 0..500 {
            let got = a.batches().retrieve(&batch.id).await.unwrap();
            if got.status == BatchStatus::Completed {
                done = Some(got);
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let done = done.expect("the batch completes");
        let counts = done.request_counts.unwrap();
        assert_eq!((counts.total, counts.completed, counts.failed), (20, 20, 0));
        let out = a
            .files()
            .content(done.output_file_id.as_deref().unwrap())
            .await
            .unwrap();
        let records = jsonl(&out);
        for v in &records {
            assert_eq!(v["response"]["status_code"], 200);
            assert_eq!(v["response"]["body"]["object"], "chat.completion");
        }
        let ids = custom_ids(&records);
        let mut want: Vec<String> = (0..20).map(|i| format!("req-{i}")).collect();
        want.sort();
        assert_eq!(ids, want, "every custom_id exactly once");
        assert_eq!(mock.stats.requests(), 20);
        let text = scrape(proxy.addr).await;
        let lines = [("tenant", "a"), ("outcome", "completed")];
        assert_eq!(
            value(&text, "fairgate_batch_lines_total", &lines),
            Some(20.0),
            "{text}"
        );
        let addr = proxy.addr;
        let mut gauged = None;
        for _ in 0..200 {
            let text = scrape(addr).await;
            gauged = value(
                &text,
                "fairgate_jobs",
                &[("tenant", "a"), ("state", "completed")],
            );
            if gauged == Some(20.0) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(
            gauged,
            Some(20.0),
            "fairgate_jobs is set within the runner's tick"
        );
        let list = a.batches().list().await.unwrap();
        assert_eq!(list.data.len(), 1);
        assert!(b.batches().list().await.unwrap().data.is_empty());
        a.files().delete(&file).await.unwrap();
        assert!(a.files().retrieve(&file).await.is_err());
    }

    #[tokio::test]
    async fn a_bad_line_fails_the_batch_naming_the_line_and_nothing_runs() {
        let mock = mock().await;
        let proxy = jobs_config(&mock.base_url()).start().await;
        let a = openai(proxy.addr, KEY_A);
        let mut content = input(3);
        content.extend_from_slice(b"{\"custom_id\":\"x\",\"method\":\"GET\",\"url\":\"/v1/chat/completions\",\"body\":{\"model\":\"m\"}}\n");
        let file = upload(&a, content).await;
        let batch = a.batches().create(request(&file)).await.unwrap();
        assert_eq!(batch.status, BatchStatus::Failed);
        let errors = batch.errors.unwrap().data;
        assert_eq!(errors.len(), 1);
        assert_eq!(errors[0].line, Some(4));
        assert_eq!(errors[0].param.as_deref(), Some("method"));
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(mock.stats.requests(), 0);
    }

    /// `GET /v1/files` lists the tenant's own files newest first (the official client's
    /// `files().list()`), pages with `limit`/`after`, filters by `purpose`, and never shows
    /// another tenant's files.
    #[tokio::test]
    async fn files_are_listed_per_tenant_newest_first() {
        let mock = mock().await;
        let proxy = jobs_config(&mock.base_url()).start().await;
        let (a, b) = (openai(proxy.addr, KEY_A), openai(proxy.addr, KEY_B));
        let mut mine = Vec::new();
        for n in 1..=3 {
            mine.push(upload(&a, input(n)).await);
        }
        let theirs = upload(&b, input(1)).await;
        let listed = a.files().list().await.unwrap();
        let ids: Vec<_> = listed.data.iter().map(|f| f.id.clone()).collect();
        let newest_first: Vec<_> = mine.iter().rev().cloned().collect();
        assert_eq!(ids, newest_first);
        assert!(!listed.has_more);
        let raw = |q: &str| {
            let q = q.to_owned();
            let addr = proxy.addr;
            async move {
                send(get(addr, &format!("/v1/files?{q}"), KEY_A))
                    .await
                    .json()
            }
        };
        let page = raw("limit=2").await;
        assert_eq!(page["has_more"], true);
        assert_eq!(page["data"].as_array().unwrap().len(), 2);
        let rest = raw(&format!(
            "limit=2&after={}",
            page["last_id"].as_str().unwrap()
        ))
        .await;
        assert_eq!(rest["data"][0]["id"], mine[0].as_str());
        assert_eq!(rest["has_more"], false);
        assert_eq!(
            raw("purpose=batch_output").await["data"],
            serde_json::json!([])
        );
        let only_b = b.files().list().await.unwrap().data;
        assert_eq!(only_b.len(), 1);
        assert_eq!(only_b[0].id, theirs);
        let bad = send(get(proxy.addr, "/v1/files?limit=0", KEY_A)).await;
        assert_eq!(bad.status, 400);
    }

    /// A mock answering in `ms`, a proxy running one job of a tenant at a time, tenant A's
    /// client and an uploaded input file of `lines` lines.
    async fn one_line_at_a_time(
        ms: u64,
        lines: usize,
    ) -> (
        fairgate_mock::MockServer,
        fairgate::server::ServerHandle,
        Client<OpenAIConfig>,
        String,
    ) {
        let mock = mock_slow(ms).await;
        let proxy = jobs_config(&mock.base_url())
            .set("jobs.max_inflight_per_tenant", 1)
            .start()
            .await;
        let a = openai(proxy.addr, KEY_A);
        let file = upload(&a, input(lines)).await;
        (mock, proxy, a, file)
    }

    #[tokio::test]
    async fn cancel_stops_the_lines_not_yet_run() {
        let (mock, _proxy, a, file) = one_line_at_a_time(50, 30).await;
        let batch = a.batches().create(request(&file)).await.unwrap();
        let c = a.batches().cancel(&batch.id).await.unwrap();
        assert!(matches!(
            c.status,
            BatchStatus::Cancelling | BatchStatus::Cancelled
        ));
        let mut done = None;
        for _ in 0..500 {
            let got = a.batches().retrieve(&batch.id).await.unwrap();
            if got.status == BatchStatus::Cancelled {
                done = Some(got);
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let done = done.expect("the batch is cancelled");
        let ran = mock.stats.requests();
        assert!(ran <= 2, "{ran} lines ran after cancel");
        let counts = done.request_counts.unwrap();
        assert_eq!(counts.total, 30);
        assert_eq!(u64::from(counts.completed), ran);
        let errors = a
            .files()
            .content(done.error_file_id.as_deref().unwrap())
            .await
            .unwrap();
        let cancelled = errors
            .split(|&b| b == b'\n')
            .filter(|l| !l.is_empty())
            .count() as u64;
        assert_eq!(
            cancelled + ran,
            30,
            "each line once, in one of the two files"
        );
    }

    /// A batch whose completion window ends stops: lines that had not run are in the error file
    /// as `batch_expired`, the ones that ran are in the output, each custom id once, and the
    /// batch ends `expired` (OpenAI's status), read through the official client. The window is
    /// a fairgate extension (`2s`; OpenAI accepts only `24h`); a window that is not a duration
    /// is a 400 naming the field.
    #[tokio::test]
    async fn a_batch_past_its_completion_window_expires_with_what_ran() {
        let (mock, proxy, a, file) = one_line_at_a_time(300, 40).await;
        let create = |window: &str| {
            post(
                proxy.addr,
                "/v1/batches",
                Some(KEY_A),
                &format!(
                    r#"{{"input_file_id":"{file}","endpoint":"/v1/chat/completions","completion_window":"{window}"}}"#
                ),
                &[],
            )
        };
        let bad = send(create("soon")).await;
        assert_eq!(bad.status, 400);
        assert_eq!(bad.json()["error"]["param"], "completion_window");
        let created = send(create("2s")).await;
        assert_eq!(created.status, 200);
        let id = created.json()["id"].as_str().unwrap().to_owned();
        let mut done = None;
        for _ in 0..800 {
            let got = a.batches().retrieve(&id).await.unwrap();
            if got.status == BatchStatus::Expired {
                done = Some(got);
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let done = done.expect("the batch expires");
        assert!(done.expired_at.is_some());
        let ran = mock.stats.requests();
        assert!(ran > 0 && ran < 40, "{ran} of 40 lines ran");
        let counts = done.request_counts.unwrap();
        assert_eq!((counts.total, u64::from(counts.completed)), (40, ran));
        let out = jsonl(
            &a.files()
                .content(done.output_file_id.as_deref().unwrap())
                .await
                .unwrap(),
        );
        let err = jsonl(
            &a.files()
                .content(done.error_file_id.as_deref().unwrap())
                .await
                .unwrap(),
        );
        assert_eq!(out.len() as u64, ran);
        assert!(
            err.iter().all(|l| l["error"]["code"] == "batch_expired"),
            "{err:?}"
        );
        let mut want: Vec<String> = (0..40).map(|i| format!("req-{i}")).collect();
        want.sort();
        assert_eq!(
            custom_ids(&[out, err].concat()),
            want,
            "each custom id once, in one of the two files"
        );
    }
}

#[tokio::test]
async fn stored_bytes_beyond_the_tenant_limit_are_a_429_tenant() {
    // One JSON line of `n` bytes (an upload is checked line by line).
    let line = |n: usize| format!("{{\"p\":\"{}\"}}", "x".repeat(n - 8));
    let mock = mock().await;
    let proxy = jobs_config(&mock.base_url())
        .set("jobs.max_stored_bytes_per_tenant", 300)
        .start()
        .await;
    let upload = |key: &str, content: &str| {
        let body = format!(
            "--B\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n--B\r\n\
             Content-Disposition: form-data; name=\"file\"; filename=\"in.jsonl\"\r\n\r\n{content}\r\n--B--\r\n"
        );
        Request::post(format!("http://{}/v1/files", proxy.addr))
            .header("authorization", format!("Bearer {key}"))
            .header("content-type", "multipart/form-data; boundary=B")
            .body(Full::new(Bytes::from(body)))
            .unwrap()
    };
    let r = send(upload(KEY_A, &line(200))).await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let r = send(upload(KEY_A, &line(200))).await;
    r.assert_error(429, "job_limit_exceeded");
    assert_eq!(r.headers["x-fairgate-limit"], "tenant");
    // Tenant b's budget is its own.
    assert_eq!(send(upload(KEY_B, &line(200))).await.status, 200);
}
