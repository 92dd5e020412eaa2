//! Attack: a tenant that sends requests and never reads the answers (issue 13, point 1).
//! HTTP/1.1 (a tiny receive buffer, never read) and h2 (a tiny stream window, body never
//! polled); on a pool of one slot, the victim is served once `client_write_timeout_ms` cuts the
//! attacker, and `fairgate_rejected_total{reason="client_stalled"}` counts the cut.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpSocket;

use super::support::{figure, scrape, value, victim_run};
use crate::support::{eventually, mock, Conf, KEY_A, KEY_B};

/// The attacker's request: a long answer (100 000 tokens).
fn long(stream: bool) -> String {
    format!(
        r#"{{"model":"gpt-4o-mini","stream":{stream},"mock_output_tokens":100000,"messages":[{{"role":"user","content":"hi"}}]}}"#
    )
}

/// A pool of one slot; a client accepting no bytes for 300 ms is cut.
fn config(base_url: &str) -> Conf {
    Conf::new(base_url)
        .server("client_write_timeout_ms", 300)
        .upstream("max_concurrency", 1)
}
const VICTIM_REQUESTS: usize = 5;

#[tokio::test]
async fn http1_client_that_never_reads_is_cut_and_the_victim_served() {
    let mock = mock().await;
    let proxy = config(&mock.base_url()).start().await;
    let alone = victim_run(proxy.addr, &mock.stats, KEY_B, VICTIM_REQUESTS, &[])
        .await
        .ok;

    // The attacker: a small receive buffer, a streamed answer of ~20 MB, never a byte read.
    let socket = TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut attacker = socket.connect(proxy.addr).await.unwrap();
    let body = long(true);
    let req = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: fairgate\r\nauthorization: Bearer {KEY_A}\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    attacker.write_all(req.as_bytes()).await.unwrap();
    assert!(eventually(|| mock.stats.requests() > alone as u64).await);

    let under_attack = victim_run(proxy.addr, &mock.stats, KEY_B, VICTIM_REQUESTS, &[])
        .await
        .ok;
    let metrics = scrape(proxy.addr).await;
    let stalled = value(
        &metrics,
        "fairgate_rejected_total",
        &[("tenant", "a"), ("reason", "client_stalled")],
    );
    figure(
        "client never reads (HTTP/1.1, SSE)",
        "victim served under attack / alone",
        under_attack as f64 / alone as f64,
        &format!("attacker cut {stalled} time(s); pool of 1 slot"),
    );
    assert_eq!(alone, VICTIM_REQUESTS);
    assert_eq!(
        under_attack, VICTIM_REQUESTS,
        "the victim is served while the attacker stalls"
    );
    assert_eq!(stalled, 1.0, "{metrics}");
    // The attacker's upstream request was cancelled, not left running.
    assert!(eventually(|| mock.stats.in_flight() == 0).await);
    assert!(mock.stats.cancelled() >= 1);
    drop(attacker);
}

#[tokio::test]
async fn h2_stream_whose_window_stays_shut_is_cut_and_the_victim_served() {
    h2_attack(false).await;
}

#[tokio::test]
async fn h2_sse_stream_whose_window_stays_shut_is_cut_and_the_victim_served() {
    h2_attack(true).await;
}

async fn h2_attack(stream: bool) {
    let mock = mock().await;
    let proxy = config(&mock.base_url()).start().await;
    let alone = victim_run(proxy.addr, &mock.stats, KEY_B, VICTIM_REQUESTS, &[])
        .await
        .ok;

    // The attacker: h2 with a 16-byte stream window, the response body never polled.
    let tcp = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .initial_stream_window_size(16)
        .initial_connection_window_size(65_535)
        .handshake::<_, Full<Bytes>>(TokioIo::new(tcp))
        .await
        .unwrap();
    let conn = tokio::spawn(conn);
    let req = http::Request::post(format!("http://{}/v1/chat/completions", proxy.addr))
        .header("authorization", format!("Bearer {KEY_A}"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(long(stream))))
        .unwrap();
    let head = tokio::time::timeout(Duration::from_secs(20), sender.send_request(req))
        .await
        .expect("the head arrives")
        .unwrap();
    assert_eq!(head.status(), 200);

    let under_attack = victim_run(proxy.addr, &mock.stats, KEY_B, VICTIM_REQUESTS, &[])
        .await
        .ok;
    let metrics = scrape(proxy.addr).await;
    let stalled = value(
        &metrics,
        "fairgate_rejected_total",
        &[("tenant", "a"), ("reason", "client_stalled")],
    );
    figure(
        if stream {
            "client never reads (h2 SSE, window shut)"
        } else {
            "client never reads (h2, window shut)"
        },
        "victim served under attack / alone",
        under_attack as f64 / alone as f64,
        &format!("attacker cut {stalled} time(s); pool of 1 slot"),
    );
    assert_eq!(under_attack, alone);
    assert_eq!(stalled, 1.0, "{metrics}");
    assert!(eventually(|| mock.stats.in_flight() == 0).await);
    drop(head);
    conn.abort();
}
