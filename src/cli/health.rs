//! `fairgate health --url URL`: the container's own health check (the runtime image carries no
//! curl). One GET, bounded by `--timeout-ms`; exit 0 on a 2xx answer, 1 on anything else (another
//! status, a refused connection, a timeout, a bad URL), with the reason on stderr.
//!
//! Invariants: never waits longer than the timeout (connect, TLS, head and body together);
//! reads at most [`MAX_BODY`] bytes of the answer; `https://` trusts the bundled Mozilla roots
//! plus `--ca-file` (rustls with ring, as everywhere else in fairgate).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;

/// The answer's body is read up to this many bytes (a probe answers a few).
pub const MAX_BODY: usize = 64 * 1024;

/// The arguments of `fairgate health`.
#[derive(Debug, Clone, clap::Args)]
pub struct HealthArgs {
    /// The URL to GET, e.g. http://127.0.0.1:8080/readyz.
    #[arg(long, default_value = "http://127.0.0.1:8080/readyz")]
    pub url: String,
    /// Give up after this many milliseconds.
    #[arg(long, default_value_t = 2000)]
    pub timeout_ms: u64,
    /// A PEM bundle of CAs to trust for an https:// URL, beside the bundled roots.
    #[arg(long)]
    pub ca_file: Option<PathBuf>,
}

/// Runs the check; see the module docs.
pub fn run(args: &HealthArgs) -> ExitCode {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("unhealthy: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(probe(args)) {
        Ok(status) => {
            println!("healthy: {status}");
            ExitCode::SUCCESS
        }
        Err(why) => {
            eprintln!("unhealthy: {why}");
            ExitCode::FAILURE
        }
    }
}

/// GETs `args.url`: `Ok(status)` when it answers 2xx within the timeout, else why not.
pub async fn probe(args: &HealthArgs) -> Result<http::StatusCode, String> {
    let uri: http::Uri = args.url.parse().map_err(|e| format!("{}: {e}", args.url))?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.authority().is_none() {
        return Err(format!("{}: not an http:// or https:// URL", args.url));
    }
    let tls = tls_config(args.ca_file.as_deref())?;
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .build();
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build::<_, Empty<Bytes>>(connector);
    let req = http::Request::get(uri)
        .header(http::header::USER_AGENT, "fairgate-health")
        .body(Empty::new())
        .map_err(|e| e.to_string())?;
    let timeout = Duration::from_millis(args.timeout_ms);
    let call = async {
        let res = client.request(req).await.map_err(|e| error_chain(&e))?;
        let status = res.status();
        // Read the (small) body so the server sees a complete exchange.
        let _ = Limited::new(res.into_body(), MAX_BODY).collect().await;
        Ok::<_, String>(status)
    };
    let status = tokio::time::timeout(timeout, call)
        .await
        .map_err(|_| format!("no answer within {} ms", args.timeout_ms))??;
    if status.is_success() {
        Ok(status)
    } else {
        Err(format!("answered {status}"))
    }
}

fn tls_config(ca_file: Option<&Path>) -> Result<rustls::ClientConfig, String> {
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    if let Some(path) = ca_file {
        let certs = CertificateDer::pem_file_iter(path)
            .map_err(|e| format!("{}: {e}", path.display()))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("{}: {e}", path.display()))?;
        if certs.is_empty() {
            return Err(format!("{}: no certificate", path.display()));
        }
        for c in certs {
            roots
                .add(c)
                .map_err(|e| format!("{}: {e}", path.display()))?;
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

/// `e` and its sources, `: `-separated (hyper's own message is only "client error (Connect)").
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}
