//! The server: assembles the tower stack ([`stack`], one function, top to bottom: `stack.rs`)
//! over the shared [`State`] of a configuration generation (`state.rs`, built one way: startup
//! is a reload from empty, `reload.rs`) and runs the listener (HTTP/1.1, h2 and h2c via
//! hyper-util's auto builder, optional rustls TLS) with graceful shutdown and live config
//! reload (`start.rs`, `live`, `diff`).
//!
//! Invariants: all per-request state is shared through `Arc`s built once per configuration
//! generation, at startup and at each reload (nothing is cloned from the config per request);
//! on shutdown the server stops accepting, `/readyz` turns 503, in-flight requests and streams
//! get up to `shutdown_grace_ms` to finish, and whatever is left after that is aborted.

mod connection;
pub mod connections;
pub mod diff;
mod jobs;
pub mod live;
pub mod ops;
mod reload;
mod stack;
pub mod stall;
mod start;
mod state;
mod tenants;
mod tls;
pub mod workers;

pub use diff::Changes;
pub use live::Live;
pub use reload::ReloadError;
pub use stack::stack;
pub use start::{
    run, start, start_from_file, start_from_file_with_env, start_with_env, ServerHandle, StartError,
};
pub use state::{Env, State, UNTRUSTED_HEADER};

#[cfg(test)]
mod ledger_props;

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use http::{Request, Response};
    use tower::ServiceBuilder;

    use super::*;
    use crate::config::Config;
    use crate::response::ResponseBody;
    use crate::{admission, body, estimate, queue, render, route, tenant};
    use bytes::Bytes;
    use http_body_util::Full;
    use tower::ServiceExt;

    fn state() -> State {
        let config = Config::from_toml_str(
            "[[upstreams]]\nname = \"u\"\nbase_url = \"http://127.0.0.1:9/v1\"\nmodels = [\"m\"]\n\
             [[tenants]]\nid = \"a\"\napi_keys = [\"k\"]\n",
        )
        .unwrap();
        State::new(config).unwrap()
    }

    #[test]
    fn an_empty_admin_token_is_refused_without_echoing_one() {
        let config = Config::from_toml_str(
            "[admin]\ntoken_env = \"ADMIN_T\"\n\
             [[upstreams]]\nname = \"u\"\nbase_url = \"http://127.0.0.1:9/v1\"\n",
        )
        .unwrap();
        for empty in ["", "  ", "\t"] {
            let e = State::admin_token(&config, |_| Some(empty.to_owned()))
                .unwrap_err()
                .to_string();
            assert!(
                e.starts_with("admin.token_env") && e.contains("empty"),
                "{e}"
            );
        }
        let t = State::admin_token(&config, |_| Some("s3cret".to_owned())).unwrap();
        assert_eq!(t.as_deref(), Some("s3cret"));
        let e = State::admin_token(&config, |_| None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("ADMIN_T"), "{e}");
    }

    async fn status(state: &State, req: Request<Full<Bytes>>) -> u16 {
        let res = stack(state).oneshot(req).await.unwrap();
        assert!(res.headers().contains_key(render::QUEUE_MS_HEADER));
        res.status().as_u16()
    }

    #[tokio::test]
    async fn stack_order_health_then_tenant_then_body_then_route() {
        let s = state();
        let get = |p: &str| Request::get(p).body(Full::default()).unwrap();
        // Health answers before authentication; readiness follows the flag.
        assert_eq!(status(&s, get("/healthz")).await, 200);
        assert_eq!(status(&s, get("/readyz")).await, 503);
        s.ready.store(true, Ordering::Release);
        assert_eq!(status(&s, get("/readyz")).await, 200);
        // Authentication comes before path handling: unknown paths without a key are 401.
        assert_eq!(status(&s, get("/v1/nope")).await, 401);
        let authed = |b: http::request::Builder| b.header("authorization", "Bearer k");
        let req = authed(Request::get("/v1/nope"))
            .body(Full::default())
            .unwrap();
        assert_eq!(status(&s, req).await, 404);
        let req = authed(Request::get("/v1/models"))
            .body(Full::default())
            .unwrap();
        assert_eq!(status(&s, req).await, 200);
        let req = authed(Request::post("/v1/chat/completions"))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from_static(b"{\"model\":\"other\"}")))
            .unwrap();
        assert_eq!(status(&s, req).await, 404);
        let req = authed(Request::get("/v1/chat/completions"))
            .body(Full::default())
            .unwrap();
        assert_eq!(status(&s, req).await, 405);
    }

    /// A stack whose stages are out of order fails loudly (500 naming the missing field), never
    /// passes the request through with a limit skipped.
    #[tokio::test]
    async fn a_misordered_stack_answers_500_instead_of_skipping_a_stage() {
        use http_body_util::BodyExt;
        use tower::Layer as _;
        let s = state();
        let ok = || {
            tower::service_fn(|_: Request<Bytes>| async {
                Ok::<_, crate::Error>(Response::new(ResponseBody::empty()))
            })
        };
        let chat = || {
            Request::post("/v1/chat/completions")
                .header("authorization", "Bearer k")
                .header("content-type", "application/json")
                .body(Full::new(Bytes::from_static(
                    b"{\"model\":\"m\",\"messages\":[]}",
                )))
                .unwrap()
        };
        let message = |res: Response<ResponseBody>| async move {
            assert_eq!(res.status(), 500);
            let body = res.into_body().collect().await.unwrap().to_bytes();
            let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(v["error"]["code"], "internal_error");
            v["error"]["message"].as_str().unwrap().to_owned()
        };
        // The stages above the two under test, in order.
        let top = || {
            ServiceBuilder::new()
                .layer(render::Layer)
                .layer(tenant::Layer(s.tenants.clone()))
                .layer(body::Layer::new(body::Reading {
                    max_body_bytes: 1 << 20,
                    budget: s.tenant_bytes.clone(),
                }))
                .layer(route::Layer::new(s.router.clone()))
        };
        // Admission above estimation: the estimate it charges is not there yet.
        let misordered = top()
            .layer(admission::Layer::new(s.admission.clone()))
            .layer(estimate::Layer::new(s.estimator.clone()))
            .service(ok());
        let m = message(misordered.oneshot(chat()).await.unwrap()).await;
        assert!(m.contains("`estimate` must run"), "{m}");
        // The queue without admission: no deadline decision to honour.
        let unadmitted = top()
            .layer(estimate::Layer::new(s.estimator.clone()))
            .layer(queue::Layer::new(queue::Queueing {
                pools: s.pools.clone(),
                observer: s.metrics.clone(),
            }))
            .service(ok());
        let m = message(unadmitted.oneshot(chat()).await.unwrap()).await;
        assert!(m.contains("`admission` must run"), "{m}");
        assert_eq!(s.pools[0].load(), (0, 0), "nothing was queued");
        // No render layer on top: there is no context, and the first stage says so.
        let headless = tenant::Layer(s.tenants.clone()).layer(ok());
        let (head, _) = chat().into_parts();
        let e = headless
            .oneshot(Request::from_parts(head, Bytes::new()))
            .await
            .unwrap_err();
        assert_eq!(e.status(), 500);
        assert!(e.to_string().contains("render"), "{e}");
        // In order, the same request passes every stage.
        let res = stack(&s).oneshot(chat()).await.unwrap();
        assert_ne!(res.status(), 500);
    }
}
