//! The one builder of a JSON answer of fairgate's own (errors, `/v1/models`, the jobs and
//! admin APIs): the status, `content-type: application/json`, the bytes in memory.

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};

use super::ResponseBody;

/// A JSON response of `value`.
pub fn json(status: StatusCode, value: &serde_json::Value) -> Response<ResponseBody> {
    json_bytes(status, serde_json::to_vec(value).unwrap_or_default())
}

/// A JSON response of bytes already serialized.
pub fn json_bytes(status: StatusCode, body: impl Into<Bytes>) -> Response<ResponseBody> {
    let mut res = Response::new(ResponseBody::full(body.into()));
    *res.status_mut() = status;
    res.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    res
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt;

    use super::*;

    #[tokio::test]
    async fn a_json_answer_has_its_status_type_and_bytes() {
        let res = json(StatusCode::CREATED, &serde_json::json!({"a": 1}));
        assert_eq!(res.status(), StatusCode::CREATED);
        assert_eq!(res.headers()[header::CONTENT_TYPE], "application/json");
        let body = res.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], br#"{"a":1}"#);
    }
}
