//! The live console end to end. Over plain HTTP: `/admin/ui` exists only with the admin API on
//! and is the one admin path served without the token (it holds no data), self-contained
//! (Content-Security-Policy: nothing from elsewhere); `/admin/state` needs the token. In a real
//! browser (headless chromium driven over WebDriver, `console/webdriver.rs`), under a
//! noisy-neighbour load: `/admin/ui#token=…` lists every tenant without a prompt and drops the
//! fragment from the address bar, the flood tenant's served share is shown near its entitlement,
//! values change between two reads, a wrong token shows an error and the form, the form with the
//! right token opens the view, a reload keeps it (sessionStorage). Each tenant's spend against its
//! budgets is in `/admin/state` and shown per row (spent / amount this period).
//!
//! Without chromium and chromedriver the browser test fails naming the packages, unless
//! `FAIRGATE_SKIP_BROWSER=1`. With `FAIRGATE_CONSOLE_SCREENSHOT=PATH` it also writes a
//! screenshot there. Loops are bounded in count and time; no assertion is on wall time.

mod webdriver;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::support::*;
use bytes::Bytes;
use fairgate_mock::MockConfig;
use http::Request;
use http_body_util::Full;
use serde_json::json;

const SMALL: [&str; 4] = ["small-1", "small-2", "small-3", "small-4"];

/// The admin API on (token in `var`), pool `mock` of two, tenant `flood` and the [`SMALL`] ones.
fn config(base_url: &str, var: &str) -> Conf {
    let conf = Conf::bare()
        .set("admin.token_env", var)
        .set("scheduler.quantum", 64)
        .add_upstream("mock", base_url)
        .upstream("max_concurrency", 2)
        .add_tenant("flood", "key-flood");
    SMALL
        .iter()
        .fold(conf, |c, t| c.add_tenant(t, &format!("key-{t}")))
}

fn body() -> String {
    r#"{"model":"gpt-4o-mini","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}"#
        .to_owned()
}

async fn get(addr: SocketAddr, path: &str, token: Option<&str>) -> Collected {
    let mut b = Request::get(format!("http://{addr}{path}"));
    if let Some(t) = token {
        b = b.header("authorization", format!("Bearer {t}"));
    }
    send(b.body(Full::<Bytes>::default()).unwrap()).await
}

/// The noisy neighbour: `flood` keeps 24 requests outstanding, each small tenant 8 (so that
/// every tenant stays backlogged behind the pool's 2 slots; FIFO would serve the flood 24/56 of
/// the pool, DRR 1/5), all in
/// closed loops of at most 3,000 requests each, until `stop`.
fn load(addr: SocketAddr, stop: Arc<AtomicBool>) -> Vec<tokio::task::JoinHandle<()>> {
    let mut loops = Vec::new();
    let mut spawn = |key: String| {
        let stop = stop.clone();
        loops.push(tokio::spawn(async move {
            for _ in 0..3_000 {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                send(post(addr, "/v1/chat/completions", Some(&key), &body(), &[])).await;
            }
        }));
    };
    for _ in 0..24 {
        spawn("key-flood".to_owned());
    }
    for t in SMALL {
        for _ in 0..8 {
            spawn(format!("key-{t}"));
        }
    }
    loops
}

async fn start() -> (
    fairgate_mock::MockServer,
    fairgate::server::ServerHandle,
    String,
) {
    let mock = mock_with(MockConfig {
        base_latency: Duration::from_millis(40),
        ..MockConfig::default()
    })
    .await;
    let var = unique_env("CONSOLE");
    let token = format!("console-{}", rand::random::<u64>());
    let proxy = config(&mock.base_url(), &var)
        .start_with_env(&[(&var, &token)])
        .await;
    (mock, proxy, token)
}

#[tokio::test]
async fn the_page_is_served_without_the_token_and_the_state_only_with_it() {
    let (_mock, proxy, token) = start().await;
    let addr = proxy.addr;
    let page = get(addr, "/admin/ui", None).await;
    assert_eq!(page.status, 200);
    assert!(page.headers["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/html"));
    let csp = page.headers["content-security-policy"].to_str().unwrap();
    assert!(csp.contains("default-src 'none'") && csp.contains("connect-src 'self'"));
    assert!(String::from_utf8_lossy(&page.body).contains("/admin/state"));

    get(addr, "/admin/state", None)
        .await
        .assert_error(401, "invalid_admin_token");
    get(addr, "/admin/state", Some("wrong"))
        .await
        .assert_error(401, "invalid_admin_token");
    get(addr, "/admin/state", Some("key-flood"))
        .await
        .assert_error(401, "invalid_admin_token");
    let post = Request::post(format!("http://{addr}/admin/state"))
        .header("authorization", format!("Bearer {token}"))
        .body(Full::<Bytes>::default())
        .unwrap();
    send(post).await.assert_error(405, "method_not_allowed");
    let post = Request::post(format!("http://{addr}/admin/ui"))
        .body(Full::<Bytes>::default())
        .unwrap();
    send(post).await.assert_error(405, "method_not_allowed");

    // Under load the state shows the flood queued, every tenant listed.
    let stop = Arc::new(AtomicBool::new(false));
    let loops = load(addr, stop.clone());
    let mut seen = false;
    for _ in 0..100 {
        let v = get(addr, "/admin/state?timeline=1", Some(&token))
            .await
            .json();
        let rows = v["tenants"].as_array().unwrap();
        let flood = rows.iter().find(|r| r["tenant"] == "flood");
        if rows.len() == 5 && flood.is_some_and(|f| f["queued"].as_u64() > Some(0)) {
            assert_eq!(v["pools"][0]["configured"], 2);
            assert_eq!(v["pools"][0]["degraded"], serde_json::Value::Null);
            assert!(v["pools"][0]["timeline"].is_array());
            seen = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for l in loops {
        l.await.unwrap();
    }
    assert!(seen, "the flood's queue never showed in /admin/state");
}

/// The timeline fills while nobody reads: opened after a while, the console shows the last
/// minutes, not one sample taken by the first read. Two sample periods pass unread; the first
/// read then sees more than the one sample it would take itself.
#[tokio::test]
async fn the_timeline_is_sampled_while_nobody_reads() {
    let (_mock, proxy, token) = start().await;
    tokio::time::sleep(Duration::from_secs(2 * fairgate::metrics::SAMPLE_SECS + 1)).await;
    let v = get(proxy.addr, "/admin/state?timeline=1", Some(&token))
        .await
        .json();
    let samples = v["pools"][0]["timeline"].as_array().unwrap().len();
    assert!(samples >= 2, "{samples} sample(s): sampled only when read");
}

#[tokio::test]
async fn the_page_is_served_only_while_the_admin_api_is_on() {
    let mock = mock().await;
    let proxy = Conf::new(&mock.base_url()).start().await;
    get(proxy.addr, "/admin/ui", None)
        .await
        .assert_error(404, "not_found");
    get(proxy.addr, "/admin/state", None)
        .await
        .assert_error(404, "not_found");
}

/// The page's read counter and table text.
async fn reads(d: &webdriver::Driver) -> serde_json::Value {
    d.eval(
        "return document.getElementById('status').dataset.reads + '|' + \
         document.getElementById('rows').innerText",
        json!([]),
    )
    .await
}

/// The rows the page shows: `[tenant, served share, entitled share, the row's text]`.
const ROWS: &str = "return [...document.querySelectorAll('#rows tr')].map(r => \
    [r.dataset.tenant, Number(r.dataset.served), Number(r.dataset.entitled), r.innerText]);";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_shows_the_live_shares_in_a_real_browser() {
    let Some(driver) = webdriver::Driver::start().await else {
        return;
    };
    let (_mock, proxy, token) = start().await;
    let addr = proxy.addr;
    let stop = Arc::new(AtomicBool::new(false));
    let loops = load(addr, stop.clone());
    // Let the rolling window fill with a few seconds of contention (bounded wait on a count).
    assert!(
        eventually(|| proxy.pools[0].load().0 >= 40).await,
        "the load never queued"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;

    // 1. The fragment carries the token: the view, no prompt, and the fragment is gone.
    let ui = format!("http://{addr}/admin/ui");
    driver.goto(&format!("{ui}#token={token}")).await;
    assert!(
        driver
            .wait_for(
                "return document.querySelectorAll('#rows tr').length === 5",
                100
            )
            .await,
        "the page did not list the 5 tenants: {}",
        driver
            .eval("return document.body.innerText", json!([]))
            .await
    );
    assert_eq!(driver.eval("return location.hash", json!([])).await, "");
    assert_eq!(
        driver
            .eval(
                "return getComputedStyle(document.getElementById('login')).display",
                json!([])
            )
            .await,
        "none",
        "no prompt"
    );
    let rows = driver.eval(ROWS, json!([])).await;
    let names: Vec<&str> = rows
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r[0].as_str().unwrap())
        .collect();
    for t in ["flood"].iter().chain(SMALL.iter()) {
        assert!(names.contains(t), "{t} not listed: {names:?}");
    }
    // 2. The flood's served share is shown near its entitlement (1/5: everyone backlogged).
    let flood = rows
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r[0] == "flood")
        .unwrap()
        .clone();
    let (served, entitled) = (flood[1].as_f64().unwrap(), flood[2].as_f64().unwrap());
    assert!(
        (entitled - 0.2).abs() < 0.05,
        "flood entitled to {entitled}, expected 0.2"
    );
    assert!(
        (served - entitled).abs() <= 0.08,
        "flood served {served} vs entitled {entitled}"
    );
    let text = flood[3].as_str().unwrap();
    assert!(
        text.contains(&format!("{:.1}% entitled", 100.0 * entitled)),
        "{text}"
    );
    assert!(
        text.contains(&format!("{:.1}% served", 100.0 * served)),
        "{text}"
    );
    if let Some(path) = std::env::var_os("FAIRGATE_CONSOLE_SCREENSHOT") {
        std::fs::write(path, driver.screenshot().await).unwrap();
    }

    // 3. Values change between two reads.
    let first = reads(&driver).await;
    let mut changed = false;
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = reads(&driver).await;
        let table =
            |v: &serde_json::Value| v.as_str().unwrap().split_once('|').unwrap().1.to_owned();
        if now != first && table(&now) != table(&first) {
            changed = true;
            break;
        }
    }
    assert!(changed, "the table did not change between reads");

    // 4. A wrong token shows an error and the form.
    driver.goto(&format!("{ui}#token=not-the-token")).await;
    assert!(
        driver
            .wait_for(
                "return document.getElementById('error').innerText.includes('wrong admin token') \
                 && getComputedStyle(document.getElementById('login')).display !== 'none'",
                100
            )
            .await,
        "no error for a wrong token: {}",
        driver
            .eval("return document.body.innerText", json!([]))
            .await
    );
    // 5. The form with the right token opens the view.
    driver.type_into("#token", &token).await;
    driver.click("#open").await;
    assert!(
        driver
            .wait_for(
                "return document.querySelectorAll('#rows tr').length === 5 \
                 && document.getElementById('error').innerText === ''",
                100
            )
            .await,
        "the form did not open the view"
    );
    // 6. A reload keeps the token (sessionStorage): no prompt.
    driver.goto(&ui).await;
    assert!(
        driver
            .wait_for(
                "return document.querySelectorAll('#rows tr').length === 5",
                100
            )
            .await,
        "the reload asked again"
    );

    stop.store(true, Ordering::Relaxed);
    driver.quit().await;
    for l in loops {
        l.await.unwrap();
    }
}

/// The admin API on, tenant `a` with a day budget of 1,000 tokens and a month budget of $1
/// (gpt-4o-mini priced), tenant `b` with none; `a` has spent three requests. Returns the proxy,
/// its token, and the tokens and dollars the mock reported for `a`.
async fn budgeted() -> (
    fairgate_mock::MockServer,
    fairgate::server::ServerHandle,
    String,
    u64,
    f64,
) {
    let mock = mock().await;
    let var = unique_env("CONSOLE");
    let token = format!("console-{}", rand::random::<u64>());
    let mut day = toml::Table::new();
    day.insert("period".into(), "day".into());
    day.insert("tokens".into(), 1000.into());
    let mut month = toml::Table::new();
    month.insert("period".into(), "month".into());
    month.insert("usd".into(), 1.0.into());
    let proxy = Conf::new(&mock.base_url())
        .set("admin.token_env", &var)
        .set("prices.gpt-4o-mini.input", 0.15)
        .set("prices.gpt-4o-mini.output", 0.60)
        .tenant("a", "budgets", vec![day, month])
        .start_with_env(&[(&var, &token)])
        .await;
    let (mut tokens, mut usd) = (0, 0.0);
    for _ in 0..3 {
        let r = send(post(
            proxy.addr,
            "/v1/chat/completions",
            Some(KEY_A),
            &body(),
            &[],
        ))
        .await;
        assert_eq!(r.status, 200);
        let u = &r.json()["usage"];
        let (i, o) = (
            u["prompt_tokens"].as_u64().unwrap(),
            u["completion_tokens"].as_u64().unwrap(),
        );
        tokens += i + o;
        usd += (i as f64 * 0.15 + o as f64 * 0.60) / 1e6;
    }
    (mock, proxy, token, tokens, usd)
}

#[tokio::test]
async fn the_state_shows_each_tenants_spend_against_its_budgets() {
    let (_mock, proxy, token, tokens, usd) = budgeted().await;
    let v = get(proxy.addr, "/admin/state", Some(&token)).await.json();
    let row = |t: &str| {
        v["tenants"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["tenant"] == t)
            .unwrap_or_else(|| panic!("{t} not listed: {v}"))
            .clone()
    };
    let a = row("a");
    let b = &a["budgets"];
    assert_eq!(b.as_array().map(Vec::len), Some(2), "{a}");
    assert_eq!(
        (&b[0]["period"], &b[0]["unit"]),
        (&json!("day"), &json!("tokens"))
    );
    assert_eq!(b[0]["amount"], 1000);
    assert_eq!(b[0]["spent"], tokens);
    assert_eq!(b[0]["reserved"], 0, "nothing in flight");
    assert_eq!(b[0]["left"], 1000 - tokens);
    assert_eq!(
        (&b[1]["period"], &b[1]["unit"]),
        (&json!("month"), &json!("usd"))
    );
    assert_eq!(b[1]["amount"], 1.0);
    let spent = b[1]["spent"].as_f64().unwrap();
    assert!((spent - usd).abs() < 1e-12, "{spent} vs {usd}");
    assert_eq!(row("b")["budgets"], serde_json::Value::Null);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_shows_each_tenants_spend_against_its_budgets_in_a_real_browser() {
    let Some(driver) = webdriver::Driver::start().await else {
        return;
    };
    let (_mock, proxy, token, tokens, _usd) = budgeted().await;
    driver
        .goto(&format!("http://{}/admin/ui#token={token}", proxy.addr))
        .await;
    let day = "document.querySelector('#rows tr[data-tenant=a] .budget[data-period=day]')";
    assert!(
        driver
            .wait_for(&format!("return {day} !== null"), 100)
            .await,
        "no budget shown for a: {}",
        driver
            .eval("return document.body.innerText", json!([]))
            .await
    );
    let text = driver
        .eval(&format!("return {day}.innerText"), json!([]))
        .await;
    let share = 100.0 * tokens as f64 / 1000.0;
    assert_eq!(
        text,
        format!("day {tokens} / 1000 tokens ({share:.1}%)"),
        "the day budget's spend"
    );
    let month = driver
        .eval(
            "return document.querySelector('#rows tr[data-tenant=a] .budget[data-period=month]').innerText",
            json!([]),
        )
        .await;
    assert!(
        month.as_str().unwrap().starts_with("month $0.00 / $1.00"),
        "{month}"
    );
    let none = driver
        .eval(
            "return document.querySelectorAll('#rows tr[data-tenant=b] .budget').length",
            json!([]),
        )
        .await;
    assert_eq!(none, 0, "b has no budget");
    driver.quit().await;
}
