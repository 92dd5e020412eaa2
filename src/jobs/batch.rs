//! OpenAI's Batch API over the job store: a batch is a set of jobs (its lines), validated up
//! front (a bad line fails the batch with errors naming the line, as OpenAI does), run by the
//! runner like any job, and finalized once no line is left: an output file (2xx answers) and
//! an error file (everything else, and lines cancelled before they ran), each line once, in
//! input order.
//!
//! Statuses: `in_progress` at creation (validation is synchronous), `failed` (validation),
//! `cancelling` → `cancelled`, `completed`.

use crate::domain::TenantId;
use bytes::Bytes;
use http::{Response, StatusCode};
use serde_json::{json, Value};

use super::store::{self, File, NewJob};
use super::{api, Error, Jobs};
use crate::response::ResponseBody;

/// Endpoints a batch may target.
pub const ENDPOINTS: &[&str] = &[
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/v1/responses",
];

/// Validation errors kept per batch (OpenAI lists a bounded number too).
const MAX_ERRORS: usize = 100;

fn field<'a>(v: &'a Value, name: &'static str) -> Result<&'a str, Error> {
    v.get(name)
        .and_then(Value::as_str)
        .ok_or_else(|| Error::invalid(format!("`{name}` is required (a string)"), Some(name)))
}

/// One line's error, OpenAI's shape.
fn line_error(line: usize, code: &str, message: String, param: Option<&str>) -> Value {
    json!({"code": code, "message": message, "param": param, "line": line})
}

pub mod record;

pub use record::{Batch, BatchStatus, RequestCounts};

/// Checks the input file; the lines as jobs, or the errors naming the lines.
pub fn validate(batch: &str, endpoint: &str, content: &[u8]) -> Result<Vec<NewJob>, Vec<Value>> {
    let mut v = Validator::new(batch, endpoint);
    for raw in content.split(|&b| b == b'\n') {
        if v.full() {
            break;
        }
        v.line(raw);
    }
    v.finish()
}

/// Checks a batch input file line by line as its chunks are read (see [`validate`]), keeping
/// only the jobs made so far, never the file.
pub struct Validator<'a> {
    batch: &'a str,
    endpoint: &'a str,
    jobs: Vec<NewJob>,
    errors: Vec<Value>,
    seen: std::collections::HashSet<String>,
    /// Lines seen (blank ones included: they keep their numbers).
    lines: usize,
}

impl<'a> Validator<'a> {
    /// A validator of the lines of `batch` for `endpoint`.
    pub fn new(batch: &'a str, endpoint: &'a str) -> Self {
        Self {
            batch,
            endpoint,
            jobs: Vec::new(),
            errors: Vec::new(),
            seen: std::collections::HashSet::new(),
            lines: 0,
        }
    }

    /// Whether enough errors were found to stop reading.
    pub fn full(&self) -> bool {
        self.errors.len() >= MAX_ERRORS
    }

    /// Checks the next line (without its newline).
    pub fn line(&mut self, raw: &[u8]) {
        let (i, batch, endpoint) = (self.lines, self.batch, self.endpoint);
        self.lines += 1;
        let n = i + 1;
        if raw.iter().all(u8::is_ascii_whitespace) {
            return;
        }
        let (jobs, errors, seen) = (&mut self.jobs, &mut self.errors, &mut self.seen);
        let v: Value = match serde_json::from_slice(raw) {
            Ok(v @ Value::Object(_)) => v,
            _ => {
                errors.push(line_error(
                    n,
                    "invalid_json_line",
                    format!("line {n} is not a JSON object"),
                    None,
                ));
                return;
            }
        };
        let custom_id = v.get("custom_id").and_then(Value::as_str).unwrap_or("");
        let body = v.get("body").filter(|b| b.is_object());
        let problem = if custom_id.is_empty() {
            Some((
                "missing_required_parameter",
                "custom_id",
                "a non-empty string `custom_id` is required".to_owned(),
            ))
        } else if !seen.insert(custom_id.to_owned()) {
            Some((
                "duplicate_custom_id",
                "custom_id",
                format!("`custom_id` {custom_id:?} appears more than once"),
            ))
        } else if v.get("method").and_then(Value::as_str) != Some("POST") {
            Some((
                "invalid_value",
                "method",
                "`method` must be POST".to_owned(),
            ))
        } else if v.get("url").and_then(Value::as_str) != Some(endpoint) {
            Some((
                "mismatched_endpoint",
                "url",
                format!("`url` must be the batch's endpoint {endpoint}"),
            ))
        } else if !body.is_some_and(|b| b.get("model").is_some_and(Value::is_string)) {
            Some((
                "missing_required_parameter",
                "body.model",
                "`body` must be an object with a string `model`".to_owned(),
            ))
        } else if body.and_then(|b| b.get("stream")).and_then(Value::as_bool) == Some(true) {
            Some((
                "invalid_value",
                "body.stream",
                "`stream: true` is not supported in a batch".to_owned(),
            ))
        } else {
            None
        };
        match (problem, body) {
            (Some((code, param, message)), _) => {
                errors.push(line_error(
                    n,
                    code,
                    format!("line {n}: {message}"),
                    Some(param),
                ));
            }
            (None, Some(body)) => jobs.push(NewJob {
                id: super::new_id("job_"),
                batch: Some((batch.to_owned(), i as u32, custom_id.to_owned())),
                method: "POST".to_owned(),
                path: endpoint.to_owned(),
                body: serde_json::to_vec(body).unwrap_or_default(),
            }),
            (None, None) => {}
        }
    }

    /// The jobs of a valid file, or its errors.
    pub fn finish(mut self) -> Result<Vec<NewJob>, Vec<Value>> {
        if self.jobs.is_empty() && self.errors.is_empty() {
            self.errors.push(line_error(
                1,
                "empty_file",
                "the input file has no request".to_owned(),
                None,
            ));
        }
        if self.errors.is_empty() {
            Ok(self.jobs)
        } else {
            Err(self.errors)
        }
    }
}

/// Validates the stored file `input` of `tenant` for `batch` (see [`validate`]), read one chunk
/// at a time: what is held is the jobs made so far and one partial line, never the file.
async fn validate_stored(
    jobs: &Jobs,
    tenant: &TenantId,
    input: &str,
    batch: &str,
    endpoint: &str,
) -> Result<Result<Vec<NewJob>, Vec<Value>>, Error> {
    let mut v = Validator::new(batch, endpoint);
    let mut partial: Vec<u8> = Vec::new();
    let mut seq = 0;
    while let Some(chunk) = jobs.store().file_chunk(tenant, input, seq).await? {
        seq += 1;
        let mut data = &chunk[..];
        while let Some(end) = data.iter().position(|&b| b == b'\n') {
            if partial.is_empty() {
                v.line(&data[..end]);
            } else {
                partial.extend_from_slice(&data[..end]);
                v.line(&partial);
                partial.clear();
            }
            data = &data[end + 1..];
            if v.full() {
                return Ok(v.finish());
            }
        }
        partial.extend_from_slice(data);
    }
    v.line(&partial);
    Ok(v.finish())
}

/// `POST /v1/batches`.
pub async fn create(
    jobs: &Jobs,
    tenant: &TenantId,
    body: &Bytes,
) -> Result<Response<ResponseBody>, Error> {
    let req: Value = serde_json::from_slice(body)
        .map_err(|_| Error::invalid("request body must be a JSON object", None))?;
    let input = field(&req, "input_file_id")?;
    let endpoint = field(&req, "endpoint")?;
    let window = field(&req, "completion_window")?;
    let window_secs = window_secs(window).ok_or_else(|| {
        Error::invalid(
            "`completion_window` must be a duration such as `24h` (units s, m, h, d; at most 7d)",
            Some("completion_window"),
        )
    })?;
    if !ENDPOINTS.contains(&endpoint) {
        return Err(Error::invalid(
            format!("`endpoint` must be one of {}", ENDPOINTS.join(", ")),
            Some("endpoint"),
        ));
    }
    let file = jobs
        .store()
        .file(tenant, input)
        .await?
        .ok_or(Error::NotFound("file"))?;
    if file.purpose != "batch" {
        return Err(Error::invalid(
            "the input file's purpose must be `batch`",
            Some("input_file_id"),
        ));
    }
    let id = super::new_id("batch_");
    let now = store::now();
    let mut doc = Batch {
        id: id.clone(),
        object: "batch".to_owned(),
        endpoint: endpoint.to_owned(),
        model: None,
        errors: None,
        input_file_id: input.to_owned(),
        completion_window: window.to_owned(),
        status: BatchStatus::InProgress,
        output_file_id: None,
        error_file_id: None,
        created_at: now,
        in_progress_at: Some(now),
        expires_at: Some(now + window_secs),
        finalizing_at: None,
        completed_at: None,
        failed_at: None,
        expired_at: None,
        cancelling_at: None,
        cancelled_at: None,
        request_counts: RequestCounts::default(),
        metadata: req.get("metadata").cloned().unwrap_or(Value::Null),
    };
    match validate_stored(jobs, tenant, input, &id, endpoint).await? {
        Ok(lines) => {
            let bytes: u64 = lines.iter().map(|l| l.body.len() as u64).sum();
            jobs.check_limits(tenant, lines.len() as u64, bytes).await?;
            doc.request_counts.total = lines.len() as u64;
            jobs.store()
                .insert(tenant, lines, Some((id.clone(), doc.to_json())))
                .await?;
            jobs.wake();
        }
        Err(errors) => {
            doc.status = BatchStatus::Failed;
            doc.in_progress_at = None;
            doc.failed_at = Some(now);
            doc.errors = Some(json!({"object": "list", "data": errors}));
            jobs.store()
                .insert_failed_batch(tenant, &id, &doc.to_json())
                .await?;
        }
    }
    Ok(api::json(StatusCode::OK, &doc.to_value()))
}

/// A batch as OpenAI shows it, with its current request counts.
pub async fn doc(jobs: &Jobs, tenant: &TenantId, id: &str) -> Result<Batch, Error> {
    let raw = jobs
        .store()
        .batch(tenant, id)
        .await?
        .ok_or(Error::NotFound("batch"))?;
    with_counts(jobs, id, &raw).await
}

/// A stored batch document, or the error a corrupt record is (never a default, which a later
/// update would store as if it were the batch).
fn stored(raw: &str) -> Result<Batch, Error> {
    match Batch::parse(raw) {
        Some(doc) => Ok(doc),
        None => {
            tracing::warn!(
                bytes = raw.len(),
                "jobs: a stored batch document is corrupt"
            );
            Err(Error::Store(store::StoreError::Shape))
        }
    }
}

async fn with_counts(jobs: &Jobs, id: &str, raw: &str) -> Result<Batch, Error> {
    let mut doc = stored(raw)?;
    let c = jobs.store().counts(id).await?;
    if c.total > 0 {
        doc.request_counts = RequestCounts {
            total: c.total,
            completed: c.completed,
            failed: c.failed,
        };
    }
    Ok(doc)
}

/// `GET /v1/batches?after=&limit=`.
pub async fn list(
    jobs: &Jobs,
    tenant: &TenantId,
    query: Option<&str>,
) -> Result<Response<ResponseBody>, Error> {
    let mut after = None;
    let mut limit = 20usize;
    for (k, v) in query
        .unwrap_or("")
        .split('&')
        .filter_map(|p| p.split_once('='))
    {
        match k {
            "after" => after = Some(v.to_owned()),
            "limit" => limit = v.parse().unwrap_or(20).clamp(1, 100),
            _ => {}
        }
    }
    let raws = jobs
        .store()
        .batches(tenant, after.as_deref(), limit + 1)
        .await?;
    let has_more = raws.len() > limit;
    let mut data = Vec::new();
    for raw in raws.iter().take(limit) {
        let id = stored(raw)?.id;
        data.push(with_counts(jobs, &id, raw).await?.to_value());
    }
    let first = data.first().map(|d| d["id"].clone());
    let last = data.last().map(|d| d["id"].clone());
    Ok(api::json(
        StatusCode::OK,
        &json!({"object": "list", "data": data, "first_id": first, "last_id": last, "has_more": has_more}),
    ))
}

/// `POST /v1/batches/{id}/cancel`: queued lines are cancelled, running ones finish.
pub async fn cancel(
    jobs: &Jobs,
    tenant: &TenantId,
    id: &str,
) -> Result<Response<ResponseBody>, Error> {
    let raw = jobs
        .store()
        .batch(tenant, id)
        .await?
        .ok_or(Error::NotFound("batch"))?;
    let mut doc = stored(&raw)?;
    if doc.status == BatchStatus::InProgress {
        doc.status = BatchStatus::Cancelling;
        doc.cancelling_at = Some(store::now());
        let doc = doc.to_json();
        if jobs.store().cancel_batch(tenant, id, &doc).await? {
            finalize_if_done(jobs, id).await?;
        }
    }
    Ok(api::json(
        StatusCode::OK,
        &self::doc(jobs, tenant, id).await?.to_value(),
    ))
}

/// Once no line of batch `id` is queued or running: writes its output and error files and
/// moves it to `completed` (or `cancelled`). Idempotent and exactly once: the files and the
/// final status are stored by one compare-and-set on the status read here (another caller, on
/// this replica or another, that got there first makes this one a no-op).
pub async fn finalize_if_done(jobs: &Jobs, id: &str) -> Result<(), Error> {
    let store = jobs.store();
    if store.unfinished(id).await? {
        return Ok(());
    }
    let Some(tenant) = store.batch_tenant(id).await? else {
        return Ok(());
    };
    let tenant = TenantId::new(tenant);
    let Some(raw) = store.batch(&tenant, id).await? else {
        return Ok(());
    };
    let mut doc = stored(&raw)?;
    // An expired batch was stopped like a cancelled one (`expire_due`), marked by `expired_at`.
    let expiring = doc.status == BatchStatus::Finalizing && doc.expired_at.is_some();
    let cancelling = doc.status == BatchStatus::Cancelling || expiring;
    if !(cancelling || doc.status == BatchStatus::InProgress) {
        return Ok(());
    }
    let (code, why) = if expiring {
        (
            "batch_expired",
            "the batch's completion window ended before this request ran",
        )
    } else {
        (
            "batch_cancelled",
            "the batch was cancelled before this request ran",
        )
    };
    let expected = if cancelling {
        BatchStatus::Cancelling
    } else {
        BatchStatus::InProgress
    };
    let (mut out, mut err) = (Vec::new(), Vec::new());
    for line in store.lines(id).await? {
        let body = line.response.as_deref().map(|b| {
            serde_json::from_slice::<Value>(b)
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(b).into_owned()))
        });
        let (record, ok) = match (line.state, line.status) {
            (store::JobState::Cancelled, _) | (_, None) => (
                json!({"id": format!("batch_req_{}", line.id), "custom_id": line.custom_id,
                       "response": null,
                       "error": {"code": code, "message": why}}),
                false,
            ),
            (_, Some(status)) => (
                json!({"id": format!("batch_req_{}", line.id), "custom_id": line.custom_id,
                       "response": {"status_code": status, "request_id": line.id, "body": body},
                       "error": null}),
                (200..300).contains(&status),
            ),
        };
        let target = if ok { &mut out } else { &mut err };
        target.extend_from_slice(record.to_string().as_bytes());
        target.push(b'\n');
    }
    let now = store::now();
    let mut files = Vec::new();
    for (content, key) in [(out, "output"), (err, "error")] {
        if content.is_empty() {
            continue;
        }
        let f = File {
            id: super::new_id("file-"),
            purpose: "batch_output".to_owned(),
            filename: format!("{id}_{key}.jsonl"),
            bytes: content.len() as u64,
            created: now,
        };
        if key == "output" {
            doc.output_file_id = Some(f.id.clone());
        } else {
            doc.error_file_id = Some(f.id.clone());
        }
        files.push((f, content));
    }
    let status = if expiring {
        BatchStatus::Expired
    } else if cancelling {
        BatchStatus::Cancelled
    } else {
        BatchStatus::Completed
    };
    doc.finalized(status, now);
    if !store
        .finalize(
            id,
            expected.as_str(),
            &doc.to_json(),
            status.as_str(),
            files,
        )
        .await?
    {
        tracing::debug!(batch = id, "jobs: batch finalized by another caller");
    }
    Ok(())
}

/// Longest `completion_window` accepted. OpenAI accepts only `24h`; other durations are a
/// fairgate extension (a self-hosted provider's batch may have a deadline of its own).
pub const MAX_WINDOW_SECS: u64 = 7 * 24 * 3600;

/// `24h`, `90m`, `30s`, `2d` → seconds (positive, at most [`MAX_WINDOW_SECS`]).
fn window_secs(w: &str) -> Option<u64> {
    let (n, unit) = w.split_at(w.len().checked_sub(1)?);
    let n: u64 = n.parse().ok()?;
    let secs = n.checked_mul(match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return None,
    })?;
    (1..=MAX_WINDOW_SECS).contains(&secs).then_some(secs)
}

/// Stops every open batch whose completion window has ended: its queued lines will not run
/// (`batch_expired` in the error file), lines already running finish and are recorded, and once
/// none runs the batch is finalized as `expired` with what completed. Shows `finalizing`
/// meanwhile. Called by the runner every few seconds; the store finds the due batches by
/// expiry (a tenant's thousands of open batches are not each read every time).
pub async fn expire_due(jobs: &Jobs) -> Result<usize, Error> {
    let store = jobs.store();
    let mut expired = 0;
    for (tenant, id, raw) in store.due_batches(store::now()).await? {
        // A corrupt document is logged and skipped: it must not stop the others expiring.
        let Ok(mut doc) = stored(&raw) else { continue };
        doc.status = BatchStatus::Finalizing;
        doc.expired_at = Some(store::now());
        if store
            .cancel_batch(&TenantId::new(tenant), &id, &doc.to_json())
            .await?
        {
            expired += 1;
            finalize_if_done(jobs, &id).await?;
        }
    }
    Ok(expired)
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn a_corrupt_stored_batch_document_is_an_error_not_null() {
        for raw in ["", "not json", "null", "[]", r#"{"status":"in_progress"}"#] {
            assert!(
                matches!(stored(raw), Err(Error::Store(store::StoreError::Shape))),
                "{raw:?}"
            );
        }
        let b = r#"{"id":"b1","object":"batch","endpoint":"/v1/chat/completions","model":null,
            "errors":null,"input_file_id":"f","completion_window":"24h","status":"in_progress",
            "output_file_id":null,"error_file_id":null,"created_at":1,"in_progress_at":1,
            "expires_at":86401,"finalizing_at":null,"completed_at":null,"failed_at":null,
            "expired_at":null,"cancelling_at":null,"cancelled_at":null,
            "request_counts":{"total":2,"completed":0,"failed":0},"metadata":null}"#;
        let doc = stored(b).unwrap();
        assert_eq!(
            (doc.id.as_str(), doc.status),
            ("b1", BatchStatus::InProgress)
        );
        assert!(
            stored(&b.replace("in_progress", "running")).is_err(),
            "a status that is none of OpenAI's"
        );
        assert_eq!(stored(&doc.to_json()).unwrap(), doc, "stored and read back");
    }

    #[test]
    fn completion_windows_are_durations_up_to_a_week() {
        assert_eq!(window_secs("24h"), Some(86_400));
        assert_eq!(window_secs("90m"), Some(5_400));
        assert_eq!(window_secs("2s"), Some(2));
        assert_eq!(window_secs("7d"), Some(MAX_WINDOW_SECS));
        for bad in [
            "",
            "h",
            "0h",
            "8d",
            "24",
            "24 h",
            "-1h",
            "1w",
            "99999999999999999999d",
        ] {
            assert_eq!(window_secs(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_bad_line_fails_validation_naming_the_line() {
        let ok = br#"{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":{"model":"m"}}"#;
        let lines = validate("b", "/v1/chat/completions", ok).unwrap();
        assert_eq!(lines.len(), 1);
        let bad = [
            &ok[..],
            b"\nnot json\n",
            br#"{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":{"model":"m"}}"#,
            b"\n",
            br#"{"custom_id":"c","method":"POST","url":"/v1/embeddings","body":{"model":"m"}}"#,
        ]
        .concat();
        let errors = validate("b", "/v1/chat/completions", &bad).unwrap_err();
        let lines: Vec<_> = errors.iter().map(|e| e["line"].as_u64().unwrap()).collect();
        assert_eq!(lines, [2, 3, 4]);
        assert_eq!(errors[1]["code"], "duplicate_custom_id");
        assert_eq!(errors[2]["code"], "mismatched_endpoint");
        assert!(
            validate("b", "/v1/chat/completions", b"\n\n").is_err(),
            "empty"
        );
    }
}
