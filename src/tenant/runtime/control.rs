//! The control plane's thread: the runtime tenants' store writes (the SQLite transaction of a
//! tenant or key created, changed, deleted or revoked) run on one dedicated thread at the
//! lowest CPU priority the system gives without privilege, so a burst of admin writes takes
//! only the CPU the connection workers leave.
//!
//! Invariants:
//! - One thread, started on the first write, runs the writes one at a time in the order they
//!   were admitted, and exits when its [`Control`] is dropped. Its priority is set once, on
//!   itself: `SCHED_IDLE` (Linux; no privilege needed), else nice 19 on its thread id, else it
//!   runs at normal priority and says so once in the log ([`lower_priority`]).
//! - Admin writes in progress are bounded ([`Control::admit`]: at most `max_queued_writes`
//!   slots, a slot held for a write's whole life, queueing included); one more is refused at
//!   once with [`Busy`], whose wait is what the writes ahead take at the recent pace.
//! - The thread holds no lock the request path takes: it never touches the key index, the
//!   generation, the fair queues or the log (a low-priority thread preempted inside one of
//!   those would stall the workers waiting on it). The caller, a connection worker at normal
//!   priority, applies the written change to the index and logs it after the write returns.
//! - A write that panics fails alone (its caller gets [`Gone`]); the thread goes on.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex, OnceLock};
use std::time::Duration;

/// Default bound of admin writes in progress (`[admin] max_queued_writes`).
pub const DEFAULT_MAX_QUEUED_WRITES: usize = 256;

/// A write refused because `max_queued_writes` are already waiting: retry after this.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Busy(pub Duration);

/// The control thread died or dropped the write (it panicked).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gone;

/// The priority the control thread runs at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Priority {
    /// `SCHED_IDLE`: runs only when no normal thread wants the core.
    Idle,
    /// Nice 19 (`SCHED_IDLE` refused).
    Nice19,
    /// Neither could be set: normal priority.
    Normal,
}

type Job = Box<dyn FnOnce() + Send>;

/// The control plane's thread and the bound on the writes waiting for it.
pub struct Control {
    max: usize,
    /// Slots held (writes admitted and not done).
    held: Arc<AtomicUsize>,
    /// Recent time a job took on the thread, in µs (an exponential average).
    pace_us: Arc<AtomicU64>,
    tx: OnceLock<Mutex<mpsc::Sender<Job>>>,
}

impl std::fmt::Debug for Control {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Control")
            .field("max", &self.max)
            .field("held", &self.held.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// One admitted write's place in the bound, given back on drop.
#[derive(Debug)]
pub struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Control {
    /// A control plane admitting at most `max_queued_writes` writes at once (0: 1).
    pub fn new(max_queued_writes: usize) -> Self {
        Self {
            max: max_queued_writes.max(1),
            held: Arc::default(),
            // Before any measure: 1 ms a write (an SQLite transaction on a busy machine).
            pace_us: Arc::new(AtomicU64::new(1000)),
            tx: OnceLock::new(),
        }
    }

    /// A slot for one write, or [`Busy`] with the wait the writes ahead take.
    pub fn admit(&self) -> Result<Slot, Busy> {
        let before = self.held.fetch_add(1, Ordering::AcqRel);
        let slot = Slot(self.held.clone());
        if before >= self.max {
            drop(slot);
            return Err(Busy(self.wait(before)));
        }
        Ok(slot)
    }

    /// What `ahead` writes take at the recent pace (at least 1 s: `Retry-After` is whole
    /// seconds).
    fn wait(&self, ahead: usize) -> Duration {
        let us = self.pace_us.load(Ordering::Relaxed).max(1);
        Duration::from_micros(us.saturating_mul(ahead as u64)).max(Duration::from_secs(1))
    }

    /// Runs `f` on the control thread (after the writes before it) and answers its result.
    pub async fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, Gone> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let pace = self.pace_us.clone();
        let job: Job = Box::new(move || {
            let t0 = std::time::Instant::now();
            let out = std::panic::catch_unwind(AssertUnwindSafe(f));
            let took = t0.elapsed().as_micros().min(u64::MAX as u128) as u64;
            // Average over ~8 jobs: the pace a full queue drains at.
            let old = pace.load(Ordering::Relaxed);
            pace.store((old * 7 + took.max(1)) / 8, Ordering::Relaxed);
            if let Ok(out) = out {
                let _ = tx.send(out);
            }
        });
        let sent = self.sender().lock().map_err(|_| Gone)?.send(job);
        sent.map_err(|_| Gone)?;
        rx.await.map_err(|_| Gone)
    }

    fn sender(&self) -> &Mutex<mpsc::Sender<Job>> {
        self.tx.get_or_init(|| {
            let (tx, rx) = mpsc::channel::<Job>();
            let spawned = std::thread::Builder::new()
                .name("fairgate-control".into())
                .spawn(move || {
                    let p = lower_priority();
                    if p == Priority::Normal {
                        tracing::warn!(
                            "the control-plane thread runs at normal priority (neither \
                             SCHED_IDLE nor nice 19 could be set): admin writes compete with \
                             requests for the CPU"
                        );
                    }
                    while let Ok(job) = rx.recv() {
                        job();
                    }
                });
            if let Err(e) = spawned {
                // No thread: every write answers Gone (a 503) as a store down would.
                tracing::error!(error = %e, "the control-plane thread did not start");
            }
            Mutex::new(tx)
        })
    }
}

/// Sets the calling thread's priority as low as it goes without privilege: `SCHED_IDLE`, else
/// nice 19 (on this thread only: Linux's `setpriority` on a thread id), else nothing.
#[allow(unsafe_code)] // sched_setscheduler / setpriority / gettid on the calling thread.
pub fn lower_priority() -> Priority {
    #[cfg(target_os = "linux")]
    {
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: pid 0 is the calling thread; `param` is a valid sched_param for the call.
        if unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) } == 0 {
            return Priority::Idle;
        }
        // SAFETY: gettid has no preconditions; setpriority on a thread id changes that thread.
        let tid = unsafe { libc::gettid() };
        if unsafe { libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 19) } == 0 {
            return Priority::Nice19;
        }
    }
    Priority::Normal
}

/// The calling thread's priority, as [`lower_priority`] names them.
#[allow(unsafe_code)] // sched_getscheduler / getpriority / gettid on the calling thread.
pub fn current_priority() -> Priority {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: pid 0 is the calling thread.
        if unsafe { libc::sched_getscheduler(0) } == libc::SCHED_IDLE {
            return Priority::Idle;
        }
        // SAFETY: as above; getpriority of this thread's id.
        let tid = unsafe { libc::gettid() };
        if unsafe { libc::getpriority(libc::PRIO_PROCESS, tid as libc::id_t) } == 19 {
            return Priority::Nice19;
        }
    }
    Priority::Normal
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn writes_run_in_order_on_one_low_priority_thread_and_a_panic_fails_alone() {
        let c = Control::new(4);
        let (name, p) = c
            .run(|| {
                let t = std::thread::current();
                (t.name().map(str::to_owned), current_priority())
            })
            .await
            .unwrap();
        assert_eq!(name.as_deref(), Some("fairgate-control"));
        #[cfg(target_os = "linux")]
        assert_ne!(p, Priority::Normal, "SCHED_IDLE or nice 19 on Linux");
        // This (the caller's) thread keeps its priority.
        assert_eq!(current_priority(), Priority::Normal);
        assert_eq!(c.run(|| -> u8 { panic!("a bad write") }).await, Err(Gone));
        let order = Arc::new(Mutex::new(Vec::new()));
        let runs: Vec<_> = (0..20)
            .map(|i| {
                let order = order.clone();
                c.run(move || order.lock().unwrap().push(i))
            })
            .collect();
        for r in futures_util::future::join_all(runs).await {
            r.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), (0..20).collect::<Vec<_>>());
    }

    #[test]
    fn a_full_queue_refuses_with_the_wait_of_the_writes_ahead() {
        let c = Control::new(3);
        let held: Vec<Slot> = (0..3).map(|_| c.admit().unwrap()).collect();
        // 3 ahead at the initial pace (1 ms each): the floor, 1 s.
        assert_eq!(c.admit().unwrap_err(), Busy(Duration::from_secs(1)));
        // At 500 ms a write, 3 ahead: 1.5 s.
        c.pace_us.store(500_000, Ordering::Relaxed);
        assert_eq!(c.admit().unwrap_err(), Busy(Duration::from_millis(1500)));
        // A refusal holds nothing; a finished write frees its slot.
        assert_eq!(c.held.load(Ordering::Relaxed), 3);
        drop(held);
        let again: Vec<Slot> = (0..3).map(|_| c.admit().unwrap()).collect();
        assert_eq!(again.len(), 3);
    }
}
