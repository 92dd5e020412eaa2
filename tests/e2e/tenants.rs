//! Tenants and keys at runtime (`/admin/tenants`) on one replica, end to end: a tenant
//! created, used with raw HTTP and the official client, its key rotated with an overlap and
//! revoked, everything kept across a restart from the SQLite store (`[store] path`); config
//! tenants read-only (409 naming the file); validation errors naming the field. The cluster
//! cases (two replicas on one Redis, the store down) are in `cluster::tenants`.

use std::net::SocketAddr;

use crate::support::*;
use async_openai::config::OpenAIConfig;
use async_openai::types::chat::{
    ChatCompletionRequestUserMessageArgs, CreateChatCompletionRequestArgs,
};
use bytes::Bytes;
use http::{Method, Request};
use http_body_util::Full;
use serde_json::{json, Value};

pub const TOKEN: &str = "admin-token-runtime";

/// An admin call with the token and a JSON body (`Value::Null`: none).
pub async fn admin(addr: SocketAddr, method: Method, path: &str, body: Value) -> Collected {
    let b = Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"))
        .header("authorization", format!("Bearer {TOKEN}"))
        .header("content-type", "application/json");
    let body = match body {
        Value::Null => Bytes::new(),
        v => Bytes::from(v.to_string()),
    };
    send(b.body(Full::new(body)).unwrap()).await
}

/// A chat as the holder of `key`: its status.
pub async fn chat_status(addr: SocketAddr, key: &str) -> u16 {
    send(post(
        addr,
        "/v1/chat/completions",
        Some(key),
        &chat("gpt-4o-mini"),
        &[],
    ))
    .await
    .status
}

/// A new key of `tenant`: (key id, key).
pub async fn new_key(addr: SocketAddr, tenant: &str) -> (String, String) {
    let path = format!("/admin/tenants/{tenant}/keys");
    let r = admin(addr, Method::POST, &path, json!({"label": "test"})).await;
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    let v = r.json();
    (
        v["id"].as_str().unwrap().into(),
        v["key"].as_str().unwrap().into(),
    )
}

fn conf(mock: &str, store: &std::path::Path, var: &str) -> Conf {
    Conf::new(mock)
        .set("admin.token_env", var)
        .set("store.path", store.display().to_string())
        .set("plans.gold.weight", 3.0)
}

async fn openai_chat(addr: SocketAddr, key: &str) -> Result<(), String> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let config = OpenAIConfig::new()
        .with_api_base(format!("http://{addr}/v1"))
        .with_api_key(key);
    let req = CreateChatCompletionRequestArgs::default()
        .model("gpt-4o-mini")
        .messages([ChatCompletionRequestUserMessageArgs::default()
            .content("hello")
            .build()
            .unwrap()
            .into()])
        .build()
        .unwrap();
    let res = async_openai::Client::with_config(config)
        .chat()
        .create(req)
        .await;
    res.map(drop).map_err(|e| e.to_string())
}

fn temp_store() -> std::path::PathBuf {
    std::env::temp_dir().join(format!("fg-e2e-tenants-{:x}.db", rand::random::<u64>()))
}

#[tokio::test]
async fn create_use_rotate_revoke_and_restart() {
    let (mock, store, var) = (mock().await, temp_store(), unique_env("RT"));
    let c = conf(&mock.base_url(), &store, &var);
    let proxy = c.start_with_env(&[(&var, TOKEN)]).await;
    let addr = proxy.addr;
    let body =
        json!({"id": "acme", "plan": "gold", "max_concurrency": 4, "requests_per_minute": 600});
    let r = admin(addr, Method::POST, "/admin/tenants", body).await;
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()["source"], "api");
    let (old_id, old) = new_key(addr, "acme").await;
    assert_eq!(chat_status(addr, &old).await, 200);
    openai_chat(addr, &old).await.unwrap();
    // Its weight is the plan's, in the live rows like any config tenant.
    let v = admin(addr, Method::GET, "/admin/tenants", Value::Null)
        .await
        .json();
    let row = v["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["tenant"] == "acme")
        .cloned();
    assert_eq!(row.unwrap()["weight"], 3.0);
    let ids: Vec<&str> = v["data"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["id"].as_str())
        .collect();
    assert_eq!(ids, ["a", "b", "acme"], "config tenants, then API ones");
    // The console's view lists it beside the config tenants, with its keys' ids.
    let v = admin(addr, Method::GET, "/admin/state", Value::Null)
        .await
        .json();
    let rows = v["tenants"].as_array().unwrap();
    let acme = rows.iter().find(|t| t["tenant"] == "acme").unwrap();
    assert_eq!(
        (acme["source"].as_str(), acme["keys"][0].as_str()),
        (Some("api"), Some(old_id.as_str()))
    );
    let a = rows.iter().find(|t| t["tenant"] == "a").unwrap();
    assert_eq!(
        (a["source"].as_str(), a["keys"].is_null()),
        (Some("config"), true)
    );
    // GET never shows a key; it shows its id and a hash prefix.
    let t = admin(addr, Method::GET, "/admin/tenants/acme", Value::Null).await;
    assert!(!String::from_utf8_lossy(&t.body).contains(&old));
    assert_eq!(t.json()["keys"][0]["id"], old_id.as_str());
    // Rotation: both keys work during the overlap.
    let path = format!("/admin/tenants/acme/keys/{old_id}/rotate");
    let r = admin(addr, Method::POST, &path, json!({"overlap_seconds": 600})).await;
    assert_eq!(r.status, 201);
    let rotated = r.json();
    let new = rotated["key"].as_str().unwrap().to_owned();
    assert!(rotated["rotated"]["expires_at"].as_u64().is_some());
    assert_eq!(chat_status(addr, &old).await, 200);
    assert_eq!(chat_status(addr, &new).await, 200);
    // Revocation: refused from the answer on.
    let path = format!("/admin/tenants/acme/keys/{old_id}");
    assert_eq!(
        admin(addr, Method::DELETE, &path, Value::Null).await.status,
        204
    );
    let r = send(post(
        addr,
        "/v1/chat/completions",
        Some(&old),
        &chat("gpt-4o-mini"),
        &[],
    ))
    .await;
    r.assert_error(401, "invalid_api_key");
    assert!(openai_chat(addr, &old).await.is_err());
    admin(addr, Method::DELETE, &path, Value::Null)
        .await
        .assert_error(404, "key_not_found");
    // PATCH changes a field live.
    let r = admin(
        addr,
        Method::PATCH,
        "/admin/tenants/acme",
        json!({"weight": 5.0}),
    )
    .await;
    assert_eq!(r.status, 200);
    let v = admin(
        addr,
        Method::GET,
        "/admin/tenants?limit=1&after=b",
        Value::Null,
    )
    .await
    .json();
    assert_eq!(v["data"][0]["id"], "acme");
    assert_eq!(v["tenants"][0]["weight"], 5.0);
    let m = scrape(addr).await;
    assert_eq!(
        value(&m, "fairgate_tenant_changes_total", &[("op", "create_key")]),
        Some(1.0)
    );
    assert_eq!(
        value(&m, "fairgate_tenant_changes_total", &[("op", "revoke_key")]),
        Some(1.0)
    );
    proxy.shutdown();
    proxy.join().await.unwrap();

    // A restart keeps the tenant, its settings and its live key; the revoked one stays out.
    let proxy = c.start_with_env(&[(&var, TOKEN)]).await;
    let addr = proxy.addr;
    assert_eq!(chat_status(addr, &new).await, 200);
    assert_eq!(chat_status(addr, &old).await, 401);
    let t = admin(addr, Method::GET, "/admin/tenants/acme", Value::Null)
        .await
        .json();
    assert_eq!(t["weight"], 5.0);
    // Deleting the tenant refuses its keys.
    let r = admin(addr, Method::DELETE, "/admin/tenants/acme", Value::Null).await;
    assert_eq!(r.status, 204);
    assert_eq!(chat_status(addr, &new).await, 401);
    admin(addr, Method::GET, "/admin/tenants/acme", Value::Null)
        .await
        .assert_error(404, "tenant_not_found");
    let _ = std::fs::remove_file(&store);
}

#[tokio::test]
async fn config_tenants_are_read_only_and_fields_are_validated() {
    let (mock, store, var) = (mock().await, temp_store(), unique_env("RT"));
    let proxy = conf(&mock.base_url(), &store, &var)
        .start_with_env(&[(&var, TOKEN)])
        .await;
    let addr = proxy.addr;
    for (method, path, body) in [
        (Method::POST, "/admin/tenants", json!({"id": "a"})),
        (Method::PATCH, "/admin/tenants/a", json!({"weight": 2.0})),
        (Method::DELETE, "/admin/tenants/a", Value::Null),
        (Method::POST, "/admin/tenants/a/keys", json!({})),
    ] {
        let r = admin(addr, method, path, body).await;
        r.assert_error(409, "config_tenant");
        assert!(r.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("config file"));
    }
    // A config tenant's key still works, and reads fine.
    assert_eq!(chat_status(addr, KEY_A).await, 200);
    let t = admin(addr, Method::GET, "/admin/tenants/a", Value::Null)
        .await
        .json();
    assert_eq!(t["source"], "config");
    for (body, param) in [
        (json!({"id": "x", "weight": -1}), "weight"),
        (json!({"id": "x", "plan": "nope"}), "plan"),
        (json!({"id": "x", "wieght": 1}), "wieght"),
        (json!({"id": "x", "api_keys": ["k"]}), "api_keys"),
        (json!({"weight": 1}), "id"),
    ] {
        let r = admin(addr, Method::POST, "/admin/tenants", body).await;
        r.assert_error(400, "invalid_tenant");
        assert_eq!(r.json()["error"]["param"], param);
    }
    let r = admin(addr, Method::POST, "/admin/tenants", json!({"id": "x"})).await;
    assert_eq!(r.status, 201);
    admin(addr, Method::POST, "/admin/tenants", json!({"id": "x"}))
        .await
        .assert_error(409, "tenant_exists");
    // Without the admin token: 401, nothing changes.
    let r = send(post(
        addr,
        "/admin/tenants",
        Some(KEY_A),
        r#"{"id":"y"}"#,
        &[],
    ))
    .await;
    r.assert_error(401, "invalid_admin_token");
    let _ = std::fs::remove_file(&store);
}

#[tokio::test]
async fn without_a_store_writes_are_refused() {
    let (mock, var) = (mock().await, unique_env("RT"));
    let proxy = Conf::new(&mock.base_url())
        .set("admin.token_env", &var)
        .start_with_env(&[(&var, TOKEN)])
        .await;
    let r = admin(
        proxy.addr,
        Method::POST,
        "/admin/tenants",
        json!({"id": "x"}),
    )
    .await;
    r.assert_error(409, "no_store");
}

/// A burst of key creations beside requests. Admin writes wait for the control plane's
/// low-priority thread, at most `[admin] max_queued_writes` (here 4) at once. With the store's
/// file held locked by another connection, the writes stall on that thread: 4 of 20
/// concurrent creations wait, the 16 others are refused at once (503 `admin_writes_busy`, an
/// honest `Retry-After`, nothing changed), and requests, of config and API keys alike, are
/// answered meanwhile. Unlocked, the 4 are created; a key revoked is refused (401) from its 204
/// on, on this replica.
#[tokio::test]
async fn a_key_burst_waits_in_a_bounded_queue_while_requests_are_answered() {
    let (mock, store, var) = (mock().await, temp_store(), unique_env("RT"));
    let c = conf(&mock.base_url(), &store, &var).set("admin.max_queued_writes", 4);
    let proxy = c.start_with_env(&[(&var, TOKEN)]).await;
    let addr = proxy.addr;
    let r = admin(addr, Method::POST, "/admin/tenants", json!({"id": "acme"})).await;
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    let (first_id, first) = new_key(addr, "acme").await;

    let lock = rusqlite::Connection::open(&store).unwrap();
    lock.execute_batch("BEGIN IMMEDIATE").unwrap();
    let (tx, mut answers) = tokio::sync::mpsc::unbounded_channel();
    for _ in 0..20 {
        let tx = tx.clone();
        tokio::spawn(async move {
            let r = admin(addr, Method::POST, "/admin/tenants/acme/keys", json!({})).await;
            let _ = tx.send(r);
        });
    }
    drop(tx);
    for _ in 0..16 {
        let r = answers.recv().await.unwrap();
        r.assert_error(503, "admin_writes_busy");
        let retry: u64 = r.headers["retry-after"].to_str().unwrap().parse().unwrap();
        assert!(retry >= 1);
        assert!(r.headers.contains_key("retry-after-ms"));
    }
    // The control plane is stuck; the data plane is not.
    for _ in 0..5 {
        assert_eq!(chat_status(addr, KEY_A).await, 200);
        assert_eq!(chat_status(addr, &first).await, 200);
    }
    lock.execute_batch("ROLLBACK").unwrap();
    let mut created = Vec::new();
    while let Some(r) = answers.recv().await {
        assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
        created.push(r.json()["key"].as_str().unwrap().to_owned());
    }
    assert_eq!(created.len(), 4, "the queue's bound waited, no more");
    for key in &created {
        assert_eq!(chat_status(addr, key).await, 200);
    }
    let m = scrape(addr).await;
    assert_eq!(
        value(&m, "fairgate_tenant_changes_total", &[("op", "create_key")]),
        Some(5.0),
        "a refused creation changed nothing"
    );
    // A revocation answers once this replica refuses the key.
    let path = format!("/admin/tenants/acme/keys/{first_id}");
    let r = admin(addr, Method::DELETE, &path, Value::Null).await;
    assert_eq!(r.status, 204);
    assert_eq!(chat_status(addr, &first).await, 401);
    proxy.shutdown();
    proxy.join().await.unwrap();
    let _ = std::fs::remove_file(&store);
}
