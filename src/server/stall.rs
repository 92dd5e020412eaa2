//! The write watchdog: `[server] client_write_timeout_ms` (nginx's `send_timeout`).
//!
//! hyper polls a response body only when it can write: a client that stops reading (HTTP/1.1:
//! its socket does not drain; h2: its stream's flow-control window stays shut) simply stops the
//! polling, and the body — with the fair-queue permit, the capacity ticket, the usage observer
//! and the log line attached to it — would live as long as the client keeps its socket open.
//! [`watch`] moves the body into a slot shared with a small watchdog task:
//!
//! - When hyper takes a frame, the watchdog starts the clock. If hyper has not come back for
//!   the next frame within the timeout, the client is stalled: the watchdog marks the request's
//!   context `stalled`, drops the body (cancelling the upstream request and releasing every
//!   guard at once), and tells the connection to close.
//! - While the client is not reading, the watchdog reads at most **one** frame ahead from the
//!   upstream, so the upstream's idle timeout (`response::idle`) still fires while the client
//!   is stalled; nothing more is buffered (the buffer is one frame).
//! - While hyper waits on the upstream (its last poll was `Pending`) nothing is timed: a slow
//!   upstream is the idle timeout's business, not this one's.
//!
//! No task for a body that ends with the frame hyper takes (`is_end_stream` says so and hyper
//! drops it with that frame): fairgate's own answers, e.g. every refusal of a flood. An upstream
//! answer is watched from its first frame: the usage stage learns of the end only by polling
//! once more (it may still have bytes to add), so it never says `is_end_stream` early.
//!
//! Invariants: the std mutex is held only inside a poll (never across `.await`); the body is
//! dropped outside the lock; the watchdog ends when the body ends, is dropped or is aborted.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::context::Ctx;
use crate::response::{BoxError, ResponseBody};

/// The response was cut because its client accepted no bytes for the timeout.
#[derive(Debug, thiserror::Error)]
#[error("the client accepted no bytes for {0:?}")]
pub struct ClientStalled(pub Duration);

type Polled = Option<Result<Frame<Bytes>, BoxError>>;

struct Slot {
    /// The body; `None` once it ended, was dropped or aborted.
    body: Option<Pin<Box<ResponseBody>>>,
    /// One frame (or the end, or an error) read ahead by the watchdog.
    ahead: Option<Polled>,
    /// When hyper took its last frame, if it has not come back since.
    handed: Option<Instant>,
    /// Aborted by the watchdog.
    stalled: bool,
}

struct Shared {
    slot: Mutex<Slot>,
    /// Pinged on every change the watchdog waits for (a frame handed, hyper back, the end).
    changed: Notify,
    timeout: Duration,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Slot> {
        self.slot.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A response body under the write watchdog; see the module docs.
pub struct Watched {
    shared: Arc<Shared>,
    end: bool,
    hint: SizeHint,
    /// What the watchdog needs, until it is spawned.
    arm: Option<(Option<Ctx>, Arc<Notify>)>,
}

/// Puts `body` under the watchdog with `timeout`; `ctx` is marked stalled and `abort` pinged
/// when the client stalls. The watchdog task is spawned (on the current runtime) when hyper
/// takes the first frame the body does not end with: a body that ends with its frame (a
/// non-streamed answer of known length) says so through `is_end_stream`, hyper drops it with
/// that frame and every guard goes with it, so there is nothing to watch and no task.
pub fn watch(
    body: ResponseBody,
    ctx: Option<Ctx>,
    timeout: Duration,
    abort: Arc<Notify>,
) -> Watched {
    let end = body.is_end_stream();
    let hint = body.size_hint();
    let shared = Arc::new(Shared {
        slot: Mutex::new(Slot {
            body: Some(Box::pin(body)),
            ahead: None,
            handed: None,
            stalled: false,
        }),
        changed: Notify::new(),
        timeout,
    });
    Watched {
        shared,
        end,
        hint,
        arm: (!end).then_some((ctx, abort)),
    }
}

async fn watchdog(shared: Arc<Shared>, ctx: Option<Ctx>, abort: Arc<Notify>) {
    loop {
        let changed = shared.changed.notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        let (handed, ahead) = {
            let slot = shared.lock();
            if slot.body.is_none() {
                return;
            }
            (slot.handed, slot.ahead.is_some())
        };
        let Some(since) = handed else {
            // hyper is polling or waiting on the upstream: nothing to time.
            changed.await;
            continue;
        };
        let read_ahead = std::future::poll_fn(|cx| read_ahead(&shared, since, cx));
        tokio::select! {
            _ = tokio::time::sleep_until(since + shared.timeout) => {
                let body = {
                    let mut slot = shared.lock();
                    if slot.handed != Some(since) {
                        continue;
                    }
                    slot.stalled = true;
                    slot.ahead = None;
                    slot.body.take()
                };
                if let Some(ctx) = &ctx {
                    ctx.set_stalled();
                }
                tracing::debug!(timeout_ms = shared.timeout.as_millis() as u64, "client stalled: response aborted");
                // Outside the lock: runs every guard (permit, ticket, usage, log line).
                drop(body);
                abort.notify_one();
                return;
            }
            _ = changed => {}
            _ = read_ahead, if !ahead => {}
        }
    }
}

/// Reads one frame ahead while hyper holds the frame handed at `since`.
fn read_ahead(shared: &Shared, since: Instant, cx: &mut Context<'_>) -> Poll<()> {
    let mut slot = shared.lock();
    if slot.handed != Some(since) || slot.ahead.is_some() {
        return Poll::Ready(());
    }
    let Some(body) = slot.body.as_mut() else {
        return Poll::Ready(());
    };
    let polled = std::task::ready!(body.as_mut().poll_frame(cx));
    let finished = !matches!(polled, Some(Ok(_)));
    slot.ahead = Some(polled);
    // The end or an error (e.g. the upstream's idle timeout): release everything now; hyper
    // gets the outcome when it comes back.
    let body = if finished { slot.body.take() } else { None };
    drop(slot);
    drop(body);
    Poll::Ready(())
}

impl Body for Watched {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let shared = self.shared.clone();
        let mut slot = shared.lock();
        let was_handed = slot.handed.take().is_some();
        let polled = if let Some(ahead) = slot.ahead.take() {
            ahead
        } else if slot.stalled {
            Some(Err(Box::new(ClientStalled(shared.timeout)) as BoxError))
        } else if let Some(body) = slot.body.as_mut() {
            match body.as_mut().poll_frame(cx) {
                Poll::Ready(p) => p,
                Poll::Pending => {
                    drop(slot);
                    if was_handed {
                        shared.changed.notify_one();
                    }
                    return Poll::Pending;
                }
            }
        } else {
            None
        };
        let mut spawn = None;
        let body = match &polled {
            Some(Ok(_)) => {
                slot.handed = Some(Instant::now());
                if slot.body.as_ref().is_some_and(|b| !b.is_end_stream()) {
                    spawn = self.arm.take();
                }
                None
            }
            _ => {
                self.end = true;
                slot.body.take()
            }
        };
        drop(slot);
        drop(body);
        if let Some((ctx, abort)) = spawn {
            tokio::spawn(watchdog(shared.clone(), ctx, abort));
        }
        shared.changed.notify_one();
        Poll::Ready(polled)
    }

    fn is_end_stream(&self) -> bool {
        if self.end {
            return true;
        }
        let slot = self.shared.lock();
        // A stalled body is not ended: hyper must poll once more and get `ClientStalled`.
        !slot.stalled
            && slot.ahead.is_none()
            && slot.body.as_ref().is_none_or(|b| b.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        self.hint
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        let body = self.shared.lock().body.take();
        drop(body);
        self.shared.changed.notify_one();
    }
}

#[cfg(test)]
mod tests;
