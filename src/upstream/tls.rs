//! The TLS client configuration of one upstream: which roots it trusts (the bundled Mozilla
//! roots, plus a PEM bundle of its own CAs, plus optionally the system store) and, for mutual
//! TLS, the client certificate it presents. rustls with the ring provider only.
//!
//! Invariants: a file that cannot be read or holds no certificate (or no key) is a config error
//! naming the key, at startup and at reload, never a failure at the first request; a client
//! certificate needs its key and the reverse.

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ClientConfig, RootCertStore};

use crate::config::{ConfigError, EndpointConfig};

/// Builds the rustls client configuration of endpoint `j` of upstream `i` (ALPN is set by the
/// connector).
pub fn client_config(
    cfg: &EndpointConfig,
    i: usize,
    j: usize,
) -> Result<ClientConfig, ConfigError> {
    let invalid = |k: &str, message: String| ConfigError::Invalid {
        key: cfg.key(i, j, k),
        message,
    };
    let mut roots = RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    if cfg.system_roots {
        let found = rustls_native_certs::load_native_certs();
        let (added, _) = roots.add_parsable_certificates(found.certs);
        if added == 0 {
            return Err(invalid(
                "system_roots",
                "no certificate found in the system's trust store".into(),
            ));
        }
    }
    if let Some(path) = &cfg.ca_file {
        let certs = certs(path).map_err(|m| invalid("ca_file", m))?;
        for c in certs {
            roots
                .add(c)
                .map_err(|e| invalid("ca_file", format!("{}: {e}", path.display())))?;
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| invalid("base_url", format!("TLS: {e}")))?
        .with_root_certificates(roots);
    match (&cfg.client_cert_file, &cfg.client_key_file) {
        (None, None) => Ok(builder.with_no_client_auth()),
        (Some(cert), Some(key)) => {
            let chain = certs(cert).map_err(|m| invalid("client_cert_file", m))?;
            let key = PrivateKeyDer::from_pem_file(key).map_err(|e| {
                invalid(
                    "client_key_file",
                    format!("{}: no private key ({e})", key.display()),
                )
            })?;
            builder.with_client_auth_cert(chain, key).map_err(|e| {
                invalid(
                    "client_key_file",
                    format!("does not match the certificate: {e}"),
                )
            })
        }
        (Some(_), None) => Err(invalid(
            "client_key_file",
            "client_cert_file needs its client_key_file".into(),
        )),
        (None, Some(_)) => Err(invalid(
            "client_cert_file",
            "client_key_file needs its client_cert_file".into(),
        )),
    }
}

/// The certificates of a PEM file (at least one).
fn certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
        .map_err(|e| format!("{}: {e}", path.display()))?
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{}: no certificate in the file", path.display()));
    }
    Ok(certs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(extra: &str) -> EndpointConfig {
        let u: crate::config::UpstreamConfig = toml::from_str(&format!(
            "name = \"u\"\nbase_url = \"https://a/v1\"\n{extra}\n"
        ))
        .unwrap();
        u.resolved().endpoints.remove(0)
    }

    fn fixture(name: &str) -> String {
        format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"))
    }

    #[test]
    fn bundled_roots_plus_a_ca_file_and_mtls_files_load() {
        assert!(client_config(&cfg(""), 0, 0).is_ok());
        let ca = format!("ca_file = \"{}\"", fixture("localhost.crt"));
        assert!(client_config(&cfg(&ca), 0, 0).is_ok());
        let mtls = format!(
            "client_cert_file = \"{}\"\nclient_key_file = \"{}\"",
            fixture("localhost.crt"),
            fixture("localhost.key")
        );
        assert!(client_config(&cfg(&mtls), 0, 0).is_ok());
    }

    #[test]
    fn bad_files_are_config_errors_naming_the_key() {
        let e = client_config(&cfg("ca_file = \"/nonexistent.pem\""), 3, 0)
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("upstreams[3].ca_file"), "{e}");
        // A key file is not a certificate bundle.
        let key_as_ca = format!("ca_file = \"{}\"", fixture("localhost.key"));
        let e = client_config(&cfg(&key_as_ca), 0, 0)
            .unwrap_err()
            .to_string();
        assert!(e.contains("no certificate"), "{e}");
        let half = format!("client_cert_file = \"{}\"", fixture("localhost.crt"));
        let e = client_config(&cfg(&half), 0, 0).unwrap_err().to_string();
        assert!(e.contains("client_key_file"), "{e}");
    }
}
