//! Header hygiene between client and provider: hop-by-hop headers never cross the proxy, and the
//! tenant's credentials never go upstream.
//!
//! Headers cannot act as the operator: a client header that carries a credential or selects the
//! operator's provider account ([`is_credential`]: any `*authorization*`, `*api-key*`/`*apikey*`/
//! `*api_key*`, `cookie`, `*-organization`, `*-project`, `*-organization-id`, `*-project-id` —
//! so `openai-organization`, `openai-project`, `api-key`, `x-api-key`, `x-goog-api-key`,
//! `anthropic-api-key`, `proxy-authorization`…) is stripped unless the tenant's
//! `forward_headers` names it; `authorization` itself is always fairgate's to set, and
//! fairgate's own control headers (`x-fairgate-*`) are never forwarded.

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

/// Hop-by-hop headers (RFC 9110 §7.6.1) plus `proxy-*` handled in [`strip_hop_by_hop`].
const HOP_BY_HOP: [HeaderName; 6] = [
    header::CONNECTION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::PROXY_AUTHORIZATION,
];

/// Whether `name` is hop-by-hop on its own (not counting what `Connection` names).
fn is_hop_by_hop(name: &HeaderName) -> bool {
    HOP_BY_HOP.contains(name)
        || name == header::PROXY_AUTHENTICATE
        || name.as_str() == "keep-alive"
        || name.as_str() == "proxy-connection"
}

/// Removes hop-by-hop headers, including every header named in `Connection`.
///
/// One pass over the (few) headers present rather than a removal per possible name: the
/// common message has none of them, and then nothing is allocated or rehashed.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let mut named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    named.extend(headers.keys().filter(|n| is_hop_by_hop(n)).cloned());
    for name in named {
        headers.remove(name);
    }
}

/// Whether `name` carries a credential or selects a provider account (see the module docs).
pub fn is_credential(name: &HeaderName) -> bool {
    let n = name.as_str();
    // Asked of every header of every request: one pass for the four words, at each `a`.
    let b = n.as_bytes();
    memchr::memchr_iter(b'a', b).any(|i| {
        let rest = &b[i..];
        [&b"authorization"[..], b"api-key", b"apikey", b"api_key"]
            .iter()
            .any(|w| rest.starts_with(w))
    }) || n == "cookie"
        || [
            "-organization",
            "-project",
            "-organization-id",
            "-project-id",
        ]
        .iter()
        .any(|s| n.ends_with(s))
}

/// Prepares client request headers for the provider: hop-by-hop, `host`, `content-length`
/// (recomputed), `expect` (the body is already read), the client's `authorization`, the sidecar
/// tenant header, fairgate's own control headers (every `x-fairgate-*`) and every credential or
/// account header not named in `allowed` (the tenant's `forward_headers`) are removed.
pub fn for_upstream(
    headers: &mut HeaderMap,
    tenant_header: Option<&HeaderName>,
    allowed: &[HeaderName],
) {
    strip_hop_by_hop(headers);
    headers.remove(header::HOST);
    headers.remove(header::CONTENT_LENGTH);
    headers.remove(header::EXPECT);
    headers.remove(header::AUTHORIZATION);
    let ours: Vec<HeaderName> = headers
        .keys()
        .filter(|k| {
            k.as_str().starts_with("x-fairgate-") || (is_credential(k) && !allowed.contains(k))
        })
        .cloned()
        .collect();
    for k in ours {
        headers.remove(k);
    }
    if let Some(h) = tenant_header {
        headers.remove(h);
    }
}

/// Removes every `x-fairgate-*` header (of a provider's answer: only fairgate writes those).
pub fn strip_ours(headers: &mut HeaderMap) {
    let ours: Vec<HeaderName> = headers
        .keys()
        .filter(|k| k.as_str().starts_with("x-fairgate-"))
        .cloned()
        .collect();
    for k in ours {
        headers.remove(k);
    }
}

/// A sensitive `Bearer <key>` header value.
pub fn bearer(key: &str) -> Option<HeaderValue> {
    let mut v = HeaderValue::try_from(format!("Bearer {key}")).ok()?;
    v.set_sensitive(true);
    Some(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn credential_and_account_names_are_known_by_their_words() {
        for n in [
            "authorization",
            "proxy-authorization",
            "x-api-key",
            "api-key",
            "x-goog-apikey",
            "openai_api_key",
            "cookie",
            "openai-organization",
            "openai-project",
            "x-stainless-organization-id",
            "anthropic-project-id",
        ] {
            assert!(is_credential(&HeaderName::from_static(n)), "{n}");
        }
        for n in [
            "content-type",
            "accept",
            "x-request-id",
            "cookies-allowed",
            "x-api",
            "x-project-name",
            "authorizer",
            "apiary",
        ] {
            assert!(!is_credential(&HeaderName::from_static(n)), "{n}");
        }
    }

    #[test]
    fn strips_hop_by_hop_credentials_and_connection_named() {
        let mut h = HeaderMap::new();
        for (k, v) in [
            ("connection", "keep-alive, x-secret-hop"),
            ("keep-alive", "timeout=5"),
            ("x-secret-hop", "1"),
            ("proxy-authorization", "Basic x"),
            ("te", "trailers"),
            ("trailer", "x-t"),
            ("transfer-encoding", "chunked"),
            ("upgrade", "websocket"),
            ("host", "proxy.local"),
            ("content-length", "12"),
            ("authorization", "Bearer tenant-key"),
            ("x-tenant-id", "acme"),
            ("x-fairgate-priority", "batch"),
            ("content-type", "application/json"),
            ("x-request-id", "abc"),
        ] {
            h.append(HeaderName::from_static(k), HeaderValue::from_static(v));
        }
        let sidecar = HeaderName::from_static("x-tenant-id");
        for_upstream(&mut h, Some(&sidecar), &[]);
        let left: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        assert_eq!(left, vec!["content-type", "x-request-id"]);
    }

    #[test]
    fn headers_cannot_act_as_the_operator_unless_the_tenant_allows_them() {
        let operator = [
            "openai-organization",
            "openai-project",
            "api-key",
            "x-api-key",
            "x-goog-api-key",
            "anthropic-api-key",
            "proxy-authorization",
            "x-upstream-authorization",
            "x-apikey",
            "cookie",
            "x-goog-user-project",
        ];
        let ours = [
            "x-fairgate-priority",
            "x-fairgate-deadline-ms",
            "x-fairgate-anything",
        ];
        let fill = || {
            let mut h = HeaderMap::new();
            for k in operator
                .iter()
                .chain(&ours)
                .chain(&["x-request-id", "openai-beta"])
            {
                h.insert(HeaderName::from_static(k), HeaderValue::from_static("v"));
            }
            h.insert(
                "authorization",
                HeaderValue::from_static("Bearer fg-tenant"),
            );
            h
        };
        let mut h = fill();
        for_upstream(&mut h, None, &[]);
        let mut left: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        left.sort_unstable();
        assert_eq!(left, vec!["openai-beta", "x-request-id"]);
        // A tenant allowed `openai-project` forwards that one only; never `x-fairgate-*`.
        let mut h = fill();
        let allowed = [
            HeaderName::from_static("openai-project"),
            HeaderName::from_static("x-fairgate-priority"),
        ];
        for_upstream(&mut h, None, &allowed);
        let mut left: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        left.sort_unstable();
        assert_eq!(left, vec!["openai-beta", "openai-project", "x-request-id"]);
    }
}
