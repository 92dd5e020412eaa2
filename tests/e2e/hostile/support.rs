//! Helpers of the hostile suite: metrics scraping and the figure lines.
#![allow(dead_code)]

use std::net::SocketAddr;

use crate::support::send;

pub use crate::support::scrape;

/// The value of the series `name` whose labels include every `k="v"` of `labels` (0 if absent).
pub fn value(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    crate::support::value(text, name, labels).unwrap_or(0.0)
}

/// Prints one figure of the isolation table.
pub fn figure(attack: &str, figure: &str, value: f64, detail: &str) {
    println!("ISOLATION | {attack} | {figure} = {value:.2} | {detail}");
}

/// A victim's sequential requests: how many were answered 200, how many upstream requests the
/// mock received while each one waited (its own included: the upstream attempts it queued
/// behind, plus one), and the run's duration (for the printed figure only).
pub struct VictimRun {
    pub ok: usize,
    pub behind_max: u64,
    pub secs: f64,
}

/// Sends `n` chats as tenant `key` one after the other; `headers` are added to each.
pub async fn victim_run(
    addr: SocketAddr,
    stats: &fairgate_mock::MockStats,
    key: &str,
    n: usize,
    headers: &[(&str, &str)],
) -> VictimRun {
    let start = std::time::Instant::now();
    let (mut ok, mut behind_max) = (0, 0);
    for _ in 0..n {
        let before = stats.requests();
        let r = send(crate::support::post(
            addr,
            "/v1/chat/completions",
            Some(key),
            &crate::support::chat("gpt-4o-mini"),
            headers,
        ))
        .await;
        ok += usize::from(r.status == 200);
        behind_max = behind_max.max(stats.requests().saturating_sub(before));
    }
    VictimRun {
        ok,
        behind_max,
        secs: start.elapsed().as_secs_f64(),
    }
}

/// Throughput under attack ÷ alone, from two runs of the same number of requests.
pub fn throughput_ratio(alone: &VictimRun, attacked: &VictimRun) -> f64 {
    alone.secs / attacked.secs.max(1e-9)
}
