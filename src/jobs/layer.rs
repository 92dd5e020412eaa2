//! The jobs stage as a tower layer (below `body`, above `route`): the jobs endpoints, a
//! `respond-async` request turned into a job, and a job re-entering the stack passed through
//! with fairgate's own refusals noted for the runner.

use std::sync::Arc;

use bytes::Bytes;
use http::{header, HeaderValue, Request, Response, StatusCode};

use super::rate::Requests;
use super::{api, Error, Jobs};
use crate::context::{Endpoint, JobRun};
use crate::response::ResponseBody;

/// The jobs stage: the jobs subsystem (`None`: `[jobs]` is off; `respond-async` is then
/// ignored, as RFC 7240 allows, and the jobs endpoints answer 404) and the request bucket its
/// files and batches calls take from.
#[derive(Clone)]
pub struct Deferring {
    jobs: Option<Jobs>,
    requests: Arc<dyn Requests>,
}

impl Deferring {
    /// The stage over `jobs`, charging `requests`.
    pub fn new(jobs: Option<Jobs>, requests: Arc<dyn Requests>) -> Self {
        Self { jobs, requests }
    }

    /// Whether `req` is a `respond-async` request this stage stores as a job (`prefer`).
    fn deferred(&self, req: &Request<Bytes>, prefer: Prefer) -> bool {
        self.jobs.is_some()
            && prefer.respond_async
            && req.method() == http::Method::POST
            && Endpoint::of_path(req.uri().path()).is_some()
    }
}

/// Tower layer of the jobs stage.
pub type Layer = crate::stage::Layer<Deferring>;

/// What `Prefer` asks for.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Prefer {
    /// `respond-async`.
    pub respond_async: bool,
    /// `wait=N` beside it: try synchronously first, a job only instead of a refusal.
    pub wait: bool,
}

impl Prefer {
    /// Parses every `Prefer` header (tokens case-insensitive, parameters ignored).
    pub fn of(headers: &http::HeaderMap) -> Self {
        const PREFER: http::HeaderName = http::HeaderName::from_static("prefer");
        let mut p = Prefer::default();
        for v in headers.get_all(PREFER) {
            let Ok(v) = v.to_str() else { continue };
            for pref in v.split(',') {
                let token = pref.split(';').next().unwrap_or("").trim();
                let name = token.split('=').next().unwrap_or("").trim();
                if name.eq_ignore_ascii_case("respond-async") {
                    p.respond_async = true;
                } else if name.eq_ignore_ascii_case("wait") {
                    p.wait = true;
                }
            }
        }
        p
    }
}

impl<S> crate::stage::Stage<Request<Bytes>, S> for Deferring
where
    S: crate::stage::Below<Request<Bytes>, Response<ResponseBody>, crate::Error> + Clone,
{
    /// Every request that is no job, no jobs endpoint and no `respond-async` to store passes
    /// on, unboxed.
    type Down = Request<Bytes>;

    fn pass(&self, req: Request<Bytes>) -> Result<Request<Bytes>, Request<Bytes>> {
        let passes = req.extensions().get::<JobRun>().is_none()
            && !api::is_jobs_path(req.uri().path())
            && !self.deferred(&req, Prefer::of(req.headers()));
        if passes {
            Ok(req)
        } else {
            Err(req)
        }
    }

    async fn call(
        self,
        req: Request<Bytes>,
        mut inner: S,
    ) -> Result<Response<ResponseBody>, crate::Error> {
        // A job re-entering the stack: note fairgate's own refusal for the runner.
        if let Some(run) = req.extensions().get::<JobRun>().cloned() {
            return inner.call(req).await.inspect_err(|e| {
                if e.never_sent() {
                    let _ = run.refused.set((e.status(), e.reason()));
                }
            });
        }
        // The jobs endpoints and a stored job are boxed on their own: inline, their futures
        // (the store's) would size every job's future.
        if api::is_jobs_path(req.uri().path()) {
            let jobs = self.jobs.ok_or(Error::Disabled)?;
            let requests = self.requests;
            return Box::pin(async move { api::handle(&jobs, &*requests, req).await }).await;
        }
        let prefer = Prefer::of(req.headers());
        match self.jobs {
            Some(jobs) if self.deferred(&req, prefer) => {
                Box::pin(respond_async(jobs, prefer, inner, req)).await
            }
            _ => inner.call(req).await,
        }
    }
}

/// A `respond-async` request: stored as a job, or with `wait` tried synchronously first.
async fn respond_async<S>(
    jobs: Jobs,
    prefer: Prefer,
    mut inner: S,
    req: Request<Bytes>,
) -> Result<Response<ResponseBody>, crate::Error>
where
    S: tower::Service<Request<Bytes>, Response = Response<ResponseBody>, Error = crate::Error>,
{
    let ctx = crate::context::of(&req)?;
    if ctx.request()?.stream {
        return Err(Error::Stream.into());
    }
    if !prefer.wait {
        return accept(&jobs, &ctx, &req).await;
    }
    // `wait`: synchronously if admitted; a job instead of a full-queue or deadline refusal.
    let (parts, body) = req.into_parts();
    let copy = Request::from_parts(parts.clone(), body.clone());
    match inner.call(Request::from_parts(parts, body)).await {
        // A full queue or an unmeetable deadline (`Reason::deferrable`): a job waits.
        Err(e) if e.reason().deferrable() => accept(&jobs, &ctx, &copy).await,
        other => other,
    }
}

/// Stores `req` as a job of the caller: 202, `Location`, `Preference-Applied`.
async fn accept(
    jobs: &Jobs,
    ctx: &crate::context::Ctx,
    req: &Request<Bytes>,
) -> Result<Response<ResponseBody>, crate::Error> {
    let tenant = ctx.identity()?.tenant.id.clone();
    let body = req.body().clone();
    jobs.check_limits(&tenant, 1, body.len() as u64).await?;
    let id = super::new_id("job_");
    let job = super::store::NewJob {
        id: id.clone(),
        batch: None,
        method: req.method().as_str().to_owned(),
        path: req.uri().path().to_owned(),
        body: body.to_vec(),
    };
    jobs.store()
        .insert(&tenant, vec![job], None)
        .await
        .map_err(Error::from)?;
    jobs.wake();
    let doc = serde_json::json!({"id": id, "object": "fairgate.job", "status": "queued"});
    let mut res = api::json(StatusCode::ACCEPTED, &doc);
    let h = res.headers_mut();
    if let Ok(v) = HeaderValue::try_from(format!("{}{id}", super::JOBS_PATH)) {
        h.insert(header::LOCATION, v);
    }
    h.insert(
        "preference-applied",
        HeaderValue::from_static("respond-async"),
    );
    h.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    Ok(res)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefer_parses_respond_async_and_wait() {
        let mut h = http::HeaderMap::new();
        assert_eq!(Prefer::of(&h), Prefer::default());
        h.insert("prefer", HeaderValue::from_static("Respond-Async, wait=10"));
        assert_eq!(
            Prefer::of(&h),
            Prefer {
                respond_async: true,
                wait: true
            }
        );
        h.insert("prefer", HeaderValue::from_static("return=minimal"));
        assert!(!Prefer::of(&h).respond_async);
    }
}
