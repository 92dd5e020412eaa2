//! The exporter's HTTP transport: `opentelemetry_http::HttpClient` over the hyper-util legacy
//! client and hyper-rustls (ring, webpki roots) fairgate already uses for its providers, so the
//! OTLP exporter brings no second HTTP or TLS stack (no reqwest).
//!
//! Invariants: one call is bounded by `timeout` (connect, request and response body) and reads
//! at most `MAX_RESPONSE` bytes of the collector's answer; a call polled outside a tokio
//! runtime runs on the runtime captured when the client was made (spawned there, the
//! `JoinHandle` awaited), never on a runtime of its own.

use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full, Limited};
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use opentelemetry_http::{HttpClient, HttpError};
use tokio::runtime::Handle;

/// The collector's answer is read up to this many bytes (an OTLP partial-success message).
pub const MAX_RESPONSE: usize = 64 * 1024;

type Hyper = hyper_util::client::legacy::Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

/// See the module docs.
#[derive(Debug, Clone)]
pub struct Client {
    hyper: Hyper,
    timeout: Duration,
    runtime: Option<Handle>,
}

impl Client {
    /// A client whose calls time out after `timeout`; captures the current tokio runtime, if
    /// any, for calls polled outside one.
    pub fn new(timeout: Duration) -> Self {
        let hyper = hyper_util::client::legacy::Client::builder(TokioExecutor::new()).build(
            HttpsConnectorBuilder::new()
                .with_webpki_roots()
                .https_or_http()
                .enable_http1()
                .build(),
        );
        Self {
            hyper,
            timeout,
            runtime: Handle::try_current().ok(),
        }
    }

    async fn call(
        hyper: Hyper,
        timeout: Duration,
        req: Request<Bytes>,
    ) -> Result<Response<Bytes>, HttpError> {
        let (parts, body) = req.into_parts();
        let req = Request::from_parts(parts, Full::new(body));
        let call = async {
            let res = hyper.request(req).await?;
            let (parts, body) = res.into_parts();
            let body = Limited::new(body, MAX_RESPONSE).collect().await?.to_bytes();
            Ok::<_, HttpError>(Response::from_parts(parts, body))
        };
        match tokio::time::timeout(timeout, call).await {
            Ok(r) => r,
            Err(_) => Err(format!("no answer within {timeout:?}").into()),
        }
    }
}

#[async_trait]
impl HttpClient for Client {
    async fn send_bytes(&self, req: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let call = Self::call(self.hyper.clone(), self.timeout, req);
        if Handle::try_current().is_ok() {
            return call.await;
        }
        match &self.runtime {
            Some(rt) => rt.spawn(call).await?,
            None => Err("otel: no tokio runtime to send the export on".into()),
        }
    }
}
