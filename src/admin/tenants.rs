//! `/admin/tenants`: tenants and keys at runtime (the store and the merge rule are
//! `tenant::runtime`'s).
//!
//! - `GET /admin/tenants[?limit=N&after=ID]` — `data`: a page of tenants in id order, config
//!   tenants first then API ones (`source`), `has_more`, `last_id`; `tenants`: the live rows of
//!   every pool (of the page's tenants when paged).
//! - `POST /admin/tenants` — a `[[tenants]]` entry without keys → `201` and the tenant.
//! - `GET|PATCH|DELETE /admin/tenants/{id}` — `200` (with its keys' ids), `200`, `204`.
//! - `POST /admin/tenants/{id}/keys` (`label`, `expires_at`) → `201` with the key, shown once;
//!   `GET …/keys` → the live keys (never a key: id, label, dates, a hash prefix);
//!   `DELETE …/keys/{key_id}` → `204`, refused (401) from then on;
//!   `POST …/keys/{key_id}/rotate` (`overlap_seconds`, default 3600) → `201` with a new key,
//!   the old one expiring after the overlap.
//!
//! Invariants: config tenants are read-only here (409 naming the file); errors are the
//! runtime's typed errors in OpenAI's shape, a bad field named in `param`; a change of the set
//! of tenants is in force (a new generation published) before its answer is sent.

use std::sync::{Arc, Weak};

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use serde_json::{json, Map, Value};

use super::{json, OpsError, Reload};
use crate::config::Config;
use crate::error::Error;
use crate::response::{BoxError, ResponseBody};
use crate::tenant::runtime::{self, Registry};

/// Largest admin request body read.
const MAX_BODY: usize = 1 << 20;

/// Default and largest page of `GET /admin/tenants`.
const PAGE: usize = 100;
const MAX_PAGE: usize = 1000;

/// What the tenant endpoints read (a part of the admin layer).
#[derive(Clone)]
pub struct Tenants {
    /// The runtime registry (`None`: no `[store]` nor `[cluster]`: writes are 409).
    pub runtime: Option<Arc<Registry>>,
    /// The configuration in force (file and API tenants merged).
    pub config: Arc<Config>,
    /// The generation hook (applies a change of the set of tenants).
    pub reload: Option<Weak<dyn Reload>>,
}

type Res = Result<Response<ResponseBody>, Error>;

fn status(mut res: Response<ResponseBody>, code: StatusCode) -> Response<ResponseBody> {
    *res.status_mut() = code;
    res
}

fn no_content() -> Response<ResponseBody> {
    status(Response::new(ResponseBody::empty()), StatusCode::NO_CONTENT)
}

fn bad(field: &str, message: impl Into<String>) -> Error {
    runtime::Error::Invalid {
        field: field.to_owned(),
        message: message.into(),
    }
    .into()
}

/// The request body as a JSON object (empty: `{}`).
async fn object<B>(body: B) -> Result<Map<String, Value>, Error>
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let bytes = http_body_util::Limited::new(body, MAX_BODY)
        .collect()
        .await
        .map_err(|e| bad("body", format!("unreadable body (at most 1 MiB): {e}")))?
        .to_bytes();
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(Map::new());
    }
    match serde_json::from_slice(&bytes) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(bad("body", "must be a JSON object")),
        Err(e) => Err(bad("body", format!("not JSON: {e}"))),
    }
}

fn query(q: Option<&str>, name: &str) -> Option<String> {
    q?.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k == name).then(|| v.to_owned())
    })
}

impl Tenants {
    fn registry(&self) -> Result<&Arc<Registry>, Error> {
        self.runtime
            .as_ref()
            .ok_or_else(|| OpsError::NoStore.into())
    }

    fn hook(&self) -> Option<Arc<dyn Reload>> {
        self.reload.as_ref().and_then(Weak::upgrade)
    }

    /// A 409 naming the config file, for a config tenant.
    fn config_tenant(&self, e: runtime::Error) -> Error {
        match e {
            runtime::Error::ConfigTenant(id) => {
                let file = self.hook().and_then(|h| h.config_file());
                OpsError::ConfigTenant { id, file }.into()
            }
            e => e.into(),
        }
    }

    /// Publishes a generation with the API tenants as they are now.
    async fn apply(&self) -> Result<(), Error> {
        let Some(hook) = self.hook() else {
            return Ok(());
        };
        match tokio::task::spawn_blocking(move || hook.apply_tenants()).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(e.into()),
            Err(_) => Err(Error::internal("the tenant apply task panicked")),
        }
    }

    /// A config tenant as the API shows it (its effective settings; no keys).
    fn config_view(&self, id: &str) -> Option<Value> {
        let t = self.config.tenants.iter().find(|t| t.id == id)?;
        Some(json!({
            "id": t.id,
            "source": "config",
            "weight": t.effective_weight(&self.config).get(),
            "plan": t.plan,
            "max_concurrency": t.effective_max_concurrency(&self.config),
            "priority": format!("{:?}", t.priority).to_lowercase(),
        }))
    }

    fn is_file_tenant(&self, id: &str) -> bool {
        match &self.runtime {
            Some(r) => r.is_file_tenant(id),
            None => self.config.tenants.iter().any(|t| t.id == id),
        }
    }

    /// `GET /admin/tenants` page: config tenants (in file order… by id), then API tenants.
    pub fn page(&self, q: Option<&str>) -> (Value, Option<Vec<String>>) {
        let paged = query(q, "limit").is_some() || query(q, "after").is_some();
        let limit = query(q, "limit")
            .and_then(|l| l.parse::<usize>().ok())
            .unwrap_or(PAGE)
            .clamp(1, MAX_PAGE);
        let after = query(q, "after");
        let mut file: Vec<&str> = (self.config.tenants.iter())
            .map(|t| t.id.as_str())
            .filter(|id| self.is_file_tenant(id))
            .collect();
        file.sort_unstable();
        // Config ids sort before API ids: the cursor is `after` in (config, api) order.
        let after_api = after.as_deref().is_some_and(|a| !self.is_file_tenant(a));
        let mut data: Vec<Value> = Vec::new();
        if !after_api {
            let start = after
                .as_deref()
                .map_or(0, |a| file.partition_point(|id| *id <= a));
            for id in file.iter().skip(start).take(limit) {
                data.extend(self.config_view(id));
            }
        }
        let mut has_more = data.len() == limit && file.len() > data.len();
        if data.len() < limit {
            if let Some(r) = &self.runtime {
                let from = if after_api { after.as_deref() } else { None };
                let (page, more) = r.tenants(from, limit - data.len());
                has_more = more;
                data.extend(page.iter().map(|t| t.view()));
            }
        }
        let ids: Vec<String> = (data.iter())
            .filter_map(|v| v["id"].as_str().map(str::to_owned))
            .collect();
        let doc = json!({
            "object": "list",
            "data": data,
            "first_id": ids.first(),
            "last_id": ids.last(),
            "has_more": has_more,
        });
        (doc, paged.then_some(ids))
    }

    /// Answers `/admin/tenants/…` (`rest`: the path after `/admin/tenants/`).
    pub async fn route<B>(self, req: Request<B>, rest: String) -> Res
    where
        B: http_body::Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        let method = req.method().clone();
        let parts: Vec<&str> = rest.split('/').collect();
        match (&method, parts.as_slice()) {
            (&Method::POST, [""]) => {
                let mut body = object(req.into_body()).await?;
                let id = match body.remove("id") {
                    Some(Value::String(id)) => id,
                    _ => return Err(bad("id", "a string is required")),
                };
                let r = self.registry()?;
                let t = (r.create_tenant(id, body).await).map_err(|e| self.config_tenant(e))?;
                self.apply().await?;
                Ok(status(json(&t.view()), StatusCode::CREATED))
            }
            (&Method::GET, [id]) => self.show(id),
            (&Method::PATCH, [id]) => {
                let body = object(req.into_body()).await?;
                if body.contains_key("id") {
                    return Err(bad("id", "a tenant's id does not change"));
                }
                let r = self.registry_for(id)?;
                let t = (r.update_tenant(id, body).await).map_err(|e| self.config_tenant(e))?;
                self.apply().await?;
                Ok(json(&t.view()))
            }
            (&Method::DELETE, [id]) => {
                let r = self.registry_for(id)?;
                (r.delete_tenant(id).await).map_err(|e| self.config_tenant(e))?;
                self.apply().await?;
                Ok(no_content())
            }
            (&Method::POST, [id, "keys"]) => {
                let body = object(req.into_body()).await?;
                let label = string_field(&body, "label")?;
                let expires_at = match body.get("expires_at") {
                    None | Some(Value::Null) => None,
                    Some(v) => Some(
                        v.as_u64()
                            .ok_or_else(|| bad("expires_at", "seconds since the epoch"))?,
                    ),
                };
                if let Some(f) = body
                    .keys()
                    .find(|k| !["label", "expires_at"].contains(&k.as_str()))
                {
                    return Err(bad(f, "unknown field (label, expires_at)"));
                }
                let r = self.registry_for(id)?;
                let (k, key) = (r.create_key(id, label, expires_at).await)
                    .map_err(|e| self.config_tenant(e))?;
                Ok(status(json(&shown(&k, &key)), StatusCode::CREATED))
            }
            (&Method::GET, [id, "keys"]) => {
                let r = self.registry_for(id)?;
                if r.tenant(id).is_none() {
                    return Err(runtime::Error::NoTenant((*id).to_owned()).into());
                }
                let keys: Vec<Value> = r.keys_of(id).iter().map(|k| k.view()).collect();
                Ok(json(&json!({ "object": "list", "data": keys })))
            }
            (&Method::DELETE, [id, "keys", key_id]) => {
                let r = self.registry_for(id)?;
                (r.revoke_key(id, key_id).await).map_err(|e| self.config_tenant(e))?;
                Ok(no_content())
            }
            (&Method::POST, [id, "keys", key_id, "rotate"]) => {
                let body = object(req.into_body()).await?;
                let label = string_field(&body, "label")?;
                let overlap = match body.get("overlap_seconds") {
                    None | Some(Value::Null) => 3600,
                    Some(v) => v
                        .as_u64()
                        .ok_or_else(|| bad("overlap_seconds", "a whole number of seconds"))?,
                };
                let r = self.registry_for(id)?;
                let (k, key, old) = (r.rotate_key(id, key_id, overlap, label).await)
                    .map_err(|e| self.config_tenant(e))?;
                let mut doc = shown(&k, &key);
                doc["rotated"] = json!({ "id": old.id, "expires_at": old.expires_at });
                Ok(status(json(&doc), StatusCode::CREATED))
            }
            (_, [_] | [_, "keys"] | [_, "keys", _] | [_, "keys", _, "rotate"]) => {
                Err(OpsError::MethodNotAllowed.into())
            }
            _ => Err(OpsError::NotFound.into()),
        }
    }

    /// The registry, for a change of tenant `id` (a config tenant: 409 even without a store).
    fn registry_for(&self, id: &str) -> Result<&Arc<Registry>, Error> {
        if self.is_file_tenant(id) {
            return Err(self.config_tenant(runtime::Error::ConfigTenant(id.to_owned())));
        }
        self.registry()
    }

    fn show(&self, id: &str) -> Res {
        if self.is_file_tenant(id) {
            return self
                .config_view(id)
                .map(|v| json(&v))
                .ok_or_else(|| runtime::Error::NoTenant(id.to_owned()).into());
        }
        let r = self.registry()?;
        let t = r
            .tenant(id)
            .ok_or_else(|| runtime::Error::NoTenant(id.to_owned()))?;
        let mut v = t.view();
        v["keys"] = r.keys_of(id).iter().map(|k| k.view()).collect();
        Ok(json(&v))
    }
}

fn string_field(body: &Map<String, Value>, name: &str) -> Result<Option<String>, Error> {
    match body.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.len() <= 256 => Ok(Some(s.clone())),
        Some(_) => Err(bad(name, "a string of at most 256 bytes")),
    }
}

/// A new key's answer: the key itself, this once.
fn shown(k: &runtime::record::KeyRecord, key: &str) -> Value {
    let mut v = k.view();
    v["key"] = key.into();
    v["object"] = "api_key".into();
    v
}

/// `Cache-Control: no-store` (an answer holding a key must not be kept by a cache).
pub fn no_store(mut res: Response<ResponseBody>) -> Response<ResponseBody> {
    res.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    res
}
