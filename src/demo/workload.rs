//! The demo's fixed request schedule and its runner over HTTP.
//!
//! Invariant: a bounded, deterministic list of (time, tenant) sends; every request has a
//! safety timeout, so a run always ends.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::time::Instant;

/// One request as the client saw it.
#[derive(Clone, Debug)]
pub struct Sample {
    /// Tenant id.
    pub tenant: String,
    /// When it was sent, since the run started.
    pub sent: Duration,
    /// fairgate's `x-fairgate-queue-ms`.
    pub queue_wait: Duration,
    /// 200 received and body read.
    pub ok: bool,
}

/// (send offset, tenant id) pairs, in time order.
#[derive(Clone, Debug)]
pub struct Schedule {
    sends: Vec<(Duration, String)>,
}

impl Schedule {
    /// A floods 160 requests over 4 s (2.5× the pool's rate); ten small tenants send two each,
    /// spread over the 9 s the flood takes to drain. `scale` stretches or shrinks time.
    pub fn noisy_neighbor(scale: f64) -> Self {
        let mut sends: Vec<(Duration, String)> = (0..160)
            .map(|i| {
                (
                    Duration::from_millis(25 * i).mul_f64(scale),
                    "A".to_string(),
                )
            })
            .collect();
        for k in 0..20u64 {
            let at = Duration::from_millis(500 + 430 * k).mul_f64(scale);
            sends.push((at, format!("s{}", k % 10 + 1)));
        }
        sends.sort();
        Self { sends }
    }

    /// Requests the flood tenant sends.
    pub fn flood_count(&self) -> usize {
        self.sends.iter().filter(|(_, t)| t == "A").count()
    }

    /// Requests the small tenants send.
    pub fn small_count(&self) -> usize {
        self.sends.len() - self.flood_count()
    }

    /// Time over which the flood is sent.
    pub fn flood_span(&self) -> Duration {
        self.sends
            .iter()
            .filter(|(_, t)| t == "A")
            .map(|(at, _)| *at)
            .max()
            .unwrap_or_default()
    }

    /// Sends the schedule to fairgate at `addr` and collects what each request saw.
    pub async fn run(&self, addr: SocketAddr) -> Vec<Sample> {
        let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
        let start = Instant::now();
        let mut tasks = Vec::with_capacity(self.sends.len());
        for (at, tenant) in self.sends.clone() {
            let client = client.clone();
            tasks.push(tokio::spawn(async move {
                tokio::time::sleep_until(start + at).await;
                let body = r#"{"model":"gpt-4o-mini","max_tokens":400,"messages":[{"role":"user","content":"Summarise the incident report."}]}"#;
                let req = Request::post(format!("http://{addr}/v1/chat/completions"))
                    .header("content-type", "application/json")
                    .header("authorization", format!("Bearer demo-{tenant}"))
                    .header("x-mock-output-tokens", "16")
                    .body(Full::new(Bytes::from_static(body.as_bytes())))
                    .expect("static request");
                let sent = start.elapsed();
                let attempt = async {
                    let res = client.request(req).await.ok()?;
                    let wait = res
                        .headers()
                        .get("x-fairgate-queue-ms")
                        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
                        .unwrap_or(0);
                    let ok = res.status().is_success();
                    res.into_body().collect().await.ok()?;
                    Some((wait, ok))
                };
                let got = tokio::time::timeout(Duration::from_secs(120), attempt).await;
                let (wait, ok) = got.ok().flatten().unwrap_or((0, false));
                Sample {
                    tenant,
                    sent,
                    queue_wait: Duration::from_millis(wait),
                    ok,
                }
            }));
        }
        let mut out = Vec::with_capacity(tasks.len());
        for t in tasks {
            if let Ok(s) = t.await {
                out.push(s);
            }
        }
        out
    }
}
