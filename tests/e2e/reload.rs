//! Hot reload end to end (`POST /admin/reload`, and the function SIGHUP calls): a new weight is
//! followed by the served shares, an invalid config is refused and the old one keeps serving, a
//! removed tenant's queued and in-flight requests still complete while its key is refused.
//! Assertions are on counts and shares, never on wall-clock durations.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::support::*;
use bytes::Bytes;
use fairgate::domain::TenantId;
use fairgate::server::{self, ReloadError, ServerHandle};
use fairgate_mock::MockConfig;
use http::Request;
use http_body_util::Full;
use tokio::net::TcpListener;

const TOKEN: &str = "reload-admin-token";

/// A config file of its own for one test, removed on drop.
struct ConfigFile(PathBuf);

impl ConfigFile {
    fn new(tag: &str) -> Self {
        let name = format!(
            "fairgate-reload-{tag}-{}-{}.toml",
            std::process::id(),
            rand::random::<u32>()
        );
        Self(std::env::temp_dir().join(name))
    }

    fn write(&self, toml: &str) {
        std::fs::write(&self.0, toml).unwrap();
    }
}

impl Drop for ConfigFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// One pool of `capacity` at `base_url`, the admin token in `token_var`, quantum 200; no
/// tenants yet.
fn config(base_url: &str, token_var: &str, capacity: usize) -> Conf {
    Conf::pool(base_url, capacity)
        .set("admin.token_env", token_var)
        .set("scheduler.quantum", 200)
}

/// The variable the admin token is read from (from the server's own env map, not the
/// process environment).
const TOKEN_VAR: &str = "FG_TEST_RELOAD_TOKEN";

fn token_var() -> String {
    TOKEN_VAR.to_owned()
}

async fn start(file: &ConfigFile) -> ServerHandle {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let env = server::Env::vars([(TOKEN_VAR, TOKEN)]);
    server::start_from_file_with_env(&file.0, listener, env)
        .await
        .expect("proxy starts")
}

async fn reload(addr: SocketAddr) -> Collected {
    send(post(addr, "/admin/reload", Some(TOKEN), "", &[])).await
}

async fn tenants(addr: SocketAddr) -> serde_json::Value {
    let req = Request::get(format!("http://{addr}/admin/tenants"))
        .header("authorization", format!("Bearer {TOKEN}"))
        .body(Full::<Bytes>::default())
        .unwrap();
    let r = send(req).await;
    assert_eq!(r.status, 200);
    r.json()
}

/// `field` of `tenant` in `/admin/tenants`.
async fn field(addr: SocketAddr, tenant: &str, field: &str) -> serde_json::Value {
    let v = tenants(addr).await;
    let t = v["tenants"].as_array().unwrap().iter();
    t.clone()
        .find(|t| t["tenant"] == tenant)
        .map(|t| t[field].clone())
        .unwrap_or(serde_json::Value::Null)
}

async fn served(addr: SocketAddr, tenant: &str) -> u64 {
    field(addr, tenant, "served_tokens").await.as_u64().unwrap()
}

/// Tokens served to (heavy, light) since `start`, once at least `total` (bounded wait).
async fn served_for(addr: SocketAddr, start: (u64, u64), total: u64) -> (u64, u64) {
    let mut shares = (0, 0);
    for _ in 0..800 {
        shares = (
            served(addr, "heavy").await - start.0,
            served(addr, "light").await - start.1,
        );
        if shares.0 + shares.1 >= total {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    shares
}

fn body() -> String {
    r#"{"model":"gpt-4o-mini","max_tokens":100,"messages":[{"role":"user","content":"hi"}]}"#
        .to_owned()
}

async fn chat(addr: SocketAddr, tenant: &str, headers: &[(&str, &str)]) -> Collected {
    let key = format!("key-{tenant}");
    send(post(
        addr,
        "/v1/chat/completions",
        Some(&key),
        &body(),
        headers,
    ))
    .await
}

#[tokio::test]
async fn a_reloaded_weight_is_followed_by_the_served_shares() {
    let mock = mock_with(MockConfig::default()).await;
    let (file, var) = (ConfigFile::new("weights"), token_var());
    let one_to_one = config(&mock.base_url(), &var, 1).add_tenants(&["heavy", "light"]);
    file.write(&one_to_one.toml());
    let proxy = start(&file).await;
    let addr = proxy.addr;
    // Both tenants stay backlogged: six closed-loop clients each, equal-cost requests.
    let stop = Arc::new(AtomicBool::new(false));
    let mut clients = Vec::new();
    for tenant in ["heavy", "light"] {
        for _ in 0..6 {
            let stop = stop.clone();
            clients.push(tokio::spawn(async move {
                for _ in 0..2000 {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let r = chat(addr, tenant, &[("x-mock-delay-ms", "2")]).await;
                    assert_eq!(r.status, 200);
                }
            }));
        }
    }
    assert!(
        eventually(|| proxy.pools[0].load().0 >= 8).await,
        "both queue"
    );
    let before = served_for(addr, (0, 0), 6_000).await;
    let ratio = before.0 as f64 / before.1 as f64;
    assert!(
        (0.5..=2.0).contains(&ratio),
        "1:1 before the reload: {before:?}"
    );

    file.write(&one_to_one.tenant("heavy", "weight", 3.0).toml());
    let r = reload(addr).await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(
        r.json()["changes"]["tenants_changed"],
        serde_json::json!(["heavy"])
    );
    assert_eq!(field(addr, "heavy", "weight").await, 3.0);

    // Measure from a little after the switch (the visit in progress ends under the old weight).
    let start = (served(addr, "heavy").await, served(addr, "light").await);
    let shares = served_for(addr, start, 25_000).await;
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.await.unwrap();
    }
    let (heavy, light) = shares;
    assert!(heavy + light >= 25_000, "served {shares:?}");
    let ratio = heavy as f64 / light as f64;
    // At 1:1 this would be ~1.0.
    assert!(
        (2.4..=3.6).contains(&ratio),
        "heavy:light = {ratio} ({shares:?})"
    );
}

#[tokio::test]
async fn an_invalid_reload_is_refused_and_the_old_config_keeps_serving() {
    let mock = mock().await;
    let (file, var) = (ConfigFile::new("invalid"), token_var());
    let good = config(&mock.base_url(), &var, 4)
        .add_tenants(&["a"])
        .tenant("a", "weight", 2.0);
    file.write(&good.toml());
    let proxy = start(&file).await;
    let addr = proxy.addr;
    let cases = [
        ("[[upstreams]\nname = ", "invalid_config", "line 1"),
        (
            &*good.clone().tenant("a", "wieght", 2.0).toml(),
            "invalid_config",
            "tenants[0].wieght",
        ),
        (
            &*good.clone().tenant("a", "weight", -1.0).toml(),
            "invalid_config",
            "tenants[0].weight",
        ),
    ];
    for (text, code, message) in cases {
        file.write(text);
        let r = reload(addr).await;
        r.assert_error(400, code);
        let m = r.json()["error"]["message"].as_str().unwrap().to_owned();
        assert!(m.contains(message), "{m}");
        assert!(m.contains("previous one stays in force"), "{m}");
        // The old config keeps serving: old key, old weight.
        assert_eq!(chat(addr, "a", &[]).await.status, 200);
        assert_eq!(field(addr, "a", "weight").await, 2.0);
    }
    // What the SIGHUP handler calls refuses it the same way.
    assert!(matches!(proxy.reload(), Err(ReloadError::Invalid(_))));
    // The admin token still guards the endpoint.
    send(post(addr, "/admin/reload", Some("wrong"), "", &[]))
        .await
        .assert_error(401, "invalid_admin_token");
    // A good file again: applied.
    file.write(&good.tenant("a", "weight", 5.0).toml());
    let changes = proxy.reload().expect("valid config reloads");
    assert_eq!(changes.tenants_changed, ["a"]);
    assert_eq!(field(addr, "a", "weight").await, 5.0);
}

#[tokio::test]
async fn a_removed_tenant_drains_and_its_key_is_refused_and_a_new_key_works() {
    let mock = mock().await;
    let (file, var) = (ConfigFile::new("remove"), token_var());
    file.write(
        &config(&mock.base_url(), &var, 1)
            .add_tenants(&["a", "b"])
            .toml(),
    );
    let proxy = start(&file).await;
    let addr = proxy.addr;
    // Long enough that b's three requests (one at a time) outlive the reload below by seconds.
    let slow = [("x-mock-delay-ms", "1500")];
    let held: Vec<_> = (0..3)
        .map(|_| tokio::spawn(async move { chat(addr, "b", &slow).await }))
        .collect();
    assert!(eventually(|| proxy.pools[0].load() == (2, 1)).await);

    let replaced = config(&mock.base_url(), &var, 1)
        .add_tenants(&["a", "c"])
        .tenant("c", "weight", 2.0);
    file.write(&replaced.toml());
    let r = reload(addr).await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let changes = &r.json()["changes"];
    assert_eq!(changes["tenants_removed"], serde_json::json!(["b"]));
    assert_eq!(changes["tenants_added"], serde_json::json!(["c"]));
    // The queue is the same one: b's requests are still there, listed as draining.
    let state = proxy.state();
    assert!(Arc::ptr_eq(&state.pools[0], &proxy.pools[0]));
    let (queued, in_flight) = state.pools[0]
        .tenant_load(&TenantId::new("b"))
        .expect("a removed tenant with requests in the pool stays known to it until drained");
    assert!(queued + in_flight as usize > 0, "b still has requests");
    assert_eq!(field(addr, "b", "configured").await, false);

    chat(addr, "b", &[])
        .await
        .assert_error(401, "invalid_api_key");
    assert_eq!(chat(addr, "c", &[]).await.status, 200);
    assert_eq!(chat(addr, "a", &[]).await.status, 200);
    for h in held {
        assert_eq!(
            h.await.unwrap().status,
            200,
            "b's queued and in-flight requests complete"
        );
    }
    assert!(eventually(|| proxy.pools[0].load() == (0, 0)).await);
    // Drained: no longer listed.
    assert!(field(addr, "b", "weight").await.is_null());
}

#[tokio::test]
async fn a_server_started_without_a_file_cannot_reload() {
    let mock = mock().await;
    let var = token_var();
    let proxy = config(&mock.base_url(), &var, 1)
        .add_tenants(&["a"])
        .start_with_env(&[(TOKEN_VAR, TOKEN)])
        .await;
    reload(proxy.addr).await.assert_error(409, "no_config_file");
    assert!(matches!(proxy.reload(), Err(ReloadError::NoFile)));
}
