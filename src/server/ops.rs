//! The operations endpoints (`/metrics`, `/admin/*`): layered into the main stack, or served on
//! their own listener when `[admin] listen` is set.
//!
//! Invariant: the operations listener answers nothing but these endpoints and the probes
//! (`/healthz`, `/readyz`: a sidecar's proxy may listen on loopback only, where the kubelet
//! cannot reach it) — everything else is 404 — and stops accepting when the server shuts down.

use std::convert::Infallible;
use std::sync::Arc;

use http::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tower::ServiceBuilder;

use super::live::{Live, LiveService};
use super::State;
use crate::admin::OpsError;
use crate::response::ResponseBody;
use crate::{admin, metrics, render};

/// The `/metrics` layer of `state`; `on_main`: on the main listener, where tenants connect, so
/// only the admin token's bearer or a trusted peer may scrape.
pub(super) fn scrape(state: &State, on_main: bool) -> metrics::Scrape {
    let guard = on_main.then(|| metrics::scrape::Guard {
        token: state.admin_token.clone(),
        trusted: state
            .config
            .server
            .trusted_sources
            .iter()
            .filter_map(|s| crate::config::Cidr::parse(s))
            .collect(),
    });
    metrics::Scrape {
        metrics: state.metrics.clone(),
        pools: state.pools.clone(),
        admission: state.admission.clone(),
        guard,
    }
}

/// The admin API layer of `state`.
pub(super) fn admin(state: &State) -> admin::Layer {
    admin::Layer::new(admin::Admin {
        token: state.admin_token.clone(),
        pool_names: state
            .config
            .upstreams
            .iter()
            .map(|u| u.name.clone())
            .collect(),
        pools: state.pools.clone(),
        estimator: state.estimator.clone(),
        metrics: state.metrics.clone(),
        admission: state.admission.clone(),
        cluster: state.cluster.as_ref().map(|c| c.link.clone()),
        reload: state.reloader.clone(),
        runtime: admin::tenants::Tenants {
            runtime: state.runtime.clone(),
            config: state.config.clone(),
            reload: state.reloader.clone(),
        },
    })
}

/// The operations listener's stack: probes, `/metrics`, `/admin/*`, else 404.
pub fn stack<B>(
    state: &State,
) -> impl tower::Service<
    Request<B>,
    Response = Response<ResponseBody>,
    Error = Infallible,
    Future: Send + 'static,
> + Clone
       + Send
       + 'static
where
    B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<crate::response::BoxError>,
{
    ServiceBuilder::new()
        .layer(render::Layer)
        .layer(crate::health::Layer(state.ready.clone()))
        .layer(scrape(state, false))
        .layer(admin(state))
        .service(tower::service_fn(|_: Request<B>| async {
            Err::<Response<ResponseBody>, _>(crate::Error::from(OpsError::NotFound))
        }))
}

/// Serves the operations stack of the generation in force on `listener` until `stopped` turns
/// true.
pub(super) fn spawn(live: Arc<Live>, listener: TcpListener, mut stopped: watch::Receiver<bool>) {
    let service = LiveService::new(live, true);
    let builder = Arc::new(auto::Builder::new(TokioExecutor::new()));
    tokio::spawn(async move {
        loop {
            tokio::select! {
                biased;
                _ = async { let _ = stopped.wait_for(|s| *s).await; } => break,
                accepted = listener.accept() => {
                    let Ok((stream, _)) = accepted else {
                        // Out of descriptors, most likely: pause rather than spin.
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                        continue;
                    };
                    let (builder, service) = (builder.clone(), service.clone());
                    tokio::spawn(async move {
                        let _ = builder.serve_connection(TokioIo::new(stream), service).await;
                    });
                }
            }
        }
    });
}
