//! The paced SSE frame sequence of a streaming response.
//!
//! A stream is: an optional `pre` frame, `total` token frames (the first may differ, e.g. it carries
//! the assistant role), then the `tail` frames (final chunk, optional usage chunk, `[DONE]`).
//!
//! Invariants:
//! - With a zero token delay no timer is ever created; with a non-zero one, one `Sleep` is
//!   allocated per stream and reset before each token frame.
//! - Frames are prebuilt `Bytes`; identical token frames are refcount clones, not copies.
//! - With `abort_after = Some(n)` at most `n` frames are emitted and the final frame never is:
//!   the stream then ends with an error, which makes hyper cut the connection (HTTP/1.1) or reset
//!   the stream (h2) — a mid-stream upstream failure as a proxy would see it.

use std::future::Future as _;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use tokio::time::{Instant, Sleep};

/// What [`SseStream::poll_next`] yields.
#[derive(Debug)]
pub(crate) enum Step {
    /// A frame; `last` is true when no frame follows.
    Frame { data: Bytes, last: bool },
    /// The mock cuts the stream here on purpose.
    Abort,
}

/// A prebuilt, paced sequence of SSE frames.
#[derive(Debug)]
pub(crate) struct SseStream {
    pre: Option<Bytes>,
    first: Bytes,
    rest: Bytes,
    total: u32,
    sent_tokens: u32,
    tail: std::vec::IntoIter<Bytes>,
    delay: Duration,
    sleep: Option<Pin<Box<Sleep>>>,
    sleeping: bool,
    abort_after: Option<u32>,
    frames: u32,
}

impl SseStream {
    /// `tail` must hold at least one frame (the stream's terminator).
    pub fn new(
        pre: Option<Bytes>,
        first: Bytes,
        rest: Bytes,
        total: u32,
        tail: Vec<Bytes>,
        delay: Duration,
        abort_after: Option<u32>,
    ) -> Self {
        SseStream {
            pre,
            first,
            rest,
            total,
            sent_tokens: 0,
            tail: tail.into_iter(),
            delay,
            sleep: None,
            sleeping: false,
            abort_after,
            frames: 0,
        }
    }

    /// True once every frame has been handed out.
    pub fn is_done(&self) -> bool {
        self.pre.is_none() && self.sent_tokens == self.total && self.tail.len() == 0
    }

    /// Waits for the token delay (if any) before a token frame.
    fn pace(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if self.delay.is_zero() {
            return Poll::Ready(());
        }
        let sleep = match &mut self.sleep {
            Some(sleep) => sleep,
            none => none.insert(Box::pin(tokio::time::sleep(self.delay))),
        };
        if !self.sleeping {
            sleep.as_mut().reset(Instant::now() + self.delay);
            self.sleeping = true;
        }
        if sleep.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        self.sleeping = false;
        Poll::Ready(())
    }

    pub fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<Step>> {
        if self.is_done() {
            return Poll::Ready(None);
        }
        if let Some(limit) = self.abort_after {
            let next_is_last =
                self.pre.is_none() && self.sent_tokens == self.total && self.tail.len() == 1;
            if self.frames >= limit || next_is_last {
                // State is left as is: every later poll aborts again, and `is_done` stays false.
                return Poll::Ready(Some(Step::Abort));
            }
        }
        let data = if let Some(pre) = self.pre.take() {
            pre
        } else if self.sent_tokens < self.total {
            if self.pace(cx).is_pending() {
                return Poll::Pending;
            }
            self.sent_tokens += 1;
            if self.sent_tokens == 1 {
                self.first.clone()
            } else {
                self.rest.clone()
            }
        } else {
            match self.tail.next() {
                Some(frame) => frame,
                None => return Poll::Ready(None),
            }
        };
        self.frames += 1;
        Poll::Ready(Some(Step::Frame {
            data,
            last: self.is_done(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(mut s: SseStream) -> (Vec<Bytes>, bool) {
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let mut out = Vec::new();
        loop {
            match s.poll_next(&mut cx) {
                Poll::Ready(Some(Step::Frame { data, .. })) => out.push(data),
                Poll::Ready(Some(Step::Abort)) => return (out, true),
                Poll::Ready(None) => return (out, false),
                Poll::Pending => panic!("zero delay never waits"),
            }
        }
    }

    fn stream(total: u32, abort_after: Option<u32>) -> SseStream {
        let b = Bytes::from_static;
        SseStream::new(
            Some(b(b"pre")),
            b(b"first"),
            b(b"rest"),
            total,
            vec![b(b"final"), b(b"done")],
            Duration::ZERO,
            abort_after,
        )
    }

    #[test]
    fn emits_frames_in_order() {
        let (frames, aborted) = drain(stream(3, None));
        assert!(!aborted);
        let names: Vec<&[u8]> = frames.iter().map(|f| &f[..]).collect();
        let expected: Vec<&[u8]> = vec![b"pre", b"first", b"rest", b"rest", b"final", b"done"];
        assert_eq!(names, expected);
    }

    #[test]
    fn abort_cuts_before_the_terminator() {
        assert_eq!(drain(stream(3, Some(2))).0.len(), 2);
        let (frames, aborted) = drain(stream(3, Some(100)));
        assert!(aborted);
        assert_eq!(frames.last().map(|f| &f[..]), Some(&b"final"[..]));
    }
}
