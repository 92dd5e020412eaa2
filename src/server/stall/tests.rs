use std::sync::atomic::{AtomicBool, Ordering};

use http_body_util::{BodyExt, StreamBody};
use tokio::sync::mpsc;

use super::*;
use crate::response::idle::{IdleTimeout, IdleTimeoutError};

struct Flag(Arc<AtomicBool>);
impl Drop for Flag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

type Tx = mpsc::Sender<Result<Frame<Bytes>, BoxError>>;

/// A streamed body fed by the returned sender, with a guard that flags its drop.
fn streamed(idle: Option<Duration>) -> (ResponseBody, Tx, Arc<AtomicBool>) {
    let (tx, rx) = mpsc::channel::<Result<Frame<Bytes>, BoxError>>(8);
    let stream =
        futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|f| (f, rx)) });
    let mut body = match idle {
        Some(t) => ResponseBody::boxed(IdleTimeout::new(StreamBody::new(stream), t)),
        None => ResponseBody::boxed(StreamBody::new(stream)),
    };
    let dropped = Arc::new(AtomicBool::new(false));
    body.attach(Box::new(Flag(dropped.clone())));
    (body, tx, dropped)
}

fn data(s: &'static str) -> Result<Frame<Bytes>, BoxError> {
    Ok(Frame::data(Bytes::from_static(s.as_bytes())))
}

const T: Duration = Duration::from_secs(30);

#[tokio::test(start_paused = true)]
async fn a_client_that_stops_reading_is_cut_and_every_guard_released() {
    let (body, tx, dropped) = streamed(None);
    let ctx = Ctx::new();
    let abort = Arc::new(Notify::new());
    let mut watched = std::pin::pin!(watch(body, Some(ctx.clone()), T, abort.clone()));
    tx.send(data("a")).await.unwrap();
    tx.send(data("b")).await.unwrap();
    assert!(watched.frame().await.unwrap().is_ok());
    // The client takes one frame, then reads nothing for the timeout.
    tokio::time::sleep(T - Duration::from_secs(1)).await;
    assert!(!dropped.load(Ordering::SeqCst), "cut before the timeout");
    tokio::time::timeout(Duration::from_secs(2), abort.notified())
        .await
        .expect("the connection is told to close");
    assert!(
        dropped.load(Ordering::SeqCst),
        "the guards are released at once"
    );
    assert!(ctx.stalled());
    // The frame read ahead is lost with the body; what hyper gets next is the abort.
    let next = watched.frame().await.unwrap().unwrap_err();
    assert!(next.is::<ClientStalled>(), "{next}");
}

#[tokio::test(start_paused = true)]
async fn a_reading_client_behind_a_slow_upstream_is_never_cut() {
    let (body, tx, dropped) = streamed(None);
    let ctx = Ctx::new();
    let abort = Arc::new(Notify::new());
    let mut watched = std::pin::pin!(watch(body, Some(ctx.clone()), T, abort));
    for _ in 0..3 {
        // The client keeps reading; the upstream takes longer than the write timeout.
        let send = async {
            tokio::time::sleep(T * 2).await;
            tx.send(data("x")).await.unwrap();
        };
        let (frame, ()) = tokio::join!(watched.frame(), send);
        assert!(frame.unwrap().is_ok());
    }
    drop(tx);
    assert!(watched.frame().await.is_none());
    assert!(dropped.load(Ordering::SeqCst));
    assert!(!ctx.stalled());
}

#[tokio::test(start_paused = true)]
async fn the_upstream_idle_timeout_fires_while_the_client_is_not_reading() {
    let idle = Duration::from_secs(5);
    let (body, tx, dropped) = streamed(Some(idle));
    let ctx = Ctx::new();
    let abort = Arc::new(Notify::new());
    let mut watched = std::pin::pin!(watch(body, Some(ctx.clone()), T, abort));
    tx.send(data("a")).await.unwrap();
    assert!(watched.frame().await.unwrap().is_ok());
    // The client stops reading and the upstream goes silent: the idle timeout still fires.
    tokio::time::sleep(idle + Duration::from_secs(1)).await;
    assert!(
        dropped.load(Ordering::SeqCst),
        "the upstream is cancelled at its idle timeout"
    );
    assert!(!ctx.stalled());
    let err = watched.frame().await.unwrap().unwrap_err();
    assert!(err.is::<IdleTimeoutError>(), "{err}");
    drop(tx);
}

#[tokio::test(start_paused = true)]
async fn read_ahead_buffers_one_frame_only() {
    let (body, tx, _dropped) = streamed(None);
    let abort = Arc::new(Notify::new());
    let mut watched = std::pin::pin!(watch(body, None, T, abort));
    tx.send(data("a")).await.unwrap();
    assert!(watched.frame().await.unwrap().is_ok());
    for _ in 0..5 {
        tx.send(data("b")).await.unwrap();
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    // One frame was taken from the upstream while the client held the first; the rest wait.
    assert_eq!(tx.capacity(), 8 - 4);
}

/// A body that ends with its frame (a non-streamed answer) says so after the frame, so hyper
/// drops it with every guard, and no watchdog task is spawned for it; a streamed body gets one
/// when hyper takes its first frame.
#[tokio::test(start_paused = true)]
async fn a_body_that_ends_with_its_frame_needs_no_watchdog_task() {
    let alive = || {
        tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks()
    };
    let before = alive();
    let mut full = std::pin::pin!(watch(
        ResponseBody::full("{}"),
        None,
        T,
        Arc::new(Notify::new())
    ));
    assert!(!full.is_end_stream());
    assert!(full.frame().await.unwrap().is_ok());
    assert!(
        full.is_end_stream(),
        "hyper would poll again instead of dropping it"
    );
    assert_eq!(alive(), before, "a task for a body that already ended");

    let (body, tx, _dropped) = streamed(None);
    let mut streamed = std::pin::pin!(watch(body, None, T, Arc::new(Notify::new())));
    tx.send(data("a")).await.unwrap();
    assert!(streamed.frame().await.unwrap().is_ok());
    assert!(!streamed.is_end_stream());
    assert_eq!(alive(), before + 1, "the streamed body is watched");
}
