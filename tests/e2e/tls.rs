//! Inbound TLS end to end: with `[server.tls]` the connection workers terminate TLS, offer ALPN
//! `h2` and `http/1.1`, and serve both over one port; a plain-text client gets nothing.
//! The certificate in `tests/fixtures/` is a self-signed test certificate for `localhost` /
//! 127.0.0.1 (P-256, valid 100 years, CA:FALSE, serverAuth), made with `openssl req -x509 -newkey ec
//! -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 36500 -subj /CN=localhost -addext …`.

use std::sync::Arc;

use crate::support::{fixture, mock, mock_tls, post, send, Conf, KEY_A};
use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const BODY: &str =
    r#"{"model":"gpt-4o-mini","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}"#;

fn connector(alpn: &[u8]) -> tokio_rustls::TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(fixture("localhost.crt")).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.alpn_protocols = vec![alpn.to_vec()];
    tokio_rustls::TlsConnector::from(Arc::new(cfg))
}

fn chat() -> Request<Full<Bytes>> {
    Request::post("/v1/chat/completions")
        .header("authorization", format!("Bearer {KEY_A}"))
        .header("content-type", "application/json")
        .header("host", "localhost")
        .body(Full::new(Bytes::from_static(BODY.as_bytes())))
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_serves_http1_and_h2_and_refuses_plain_text() {
    let mock = mock().await;
    let proxy = Conf::new(&mock.base_url())
        .set("server.tls.cert", fixture("localhost.crt"))
        .set("server.tls.key", fixture("localhost.key"))
        .start()
        .await;
    let name = ServerName::try_from("localhost").unwrap();

    // HTTP/1.1 over TLS.
    let tcp = TcpStream::connect(proxy.addr).await.unwrap();
    let stream = connector(b"http/1.1")
        .connect(name.clone(), tcp)
        .await
        .unwrap();
    assert_eq!(stream.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let res = send.send_request(chat()).await.unwrap();
    assert_eq!(res.status(), 200);
    let body = res.into_body().collect().await.unwrap().to_bytes();
    assert!(body.windows(7).any(|w| w == b"\"usage\""));

    // h2 over TLS (ALPN), two requests on one connection.
    let tcp = TcpStream::connect(proxy.addr).await.unwrap();
    let stream = connector(b"h2").connect(name, tcp).await.unwrap();
    assert_eq!(stream.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let (mut send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    for _ in 0..2 {
        let mut req = chat();
        *req.uri_mut() = format!(
            "https://localhost:{}/v1/chat/completions",
            proxy.addr.port()
        )
        .parse()
        .unwrap();
        req.headers_mut().remove("host");
        let res = send.send_request(req).await.unwrap();
        assert_eq!(res.status(), 200);
        assert_eq!(res.version(), http::Version::HTTP_2);
    }

    // Plain HTTP on the TLS port: no HTTP answer.
    let mut tcp = TcpStream::connect(proxy.addr).await.unwrap();
    tcp.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let mut buf = Vec::new();
    // The handshake fails and the server closes the connection (a bound, not a timing: a
    // server that hangs on it fails here).
    let closed = tokio::time::timeout(
        std::time::Duration::from_secs(20),
        tcp.read_to_end(&mut buf),
    )
    .await;
    assert!(
        closed.is_ok(),
        "the server kept a plain-text connection open on its TLS port"
    );
    assert!(
        !buf.starts_with(b"HTTP/"),
        "{:?}",
        String::from_utf8_lossy(&buf)
    );
}

/// An https upstream behind a private CA: trusted through `ca_file` (h2 by ALPN), refused
/// without it with a 502 whose message names TLS.
#[tokio::test]
async fn a_private_ca_upstream_is_reached_with_its_ca_file_and_refused_without() {
    let mock = mock_tls(fairgate_mock::MockConfig::default()).await;
    assert!(mock.base_url().starts_with("https://127.0.0.1:"));
    let trusted = Conf::new(&mock.base_url())
        .upstream("ca_file", fixture("localhost.crt"))
        .start()
        .await;
    let r = send(post(
        trusted.addr,
        "/v1/chat/completions",
        Some(KEY_A),
        &crate::support::chat("gpt-4o"),
        &[],
    ))
    .await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    // The bundled roots alone do not know the private CA.
    let untrusted = Conf::new(&mock.base_url()).start().await;
    let r = send(post(
        untrusted.addr,
        "/v1/chat/completions",
        Some(KEY_A),
        &crate::support::chat("gpt-4o"),
        &[],
    ))
    .await;
    r.assert_error(502, "upstream_tls_error");
    let message = r.json()["error"]["message"].as_str().unwrap().to_owned();
    assert!(message.contains("TLS"), "{message}");
    // A ca_file that does not exist stops the server from starting, naming the key.
    let bad = Conf::new(&mock.base_url())
        .upstream("ca_file", "/nonexistent/ca.pem")
        .config();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let e = fairgate::server::start(bad, listener)
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("upstreams[0].ca_file"), "{e}");
}
