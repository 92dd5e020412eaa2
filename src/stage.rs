//! One way to write a stage of the stack (in the spirit of tower's `layer_fn` and axum's
//! `from_fn`): a stage is a value (its shared state, cheap to clone) with one async decision,
//! [`Stage::call`], over the request and the service below it. The pass-through tower wiring
//! every stage repeated is written once here: [`Layer`] holds only the stage (cloning a layer
//! creates no state), [`Service`] passes `poll_ready` through to the service below and, in
//! `call`, hands the stage the service that was polled ready (leaving a clone for the next
//! call, as tower requires of a cloned service) and boxes the stage's future.
//!
//! A stage's common path may need no future of its own: [`Stage::pass`] decides first, and a
//! request it passes goes on to the service below's future, unboxed (`route` a routed model,
//! `ratelimit::headers` a tenant without limits, `admin` a path not its own; counted by
//! `examples/allocs.rs`: a boxed stage future is one allocation a request). Everything else is
//! [`Stage::call`], boxed.
//!
//! A stage may change the request it passes down ([`Stage::Down`]: `body` takes the
//! connection's body and passes its bytes).
//!
//! [`BoxFuture`] is the one boxed future of the stack.

use std::future::Future;
use std::pin::Pin;

use futures_util::future::Either;
use std::task::{Context, Poll};

/// The one boxed future of the stack's stages and services.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// A stage: its decision over one request `R`, given `next`, the service below it (ready:
/// its `poll_ready` passed), which takes the request the stage passes down ([`Stage::Down`]:
/// `R` itself for every stage but `body`, which reads the body). It calls `next` at most once,
/// or answers itself.
pub trait Stage<R, S>: Clone + Send + 'static
where
    S: tower::Service<Self::Down>,
{
    /// The request the stage passes down.
    type Down;

    /// The decision that needs no future, made first: `Ok` passes the request on to the
    /// service below, whose future is then the stage's, unboxed; `Err` (the default) hands it
    /// back for [`Stage::call`]. It may write the request's context, as any decision does.
    fn pass(&self, req: R) -> Result<Self::Down, R> {
        Err(req)
    }

    /// Handles `req` (on a clone of the stage: the future owns what it uses).
    fn call(
        self,
        req: R,
        next: S,
    ) -> impl Future<Output = Result<S::Response, S::Error>> + Send + 'static;
}

/// What a stage of the stack sits on: a service of `R` answering `Res` or `E`, whose future
/// may move across threads (the bounds every stage states once, here).
pub trait Below<R, Res, E>:
    tower::Service<R, Response = Res, Error = E, Future: Send + 'static> + Send + 'static
{
}

impl<T, R, Res, E> Below<R, Res, E> for T where
    T: tower::Service<R, Response = Res, Error = E, Future: Send + 'static> + Send + 'static
{
}

/// The tower layer of a stage: holds only the stage.
#[derive(Clone, Debug)]
pub struct Layer<St>(St);

impl<St> Layer<St> {
    /// The layer of `stage` (or of what it is built from).
    pub fn new(stage: impl Into<St>) -> Self {
        Self(stage.into())
    }
}

impl<St> std::ops::Deref for Layer<St> {
    type Target = St;
    fn deref(&self) -> &St {
        &self.0
    }
}

impl<St: Clone, S> tower::Layer<S> for Layer<St> {
    type Service = Service<St, S>;
    fn layer(&self, inner: S) -> Service<St, S> {
        Service {
            stage: self.0.clone(),
            inner,
        }
    }
}

/// The tower service of a stage over `S`; see the module docs.
#[derive(Clone, Debug)]
pub struct Service<St, S> {
    stage: St,
    inner: S,
}

impl<R, St, S> tower::Service<R> for Service<St, S>
where
    St: Stage<R, S>,
    S: tower::Service<St::Down> + Clone + Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Either<S::Future, BoxFuture<Result<S::Response, S::Error>>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: R) -> Self::Future {
        let req = match self.stage.pass(req) {
            Ok(down) => return Either::Left(self.inner.call(down)),
            Err(req) => req,
        };
        // The service polled ready goes to this call; its clone waits for the next one.
        let clone = self.inner.clone();
        let ready = std::mem::replace(&mut self.inner, clone);
        Either::Right(Box::pin(self.stage.clone().call(req, ready)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use tower::{Layer as _, Service as _, ServiceExt};

    /// Passes 0 on as it is; doubles what else it passes down, refuses odd numbers itself;
    /// counts its calls.
    #[derive(Clone, Default)]
    struct Double(Arc<AtomicUsize>);

    impl<S> Stage<u32, S> for Double
    where
        S: tower::Service<u32, Response = u32, Error = String> + Send + 'static,
        S::Future: Send,
    {
        type Down = u32;

        fn pass(&self, req: u32) -> Result<u32, u32> {
            if req == 0 {
                Ok(req)
            } else {
                Err(req)
            }
        }

        async fn call(self, req: u32, mut next: S) -> Result<u32, String> {
            self.0.fetch_add(1, Ordering::SeqCst);
            if req % 2 == 1 {
                return Err(format!("{req} is odd"));
            }
            next.call(req * 2).await
        }
    }

    #[tokio::test]
    async fn a_stage_passes_on_decides_passes_down_and_shares_its_state_across_clones() {
        let stage = Double::default();
        let calls = stage.0.clone();
        let below = tower::service_fn(|n: u32| async move { Ok::<_, String>(n + 1) });
        let layer = Layer::<Double>::new(stage);
        let mut svc = layer.layer(below);
        assert_eq!(svc.ready().await.unwrap().call(4).await, Ok(9));
        assert_eq!(
            svc.clone().oneshot(3).await,
            Err("3 is odd".to_owned()),
            "answered without the service below"
        );
        assert_eq!(svc.ready().await.unwrap().call(0).await, Ok(1), "passed on");
        assert_eq!(calls.load(Ordering::SeqCst), 2, "one state for every clone");
        assert_eq!(
            layer.0 .0.load(Ordering::SeqCst),
            2,
            "and the layer's (by `Deref`)"
        );
    }
}
