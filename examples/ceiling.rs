//! The overhead benchmark's ceiling: a reverse proxy that only forwards, built from the pieces
//! fairgate's transport is built from and in the same shape — one current-thread tokio runtime
//! per core with its own `SO_REUSEPORT` listener, hyper-util's `auto` server, a hyper-util legacy
//! client per worker, mimalloc. No tenant, body read, estimate, queue, usage, metrics or log line.
//! What it loses against nginx is the cost of hyper + tokio alone; fairgate cannot do better.
//!
//! It takes fairgate's command line so `bench/ab.sh` can run it like a fairgate build:
//! `ceiling serve --config FILE` loads a fairgate config as fairgate does, binds `[server]
//! listen` once per worker the same way, and forwards `/v1/X` to the first upstream's
//! `base_url + /X` (the rest of the config is unused). `ceiling mock-upstream …` is not supported: give a fairgate
//! binary first to `bench/ab.sh`.
//!
//! ```sh
//! cargo build --profile profiling --example ceiling
//! bench/ab.sh target/profiling/fairgate target/profiling/examples/ceiling
//! ```

use std::str::FromStr;

use bytes::Bytes;
use fairgate::config::Config;
use fairgate::server::workers;
use http::{header, Request, Response, StatusCode, Uri};
use http_body_util::{combinators::BoxBody, BodyExt, Empty};
use hyper::body::Incoming;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;

#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

type Body = BoxBody<Bytes, hyper::Error>;

fn main() -> Result<(), String> {
    let args: Vec<String> = std::env::args().collect();
    let path = match args.iter().map(String::as_str).collect::<Vec<_>>()[1..] {
        ["serve", "--config", path] => path.to_owned(),
        _ => return Err("usage: ceiling serve --config FILE".into()),
    };
    // fairgate's own loader, worker count and SO_REUSEPORT binding: only the forwarding differs.
    let config = Config::load(&path).map_err(|e| e.to_string())?;
    let base = config
        .upstreams
        .first()
        .ok_or("no [[upstreams]]")?
        .endpoints
        .first()
        .ok_or("no endpoint")?
        .base_url
        .trim_end_matches('/')
        .to_owned();
    let n = workers::count(&config.server);
    let listeners = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?
        .block_on(workers::bind(config.server.listen, n))
        .map_err(|e| e.to_string())?;
    let threads: Vec<_> = listeners
        .into_iter()
        .map(|listener| {
            let base = base.clone();
            std::thread::spawn(move || {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| e.to_string())?
                    .block_on(worker(listener, base))
            })
        })
        .collect();
    for t in threads {
        t.join().map_err(|_| "worker panicked")??;
    }
    Ok(())
}

async fn worker(listener: std::net::TcpListener, base: String) -> Result<(), String> {
    let listener = TcpListener::from_std(listener).map_err(|e| e.to_string())?;
    let mut http = HttpConnector::new();
    http.set_nodelay(true);
    let client: Client<HttpConnector, Incoming> = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(1024)
        .build(http);
    let builder = auto::Builder::new(TokioExecutor::new());
    loop {
        let (stream, _) = listener.accept().await.map_err(|e| e.to_string())?;
        let _ = stream.set_nodelay(true);
        let (client, base, builder) = (client.clone(), base.clone(), builder.clone());
        tokio::spawn(async move {
            let service =
                hyper::service::service_fn(move |req| forward(client.clone(), base.clone(), req));
            let _ = builder
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

/// `/v1/X` → `base + /X`, the client's Authorization dropped, the response streamed back.
async fn forward(
    client: Client<HttpConnector, Incoming>,
    base: String,
    mut req: Request<Incoming>,
) -> Result<Response<Body>, hyper::Error> {
    let path = req.uri().path_and_query().map_or("/", |p| p.as_str());
    let rest = path.strip_prefix("/v1").unwrap_or(path);
    let Ok(uri) = Uri::from_str(&format!("{base}{rest}")) else {
        return Ok(status(StatusCode::BAD_REQUEST));
    };
    *req.uri_mut() = uri;
    req.headers_mut().remove(header::AUTHORIZATION);
    req.headers_mut().remove(header::HOST);
    match client.request(req).await {
        Ok(resp) => Ok(resp.map(BodyExt::boxed)),
        Err(_) => Ok(status(StatusCode::BAD_GATEWAY)),
    }
}

fn status(code: StatusCode) -> Response<Body> {
    let mut r = Response::new(Empty::new().map_err(|never| match never {}).boxed());
    *r.status_mut() = code;
    r
}
