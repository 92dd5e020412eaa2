//! `GET /admin/ui`: the live fairness console, one self-contained page (`ui.html`: HTML, CSS
//! and JS embedded in the binary; no CDN, no external font — fairgate runs air-gapped).
//!
//! The page takes the admin token from its URL fragment (`/admin/ui#token=TOKEN`: a fragment
//! never reaches the server or its logs; the page then removes it from the address bar), else
//! asks for it once, and keeps it in `sessionStorage`. It reads `/admin/state` once a second
//! with `Authorization: Bearer TOKEN`; a 401 shows an error and asks again.
//!
//! Invariants: the page holds no data, so it is served without the token (while the admin API
//! is on; off, it is 404 like every `/admin/` path); its Content-Security-Policy lets it talk to
//! its own origin only and load nothing from elsewhere.

use http::{header, HeaderValue, Response};

use crate::response::ResponseBody;

/// The page.
pub const PAGE: &str = include_str!("ui.html");

/// The page's response, with headers that keep it self-contained and uncached.
pub fn page() -> Response<ResponseBody> {
    let mut res = Response::new(ResponseBody::full(PAGE));
    let h = res.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; \
             connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; \
             frame-ancestors 'none'",
        ),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    res
}

#[cfg(test)]
mod tests {
    use super::PAGE;

    #[test]
    fn the_page_loads_nothing_from_elsewhere() {
        // The SVG namespace is a name, not a fetch.
        let page = PAGE.replace("\"http://www.w3.org/2000/svg\"", "");
        for needle in [
            "http://", "https://", "//cdn", "@import", "<link", "src=", "url(",
        ] {
            assert!(!page.contains(needle), "the page refers to {needle}");
        }
        assert!(PAGE.contains("sessionStorage"));
        assert!(PAGE.contains("/admin/state"));
    }
}
