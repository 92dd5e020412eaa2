//! Inbound TLS: loads the PEM certificate chain and key named in `[server.tls]` into a rustls
//! acceptor (ring provider) offering ALPN `h2` and `http/1.1`.

use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;

use crate::config::TlsConfig;

/// Builds the acceptor; errors name the file and what is wrong with it.
pub fn acceptor(cfg: &TlsConfig) -> Result<TlsAcceptor, String> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&cfg.cert)
        .and_then(|it| it.collect::<Result<_, _>>())
        .map_err(|e| format!("server.tls.cert: cannot read {}: {e}", cfg.cert.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "server.tls.cert: no certificate in {}",
            cfg.cert.display()
        ));
    }
    let key = PrivateKeyDer::from_pem_file(&cfg.key)
        .map_err(|e| format!("server.tls.key: cannot read {}: {e}", cfg.key.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("server.tls: {e}"))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| format!("server.tls: {e}"))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}
