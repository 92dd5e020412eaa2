//! Route stage: picks the upstream pool for a request from its `model`, and answers
//! `GET /v1/models`: the names in config without a wildcard, and for upstreams routed by a
//! wildcard the provider's own list ([`catalog`]), each model listed only under the upstream it
//! routes to (first match wins, as routing does).
//!
//! Invariants: routing is first match over `[[upstreams]]` in config order, each upstream's
//! `models` globs in order (`*` = any run, `?` = any one byte); a JSON endpoint whose model
//! matches nothing gets 404 `model_not_found`; every other path is a 404 in OpenAI's shape.
//! Writes the context's [`Route`].

pub mod catalog;

use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};

use crate::body::is_json_endpoint;
use crate::error::ApiError;
use crate::response::ResponseBody;
use crate::upstream::Upstream;

pub use crate::context::Route;

/// Route stage errors.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No upstream serves the model.
    #[error("the model `{0}` does not exist or you do not have access to it")]
    ModelNotFound(String),
    /// The path is not an endpoint fairgate serves.
    #[error("unknown request URL: {0}")]
    UnknownUrl(String),
    /// A known endpoint with the wrong method.
    #[error("method {0} is not allowed for this endpoint")]
    MethodNotAllowed(Method),
}

impl ApiError for Error {
    fn status(&self) -> StatusCode {
        match self {
            Error::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
            _ => StatusCode::NOT_FOUND,
        }
    }
    fn kind(&self) -> &'static str {
        "invalid_request_error"
    }
    fn code(&self) -> &'static str {
        match self {
            Error::ModelNotFound(_) => "model_not_found",
            Error::UnknownUrl(_) => "unknown_url",
            Error::MethodNotAllowed(_) => "method_not_allowed",
        }
    }
    fn reason(&self) -> crate::error::Reason {
        crate::error::Reason::NoRoute
    }
}

/// Glob match: `*` matches any run (also empty), `?` exactly one byte, anything else itself.
pub fn glob_match(pattern: &str, name: &str) -> bool {
    let (p, n) = (pattern.as_bytes(), name.as_bytes());
    let (mut pi, mut ni) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ni < n.len() {
        if pi < p.len() && (p[pi] == b'?' || p[pi] == n[ni]) {
            pi += 1;
            ni += 1;
        } else if pi < p.len() && p[pi] == b'*' {
            star = Some((pi, ni));
            pi += 1;
        } else if let Some((sp, sn)) = star {
            pi = sp + 1;
            ni = sn + 1;
            star = Some((sp, sn + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == b'*')
}

/// The routing table: upstreams in config order, the explicit names (with the upstream that
/// lists them) and the providers' lists of wildcard-routed upstreams.
#[derive(Debug)]
pub struct Router {
    upstreams: Vec<Arc<Upstream>>,
    names: Vec<(String, usize)>,
    catalog: catalog::Catalog,
}

impl Router {
    /// Builds the table; `/v1/models` lists the patterns that contain no wildcard, and the
    /// providers' own lists for the upstreams with one.
    pub fn new(upstreams: Vec<Arc<Upstream>>) -> Self {
        let mut names: Vec<(String, usize)> = Vec::new();
        for (i, u) in upstreams.iter().enumerate() {
            for m in &u.models {
                if !catalog::is_glob(m) && !names.iter().any(|(n, _)| n == m) {
                    names.push((m.clone(), i));
                }
            }
        }
        let catalog = catalog::Catalog::new(&upstreams);
        Self {
            upstreams,
            names,
            catalog,
        }
    }

    /// Every model `/v1/models` lists, in config order: an upstream's explicit names, then the
    /// models of its provider's list that route to it. Duplicates are listed once.
    async fn listed(&self) -> Vec<serde_json::Value> {
        let fetched = if self.catalog.is_empty() {
            Vec::new()
        } else {
            self.catalog.current().await
        };
        let mut seen = std::collections::HashSet::new();
        let mut data = Vec::new();
        for (i, u) in self.upstreams.iter().enumerate() {
            for (n, _) in self.names.iter().filter(|(_, at)| *at == i) {
                if seen.insert(n.clone()) {
                    data.push(serde_json::json!({
                        "id": n, "object": "model", "created": 0, "owned_by": u.name,
                    }));
                }
            }
            for (_, models) in fetched.iter().filter(|(at, _)| *at == i) {
                for m in models.iter() {
                    if self.route(&m.id).map(|r| r.pool) == Some(i) && seen.insert(m.id.clone()) {
                        data.push(serde_json::json!({
                            "id": m.id, "object": "model", "created": m.created,
                            "owned_by": m.owned_by.as_deref().unwrap_or(&u.name),
                        }));
                    }
                }
            }
        }
        data
    }

    /// The first upstream whose patterns match `model`.
    pub fn route(&self, model: &str) -> Option<Route> {
        self.upstreams
            .iter()
            .enumerate()
            .find(|(_, u)| u.models.iter().any(|p| glob_match(p, model)))
            .map(|(pool, _)| Route { pool })
    }

    async fn answer(&self, method: Method, path: String) -> Result<Response<ResponseBody>, Error> {
        if method != Method::GET {
            return Err(Error::MethodNotAllowed(method));
        }
        let data = self.listed().await;
        let value = match path.strip_prefix("/v1/models/") {
            None => serde_json::json!({ "object": "list", "data": data }),
            Some(id) => match data.into_iter().find(|m| m["id"] == id) {
                Some(m) => m,
                None => return Err(Error::ModelNotFound(id.to_owned())),
            },
        };
        Ok(crate::response::json(http::StatusCode::OK, &value))
    }
}

/// What the route stage does with a request ([`decide`]).
#[derive(Debug)]
pub enum Decision {
    /// A JSON endpoint whose model routes to this pool: passed on.
    Pass(Route),
    /// `/v1/models` (or one model of it): answered here.
    Models,
    /// Refused here.
    Refuse(crate::Error),
}

/// The route stage's decision for `req` (a plain function of the router and the request).
pub fn decide<B>(router: &Router, req: &Request<B>) -> Decision {
    let path = req.uri().path();
    if path == "/v1/models" || path.starts_with("/v1/models/") {
        return Decision::Models;
    }
    if !is_json_endpoint(req.method(), path) {
        let e = if is_json_endpoint(&Method::POST, path) {
            Error::MethodNotAllowed(req.method().clone())
        } else {
            Error::UnknownUrl(path.to_owned())
        };
        return Decision::Refuse(e.into());
    }
    let ctx = match crate::context::of(req) {
        Ok(ctx) => ctx,
        Err(e) => return Decision::Refuse(e),
    };
    let parsed = match ctx.request() {
        Ok(p) => p,
        Err(e) => return Decision::Refuse(e),
    };
    match router.route(&parsed.model) {
        Some(route) => Decision::Pass(route),
        None => Decision::Refuse(Error::ModelNotFound(parsed.model.clone()).into()),
    }
}

/// The route stage: the routing table of the generation.
#[derive(Clone, Debug)]
pub struct Routing(Arc<Router>);

impl From<Arc<Router>> for Routing {
    fn from(router: Arc<Router>) -> Self {
        Self(router)
    }
}

/// Tower layer of the route stage.
pub type Layer = crate::stage::Layer<Routing>;

type Res = Result<Response<ResponseBody>, crate::Error>;

impl<S> crate::stage::Stage<Request<Bytes>, S> for Routing
where
    S: crate::stage::Below<Request<Bytes>, Response<ResponseBody>, crate::Error>,
{
    /// A routed model (every proxied request) passes on with its route written, unboxed.
    type Down = Request<Bytes>;

    fn pass(&self, req: Request<Bytes>) -> Result<Request<Bytes>, Request<Bytes>> {
        match decide(&self.0, &req) {
            Decision::Pass(route) => match crate::context::of(&req) {
                Ok(ctx) => {
                    ctx.set_route(route);
                    Ok(req)
                }
                Err(_) => Err(req),
            },
            _ => Err(req),
        }
    }

    async fn call(self, req: Request<Bytes>, mut next: S) -> Res {
        match decide(&self.0, &req) {
            Decision::Models => {
                let (method, path) = (req.method().clone(), req.uri().path().to_owned());
                self.0.answer(method, path).await.map_err(Into::into)
            }
            Decision::Refuse(e) => Err(e),
            Decision::Pass(route) => {
                crate::context::of(&req)?.set_route(route);
                next.call(req).await
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upstream(name: &str, models: &str) -> Arc<Upstream> {
        let cfg = toml::from_str::<crate::config::UpstreamConfig>(&format!(
            "name = \"{name}\"\nbase_url = \"http://a/v1\"\nmodels = {models}\n"
        ))
        .unwrap()
        .resolved();
        Arc::new(Upstream::from_config(&cfg, 0, 1, |_| None).unwrap())
    }

    #[test]
    fn router_first_match_wins() {
        let a = upstream("a", r#"["gpt-*", "exact"]"#);
        let b = upstream("b", r#"["*"]"#);
        let router = Router::new(vec![a, b]);
        assert_eq!(router.route("gpt-4o").unwrap().pool, 0);
        assert_eq!(router.route("exact").unwrap().pool, 0);
        assert_eq!(router.route("claude").unwrap().pool, 1);
    }

    #[test]
    fn globs() {
        assert!(glob_match("*", "gpt-4o"));
        assert!(glob_match("*", ""));
        assert!(glob_match("gpt-4*", "gpt-4o-mini"));
        assert!(!glob_match("gpt-4*", "gpt-3.5"));
        assert!(glob_match("gpt-?o", "gpt-4o"));
        assert!(!glob_match("gpt-?o", "gpt-44o"));
        assert!(glob_match("*-mini", "gpt-4o-mini"));
        assert!(glob_match("a*b*c", "axxbyyc"));
        assert!(!glob_match("a*b*c", "axxbyy"));
        assert!(glob_match("exact", "exact"));
        assert!(!glob_match("exact", "exactly"));
        assert!(glob_match("**x", "x"));
    }
}
