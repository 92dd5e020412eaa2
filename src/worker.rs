//! Which connection worker this thread is: set once by `server::workers` on each worker's
//! thread, read by `upstream` to pick that worker's pooled client (its lane).
//!
//! A leaf, so the stage that reads it does not import the server that sets it.

use std::cell::Cell;

thread_local! {
    static WORKER: Cell<usize> = const { Cell::new(0) };
}

/// The index of the connection worker running on this thread (0 on any other thread).
pub fn current() -> usize {
    WORKER.with(Cell::get)
}

/// Marks this thread as connection worker `index`.
pub fn set(index: usize) {
    WORKER.with(|w| w.set(index));
}
