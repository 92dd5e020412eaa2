//! TLS for the mock: a rustls acceptor (ring provider) from PEM files offering ALPN `h2` and
//! `http/1.1`, so a proxy's HTTPS/h2 upstream client meets a real TLS server in tests, as it
//! would meet api.openai.com or a TLS-terminated vLLM.
//!
//! Mirrors the proxy's own inbound acceptor (`server/tls.rs`, private to the server) on purpose:
//! the mock must not depend on the proxy's config types.

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;

/// Builds the acceptor from a PEM certificate chain and key; errors name the file.
pub fn tls_acceptor(cert: &Path, key: &Path) -> Result<TlsAcceptor, String> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .and_then(|it| it.collect::<Result<_, _>>())
        .map_err(|e| format!("--tls-cert: cannot read {}: {e}", cert.display()))?;
    if certs.is_empty() {
        return Err(format!("--tls-cert: no certificate in {}", cert.display()));
    }
    let key = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| format!("--tls-key: cannot read {}: {e}", key.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("mock TLS: {e}"))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| format!("mock TLS: {e}"))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}
