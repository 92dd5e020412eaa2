//! Helpers of the hostile suite: metrics scraping and the figure lines.
#![allow(dead_code)]

use std::net::SocketAddr;

use bytes::Bytes;
use http::Request;
use http_body_util::Full;

use crate::common::send;

/// The `/metrics` text.
pub async fn scrape(addr: SocketAddr) -> String {
    let req = Request::get(format!("http://{addr}/metrics"))
        .body(Full::<Bytes>::default())
        .unwrap();
    let r = send(req).await;
    assert_eq!(r.status, 200);
    String::from_utf8(r.body.to_vec()).unwrap()
}

/// The value of the series `name` whose labels include every `k="v"` of `labels` (0 if absent).
pub fn value(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with('{'))
        .find(|l| {
            labels
                .iter()
                .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

/// Prints one figure of the isolation table.
pub fn figure(attack: &str, figure: &str, value: f64, detail: &str) {
    println!("ISOLATION | {attack} | {figure} = {value:.2} | {detail}");
}
