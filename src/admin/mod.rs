//! The admin API, answered before tenant authentication and protected by its own bearer token
//! (read at startup from the env var named by `[admin] token_env`):
//! `GET /admin/ui` — the live fairness console ([`ui`]: one self-contained page, the only
//! admin path served without the token: it holds no data and reads everything from
//! `/admin/state` with the token the user gives it);
//! `GET /admin/state` — the console's compact live view ([`state`]: bounded payload);
//! `GET /admin/tenants` — live per-tenant state of every pool (queued, in flight, credit,
//! weight, served share vs entitled share, estimate error); `POST /admin/reload` — re-reads the
//! config file and applies it live (200 with what changed; 400 in OpenAI's error shape naming
//! the bad key, the previous configuration staying in force; 409 if the server has no file).
//!
//! Invariants: without a configured token every `/admin/` path is 404 (the API does not exist);
//! a missing or wrong token is 401 and reveals nothing; the token is compared in constant time
//! and never logged.

pub mod state;
pub mod tenants;
pub mod ui;
pub mod usage;

use std::sync::{Arc, Weak};

use http::{header, HeaderValue, Method, Request, Response, StatusCode};

use crate::admission::Admission;
use crate::config::ConfigError;
use crate::domain::TenantId;
use crate::error::{ApiError, Error};
use crate::estimate::Estimator;
use crate::metrics::Metrics;
use crate::queue::FairQueue;
use crate::response::ResponseBody;

/// What `POST /admin/reload` calls: the server's live configuration.
pub trait Reload: Send + Sync {
    /// Re-reads and applies the configuration: a JSON summary of what changed, or why not.
    /// Blocking.
    fn reload(&self) -> Result<serde_json::Value, ReloadError>;
    /// Rebuilds the generation in force for the API tenants as they are now. Blocking.
    fn apply_tenants(&self) -> Result<(), ReloadError>;
    /// The config file the server reads, if any (named in a 409 on a config tenant).
    fn config_file(&self) -> Option<String>;
}

/// Why a reload was refused; the configuration in force stays.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    /// The server was started from a `Config` value, not a file: there is nothing to re-read.
    #[error("this server was not started from a config file; there is nothing to reload")]
    NoFile,
    /// The new configuration is invalid (the message names the key).
    #[error("invalid configuration, the previous one stays in force: {0}")]
    Invalid(#[from] ConfigError),
}

impl ApiError for ReloadError {
    fn status(&self) -> StatusCode {
        match self {
            ReloadError::NoFile => StatusCode::CONFLICT,
            ReloadError::Invalid(_) => StatusCode::BAD_REQUEST,
        }
    }
    fn kind(&self) -> &'static str {
        "invalid_request_error"
    }
    fn code(&self) -> &'static str {
        match self {
            ReloadError::NoFile => "no_config_file",
            ReloadError::Invalid(_) => "invalid_config",
        }
    }
    fn reason(&self) -> crate::error::Reason {
        crate::error::Reason::Admin
    }
}

/// Refusals of the operations endpoints (admin API, and unknown paths on the ops listener).
#[derive(Debug, thiserror::Error)]
pub enum OpsError {
    /// No such endpoint (or the admin API is off).
    #[error("not found")]
    NotFound,
    /// Missing or wrong admin token.
    #[error("a valid admin bearer token is required")]
    Unauthorized,
    /// A known endpoint with the wrong method.
    #[error("method not allowed")]
    MethodNotAllowed,
    /// Runtime tenants need somewhere durable to live.
    #[error("tenants and keys at runtime need a durable store: set [store] path (or [cluster])")]
    NoStore,
    /// A config tenant is read-only through the API.
    #[error(
        "tenant {id:?} is defined in the config file{}: change it there (config tenants are \
         read-only through the API)",
        file.as_deref().map(|f| format!(" {f}")).unwrap_or_default()
    )]
    ConfigTenant {
        /// The tenant.
        id: String,
        /// The config file, if the server was started from one.
        file: Option<String>,
    },
}

impl ApiError for OpsError {
    fn status(&self) -> StatusCode {
        match self {
            OpsError::NotFound => StatusCode::NOT_FOUND,
            OpsError::Unauthorized => StatusCode::UNAUTHORIZED,
            OpsError::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            OpsError::NoStore | OpsError::ConfigTenant { .. } => StatusCode::CONFLICT,
        }
    }
    fn kind(&self) -> &'static str {
        "invalid_request_error"
    }
    fn code(&self) -> &'static str {
        match self {
            OpsError::NotFound => "not_found",
            OpsError::Unauthorized => "invalid_admin_token",
            OpsError::MethodNotAllowed => "method_not_allowed",
            OpsError::NoStore => "no_store",
            OpsError::ConfigTenant { .. } => "config_tenant",
        }
    }
    fn reason(&self) -> crate::error::Reason {
        crate::error::Reason::Admin
    }
}

/// The admin API stage: what it reads; cloning shares it.
#[derive(Clone)]
pub struct Admin {
    /// The bearer token; `None`: the admin API is off.
    pub token: Option<Arc<str>>,
    /// Pool names, indexed like `pools`.
    pub pool_names: Arc<[String]>,
    /// The pools.
    pub pools: Arc<[Arc<FairQueue>]>,
    /// Estimate-error statistics.
    pub estimator: Arc<Estimator>,
    /// Served tokens per pool and tenant, recent waits and refusals, the timeline.
    pub metrics: Arc<Metrics>,
    /// Configured and learned capacity, upstream 429s per pool.
    pub admission: Arc<Admission>,
    /// The cluster link (degraded state), in cluster mode.
    pub cluster: Option<Arc<crate::cluster::Link>>,
    /// The reload hook (`None`, or gone: the server cannot reload, 409).
    pub reload: Option<Weak<dyn Reload>>,
    /// Tenants and keys at runtime (`/admin/tenants` writes).
    pub runtime: tenants::Tenants,
}

/// Tower layer of the admin API.
pub type Layer = crate::stage::Layer<Admin>;

/// Equal bytes, in time independent of where they differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl Admin {
    fn authorized<B>(&self, token: &str, req: &Request<B>) -> bool {
        req.headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "))
            .is_some_and(|t| same(t, token.as_bytes()))
    }

    /// `GET /admin/tenants`: the page of tenants (`data`, see [`tenants`]) and the live rows
    /// of every pool (`tenants`; of the page's tenants only when paged).
    fn tenants_page(&self, query: Option<&str>) -> Response<ResponseBody> {
        let (mut doc, ids) = self.runtime.page(query);
        let mut live = self.tenants();
        if let (Some(ids), Some(rows)) = (ids, live["tenants"].as_array_mut()) {
            rows.retain(|r| {
                r["tenant"]
                    .as_str()
                    .is_some_and(|t| ids.iter().any(|i| i == t))
            });
        }
        doc["tenants"] = live["tenants"].take();
        json(&doc)
    }

    /// The `/admin/tenants` document.
    pub fn tenants(&self) -> serde_json::Value {
        let mut out = Vec::new();
        for (i, pool) in self.pools.iter().enumerate() {
            // Tenants removed by a reload stay in the queues while they drain: listed until then.
            let configured = |id: &TenantId| self.metrics.tenant(id).is_some();
            let mut snap = pool.snapshot();
            snap.retain(|(t, _)| configured(&t.id) || t.queued > 0 || t.in_flight > 0);
            let total_weight: f64 = snap
                .iter()
                .filter(|(t, _)| configured(&t.id))
                .map(|(t, _)| t.weight.get())
                .sum();
            let served: Vec<u64> = snap
                .iter()
                .map(|(t, _)| self.metrics.served_total(i, &t.id))
                .collect();
            let total_served: u64 = served.iter().sum();
            for ((t, age), served) in snap.into_iter().zip(served) {
                let stats = self.estimator.stats().tenant(&t.id).unwrap_or_default();
                out.push(serde_json::json!({
                    "tenant": t.id.as_str(),
                    "configured": configured(&t.id),
                    "pool": self.pool_names.get(i),
                    "weight": t.weight.get(),
                    "queued": t.queued,
                    "in_flight": t.in_flight,
                    "credit": t.credit,
                    "oldest_queued_ms": age.map(|a| a.as_millis() as u64),
                    "served_tokens": served,
                    "served_share": (total_served > 0)
                        .then(|| served as f64 / total_served as f64),
                    "entitled_share": t.weight.get() / total_weight,
                    "estimate_error_mean": stats.mean_ratio(),
                    "reconciled": stats.count,
                }));
            }
        }
        serde_json::json!({ "tenants": out })
    }
}

type Res = Result<Response<ResponseBody>, Error>;

fn json(value: &serde_json::Value) -> Response<ResponseBody> {
    crate::response::json(StatusCode::OK, value)
}

/// Runs a reload off the async threads and renders its answer.
async fn reload(hook: Option<Arc<dyn Reload>>) -> Res {
    let Some(hook) = hook else {
        return Err(ReloadError::NoFile.into());
    };
    match tokio::task::spawn_blocking(move || hook.reload()).await {
        Ok(Ok(summary)) => Ok(json(&summary)),
        Ok(Err(e)) => Err(e.into()),
        Err(_) => Err(Error::internal("the reload task panicked")),
    }
}

impl<S, B> crate::stage::Stage<Request<B>, S> for Admin
where
    S: crate::stage::Below<Request<B>, Response<ResponseBody>, Error>,
    B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<crate::response::BoxError>,
{
    type Down = Request<B>;

    /// Every path not under `/admin/` passes on, unboxed.
    fn pass(&self, req: Request<B>) -> Result<Request<B>, Request<B>> {
        match req.uri().path().starts_with("/admin/") {
            true => Err(req),
            false => Ok(req),
        }
    }

    async fn call(self, req: Request<B>, _next: S) -> Res {
        let path = req.uri().path();
        let a = &self;
        let res = match &a.token {
            None => Err(OpsError::NotFound.into()),
            // The page itself: static, no data (see the module's docs).
            Some(_) if path == "/admin/ui" => match *req.method() {
                Method::GET | Method::HEAD => Ok(ui::page()),
                _ => Err(OpsError::MethodNotAllowed.into()),
            },
            Some(t) if !a.authorized(t, &req) => Err(OpsError::Unauthorized.into()),
            Some(_) if path == "/admin/tenants" && req.method() == Method::GET => {
                Ok(a.tenants_page(req.uri().query()))
            }
            Some(_) if path == "/admin/tenants" || path.starts_with("/admin/tenants/") => {
                let rest = path
                    .strip_prefix("/admin/tenants/")
                    .unwrap_or("")
                    .to_owned();
                let t = a.runtime.clone();
                return t.route(req, rest).await.map(tenants::no_store);
            }
            Some(_) => match (req.method(), path) {
                (&Method::GET, "/admin/state") => {
                    let query = state::Query::parse(req.uri().query());
                    let mut res = json(&a.state(&query));
                    res.headers_mut()
                        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
                    Ok(res)
                }
                (&Method::GET, "/admin/usage") => {
                    let spending = a.admission.budgets.spending().clone();
                    let q = req.uri().query().map(str::to_owned);
                    let as_csv = req
                        .headers()
                        .get(header::ACCEPT)
                        .and_then(|v| v.to_str().ok())
                        .is_some_and(|v| v.contains("text/csv"));
                    return usage::answer(spending, q, as_csv).await;
                }
                (&Method::POST, "/admin/reload") => {
                    let hook = a.reload.as_ref().and_then(Weak::upgrade);
                    return reload(hook).await;
                }
                (_, "/admin/reload" | "/admin/state" | "/admin/usage") => {
                    Err(OpsError::MethodNotAllowed.into())
                }
                _ => Err(OpsError::NotFound.into()),
            },
        };
        res
    }
}

#[cfg(test)]
mod tests {
    use super::same;

    #[test]
    fn constant_time_compare() {
        assert!(same(b"abc", b"abc"));
        assert!(!same(b"abc", b"abd"));
        assert!(!same(b"abc", b"ab"));
    }
}
