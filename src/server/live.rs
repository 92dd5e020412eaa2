//! The configuration generation in force, and the services the listeners call through it.
//!
//! [`Live`] holds the current [`Generation`] (a [`State`] and the two stacks built from it)
//! behind an `ArcSwap`. Each request loads the generation once and runs entirely through that
//! generation's stack; a reload ([`Live::reload`], from `POST /admin/reload` or SIGHUP) builds
//! the next generation from the one in force (`State::reloaded`) and publishes it with one
//! atomic store.
//!
//! Each thread keeps the stacks of the generation it last served ([`LiveService`] calls them
//! in place, instead of cloning every layer of the stack for every request), and rebuilds that
//! cache when the generation in force changes; the cache holds its generation, so an idle
//! thread keeps a replaced generation alive until its next request.
//!
//! A generation with `[jobs]` also holds the stack the jobs runner sends jobs through
//! (`server::jobs`), built with the others: once per generation, never per job.
//!
//! Each request body is wrapped in a [`TimedBody`] with the `client_body_timeout_ms` of the
//! generation in force when the request arrived (see `body::timeout`), inside a [`Linger`]
//! that drains it if it is abandoned early (see `body::linger`).
//!
//! Invariants: a request never mixes two generations (routing indices, pools and metrics stay
//! consistent); requests already in flight keep their generation alive until they finish; no
//! lock is held across `.await` (reloads are serialised by a std mutex held only inside the
//! synchronous `reload`); a rejected reload publishes nothing.

use std::cell::RefCell;
use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use arc_swap::ArcSwap;
use bytes::Bytes;
use futures_util::future::Either;
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use tower::util::{BoxCloneSyncService, Oneshot};
use tower::{Service as _, ServiceExt};

use super::diff::Changes;
use super::reload::ReloadError;
use super::{ops, stack, State};
use crate::body::linger::{self, Linger};
use crate::body::timeout::TimedBody;
use crate::config::Config;
use crate::response::ResponseBody;

/// The request body the stacks read: hyper's, cut after `[server] client_body_timeout_ms`
/// without progress (the timeout of the generation in force when the request arrived), and
/// drained in the background when abandoned early.
pub type Timed = Linger<TimedBody<Incoming>>;

type HttpStack = BoxCloneSyncService<Request<Timed>, Response<ResponseBody>, Infallible>;

/// The stack jobs re-enter (`jobs::runner`): the same stack over a body read from no socket.
pub(super) type JobStack =
    BoxCloneSyncService<Request<Full<Bytes>>, Response<ResponseBody>, Infallible>;

/// One configuration generation: its state and the stacks built from it.
pub struct Generation {
    /// The shared state of this generation.
    pub state: State,
    /// The main listener's stack, then the operations listener's (indexed by `ops as usize`).
    stacks: [HttpStack; 2],
    /// With `[jobs]`: the stack the jobs runner sends jobs through.
    jobs: Option<JobStack>,
}

impl Generation {
    fn new(state: State) -> Self {
        Self {
            stacks: [
                BoxCloneSyncService::new(stack::<Timed>(&state)),
                BoxCloneSyncService::new(ops::stack::<Timed>(&state)),
            ],
            jobs: state
                .jobs
                .is_some()
                .then(|| BoxCloneSyncService::new(stack::<Full<Bytes>>(&state))),
            state,
        }
    }

    /// The stack jobs are sent through (`None` without `[jobs]`).
    pub(super) fn jobs(&self) -> Option<&JobStack> {
        self.jobs.as_ref()
    }
}

/// The generation in force and where to reload it from.
pub struct Live {
    current: ArcSwap<Generation>,
    path: Option<PathBuf>,
    reloading: Mutex<()>,
    /// The registry's tenants version the generation in force was built at.
    tenants_applied: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for Live {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Live").field("path", &self.path).finish()
    }
}

impl Live {
    /// The first generation, from `state`; `path`: the config file reloads re-read.
    pub fn new(mut state: State, path: Option<PathBuf>) -> Arc<Self> {
        Arc::new_cyclic(|weak: &Weak<Live>| {
            let hook: Weak<dyn crate::admin::Reload> = weak.clone();
            state.reloader = Some(hook);
            let applied = state.runtime.as_ref().map_or(0, |r| r.tenants_version());
            Live {
                current: ArcSwap::from_pointee(Generation::new(state)),
                path,
                reloading: Mutex::new(()),
                tenants_applied: applied.into(),
            }
        })
    }

    /// The generation in force.
    pub fn current(&self) -> Arc<Generation> {
        self.current.load_full()
    }

    /// Re-reads the config file and applies it (see `server::reload`); what SIGHUP and
    /// `POST /admin/reload` call. Logs `config reloaded` (and a warning naming the keys that need
    /// a restart), or `config reload rejected: <error>` at error level. Blocking (reads the
    /// file): call it off the async threads.
    pub fn reload(&self) -> Result<Changes, ReloadError> {
        let result = self.try_reload();
        match &result {
            Ok(c) => {
                tracing::info!(
                    tenants_added = ?c.tenants_added,
                    tenants_removed = ?c.tenants_removed,
                    tenants_changed = ?c.tenants_changed,
                    upstreams_added = ?c.upstreams_added,
                    upstreams_removed = ?c.upstreams_removed,
                    upstreams_changed = ?c.upstreams_changed,
                    settings_changed = ?c.settings_changed,
                    "config reloaded"
                );
                if !c.restart_required.is_empty() {
                    tracing::warn!(
                        keys = ?c.restart_required,
                        "config reloaded, but these keys only change on restart; \
                         their previous values stay in force"
                    );
                }
            }
            Err(e) => tracing::error!("config reload rejected: {e}"),
        }
        result
    }

    /// Rebuilds the generation in force for the API tenants as they are now (`tenant::runtime`),
    /// unless it already has them: concurrent changes are applied by one rebuild. Blocking.
    pub fn apply_tenants(&self) -> Result<(), ReloadError> {
        use std::sync::atomic::Ordering;
        let _serial = self.reloading.lock().unwrap_or_else(|p| p.into_inner());
        let current = self.current.load_full();
        let Some(runtime) = &current.state.runtime else {
            return Ok(());
        };
        let version = runtime.tenants_version();
        if self.tenants_applied.load(Ordering::Acquire) >= version {
            return Ok(());
        }
        let file = runtime.file_config(&current.state.config);
        let (state, c) = current.state.reloaded_tenants(file).inspect_err(|e| {
            tracing::error!("API tenants not applied: {e}");
        })?;
        self.current.store(Arc::new(Generation::new(state)));
        self.tenants_applied.store(version, Ordering::Release);
        tracing::info!(
            tenants_added = ?c.tenants_added,
            tenants_removed = ?c.tenants_removed,
            tenants_changed = ?c.tenants_changed,
            "API tenants applied"
        );
        Ok(())
    }

    fn try_reload(&self) -> Result<Changes, ReloadError> {
        let _serial = self.reloading.lock().unwrap_or_else(|p| p.into_inner());
        let path = self.path.as_ref().ok_or(ReloadError::NoFile)?;
        let config = Config::load(path)?;
        let (state, changes) = self.current.load().state.reloaded(config)?;
        self.current.store(Arc::new(Generation::new(state)));
        Ok(changes)
    }
}

impl crate::admin::Reload for Live {
    fn reload(&self) -> Result<serde_json::Value, ReloadError> {
        let changes = Live::reload(self)?;
        Ok(serde_json::json!({ "reloaded": true, "changes": changes }))
    }

    fn apply_tenants(&self) -> Result<(), ReloadError> {
        Live::apply_tenants(self)
    }

    fn config_file(&self) -> Option<String> {
        self.path.as_ref().map(|p| p.display().to_string())
    }
}

/// The hyper service of a listener: each request goes through the generation in force.
#[derive(Clone, Debug)]
pub struct LiveService {
    live: Arc<Live>,
    ops: bool,
}

impl LiveService {
    /// The main listener's service (`ops`: false) or the operations listener's (true).
    pub fn new(live: Arc<Live>, ops: bool) -> Self {
        Self { live, ops }
    }

    /// `[server] client_write_timeout_ms` of the generation in force.
    pub fn client_write_timeout(&self) -> Duration {
        Duration::from_millis(
            self.live
                .current
                .load()
                .state
                .config
                .server
                .client_write_timeout_ms,
        )
    }
}

/// This thread's stacks of the generation it last served (see the module docs).
struct Cached {
    generation: Arc<Generation>,
    stacks: [HttpStack; 2],
}

thread_local! {
    static CACHED: RefCell<Option<Cached>> = const { RefCell::new(None) };
}

type StackFuture = crate::stage::BoxFuture<Result<Response<ResponseBody>, Infallible>>;

impl hyper::service::Service<Request<Incoming>> for LiveService {
    type Response = Response<ResponseBody>;
    type Error = Infallible;
    type Future = Either<StackFuture, Oneshot<HttpStack, Request<Timed>>>;

    fn call(&self, req: Request<Incoming>) -> Self::Future {
        let generation = self.live.current.load();
        let server = &generation.state.config.server;
        let timeout = Duration::from_millis(server.client_body_timeout_ms);
        let bounds = linger::Bounds {
            max_bytes: server.linger_max_bytes,
            max_time: Duration::from_millis(server.linger_timeout_ms),
        };
        let (head, body) = req.into_parts();
        let head = Request::from_parts(head, ());
        let body = Linger::new(crate::body::timeout::timed(body, timeout), bounds, &head);
        let mut req = Some(head.map(|()| body));
        let in_place = CACHED.with(|cell| {
            let mut cell = cell.try_borrow_mut().ok()?;
            if !cell
                .as_ref()
                .is_some_and(|c| Arc::ptr_eq(&c.generation, &generation))
            {
                *cell = Some(Cached {
                    generation: Arc::clone(&generation),
                    stacks: generation.stacks.clone(),
                });
            }
            let cached = cell.as_mut()?;
            let stack = &mut cached.stacks[usize::from(self.ops)];
            // Every stage is always ready (none holds back in `poll_ready`); were one not, the
            // request takes the cloning path below, which waits for it.
            match stack.poll_ready(&mut Context::from_waker(Waker::noop())) {
                Poll::Ready(Ok(())) => Some(stack.call(req.take()?)),
                _ => None,
            }
        });
        match (in_place, req) {
            (Some(fut), _) => Either::Left(fut),
            (None, Some(req)) => Either::Right(
                generation.stacks[usize::from(self.ops)]
                    .clone()
                    .oneshot(req),
            ),
            (None, None) => unreachable!("the request is taken only with a future"),
        }
    }
}
