//! The process log: the writer (here), the text format's field formatter ([`fields`]) and the
//! timestamp ([`clock`]).
//!
//! Log output batched off the request path: [`Batched`] is the `MakeWriter` of the process's
//! log subscriber. A request appends its formatted line to a shared buffer (one short mutex
//! section, no syscall); a background thread writes the buffer to stdout every
//! [`FLUSH_EVERY`] or as soon as it holds [`FLUSH_AT`] bytes.
//!
//! Why not a line-per-`write(2)` stdout: measured with `perf stat -e 'syscalls:sys_enter_*'`
//! under the overhead benchmark, the per-request log line was one of seven syscalls per
//! request. Why not `tracing-appender`'s non-blocking writer: it still writes each line with
//! its own syscall (stdout is line-buffered) and its channel added ~1 `sched_yield` and a
//! third of a `futex` per request.
//!
//! Invariants: the buffer is bounded ([`MAX_BUFFERED`]); a line that does not fit is dropped
//! and counted, and the count is written out (as its own line) at the next flush, so a stalled
//! stdout never stalls or grows the proxy. Lines are written whole and in order. Dropping the
//! [`FlushGuard`] writes whatever is left.

pub mod clock;
pub mod fields;

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// How often the background thread writes.
pub const FLUSH_EVERY: Duration = Duration::from_millis(25);
/// A buffer this full is written without waiting for the tick.
pub const FLUSH_AT: usize = 64 * 1024;
/// Beyond this, lines are dropped (and counted) until the writer catches up.
pub const MAX_BUFFERED: usize = 8 * 1024 * 1024;

struct Shared {
    buf: Mutex<State>,
    wake: Condvar,
    dropped: AtomicU64,
}

#[derive(Default)]
struct State {
    lines: Vec<u8>,
    closed: bool,
}

/// The subscriber's writer factory; clones share one buffer.
#[derive(Clone)]
pub struct Batched(Arc<Shared>);

/// Flushes and stops the background writer when dropped (keep it until exit).
pub struct FlushGuard {
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Batched {
    /// A writer into `out` (stdout in `fairgate serve`), with its background thread.
    pub fn new(out: impl Write + Send + 'static) -> (Self, FlushGuard) {
        let shared = Arc::new(Shared {
            buf: Mutex::new(State::default()),
            wake: Condvar::new(),
            dropped: AtomicU64::new(0),
        });
        let for_thread = shared.clone();
        let thread = std::thread::Builder::new()
            .name("fairgate-log".into())
            .spawn(move || run(&for_thread, out))
            .ok();
        (Self(shared.clone()), FlushGuard { shared, thread })
    }

    /// Lines dropped so far because the buffer was full.
    pub fn dropped(&self) -> u64 {
        self.0.dropped.load(Ordering::Relaxed)
    }
}

fn lock(shared: &Shared) -> std::sync::MutexGuard<'_, State> {
    shared.buf.lock().unwrap_or_else(|p| p.into_inner())
}

fn run(shared: &Shared, mut out: impl Write) {
    let mut spare = Vec::with_capacity(FLUSH_AT);
    loop {
        let closed = {
            let mut st = lock(shared);
            if st.lines.len() < FLUSH_AT && !st.closed {
                st = shared
                    .wake
                    .wait_timeout(st, FLUSH_EVERY)
                    .map(|(g, _)| g)
                    .unwrap_or_else(|p| p.into_inner().0);
            }
            std::mem::swap(&mut st.lines, &mut spare);
            st.closed
        };
        let dropped = shared.dropped.swap(0, Ordering::Relaxed);
        if dropped > 0 {
            let _ = writeln!(
                spare,
                "fairgate: {dropped} log lines dropped (log output fell behind)"
            );
        }
        if !spare.is_empty() {
            // A failing stdout cannot be reported anywhere better; keep serving.
            let _ = out.write_all(&spare).and_then(|()| out.flush());
            spare.clear();
        }
        if closed {
            return;
        }
    }
}

/// One event's writer: appends to the shared buffer.
pub struct Line<'a>(&'a Shared);

impl Write for Line<'_> {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        let mut st = lock(self.0);
        if st.lines.len() + data.len() > MAX_BUFFERED {
            drop(st);
            self.0.dropped.fetch_add(1, Ordering::Relaxed);
        } else {
            st.lines.extend_from_slice(data);
            if st.lines.len() >= FLUSH_AT {
                self.0.wake.notify_one();
            }
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Batched {
    type Writer = Line<'a>;
    fn make_writer(&'a self) -> Line<'a> {
        Line(&self.0)
    }
}

impl Drop for FlushGuard {
    fn drop(&mut self) {
        lock(&self.shared).closed = true;
        self.shared.wake.notify_one();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<u8>>>);
    impl Write for Sink {
        fn write(&mut self, d: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(d);
            Ok(d.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn lines_come_out_whole_in_order_and_the_guard_flushes_the_rest() {
        let sink = Sink::default();
        let (w, guard) = Batched::new(sink.clone());
        for i in 0..1000 {
            use tracing_subscriber::fmt::MakeWriter;
            writeln!(w.make_writer(), "line {i}").unwrap();
        }
        drop(guard);
        let text = String::from_utf8(sink.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<_> = text.lines().collect();
        assert_eq!(lines.len(), 1000);
        assert!(lines
            .iter()
            .enumerate()
            .all(|(i, l)| *l == format!("line {i}")));
    }

    /// A writer that never returns: a stalled stdout.
    struct Stalled;
    impl Write for Stalled {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            std::thread::park();
            Ok(0)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_stalled_output_drops_and_counts_lines_instead_of_growing() {
        let (w, guard) = Batched::new(Stalled);
        let line = vec![b'x'; 1023];
        use tracing_subscriber::fmt::MakeWriter;
        // Enough to fill the buffer several times over, whatever the writer thread took.
        for _ in 0..(4 * MAX_BUFFERED / 1024) {
            w.make_writer().write_all(&line).unwrap();
        }
        assert!(lock(&w.0).lines.len() <= MAX_BUFFERED);
        assert!(w.dropped() > 0);
        // The writer thread is parked forever; don't join it.
        std::mem::forget(guard);
    }
}
