//! `/v1/files` streamed both ways (`jobs::files`): an upload far over `[server] max_body_bytes`
//! is accepted up to `[jobs] max_file_bytes` and read back byte for byte (and used by a batch),
//! a quoted filename with `;` is kept, `max_file_bytes` / `max_file_lines` / a bad line are
//! refused, and a tenant's open transfers are capped (`max_transfers_per_tenant`) without
//! touching another tenant's.

use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full, StreamBody};

use crate::support::*;

fn db() -> String {
    std::env::temp_dir()
        .join(format!("fg-files-{:032x}.sqlite", rand::random::<u128>()))
        .display()
        .to_string()
}

/// `n` batch lines of about `size` bytes each.
fn batch_lines(n: usize, size: usize) -> String {
    (0..n)
        .map(|i| {
            let pad = "x".repeat(size.saturating_sub(140));
            format!(
                "{{\"custom_id\":\"r-{i}\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{{\"model\":\"gpt-4o-mini\",\"messages\":[{{\"role\":\"user\",\"content\":\"{pad}\"}}]}}}}\n"
            )
        })
        .collect()
}

fn form(filename: &str, content: &str) -> (String, String) {
    let head = format!(
        "--B\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n--B\r\n\
         Content-Disposition: form-data; name=\"file\"; filename=\"{filename}\"\r\n\
         Content-Type: application/jsonl\r\n\r\n"
    );
    (head, format!("{content}\r\n--B--\r\n"))
}

fn upload(
    addr: std::net::SocketAddr,
    key: &str,
    filename: &str,
    content: &str,
) -> Request<Full<Bytes>> {
    let (head, tail) = form(filename, content);
    Request::post(format!("http://{addr}/v1/files"))
        .header("authorization", format!("Bearer {key}"))
        .header("content-type", "multipart/form-data; boundary=B")
        .body(Full::new(Bytes::from(head + &tail)))
        .unwrap()
}

fn get(addr: std::net::SocketAddr, key: &str, path: &str) -> Request<Full<Bytes>> {
    Request::get(format!("http://{addr}{path}"))
        .header("authorization", format!("Bearer {key}"))
        .body(Full::default())
        .unwrap()
}

#[tokio::test]
async fn a_file_far_over_max_body_bytes_streams_in_and_out_whole() {
    let mock = mock().await;
    let proxy = Conf::new(&mock.base_url())
        .server("max_body_bytes", 64 * 1024)
        .set("jobs.path", db())
        .set("jobs.max_file_bytes", 4_000_000)
        .start()
        .await;
    // 3 MB: 46× max_body_bytes, 12 chunks of the store.
    let content = batch_lines(3000, 1000);
    let r = send(upload(proxy.addr, KEY_A, "in;put v2.jsonl", &content)).await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let f = r.json();
    assert_eq!(f["bytes"], content.len());
    assert_eq!(
        f["filename"], "in;put v2.jsonl",
        "the quoted name is kept whole"
    );
    let id = f["id"].as_str().unwrap().to_owned();
    let back = send(get(proxy.addr, KEY_A, &format!("/v1/files/{id}/content"))).await;
    assert_eq!(back.status, 200);
    assert_eq!(back.body.len(), content.len());
    assert!(back.body == content.as_bytes(), "read back byte for byte");
    // Another tenant does not see it.
    let other = send(get(proxy.addr, KEY_B, &format!("/v1/files/{id}/content"))).await;
    other.assert_error(404, "not_found");
    // A batch reads it (every line valid).
    let body = format!(
        r#"{{"input_file_id":"{id}","endpoint":"/v1/chat/completions","completion_window":"24h"}}"#
    );
    let b = send(post(proxy.addr, "/v1/batches", Some(KEY_A), &body, &[])).await;
    assert_eq!(b.status, 200, "{}", String::from_utf8_lossy(&b.body));
    assert_eq!(b.json()["request_counts"]["total"], 3000);
}

#[tokio::test]
async fn oversize_overlong_and_malformed_files_are_refused() {
    let mock = mock().await;
    let proxy = Conf::new(&mock.base_url())
        .set("jobs.path", db())
        .set("jobs.max_file_bytes", 100_000)
        .set("jobs.max_file_lines", 10)
        .start()
        .await;
    let r = send(upload(
        proxy.addr,
        KEY_A,
        "big.jsonl",
        &batch_lines(9, 20_000),
    ))
    .await;
    r.assert_error(413, "file_too_large");
    let r = send(upload(
        proxy.addr,
        KEY_A,
        "many.jsonl",
        &batch_lines(11, 200),
    ))
    .await;
    r.assert_error(400, "invalid_request");
    assert!(r.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("max_file_lines"));
    let r = send(upload(
        proxy.addr,
        KEY_A,
        "bad.jsonl",
        "{\"a\":1}\nnot json\n",
    ))
    .await;
    r.assert_error(400, "invalid_request");
    assert!(r.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("line 2"));
    // Nothing of the refused uploads is listed.
    let list = send(get(proxy.addr, KEY_A, "/v1/files")).await;
    assert_eq!(list.json()["data"].as_array().unwrap().len(), 0);
    assert_eq!(
        send(upload(proxy.addr, KEY_A, "ok.jsonl", &batch_lines(10, 200)))
            .await
            .status,
        200
    );
}

#[tokio::test]
async fn a_tenants_open_transfers_are_capped_and_another_tenant_is_not() {
    let mock = mock().await;
    let proxy = Conf::new(&mock.base_url())
        .set("jobs.path", db())
        .set("jobs.max_transfers_per_tenant", 1)
        .start()
        .await;
    type Held = (
        tokio::sync::mpsc::Sender<Result<http_body::Frame<Bytes>, std::io::Error>>,
        tokio::task::JoinHandle<Result<u16, hyper_util::client::legacy::Error>>,
    );
    // An upload that sends its head and then holds: it keeps a's one transfer slot.
    let hold = || async {
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let (head, _) = form("slow.jsonl", "");
        tx.send(Ok(http_body::Frame::data(Bytes::from(
            head + "{\"a\":1}\n",
        ))))
        .await
        .unwrap();
        let frames = futures_util::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|frame| (frame, rx))
        });
        let req = Request::post(format!("http://{}/v1/files", proxy.addr))
            .header("authorization", format!("Bearer {KEY_A}"))
            .header("content-type", "multipart/form-data; boundary=B")
            .body(StreamBody::new(frames).boxed())
            .unwrap();
        let held = tokio::spawn(async move {
            let c =
                hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                    .build_http::<http_body_util::combinators::BoxBody<Bytes, std::io::Error>>();
            c.request(req).await.map(|r| r.status().as_u16())
        });
        (tx, held) as Held
    };
    // A probe may take the slot just before the held upload asks (which then ends with its own
    // 429): a 429 counts only while the held upload is still open; else it is started again.
    let mut refused = None;
    'rounds: for _ in 0..50 {
        let (tx, held) = hold().await;
        for _ in 0..100 {
            let r = send(upload(proxy.addr, KEY_A, "second.jsonl", "{}\n")).await;
            if held.is_finished() {
                continue 'rounds;
            }
            if r.status == 429 {
                refused = Some((r, tx, held));
                break 'rounds;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let (r, tx, held) = refused.expect("a second transfer of a is refused while one is open");
    r.assert_error(429, "job_limit_exceeded");
    assert_eq!(r.headers["x-fairgate-limit"], "tenant");
    // Tenant b's transfers are its own.
    assert_eq!(
        send(upload(proxy.addr, KEY_B, "b.jsonl", "{}\n"))
            .await
            .status,
        200
    );
    // The held upload ends: a's slot is given back.
    tx.send(Ok(http_body::Frame::data(Bytes::from_static(
        b"\r\n--B--\r\n",
    ))))
    .await
    .unwrap();
    drop(tx);
    assert_eq!(held.await.unwrap().unwrap(), 200);
    assert_eq!(
        send(upload(proxy.addr, KEY_A, "third.jsonl", "{}\n"))
            .await
            .status,
        200
    );
}

#[tokio::test]
async fn a_tenant_hammering_the_files_api_is_refused_by_its_request_bucket_and_another_tenants_chat_is_not(
) {
    let mock = mock().await;
    let proxy = Conf::new(&mock.base_url())
        .set("jobs.path", db())
        .tenant("a", "requests_per_minute", 5)
        .start()
        .await;
    // Listings, an upload, reads: every call takes one request of a's bucket (5).
    let mut refused = None;
    for i in 0..20 {
        let r = if i == 2 {
            send(upload(proxy.addr, KEY_A, "in.jsonl", "{}\n")).await
        } else {
            send(get(proxy.addr, KEY_A, "/v1/files")).await
        };
        if r.status == 429 {
            refused = Some((i, r));
            break;
        }
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    }
    let (i, r) = refused.expect("a's files calls are refused once its request bucket is empty");
    assert_eq!(i, 5, "the 6th call: 5 fit in a bucket of 5");
    r.assert_error(429, "rate_limit_exceeded");
    assert_eq!(
        r.json()["error"]["type"],
        "requests",
        "the one 429 vocabulary"
    );
    assert_eq!(r.headers["x-fairgate-limit"], "tenant");
    assert!(r.headers.contains_key("retry-after"));
    assert_eq!(r.headers["x-ratelimit-remaining-requests"], "0");
    // A refused upload stores nothing; a batch call is charged the same way.
    let up = send(upload(proxy.addr, KEY_A, "more.jsonl", "{}\n")).await;
    up.assert_error(429, "rate_limit_exceeded");
    let body =
        r#"{"input_file_id":"file-x","endpoint":"/v1/chat/completions","completion_window":"24h"}"#;
    let b = send(post(proxy.addr, "/v1/batches", Some(KEY_A), body, &[])).await;
    b.assert_error(429, "rate_limit_exceeded");
    // The same bucket as a's chat requests; tenant b's chat is untouched.
    let chat_a = send(post(
        proxy.addr,
        "/v1/chat/completions",
        Some(KEY_A),
        &chat("gpt-4o-mini"),
        &[],
    ))
    .await;
    chat_a.assert_error(429, "rate_limit_exceeded");
    let chat_b = send(post(
        proxy.addr,
        "/v1/chat/completions",
        Some(KEY_B),
        &chat("gpt-4o-mini"),
        &[],
    ))
    .await;
    assert_eq!(
        chat_b.status,
        200,
        "{}",
        String::from_utf8_lossy(&chat_b.body)
    );
    let listed = send(get(proxy.addr, KEY_B, "/v1/files")).await;
    assert_eq!(listed.status, 200, "b's files calls are its own");
}

#[tokio::test]
async fn uploads_and_downloads_over_the_tenants_byte_rate_are_paced_not_cut() {
    let mock = mock().await;
    let proxy = Conf::new(&mock.base_url())
        .set("jobs.path", db())
        .set("jobs.max_file_bytes", 4_000_000)
        .set("jobs.transfer_bytes_per_second_per_tenant", 1_000_000)
        .start()
        .await;
    let content = batch_lines(3000, 1000);
    // 3 MB at 1 MB/s, the bucket never holding more than 1 MB: at least 2 s each way, whatever
    // the machine (a lower bound only: load can only add to it).
    let at_least = Duration::from_millis(1900);
    let t = std::time::Instant::now();
    let r = send(upload(proxy.addr, KEY_A, "in.jsonl", &content)).await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let up = t.elapsed();
    assert!(up >= at_least, "the upload was paced: {up:?}");
    let id = r.json()["id"].as_str().unwrap().to_owned();
    let t = std::time::Instant::now();
    let back = send(get(proxy.addr, KEY_A, &format!("/v1/files/{id}/content"))).await;
    let down = t.elapsed();
    assert_eq!(back.status, 200);
    assert!(
        back.body == content.as_bytes(),
        "paced, not cut: read back whole"
    );
    assert!(down >= at_least, "the download was paced: {down:?}");
    println!("byte rate 1 MB/s: 3 MB up in {up:?}, down in {down:?}");
}
