//! A minimal `multipart/form-data` reader for `POST /v1/files`: text fields and one `file`
//! part, from a body already read (and bounded by `[server] max_body_bytes`) by `body`.

use http::header;

use super::Error;

/// A parsed form.
#[derive(Debug, Default)]
pub struct Form {
    /// Text fields in order.
    pub fields: Vec<(String, String)>,
    /// The `file` part: (filename, content).
    pub file: Option<(String, Vec<u8>)>,
}

impl Form {
    /// The first field named `name`.
    pub fn field(&self, name: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

fn bad(message: &str) -> Error {
    Error::invalid(format!("multipart body: {message}"), None)
}

/// The boundary of a `multipart/form-data` content type.
fn boundary(headers: &http::HeaderMap) -> Result<String, Error> {
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let mut parts = ct.split(';');
    if !parts
        .next()
        .is_some_and(|m| m.trim().eq_ignore_ascii_case("multipart/form-data"))
    {
        return Err(bad("content-type must be multipart/form-data"));
    }
    parts
        .filter_map(|p| p.trim().split_once('='))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case("boundary"))
        .map(|(_, v)| v.trim().trim_matches('"').to_owned())
        .filter(|b| !b.is_empty() && b.len() <= 200)
        .ok_or_else(|| bad("no boundary"))
}

fn find(hay: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    hay.get(from..)?
        .windows(needle.len())
        .position(|w| w == needle)
        .map(|p| p + from)
}

/// A `name="…"` parameter of a `Content-Disposition` line.
fn param<'a>(disposition: &'a str, name: &str) -> Option<&'a str> {
    disposition.split(';').find_map(|p| {
        let (k, v) = p.trim().split_once('=')?;
        k.trim()
            .eq_ignore_ascii_case(name)
            .then(|| v.trim().trim_matches('"'))
    })
}

/// Parses `body` as `multipart/form-data`.
pub fn parse(headers: &http::HeaderMap, body: &[u8]) -> Result<Form, Error> {
    let delim = format!("--{}", boundary(headers)?).into_bytes();
    let mut form = Form::default();
    let mut at = find(body, &delim, 0).ok_or_else(|| bad("no part"))? + delim.len();
    loop {
        if body.get(at..at + 2) == Some(b"--") {
            return Ok(form);
        }
        let head_start = at + 2; // CRLF after the delimiter
        let head_end = find(body, b"\r\n\r\n", head_start).ok_or_else(|| bad("part headers"))?;
        let head = std::str::from_utf8(&body[head_start..head_end])
            .map_err(|_| bad("part headers are not UTF-8"))?;
        let mut next_delim = b"\r\n".to_vec();
        next_delim.extend_from_slice(&delim);
        let content_start = head_end + 4;
        let end = find(body, &next_delim, content_start).ok_or_else(|| bad("unterminated part"))?;
        let content = &body[content_start..end];
        let disposition = head
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.trim()
                    .eq_ignore_ascii_case("content-disposition")
                    .then_some(v)
            })
            .ok_or_else(|| bad("part without content-disposition"))?;
        let name = param(disposition, "name").unwrap_or("");
        if name == "file" {
            let filename = param(disposition, "filename").unwrap_or("upload.jsonl");
            form.file = Some((filename.to_owned(), content.to_vec()));
        } else {
            let v = std::str::from_utf8(content).map_err(|_| bad("field is not UTF-8"))?;
            form.fields.push((name.to_owned(), v.to_owned()));
        }
        at = end + next_delim.len();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_fields_and_the_file() {
        let mut h = http::HeaderMap::new();
        h.insert(
            header::CONTENT_TYPE,
            "multipart/form-data; boundary=XyZ".parse().unwrap(),
        );
        let body = b"--XyZ\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n\
--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"in.jsonl\"\r\n\
Content-Type: application/octet-stream\r\n\r\n{\"a\":1}\n{\"b\":2}\n\r\n--XyZ--\r\n";
        let f = parse(&h, body).unwrap();
        assert_eq!(f.field("purpose"), Some("batch"));
        let (name, content) = f.file.unwrap();
        assert_eq!(name, "in.jsonl");
        assert_eq!(content, b"{\"a\":1}\n{\"b\":2}\n");
        assert!(parse(
            &h,
            b"--XyZ\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\nx"
        )
        .is_err());
        h.insert(header::CONTENT_TYPE, "application/json".parse().unwrap());
        assert!(parse(&h, body).is_err());
    }
}
