//! Giving freed memory back to the OS. mimalloc (the binary's allocator) keeps freed memory
//! resident for a purge delay (1 s) and purges only when some thread calls into it again: after
//! a burst (10,000 tenants' first requests, a 2.6 MB `/metrics` scrape, a config parse) an idle
//! proxy kept that memory for good (BENCHMARKS.md, "Observability at 10,000 tenants"). The
//! binary also builds mimalloc without transparent huge pages (`no_thp`): with THP each touched
//! 2 MiB range of an arena is resident whole.
//!
//! [`configure`] sets mimalloc's purge delay to 10 ms (its v2 default; v3's is 1 s) unless
//! `MIMALLOC_PURGE_DELAY` is set: measured at 10,000 tenants, RSS after the load, the scrapes and
//! the state reads reads 80–87 MiB with it and 91–105 MiB with 1 s, while 0 (purge on every free)
//! costs the request path madvise calls.
//!
//! Invariants: [`collect_every`] calls `mi_collect(false)` once a period from one task, which
//! purges every arena range whose delay has expired, process-wide (no thread is forced, memory
//! in use is never touched, and the request path pays nothing); [`release_now`] is for the
//! main thread right after a one-off burst (startup's config parse). Both are harmless when the
//! process runs another allocator (the library's tests).
#![allow(unsafe_code)]

use std::time::Duration;

/// How often freed memory whose purge delay has passed is handed back.
pub const EVERY: Duration = Duration::from_secs(1);

/// mimalloc's `mi_option_purge_delay` (the index in `mimalloc.h`'s `mi_option_e`; the sys crate
/// names no constant for it).
const PURGE_DELAY_OPTION: libmimalloc_sys::mi_option_t = 15;

/// Purge delay set by [`configure`], ms.
pub const PURGE_DELAY_MS: i64 = 10;

/// Sets the purge delay (call first thing in the process), unless the environment does.
pub fn configure() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        // SAFETY: sets one integer option; mimalloc reads options atomically.
        unsafe { libmimalloc_sys::mi_option_set(PURGE_DELAY_OPTION, PURGE_DELAY_MS as _) }
    }
}

/// Hands expired freed memory back to the OS every `period`, forever (spawn it).
pub async fn collect_every(period: Duration) {
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        collect(false);
    }
}

/// Collect this thread's freed pages now and purge them at once (after startup's parse).
pub fn release_now() {
    collect(true);
}

fn collect(force: bool) {
    // SAFETY: `mi_collect` takes no pointer; it walks this thread's own heap and the process's
    // arenas under mimalloc's own synchronization.
    unsafe { libmimalloc_sys::mi_collect(force) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_collector_keeps_running_and_release_is_harmless() {
        configure();
        // SAFETY: reads one integer option.
        let delay = unsafe { libmimalloc_sys::mi_option_get(PURGE_DELAY_OPTION) };
        if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
            assert_eq!(delay, PURGE_DELAY_MS, "option index is not purge_delay");
        }
        release_now();
        let task = tokio::spawn(collect_every(EVERY));
        tokio::time::sleep(EVERY * 3).await;
        assert!(!task.is_finished(), "the collector stopped");
        task.abort();
    }
}
