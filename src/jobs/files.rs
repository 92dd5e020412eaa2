//! `POST /v1/files` and `GET /v1/files/{id}/content`, streamed (see [`super::transfer`]): the
//! upload's `multipart/form-data` is parsed by `multer` as it arrives (quoted parameters, a
//! `;` in a filename, any part order), the `file` part checked line by line and written to the
//! store a chunk at a time, bounded by `[jobs] max_file_bytes` and `max_file_lines`; the
//! download reads one stored chunk per frame the client takes. Each holds one of the tenant's
//! transfer slots for its whole life (a download's: in its response body), and every chunk
//! either way waits for its bytes of the tenant's byte rate (`super::rate::ByteRate`).
//!
//! Invariants: an upload is visible (listed, readable, usable by a batch) only once stored
//! whole; a failed or abandoned upload leaves no chunk behind (dropped at once, or at the next
//! start after a crash); another tenant's file id reads as absent.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use futures_util::TryStreamExt;
use http::{header, HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyStream, StreamBody};

use super::store::{self, File, Store, CHUNK_BYTES};
use super::transfer::{self, Lines};
use super::{api, Error, Jobs};
use crate::context::Upload;
use crate::domain::TenantId;
use crate::response::ResponseBody;

/// Room for the form around the file (boundaries, part headers, the `purpose` field).
const FORM_OVERHEAD: u64 = 64 * 1024;

/// Where an upload's bytes go as they arrive: chunks of [`CHUNK_BYTES`] (SQLite rows, or
/// fields of one Redis hash).
struct Sink {
    store: Arc<dyn Store>,
    id: String,
    buf: BytesMut,
    seq: u32,
    committed: bool,
}

impl Sink {
    fn new(store: &Arc<dyn Store>, id: &str) -> Self {
        Self {
            store: store.clone(),
            id: id.to_owned(),
            buf: BytesMut::with_capacity(CHUNK_BYTES),
            seq: 0,
            committed: false,
        }
    }

    async fn push(&mut self, mut data: Bytes) -> Result<(), Error> {
        while !data.is_empty() {
            let n = (CHUNK_BYTES - self.buf.len()).min(data.len());
            self.buf.extend_from_slice(&data.split_to(n));
            if self.buf.len() == CHUNK_BYTES {
                self.flush().await?;
            }
        }
        Ok(())
    }

    async fn flush(&mut self) -> Result<(), Error> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = self.buf.split().freeze();
        self.store.put_chunk(&self.id, self.seq, chunk).await?;
        self.seq += 1;
        Ok(())
    }

    /// Makes the file `f` of `tenant` visible.
    async fn commit(mut self, tenant: &TenantId, f: &File) -> Result<(), Error> {
        self.flush().await?;
        self.store.commit_file(tenant, f).await?;
        self.committed = true;
        Ok(())
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        if self.committed || self.seq == 0 {
            return;
        }
        // Failed or abandoned (the client went away): its chunks go at once.
        let (store, id) = (self.store.clone(), std::mem::take(&mut self.id));
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                if let Err(e) = store.abort_file(&id).await {
                    tracing::warn!(error = %e, "jobs: cannot drop an abandoned upload's chunks");
                }
            });
        }
    }
}

fn bad(message: &str) -> Error {
    Error::invalid(format!("multipart body: {message}"), None)
}

/// A `multer` error as the client's fault it is.
fn form_error(e: multer::Error, max: u64) -> Error {
    match e {
        multer::Error::StreamSizeExceeded { .. } | multer::Error::FieldSizeExceeded { .. } => {
            Error::TooLarge(max)
        }
        multer::Error::StreamReadFailed(_) => bad("the upload could not be read to its end"),
        e => bad(&e.to_string()),
    }
}

/// `POST /v1/files` (see the module docs).
pub async fn upload(
    jobs: &Jobs,
    tenant: &TenantId,
    req: &Request<Bytes>,
) -> Result<Response<ResponseBody>, Error> {
    let c = jobs.config();
    let max = c.max_file_bytes;
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max + FORM_OVERHEAD) {
        return Err(Error::TooLarge(max));
    }
    let content_type = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let boundary = multer::parse_boundary(content_type)
        .map_err(|_| bad("content-type must be multipart/form-data with a boundary"))?;
    let _slot = jobs.transfers().take(tenant)?;
    // Refused before a byte is stored when the tenant's store is already full.
    jobs.check_limits(tenant, 0, 0).await?;
    let body = req
        .extensions()
        .get::<Upload>()
        .and_then(Upload::take)
        .ok_or_else(|| bad("no upload body"))?;
    let frames = BodyStream::new(body).try_filter_map(|f| async move { Ok(f.into_data().ok()) });
    let limits = multer::SizeLimit::new()
        .whole_stream(max + FORM_OVERHEAD)
        .per_field(max)
        .for_field("purpose", 1024);
    let mut form = multer::Multipart::with_constraints(
        frames,
        boundary,
        multer::Constraints::new().size_limit(limits),
    );
    let id = super::new_id("file-");
    let mut purpose = None;
    let mut stored: Option<(String, u64, Sink)> = None;
    while let Some(mut field) = form.next_field().await.map_err(|e| form_error(e, max))? {
        match field.name() {
            Some("purpose") => {
                purpose = Some(field.text().await.map_err(|e| form_error(e, max))?);
            }
            Some("file") if stored.is_none() => {
                let filename = field.file_name().unwrap_or("upload.jsonl").to_owned();
                let mut lines = Lines::new(c.max_file_lines, jobs.max_line());
                let mut sink = Sink::new(jobs.store(), &id);
                let mut bytes = 0u64;
                let who = tenant.clone();
                while let Some(chunk) = field.chunk().await.map_err(|e| form_error(e, max))? {
                    bytes += chunk.len() as u64;
                    if bytes > max {
                        return Err(Error::TooLarge(max));
                    }
                    // The tenant's byte rate: the next bytes are read from the client only
                    // once these fit (backpressure, not a buffer).
                    jobs.bytes().pace(&who, chunk.len() as u64).await;
                    lines.feed(&chunk)?;
                    sink.push(chunk).await?;
                }
                lines.finish()?;
                stored = Some((filename, bytes, sink));
            }
            // Other fields are read past and ignored (as OpenAI does).
            _ => {
                while field
                    .chunk()
                    .await
                    .map_err(|e| form_error(e, max))?
                    .is_some()
                {}
            }
        }
    }
    let purpose = purpose.unwrap_or_default();
    if purpose != "batch" {
        return Err(Error::invalid(
            "`purpose` must be `batch` (the only purpose fairgate stores files for)",
            Some("purpose"),
        ));
    }
    let (filename, bytes, sink) =
        stored.ok_or_else(|| Error::invalid("a `file` part is required", Some("file")))?;
    jobs.check_limits(tenant, 0, bytes).await?;
    let f = File {
        id,
        purpose,
        filename,
        bytes,
        created: store::now(),
    };
    sink.commit(tenant, &f).await?;
    Ok(api::json(StatusCode::OK, &api::file_doc(&f)))
}

/// `GET /v1/files/{id}/content` (see the module docs).
pub async fn download(
    jobs: &Jobs,
    tenant: &TenantId,
    id: &str,
) -> Result<Response<ResponseBody>, Error> {
    let slot = jobs.transfers().take(tenant)?;
    let store = jobs.store();
    let first = match store.file_chunk(tenant, id, 0).await? {
        Some(c) => c,
        // No chunk 0: an empty file, or no such file of this tenant.
        None => {
            store
                .file(tenant, id)
                .await?
                .ok_or(Error::NotFound("file"))?;
            Bytes::new()
        }
    };
    // Each chunk waits for its bytes of the tenant's rate before it is passed on.
    let who = tenant.clone();
    jobs.bytes().pace(&who, first.len() as u64).await;
    let (s, t, i, j) = (
        store.clone(),
        tenant.to_owned(),
        id.to_owned(),
        jobs.clone(),
    );
    let read: transfer::ChunkReader = Box::new(move |seq| {
        let (s, t, i, j, who) = (s.clone(), t.clone(), i.clone(), j.clone(), who.clone());
        Box::pin(async move {
            let chunk = s.file_chunk(&t, &i, seq).await.map_err(Error::from)?;
            if let Some(c) = &chunk {
                j.bytes().pace(&who, c.len() as u64).await;
            }
            Ok(chunk)
        })
    });
    let mut body = ResponseBody::boxed(StreamBody::new(transfer::download(first, read)));
    body.attach(Box::new(slot));
    let mut res = Response::new(body);
    res.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    Ok(res)
}
