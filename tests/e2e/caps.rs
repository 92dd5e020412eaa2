//! Output caps see the whole request, and early errors are readable, end to end over raw
//! HTTP/1.1 sockets:
//! - the five dodges of issue 14 (a small alias beside a large one, a float, a string, a
//!   negative number, `n` × a cap at the limit) are each a 400 `invalid_request_error` naming the
//!   field, and none reaches the provider;
//! - a client streaming a body larger than `max_body_bytes` reads a complete 413 (lingering
//!   close), with a declared `Content-Length` and with a chunked body.

use std::net::SocketAddr;
use std::time::Duration;

use crate::support::*;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A raw HTTP/1.1 POST of `body` to the chat endpoint as tenant `a`.
fn raw_chat(body: &str) -> Vec<u8> {
    format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {KEY_A}\r\n\
         content-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Status and JSON body of a raw response.
fn parse(res: &str) -> (u16, Value) {
    let status = res
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {res:?}"));
    let body = res.split("\r\n\r\n").nth(1).unwrap_or("");
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

#[tokio::test]
async fn every_output_cap_dodge_is_a_400_naming_its_field() {
    let mock = mock().await;
    let proxy = Conf::new(&mock.base_url())
        .set("admission.max_output_tokens", 4096)
        .start()
        .await;
    let msgs = r#""messages":[{"role":"user","content":"hi"}]"#;
    for (dodge, param) in [
        (
            r#""max_tokens":1,"max_completion_tokens":100000"#,
            "max_completion_tokens",
        ),
        (r#""max_tokens":100000.0"#, "max_tokens"),
        (r#""max_tokens":"100000""#, "max_tokens"),
        (r#""max_tokens":-5"#, "max_tokens"),
        (r#""n":128,"max_tokens":4096"#, "n"),
        (r#""best_of":2,"max_completion_tokens":4096"#, "best_of"),
        (
            r#""max_output_tokens":18446744073709551615"#,
            "max_output_tokens",
        ),
    ] {
        let body = format!(r#"{{"model":"gpt-4o-mini",{dodge},{msgs}}}"#);
        let (status, v) = parse(&raw(proxy.addr, &raw_chat(&body)).await);
        assert_eq!(status, 400, "{dodge}: {v}");
        assert_eq!(v["error"]["type"], "invalid_request_error", "{dodge}: {v}");
        assert_eq!(v["error"]["param"], param, "{dodge}: {v}");
    }
    assert_eq!(mock.stats.requests(), 0, "no dodge reached the provider");
    // At the cap, one choice: admitted.
    let body = format!(r#"{{"model":"gpt-4o-mini","max_tokens":4096,"n":1,{msgs}}}"#);
    let (status, v) = parse(&raw(proxy.addr, &raw_chat(&body)).await);
    assert_eq!(status, 200, "{v}");
}

/// Acts like most clients: sends `head` and `total` bytes of body in 16 KiB pieces (chunked if
/// `chunked`) and only then reads the answer. Returns whether the whole body could be sent,
/// and everything read until the server closes (or 10 s).
async fn stream_large(
    addr: SocketAddr,
    head: String,
    total: usize,
    chunked: bool,
) -> (bool, String) {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let send = async {
        stream.write_all(head.as_bytes()).await?;
        let piece = vec![b'x'; 16 * 1024];
        let mut sent = 0;
        while sent < total {
            if chunked {
                let mut c = format!("{:x}\r\n", piece.len()).into_bytes();
                c.extend_from_slice(&piece);
                c.extend_from_slice(b"\r\n");
                stream.write_all(&c).await?;
            } else {
                stream.write_all(&piece).await?;
            }
            sent += piece.len();
        }
        if chunked {
            stream.write_all(b"0\r\n\r\n").await?;
        }
        stream.flush().await
    };
    let sent = tokio::time::timeout(Duration::from_secs(10), send)
        .await
        .is_ok_and(|r| r.is_ok());
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let read = async {
        loop {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    buf.extend_from_slice(&chunk[..n]);
                    if complete(&buf) {
                        break;
                    }
                }
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(10), read).await;
    (sent, String::from_utf8_lossy(&buf).into_owned())
}

/// Whether `buf` holds a whole response with a `content-length` body.
fn complete(buf: &[u8]) -> bool {
    let text = String::from_utf8_lossy(buf);
    let Some((head, body)) = text.split_once("\r\n\r\n") else {
        return false;
    };
    head.lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length:")
                .map(|v| v.trim().parse::<usize>().ok())
        })
        .flatten()
        .is_some_and(|n| body.len() >= n)
}

#[tokio::test]
async fn a_client_streaming_an_oversized_body_reads_the_whole_413() {
    let mock = mock().await;
    let proxy = Conf::new(&mock.base_url())
        .server("max_body_bytes", 1024)
        .start()
        .await;
    // 8 MiB: far more than socket buffers hold, so the client is still sending when the 413
    // is written.
    let total = 8 << 20;
    for chunked in [false, true] {
        let length = if chunked {
            "transfer-encoding: chunked".to_owned()
        } else {
            format!("content-length: {total}")
        };
        let head = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {KEY_A}\r\n\
             content-type: application/json\r\n{length}\r\n\r\n"
        );
        let (sent, res) = stream_large(proxy.addr, head, total, chunked).await;
        assert!(
            sent,
            "chunked={chunked}: the body could not be sent: {res:?}"
        );
        assert!(
            complete(res.as_bytes()),
            "chunked={chunked}: incomplete answer {res:?}"
        );
        let (status, v) = parse(&res);
        assert_eq!(status, 413, "chunked={chunked}: {res}");
        assert_eq!(v["error"]["code"], "request_too_large", "{v}");
    }
    // An unknown key, answered before the body is read: readable too.
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer nope\r\n\
         content-type: application/json\r\ncontent-length: {total}\r\n\r\n"
    );
    let (sent, res) = stream_large(proxy.addr, head, total, false).await;
    assert!(sent && complete(res.as_bytes()), "incomplete 401 {res:?}");
    assert_eq!(parse(&res).0, 401);
}
