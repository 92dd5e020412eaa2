//! How the jobs runner re-enters the stack ([`dispatch`]): each job, as a request read from no
//! socket (its `context::JobRun` identifies it), goes through the stack of the generation in
//! force, which the generation built once (`live::Generation`), on the connection workers in
//! turn.
//!
//! Why on a worker: the upstream client a request forwards with is the lane of the worker it
//! runs on (`crate::worker::current`), and the lane's connections are tasks of the runtime of
//! the request that opened them. The runner's own runtime is no worker: run there, every job
//! took lane 0, opening connections on the runner's runtime that worker 0's requests then
//! reused (their I/O woken across threads), and leaving the other lanes' pools to the
//! interactive traffic alone. Handed to worker `i` (`workers::Job`), a job uses lane `i` and
//! its connections live on worker `i` like every other request's.
//!
//! Invariants: a job's request (its head and its body, read whole by
//! `jobs::runner::Answer::read`) runs on one worker, spawned there beside its connections: on
//! stop it is drained with them within `shutdown_grace_ms`, then aborted; the stack is cloned
//! from the generation in force, never built per job; a job a stopped worker does not take, or
//! aborts, comes back as `None` (the runner queues it again), never as an answer.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};
use tower::ServiceExt;

use super::workers::Job;
use super::Live;
use crate::jobs::runner::{Answer, Dispatch};

/// The runner's [`Dispatch`]: each job to the next of `workers` (round robin; with none, on
/// the caller's runtime), through the job stack of the generation in force.
pub(super) fn dispatch(live: Arc<Live>, workers: Vec<mpsc::UnboundedSender<Job>>) -> Dispatch {
    let next = AtomicUsize::new(0);
    Arc::new(move |req| {
        let generation = live.current();
        let (tx, rx) = oneshot::channel();
        let run = async move {
            let Some(stack) = generation.jobs().cloned() else {
                return;
            };
            let res = match stack.oneshot(req).await {
                Ok(res) => res,
                Err(never) => match never {},
            };
            let _ = tx.send(Answer::read(res).await);
        };
        match workers.len() {
            0 => drop(tokio::spawn(run)),
            n => {
                // A worker that stopped drops the job unrun: `rx` then says so.
                let _ = workers[next.fetch_add(1, Ordering::Relaxed) % n].send(Box::pin(run));
            }
        }
        Box::pin(async move { rx.await.ok() })
    })
}

#[cfg(test)]
mod tests;
