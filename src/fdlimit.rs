//! File descriptors: the process limit, the connection cap derived from it, and what to do when
//! they run out.
//!
//! - [`raise`] lifts the soft `RLIMIT_NOFILE` to the hard limit at startup (`fairgate serve`).
//! - [`default_max_connections`] is the default of `[server] max_connections`: the descriptor
//!   limit minus a reserve for everything that is not a client connection, so the connection cap
//!   is reached (and idle connections shed) before `accept` fails for lack of descriptors:
//!   `reserve = 64 + (workers + 1) × Σ upstreams.max_concurrency`, `max_connections =
//!   max(nofile − reserve, nofile / 4)`. 64 covers the listeners, each worker's epoll and
//!   eventfd, the admin listener and its scrapes, Redis, log and config files; each worker keeps
//!   a pool of up to `max_concurrency` upstream connections per upstream, plus those in flight.
//! - [`is_exhaustion`] recognises EMFILE/ENFILE (on accept, and under an upstream connect
//!   error); [`AcceptErrors`] logs accept failures once per interval with their count.
//!
//! Invariants: nothing here blocks or allocates per connection; a failed `setrlimit` leaves the
//! limit as it was and says so.

use std::time::Duration;

use tokio::time::Instant;

use crate::config::Config;

/// The process's descriptor limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Nofile {
    /// The soft limit (in force).
    pub soft: u64,
    /// The hard limit (the most the soft one may be raised to).
    pub hard: u64,
}

/// The current `RLIMIT_NOFILE` (`None` where unknown).
#[allow(unsafe_code, clippy::unnecessary_cast)] // `rlim_t` is not u64 everywhere.
pub fn current() -> Option<Nofile> {
    #[cfg(unix)]
    {
        let mut rl = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: `rl` is a valid, writable rlimit for the duration of the call.
        if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) } != 0 {
            return None;
        }
        Some(Nofile {
            soft: rl.rlim_cur as u64,
            hard: rl.rlim_max as u64,
        })
    }
    #[cfg(not(unix))]
    None
}

/// Raises the soft descriptor limit to the hard one (capped at 2^20, Linux's default
/// `nr_open`, when the hard limit is infinite) and logs what the process has.
#[allow(unsafe_code, clippy::unnecessary_cast)] // `rlim_t` is not u64 everywhere.
pub fn raise() -> Option<Nofile> {
    let before = current()?;
    #[cfg(unix)]
    {
        let target = if before.hard == libc::RLIM_INFINITY as u64 {
            1 << 20
        } else {
            before.hard
        };
        if target > before.soft {
            let rl = libc::rlimit {
                rlim_cur: target as libc::rlim_t,
                rlim_max: before.hard as libc::rlim_t,
            };
            // SAFETY: `rl` is a valid rlimit read by the call.
            if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &rl) } != 0 {
                let e = std::io::Error::last_os_error();
                tracing::warn!(soft = before.soft, hard = before.hard, error = %e,
                    "cannot raise the descriptor limit");
            }
        }
    }
    let after = current()?;
    tracing::info!(
        soft = after.soft,
        hard = after.hard,
        "descriptor limit (RLIMIT_NOFILE)"
    );
    Some(after)
}

/// Descriptors kept for everything but client connections, besides the upstream pools.
pub const FIXED_RESERVE: u64 = 64;

/// The default `[server] max_connections` under a soft limit of `nofile` (see the module docs).
pub fn default_max_connections(config: &Config, workers: usize, nofile: u64) -> usize {
    let upstream: u64 = config
        .upstreams
        .iter()
        .map(|u| u.max_concurrency as u64)
        .sum();
    let reserve = FIXED_RESERVE.saturating_add(upstream.saturating_mul(workers as u64 + 1));
    let n = nofile.saturating_sub(reserve).max(nofile / 4).max(1);
    usize::try_from(n).unwrap_or(usize::MAX)
}

/// Whether `e` is "too many open files" (EMFILE: this process; ENFILE: the whole system).
pub fn is_exhaustion(e: &std::io::Error) -> bool {
    #[cfg(unix)]
    {
        matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE))
    }
    #[cfg(not(unix))]
    {
        let _ = e;
        false
    }
}

/// Whether `e` or any error under it is [`is_exhaustion`] (e.g. an upstream connect error).
pub fn caused_by_exhaustion(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(e);
    while let Some(e) = next {
        if e.downcast_ref::<std::io::Error>()
            .is_some_and(is_exhaustion)
        {
            return true;
        }
        next = e.source();
    }
    false
}

/// How often accept failures are logged (each line carries the count since the last one).
pub const LOG_EVERY: Duration = Duration::from_secs(10);

/// Counts accept failures and says when to log them: once per [`LOG_EVERY`].
#[derive(Debug, Default)]
pub struct AcceptErrors {
    count: u64,
    last_log: Option<Instant>,
}

impl AcceptErrors {
    /// Records one failure at `now`; `Some(count)` when it is time to log `count` failures.
    pub fn note(&mut self, now: Instant) -> Option<u64> {
        self.count += 1;
        if self.last_log.is_some_and(|t| now < t + LOG_EVERY) {
            return None;
        }
        self.last_log = Some(now);
        Some(std::mem::take(&mut self.count))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_cap_leaves_room_for_upstreams_and_the_rest() {
        let c = Config::from_toml_str(
            "[[upstreams]]\nname = \"u\"\nbase_url = \"http://127.0.0.1:9/v1\"\n\
             max_concurrency = 10\n",
        )
        .unwrap();
        // 64 + (2 + 1) × 10 = 94 kept back.
        assert_eq!(default_max_connections(&c, 2, 1024), 1024 - 94);
        // A tiny limit still admits a quarter of it.
        assert_eq!(default_max_connections(&c, 2, 100), 25);
        assert_eq!(default_max_connections(&c, 2, 0), 1);
    }

    #[test]
    fn emfile_is_recognised_through_a_chain_of_sources() {
        #[derive(Debug, thiserror::Error)]
        #[error("connect")]
        struct Outer(#[source] std::io::Error);
        let emfile = std::io::Error::from_raw_os_error(libc::EMFILE);
        assert!(is_exhaustion(&emfile));
        assert!(caused_by_exhaustion(&Outer(emfile)));
        let refused = std::io::Error::from_raw_os_error(libc::ECONNREFUSED);
        assert!(!caused_by_exhaustion(&Outer(refused)));
    }

    #[tokio::test(start_paused = true)]
    async fn accept_errors_are_logged_once_per_interval_with_their_count() {
        let mut errors = AcceptErrors::default();
        let t0 = Instant::now();
        assert_eq!(errors.note(t0), Some(1));
        for _ in 0..5 {
            assert_eq!(errors.note(t0 + Duration::from_secs(1)), None);
        }
        assert_eq!(errors.note(t0 + LOG_EVERY), Some(6));
    }

    #[test]
    fn the_limit_is_known_and_raising_never_lowers_it() {
        let before = current().unwrap();
        let after = raise().unwrap();
        assert!(after.soft >= before.soft);
        assert_eq!(after.hard, before.hard);
    }
}
