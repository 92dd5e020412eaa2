//! The jobs endpoints: an async job's status and result (`/v1/fairgate/jobs/{id}`), and
//! OpenAI's files and batches APIs (`/v1/files`, `/v1/batches`) in OpenAI's object shapes.
//! Every lookup is by (tenant, id): another tenant's id answers 404.

use crate::domain::TenantId;
use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};

use super::store::{self, File};
use super::{batch, files, Error, Jobs, JOBS_PATH, JOB_STATUS_HEADER};
use crate::response::ResponseBody;

/// Whether `path` is answered by this module.
pub fn is_jobs_path(path: &str) -> bool {
    path.starts_with(JOBS_PATH)
        || path == "/v1/files"
        || path.starts_with("/v1/files/")
        || path == "/v1/batches"
        || path.starts_with("/v1/batches/")
}

pub use crate::response::json;

/// Answers a request to a jobs endpoint; a files or batches call first takes one request of
/// the tenant's request bucket (`requests`).
pub async fn handle(
    jobs: &Jobs,
    requests: &dyn super::rate::Requests,
    req: Request<Bytes>,
) -> Result<Response<ResponseBody>, crate::Error> {
    let ctx = crate::context::of(&req)?;
    let tenant = ctx.identity()?.tenant.id.clone();
    if super::rate::charged(req.uri().path()) {
        requests
            .take(&tenant)
            .await
            .map_err(|retry_after| Error::RequestRate { retry_after })?;
    }
    Ok(route(jobs, &tenant, &req).await?)
}

async fn route(
    jobs: &Jobs,
    tenant: &TenantId,
    req: &Request<Bytes>,
) -> Result<Response<ResponseBody>, Error> {
    let path = req.uri().path().to_owned();
    let method = req.method().clone();
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let res = match (&method, segments.as_slice()) {
        (&Method::GET, ["v1", "fairgate", "jobs", id]) => job_status(jobs, tenant, id).await?,
        (&Method::DELETE, ["v1", "fairgate", "jobs", id]) => job_cancel(jobs, tenant, id).await?,
        (&Method::POST, ["v1", "files"]) => files::upload(jobs, tenant, req).await?,
        (&Method::GET, ["v1", "files"]) => list_files(jobs, tenant, req.uri().query()).await?,
        (&Method::GET, ["v1", "files", id]) => {
            let f = jobs
                .store()
                .file(tenant, id)
                .await?
                .ok_or(Error::NotFound("file"))?;
            json(StatusCode::OK, &file_doc(&f))
        }
        (&Method::GET, ["v1", "files", id, "content"]) => files::download(jobs, tenant, id).await?,
        (&Method::DELETE, ["v1", "files", id]) => {
            if !jobs.store().delete_file(tenant, id).await? {
                return Err(Error::NotFound("file"));
            }
            json(
                StatusCode::OK,
                &serde_json::json!({"id": id, "object": "file", "deleted": true}),
            )
        }
        (&Method::POST, ["v1", "batches"]) => batch::create(jobs, tenant, req.body()).await?,
        (&Method::GET, ["v1", "batches"]) => batch::list(jobs, tenant, req.uri().query()).await?,
        (&Method::GET, ["v1", "batches", id]) => json(
            StatusCode::OK,
            &batch::doc(jobs, tenant, id).await?.to_value(),
        ),
        (&Method::POST, ["v1", "batches", id, "cancel"]) => batch::cancel(jobs, tenant, id).await?,
        _ => return Err(Error::Method),
    };
    Ok(res)
}

async fn job_status(
    jobs: &Jobs,
    tenant: &TenantId,
    id: &str,
) -> Result<Response<ResponseBody>, Error> {
    let job = jobs
        .store()
        .job(tenant, id)
        .await?
        .ok_or(Error::NotFound("job"))?;
    match (job.state, job.status) {
        (state, Some(status)) if state.answered_yet() => {
            let mut res = Response::new(ResponseBody::full(job.response.unwrap_or_default()));
            *res.status_mut() =
                StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            let h = res.headers_mut();
            if let Some(v) = job.resp_type.and_then(|t| HeaderValue::try_from(t).ok()) {
                h.insert(header::CONTENT_TYPE, v);
            }
            h.insert(JOB_STATUS_HEADER, HeaderValue::from_static(state.as_str()));
            Ok(res)
        }
        (state, _) => {
            let status = if state == store::JobState::Cancelled {
                StatusCode::OK
            } else {
                StatusCode::ACCEPTED
            };
            let mut res = json(
                status,
                &serde_json::json!({"id": id, "object": "fairgate.job", "status": state.as_str()}),
            );
            let h = res.headers_mut();
            h.insert(JOB_STATUS_HEADER, HeaderValue::from_static(state.as_str()));
            if status == StatusCode::ACCEPTED {
                h.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            }
            Ok(res)
        }
    }
}

async fn job_cancel(
    jobs: &Jobs,
    tenant: &TenantId,
    id: &str,
) -> Result<Response<ResponseBody>, Error> {
    let state = jobs
        .store()
        .cancel(tenant, id)
        .await?
        .ok_or(Error::NotFound("job"))?;
    Ok(json(
        StatusCode::OK,
        &serde_json::json!({"id": id, "object": "fairgate.job", "status": state.as_str()}),
    ))
}

/// OpenAI's file object.
/// Most files one `GET /v1/files` lists (OpenAI's default and maximum `limit`).
pub const MAX_FILES_LISTED: usize = 10_000;

/// `GET /v1/files?purpose=&limit=&after=&order=desc`: the tenant's files, newest first (OpenAI's
/// list shape); `order=asc` is a 400 (not kept in that order).
async fn list_files(
    jobs: &Jobs,
    tenant: &TenantId,
    query: Option<&str>,
) -> Result<Response<ResponseBody>, Error> {
    let (mut after, mut purpose, mut limit) = (None, None, MAX_FILES_LISTED);
    for (k, v) in query
        .unwrap_or("")
        .split('&')
        .filter_map(|p| p.split_once('='))
    {
        match k {
            "after" => after = Some(v),
            "purpose" => purpose = Some(v),
            "limit" => {
                limit = v
                    .parse::<usize>()
                    .ok()
                    .filter(|n| (1..=MAX_FILES_LISTED).contains(n))
                    .ok_or_else(|| Error::invalid("`limit` must be 1 to 10000", Some("limit")))?;
            }
            "order" if v != "desc" => {
                return Err(Error::invalid(
                    "only `order=desc` is supported",
                    Some("order"),
                ))
            }
            _ => {}
        }
    }
    let mut files = jobs
        .store()
        .files(tenant, after, limit + 1, purpose)
        .await?;
    let has_more = files.len() > limit;
    files.truncate(limit);
    let data: Vec<_> = files.iter().map(file_doc).collect();
    Ok(json(
        StatusCode::OK,
        &serde_json::json!({
            "object": "list",
            "data": data,
            "first_id": files.first().map(|f| &f.id),
            "last_id": files.last().map(|f| &f.id),
            "has_more": has_more,
        }),
    ))
}

pub fn file_doc(f: &File) -> serde_json::Value {
    serde_json::json!({
        "id": f.id,
        "object": "file",
        "bytes": f.bytes,
        "created_at": f.created,
        "expires_at": null,
        "filename": f.filename,
        "purpose": f.purpose,
        "status": "processed",
        "status_details": null,
    })
}
