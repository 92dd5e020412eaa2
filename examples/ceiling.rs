//! The overhead benchmark's ceiling: a reverse proxy that only forwards, built from the pieces
//! fairgate's transport is built from and in the same shape — one current-thread tokio runtime
//! per core with its own `SO_REUSEPORT` listener, hyper-util's `auto` server, a hyper-util legacy
//! client per worker, mimalloc. No tenant, body read, estimate, queue, usage, metrics or log line.
//! What it loses against nginx is the cost of hyper + tokio alone; fairgate cannot do better.
//!
//! It takes fairgate's command line so `bench/ab.sh` can run it like a fairgate build:
//! `ceiling serve --config FILE` reads `[server] listen` / `workers` and the first upstream's
//! `base_url` from a fairgate config (everything else in it is ignored), and forwards
//! `/v1/X` to `base_url + /X`. `ceiling mock-upstream …` is not supported: give a fairgate
//! binary first to `bench/ab.sh`.
//!
//! ```sh
//! cargo build --release --example ceiling
//! bench/ab.sh target/release/fairgate target/release/examples/ceiling
//! ```

use std::net::SocketAddr;
use std::str::FromStr;

use bytes::Bytes;
use http::{header, Request, Response, StatusCode, Uri};
use http_body_util::{combinators::BoxBody, BodyExt, Empty};
use hyper::body::Incoming;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::{TcpListener, TcpSocket};

#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

type Body = BoxBody<Bytes, hyper::Error>;

/// What the ceiling reads from a fairgate config.
struct Settings {
    listen: SocketAddr,
    workers: usize,
    base: String,
}

fn settings(path: &str) -> Result<Settings, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
    let doc: toml::Table = text.parse().map_err(|e| format!("{path}: {e}"))?;
    let server = doc.get("server").and_then(toml::Value::as_table);
    let listen = server
        .and_then(|s| s.get("listen"))
        .and_then(toml::Value::as_str)
        .unwrap_or("127.0.0.1:8080");
    let workers = server
        .and_then(|s| s.get("workers"))
        .and_then(toml::Value::as_integer)
        .map(|n| n.max(1) as usize)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let base = doc
        .get("upstreams")
        .and_then(toml::Value::as_array)
        .and_then(|u| u.first())
        .and_then(|u| u.get("base_url"))
        .and_then(toml::Value::as_str)
        .ok_or("no [[upstreams]] base_url")?;
    Ok(Settings {
        listen: SocketAddr::from_str(listen).map_err(|e| format!("listen: {e}"))?,
        workers,
        base: base.trim_end_matches('/').to_owned(),
    })
}

fn main() -> Result<(), String> {
    let args: Vec<String> = std::env::args().collect();
    let config = match args.iter().map(String::as_str).collect::<Vec<_>>()[1..] {
        ["serve", "--config", path] => path.to_owned(),
        _ => return Err("usage: ceiling serve --config FILE".into()),
    };
    let s = settings(&config)?;
    let mut threads = Vec::with_capacity(s.workers);
    for _ in 0..s.workers {
        let (listen, base) = (s.listen, s.base.clone());
        threads.push(std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(worker(listen, base))
        }));
    }
    for t in threads {
        t.join().map_err(|_| "worker panicked")??;
    }
    Ok(())
}

async fn worker(listen: SocketAddr, base: String) -> Result<(), String> {
    let socket = TcpSocket::new_v4().map_err(|e| e.to_string())?;
    socket.set_reuseaddr(true).map_err(|e| e.to_string())?;
    socket.set_reuseport(true).map_err(|e| e.to_string())?;
    socket.bind(listen).map_err(|e| e.to_string())?;
    let listener: TcpListener = socket.listen(1024).map_err(|e| e.to_string())?;
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
