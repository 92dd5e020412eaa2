//! Connection-level protection over real sockets: the body timeout (408), idle keep-alive
//! connections closed (HTTP/1.1 and h2), the per-IP cap, and `fairgate serve` at a lowered
//! descriptor limit keeping a victim tenant served through a flood of idle connections.
//!
//! Every wait is bounded in count and time; assertions are on statuses and counts only.
//! Linux only: a second client address is 127.0.0.2 (all of 127/8 is loopback there), and the
//! descriptor limit is lowered with `setrlimit` in the spawned child.
#![cfg(target_os = "linux")]

use std::io::Read as _;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use crate::support::{chat, mock, mock_with, Conf, KEY_A, KEY_B};
use bytes::Bytes;
use fairgate_mock::MockConfig;
use http_body_util::Empty;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

mod fdlimit;

/// A raw HTTP/1.1 request (`Connection: close`) for `path`, as tenant `key`.
fn request(path: &str, key: &str, body: &str) -> String {
    let method = if body.is_empty() { "GET" } else { "POST" };
    format!(
        "{method} {path} HTTP/1.1\r\nhost: fairgate\r\nauthorization: Bearer {key}\r\n\
         content-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
}

/// Connects to `addr` from the loopback address `from` (127.0.0.x: another client).
async fn connect_from(from: IpAddr, addr: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::new(from, 0)).unwrap();
    socket.connect(addr).await.unwrap()
}

/// Reads until the server closes the connection (`true`) or 10 s pass (`false`).
async fn read_to_close(s: &mut TcpStream, out: &mut Vec<u8>) -> bool {
    let mut chunk = [0u8; 4096];
    let read = async {
        loop {
            match s.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => out.extend_from_slice(&chunk[..n]),
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(10), read)
        .await
        .is_ok()
}

/// Sends `req` on a new connection from `from` and returns the whole answer (read to close).
async fn exchange(from: IpAddr, addr: SocketAddr, req: &str) -> String {
    let mut s = connect_from(from, addr).await;
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    assert!(read_to_close(&mut s, &mut out).await, "answered and closed");
    String::from_utf8_lossy(&out).into_owned()
}

fn status(answer: &str) -> u16 {
    answer
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

const HOME: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 1));
const OTHER: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 2));

#[tokio::test]
async fn a_stalled_body_is_answered_408_in_openai_shape_and_the_connection_closed() {
    let mock = mock().await;
    let p = Conf::new(&mock.base_url())
        .server("client_body_timeout_ms", 200)
        .start()
        .await;
    let mut s = TcpStream::connect(p.addr).await.unwrap();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: fairgate\r\nauthorization: Bearer {KEY_A}\r\n\
         content-type: application/json\r\ncontent-length: 100000\r\n\r\n{{\"model\":"
    );
    s.write_all(head.as_bytes()).await.unwrap();
    // Then nothing more: the body stalls.
    let mut out = Vec::new();
    assert!(
        read_to_close(&mut s, &mut out).await,
        "the connection is closed"
    );
    let answer = String::from_utf8_lossy(&out);
    assert_eq!(status(&answer), 408, "{answer}");
    assert!(
        answer.to_ascii_lowercase().contains("connection: close"),
        "{answer}"
    );
    let body = answer.split("\r\n\r\n").nth(1).unwrap_or_default();
    let v: serde_json::Value = serde_json::from_str(body).unwrap();
    assert_eq!(v["error"]["code"], "request_timeout", "{v}");
    assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
    assert!(v["error"]["message"]
        .as_str()
        .is_some_and(|m| !m.is_empty()));

    // A body that arrives promptly is not affected.
    let ok = exchange(
        HOME,
        p.addr,
        &request("/v1/chat/completions", KEY_A, &chat("m")),
    )
    .await;
    assert_eq!(status(&ok), 200, "{ok}");
}

#[tokio::test]
async fn idle_connections_are_closed_but_busy_ones_are_not() {
    // Responses take longer than the keep-alive timeout: a busy connection is not idle.
    let mock = mock_with(MockConfig {
        base_latency: Duration::from_millis(600),
        ..MockConfig::default()
    })
    .await;
    let p = Conf::new(&mock.base_url())
        .server("keepalive_timeout_ms", 200)
        .start()
        .await;

    // A connection that never sends a byte.
    let mut silent = TcpStream::connect(p.addr).await.unwrap();
    let mut out = Vec::new();
    assert!(read_to_close(&mut silent, &mut out).await);
    assert!(out.is_empty());

    // HTTP/1.1 keep-alive: served (longer than the timeout), then closed once idle.
    let mut s = TcpStream::connect(p.addr).await.unwrap();
    let req = request("/v1/chat/completions", KEY_A, &chat("m"))
        .replace("connection: close", "connection: keep-alive");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    assert!(
        read_to_close(&mut s, &mut out).await,
        "closed after going idle"
    );
    let answer = String::from_utf8_lossy(&out);
    assert_eq!(status(&answer), 200, "{answer}");
    assert!(
        !answer.to_ascii_lowercase().contains("connection: close"),
        "{answer}"
    );

    // h2 (prior knowledge): a stream is served, then the idle connection is closed (GOAWAY).
    let io = TokioIo::new(TcpStream::connect(p.addr).await.unwrap());
    let (mut sender, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .handshake::<_, Empty<Bytes>>(io)
        .await
        .unwrap();
    let conn = tokio::spawn(conn);
    let req = http::Request::get(format!("http://{}/healthz", p.addr))
        .body(Empty::new())
        .unwrap();
    let res = sender.send_request(req).await.unwrap();
    assert_eq!(res.status(), 200);
    drop(res);
    let ended = tokio::time::timeout(Duration::from_secs(10), conn).await;
    assert!(matches!(ended, Ok(Ok(Ok(())))), "{ended:?}");
}

#[tokio::test]
async fn the_per_ip_cap_refuses_the_excess_while_another_client_is_served() {
    let mock = mock().await;
    // One connection worker: one accept queue, so connections are accepted in the order they
    // were made (with several, another worker may accept the fourth before the third).
    let p = Conf::new(&mock.base_url())
        .server("workers", 1)
        .server("max_connections_per_ip", 3)
        // The scraper at OTHER is the operator's: /metrics answers trusted peers only.
        .server("trusted_sources", ["127.0.0.1/32", "127.0.0.2/32"])
        .start()
        .await;
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(connect_from(HOME, p.addr).await);
    }
    // The fourth from the same address is closed before anything is read from it.
    let mut excess = connect_from(HOME, p.addr).await;
    let _ = excess
        .write_all(request("/healthz", KEY_A, "").as_bytes())
        .await;
    let mut out = Vec::new();
    assert!(
        read_to_close(&mut excess, &mut out).await,
        "the excess is closed"
    );
    assert!(
        out.is_empty(),
        "no answer: {}",
        String::from_utf8_lossy(&out)
    );

    // Another address is served meanwhile, and so are the held connections.
    let other = exchange(
        OTHER,
        p.addr,
        &request("/v1/chat/completions", KEY_B, &chat("m")),
    )
    .await;
    assert_eq!(status(&other), 200, "{other}");
    let mut first = held.remove(0);
    first
        .write_all(request("/v1/chat/completions", KEY_A, &chat("m")).as_bytes())
        .await
        .unwrap();
    let mut out = Vec::new();
    assert!(read_to_close(&mut first, &mut out).await);
    assert_eq!(status(&String::from_utf8_lossy(&out)), 200);

    let metrics = exchange(OTHER, p.addr, &request("/metrics", KEY_B, "")).await;
    assert!(
        metrics.contains("fairgate_connections_refused_total{reason=\"max_connections_per_ip\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("fairgate_connections{state=\"idle\"}"),
        "{metrics}"
    );
}

/// Whether the server has closed `s` (a non-blocking std stream).
fn closed(mut s: &std::net::TcpStream) -> bool {
    let mut b = [0u8; 1];
    match s.read(&mut b) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
    }
}
