//! The demo's second scene: a sequential agent (one request outstanding) beside a flood of 24
//! closed loops, alone, under FIFO and under DRR, on the same mock pool. Prints the agent's
//! requests per second (÷ alone) and its p95 queue wait.
//!
//! Invariant: every loop stops at the phase's deadline and every request has a safety timeout,
//! so a phase always ends.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::time::Instant;

/// Closed loops the flood tenant runs.
pub const FLOOD_LOOPS: usize = 24;

/// What the agent got in one run.
#[derive(Clone, Copy, Debug, Default)]
pub struct AgentRun {
    /// Answers per second.
    pub per_s: f64,
    /// 95th percentile of its `x-fairgate-queue-ms`, seconds.
    pub wait_p95_s: f64,
}

/// One request; its queue wait if answered 200.
async fn request(
    client: &Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>,
    addr: SocketAddr,
    tenant: &str,
) -> Option<Duration> {
    let body = r#"{"model":"gpt-4o-mini","max_tokens":8,"messages":[{"role":"user","content":"Classify: is this ticket urgent?"}]}"#;
    let req = Request::post(format!("http://{addr}/v1/chat/completions"))
        .header("content-type", "application/json")
        .header("authorization", format!("Bearer demo-{tenant}"))
        .header("x-mock-output-tokens", "4")
        .body(Full::new(Bytes::from_static(body.as_bytes())))
        .ok()?;
    let attempt = async {
        let res = client.request(req).await.ok()?;
        let wait = res
            .headers()
            .get("x-fairgate-queue-ms")
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())?;
        let ok = res.status().is_success();
        res.into_body().collect().await.ok()?;
        ok.then(|| Duration::from_millis(wait))
    };
    tokio::time::timeout(Duration::from_secs(30), attempt)
        .await
        .ok()
        .flatten()
}

/// Runs the agent (tenant `agent`) for `span`, beside `flood` (tenant `flood`, 24 loops) if
/// given, against fairgate at `addr`.
pub async fn run(addr: SocketAddr, agent: &str, flood: Option<&str>, span: Duration) -> AgentRun {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let end = Instant::now() + span;
    let mut flooders = Vec::new();
    if let Some(flood) = flood {
        let flood: Arc<str> = flood.into();
        for _ in 0..FLOOD_LOOPS {
            let (client, flood) = (client.clone(), flood.clone());
            flooders.push(tokio::spawn(async move {
                while Instant::now() < end {
                    request(&client, addr, &flood).await;
                }
            }));
        }
        // Let the flood fill the queue first.
        tokio::time::sleep(span / 10).await;
    }
    let start = Instant::now();
    let mut waits = Vec::new();
    while Instant::now() < end {
        if let Some(w) = request(&client, addr, agent).await {
            waits.push(w.as_secs_f64());
        }
    }
    let took = start.elapsed().as_secs_f64().max(1e-3);
    for f in flooders {
        let _ = f.await;
    }
    waits.sort_by(f64::total_cmp);
    let p95 = waits
        .get(((waits.len().max(1) - 1) as f64 * 0.95).round() as usize)
        .copied()
        .unwrap_or(0.0);
    AgentRun {
        per_s: waits.len() as f64 / took,
        wait_p95_s: p95,
    }
}

/// The scene's table: alone, FIFO and DRR rows.
pub fn table(alone: AgentRun, fifo: AgentRun, drr: AgentRun) -> String {
    let mut out = format!(
        "sequential agent beside a flood of {FLOOD_LOOPS} closed loops (short requests):\n{:<22} {:>12} {:>9} {:>14}\n",
        "", "requests/s", "÷ alone", "queue wait p95"
    );
    for (label, r) in [
        ("agent alone", alone),
        ("beside the flood, FIFO", fifo),
        ("beside the flood, DRR", drr),
    ] {
        let ratio = if alone.per_s > 0.0 {
            r.per_s / alone.per_s
        } else {
            0.0
        };
        out += &format!(
            "{label:<22} {:>12.2} {:>8.2}× {:>11.0} ms\n",
            r.per_s,
            ratio,
            r.wait_p95_s * 1000.0
        );
    }
    out
}
