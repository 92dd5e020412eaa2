//! Serving one client connection of the main listener within its limits.
//!
//! [`serve`] runs hyper's auto (HTTP/1.1 + h2) connection with a [`Tracked`] service, which
//! marks the connection busy from each request's arrival until its response body is dropped.
//! The connection is closed gracefully (h1: after the response in flight, at once when idle;
//! h2: GOAWAY, open streams finish) when it has been idle for `[server] keepalive_timeout_ms`,
//! when the registry sheds it, or when the server stops.
//!
//! Each response body is put under the write watchdog (`super::stall`, `[server]
//! client_write_timeout_ms`): when its client stalls, the body is dropped (every slot released)
//! and the connection is closed at once — the response in flight cannot be finished anyway.
//!
//! An HTTP/1 request's head is copied out of hyper's read buffer before the request goes on
//! ([`compact_head`]): hyper hands out the header values and the URI as slices of that 8 KiB
//! buffer, so a request waiting in the queue would keep it alive, and hyper would allocate a
//! second one for its next read on the connection (issue 25: 8 KiB of a queued request's ~30).
//!
//! A plain connection is served as HTTP/1 from its first byte when its first bytes, peeked (not
//! read), are not HTTP/2's preface ([`opening`]); otherwise hyper-util's auto connection reads
//! them to decide. Its read of those bytes leaves them in a small buffer that hyper's HTTP/1
//! connection then copies into its own, growing that to 16 KiB for the life of the connection.
//!
//! Invariants: graceful shutdown is started at most once; the idle timer is re-armed only when
//! it fires (a request costs two atomic updates, not a timer update); a 408 on HTTP/1 carries
//! `Connection: close` (the rest of that body is never read); a compacted head has the same
//! headers (names, values, order, sensitivity) and URI as hyper's.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{header, HeaderValue, Request, Response, StatusCode, Version};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{watch, Notify};
use tokio::time::Instant;

use super::connections::{Busy, Entry};
use super::live::LiveService;
use crate::response::ResponseBody;

/// Serves `io` until the connection ends: see the module docs.
pub async fn serve<I>(
    builder: &auto::Builder<TokioExecutor>,
    io: I,
    service: LiveService,
    entry: Arc<Entry>,
    keepalive: Duration,
    mut stop: watch::Receiver<bool>,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>>
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let abort = Arc::new(Notify::new());
    let tracked = Tracked {
        inner: service,
        entry: entry.clone(),
        abort: abort.clone(),
    };
    let conn = builder.serve_connection(TokioIo::new(io), tracked);
    tokio::pin!(conn);
    let mut closing = false;
    loop {
        let deadline = entry
            .idle_deadline(keepalive)
            .unwrap_or_else(|| Instant::now() + keepalive);
        tokio::select! {
            result = conn.as_mut() => return result,
            // A response's client stalled (its body is already dropped): close at once.
            _ = abort.notified() => return Err("a response's client stalled".into()),
            _ = stop.wait_for(|s| *s), if !closing => {}
            _ = entry.shed_requested(), if !closing => {}
            _ = tokio::time::sleep_until(deadline), if !closing => {
                if entry.idle_deadline(keepalive).is_none_or(|d| d > Instant::now()) {
                    continue;
                }
            }
        }
        closing = true;
        conn.as_mut().graceful_shutdown();
    }
}

/// The per-connection service: the listener's service, with the connection marked busy while a
/// request (and its response body) is in flight.
struct Tracked {
    inner: LiveService,
    entry: Arc<Entry>,
    /// Pinged by a response's write watchdog when its client stalls.
    abort: Arc<Notify>,
}

impl hyper::service::Service<Request<Incoming>> for Tracked {
    type Response = Response<TrackedBody>;
    type Error = Infallible;
    type Future =
        TrackedFuture<<LiveService as hyper::service::Service<Request<Incoming>>>::Future>;

    fn call(&self, mut req: Request<Incoming>) -> Self::Future {
        // Who sent it: the tenant stage trusts a sidecar header only from trusted sources.
        req.extensions_mut()
            .insert(crate::context::PeerAddr(self.entry.ip()));
        let busy = self.entry.begin();
        let h1 = req.version() < Version::HTTP_2;
        if h1 {
            compact_head(&mut req);
        }
        TrackedFuture {
            inner: self.inner.call(req),
            busy: Some(busy),
            h1,
            timeout: self.inner.client_write_timeout(),
            abort: self.abort.clone(),
        }
    }
}

/// HTTP/2's connection preface (RFC 9113 §3.4), which an h2c client with prior knowledge sends
/// first.
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Peeks a plain connection whose first bytes are still a prefix of the preface at most this
/// many times, [`PEEK_PAUSE`] apart, before leaving the decision to hyper-util.
const PEEKS: usize = 20;
const PEEK_PAUSE: Duration = Duration::from_millis(1);

/// What a plain connection's first bytes say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Opening {
    /// They are not HTTP/2's preface: HTTP/1.
    Http1,
    /// The preface, too few bytes to tell, EOF or an error: hyper-util's auto connection
    /// decides.
    Unknown,
    /// No byte within `wait` (the keep-alive time, which hyper's header-read timer would also
    /// have given it), the server stopping, or the registry shedding it: closed unserved, as
    /// hyper closes an idle connection in those cases.
    Close,
}

/// Peeks (does not read) the first bytes of `stream`: see [`Opening`].
pub async fn opening(
    stream: &tokio::net::TcpStream,
    wait: Duration,
    entry: &Entry,
    stop: &mut watch::Receiver<bool>,
) -> Opening {
    let peek = async {
        let mut buf = [0u8; PREFACE.len()];
        for _ in 0..PEEKS {
            match stream.peek(&mut buf).await {
                Ok(n) if n > 0 && buf[..n] != PREFACE[..n] => return Opening::Http1,
                Ok(n) if n > 0 && n < PREFACE.len() => tokio::time::sleep(PEEK_PAUSE).await,
                _ => return Opening::Unknown,
            }
        }
        Opening::Unknown
    };
    tokio::select! {
        o = peek => o,
        _ = tokio::time::sleep(wait) => Opening::Close,
        _ = stop.wait_for(|s| *s) => Opening::Close,
        _ = entry.shed_requested() => Opening::Close,
    }
}

/// Copies the header values and the URI of `req` into one buffer of their size, so that none
/// of them shares hyper's read buffer any more (see the module docs).
pub fn compact_head<B>(req: &mut Request<B>) {
    let uri_len = if req.uri().scheme().is_none() && req.uri().authority().is_none() {
        req.uri().path_and_query().map_or(0, |p| p.as_str().len())
    } else {
        0
    };
    let values: usize = req.headers().values().map(|v| v.len()).sum();
    let mut buf = bytes::BytesMut::with_capacity(values + uri_len);
    for v in req.headers().values() {
        buf.extend_from_slice(v.as_bytes());
    }
    if uri_len > 0 {
        if let Some(p) = req.uri().path_and_query() {
            buf.extend_from_slice(p.as_str().as_bytes());
        }
    }
    let buf = buf.freeze();
    let mut at = 0;
    for v in req.headers_mut().values_mut() {
        let len = v.len();
        // The bytes were a valid value a moment ago: this cannot fail.
        if let Ok(mut copy) = HeaderValue::from_maybe_shared(buf.slice(at..at + len)) {
            copy.set_sensitive(v.is_sensitive());
            *v = copy;
        }
        at += len;
    }
    if uri_len > 0 {
        if let Ok(p) = http::uri::PathAndQuery::from_maybe_shared(buf.slice(at..at + uri_len)) {
            let mut parts = http::uri::Parts::default();
            parts.path_and_query = Some(p);
            if let Ok(uri) = http::Uri::from_parts(parts) {
                *req.uri_mut() = uri;
            }
        }
    }
}

pin_project_lite::pin_project! {
    /// The response future of [`Tracked`].
    pub struct TrackedFuture<F> {
        #[pin]
        inner: F,
        busy: Option<Busy>,
        h1: bool,
        timeout: Duration,
        abort: Arc<Notify>,
    }
}

impl<F> Future for TrackedFuture<F>
where
    F: Future<Output = Result<Response<ResponseBody>, Infallible>>,
{
    type Output = Result<Response<TrackedBody>, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let Ok(mut res) = std::task::ready!(this.inner.poll(cx));
        if *this.h1 && res.status() == StatusCode::REQUEST_TIMEOUT {
            res.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        let busy = this.busy.take();
        let ctx = res.extensions().get::<crate::context::Ctx>().cloned();
        let (timeout, abort) = (*this.timeout, this.abort.clone());
        Poll::Ready(Ok(res.map(|body| TrackedBody {
            inner: super::stall::watch(body, ctx, timeout, abort),
            _busy: busy,
        })))
    }
}

pin_project_lite::pin_project! {
    /// A response body under the write watchdog that keeps its connection busy until it is
    /// dropped.
    pub struct TrackedBody {
        #[pin]
        inner: super::stall::Watched,
        _busy: Option<Busy>,
    }
}

impl Body for TrackedBody {
    type Data = <ResponseBody as Body>::Data;
    type Error = <ResponseBody as Body>::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        self.project().inner.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_plain_connection_is_http1_unless_it_opens_with_the_preface() {
        use tokio::io::AsyncWriteExt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let registry = super::super::connections::Registry::new(
            16,
            None,
            super::super::connections::Handles::noop(),
        );
        for (first, then, want) in [
            (
                &b"POST /v1/chat/completions HTTP/1.1\r\n"[..],
                &b""[..],
                Opening::Http1,
            ),
            (b"P", b"OST / HTTP/1.1\r\n", Opening::Http1),
            (&PREFACE[..], b"", Opening::Unknown),
            (b"PRI * HT", b"TP/2.0\r\n\r\nSM\r\n\r\n", Opening::Unknown),
            (b"", b"", Opening::Unknown),
        ] {
            let mut client = tokio::net::TcpStream::connect(addr).await.unwrap();
            let (server, peer) = listener.accept().await.unwrap();
            client.write_all(first).await.unwrap();
            if first.is_empty() {
                client.shutdown().await.unwrap();
            }
            let writer = tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(3)).await;
                let _ = client.write_all(then).await;
                client
            });
            let guard = registry.admit(peer.ip()).unwrap();
            let (_tx, mut stop) = watch::channel(false);
            let got = opening(&server, Duration::from_secs(5), &guard.entry, &mut stop).await;
            assert_eq!(got, want, "{first:?} then {then:?}");
            // Peeked, not read: every byte is still there for hyper.
            let _client = writer.await.unwrap();
            let mut buf = [0u8; 64];
            let n = server.peek(&mut buf).await.unwrap();
            assert!(n >= first.len().min(1));
            assert_eq!(&buf[..first.len().min(n)], &first[..first.len().min(n)]);
        }
        // A connection that sends nothing: closed after `wait`, when stopping, or when shed.
        let (stop_tx, mut stop) = watch::channel(false);
        for case in ["wait", "shed", "stop"] {
            let _client = tokio::net::TcpStream::connect(addr).await.unwrap();
            let (server, peer) = listener.accept().await.unwrap();
            let guard = registry.admit(peer.ip()).unwrap();
            let wait = if case == "wait" {
                Duration::from_millis(20)
            } else {
                Duration::from_secs(30)
            };
            let entry = guard.entry.clone();
            let poke = tokio::spawn({
                let stop_tx = stop_tx.clone();
                let registry = registry.clone();
                async move {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    match case {
                        "stop" => {
                            let _ = stop_tx.send(true);
                        }
                        "shed" => {
                            registry.shed_idle(16);
                        }
                        _ => {}
                    }
                }
            });
            let got = opening(&server, wait, &entry, &mut stop).await;
            assert_eq!(got, Opening::Close, "{case}");
            poke.await.unwrap();
            drop(guard);
        }
    }

    /// A head whose values and URI are slices of one "read buffer", as hyper parses it.
    fn head(read_buf: &bytes::Bytes) -> Request<()> {
        let text = std::str::from_utf8(read_buf).unwrap();
        let slice = |s: &str| {
            let at = text.find(s).unwrap();
            read_buf.slice(at..at + s.len())
        };
        let mut req = Request::builder()
            .uri(http::Uri::from_maybe_shared(slice("/v1/chat/completions?x=1")).unwrap())
            .body(())
            .unwrap();
        for (name, value) in [
            ("authorization", "Bearer fg-acme-1"),
            ("content-type", "application/json"),
            ("x-custom", "two"),
            ("x-custom", "three"),
        ] {
            let mut v = HeaderValue::from_maybe_shared(slice(value)).unwrap();
            v.set_sensitive(name == "authorization");
            req.headers_mut().append(name, v);
        }
        req
    }

    #[test]
    fn a_compacted_head_is_the_same_head_and_lets_the_read_buffer_go() {
        let read_buf = bytes::Bytes::from(
            "POST /v1/chat/completions?x=1 HTTP/1.1\r\nauthorization: Bearer fg-acme-1\r\n\
             content-type: application/json\r\nx-custom: two\r\nx-custom: three\r\n\r\n"
                .to_owned(),
        );
        let mut req = head(&read_buf);
        let before = (req.uri().clone(), req.headers().clone());
        assert!(!read_buf.is_unique());
        compact_head(&mut req);
        assert_eq!(req.uri(), &before.0);
        assert_eq!(req.headers(), &before.1);
        let order: Vec<_> = req.headers().get_all("x-custom").iter().collect();
        assert_eq!(order, ["two", "three"]);
        assert!(req.headers()["authorization"].is_sensitive());
        assert!(!req.headers()["content-type"].is_sensitive());
        drop(before);
        // Nothing of the request refers to the read buffer any more.
        assert!(read_buf.is_unique());
    }
}
