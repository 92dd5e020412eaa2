//! The retry stage's decision after each attempt, a plain function of what the attempt
//! answered and what the request has left: pass the answer on, send it on to another endpoint
//! at once, wait and retry, or give up with the answer in hand.

use std::time::Duration;

use http::StatusCode;

use super::RetryPolicy;

/// What one attempt answered, as the decision sees it.
#[derive(Clone, Copy, Debug)]
pub(super) struct Attempt {
    /// The answer's status (of an error: the status it renders as).
    pub status: StatusCode,
    /// Refused or failed before any byte reached the client, with another endpoint of the pool
    /// this round has not tried and may use.
    pub failover: bool,
    /// Sent with the tenant's own provider key.
    pub own_key: bool,
    /// The wait the upstream asked for (`Retry-After` & co).
    pub upstream_wait: Option<Duration>,
}

/// The waits a retry is at least as long as, read only when the decision gets that far.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Waits {
    /// The policy's backoff for this retry (`RetryPolicy::backoff`, jittered).
    pub backoff: Duration,
    /// The pool's pause (its learned limit paused it); a tenant's own key does not share it.
    pub pool_pause: Duration,
}

/// Where the request stands: retries made, time waited between attempts, deadline left.
#[derive(Clone, Copy, Debug)]
pub(super) struct Spent {
    /// Retries made so far (0: this was the first attempt's round).
    pub attempt: u32,
    /// Time waited between attempts so far.
    pub waited: Duration,
    /// What is left of the request's deadline, if it has one.
    pub deadline_left: Option<Duration>,
}

/// What to do after an attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Next {
    /// Pass the answer on: not retryable, or a success.
    Answer,
    /// Send the request on to another endpoint at once (charged once, no backoff).
    FailOver,
    /// Wait this long, then retry (an attempt charged to the tenant).
    Retry(Duration),
    /// Pass the retryable answer on: retries exhausted, no time left, the wait past the cap, or
    /// the tenant's own key refused; the duration is the wait the next attempt would have had.
    GiveUp(Duration),
}

/// Statuses retried within the permit.
pub(super) fn retryable(status: StatusCode) -> bool {
    matches!(status.as_u16(), 429 | 502 | 503)
}

/// The decision after `a`, given what was `spent` and the policy; `waits` (a random draw and
/// a lock of the pool) is asked for only when the answer is neither passed on nor failed over.
pub(super) fn next(
    policy: &RetryPolicy,
    a: Attempt,
    spent: Spent,
    waits: impl FnOnce() -> Waits,
) -> Next {
    if !a.failover && !retryable(a.status) {
        return Next::Answer;
    }
    if a.failover {
        return Next::FailOver;
    }
    // Never shorter than what the upstream asked for, nor than the pool's pause (which a
    // tenant's own key does not share).
    let w = waits();
    let backoff = w
        .backoff
        .max(a.upstream_wait.unwrap_or_default())
        .max(if a.own_key {
            Duration::ZERO
        } else {
            w.pool_pause
        });
    let in_time = spent.deadline_left.is_none_or(|left| backoff < left);
    // A retry waits holding its pool slot: the whole wait is capped.
    let within_cap = spent.waited + backoff <= policy.max_wait;
    // An exhausted own key is the tenant's limit: said at once, never waited out in a slot.
    let own_refusal = a.own_key && a.status == StatusCode::TOO_MANY_REQUESTS;
    if spent.attempt >= policy.max_retries || !in_time || !within_cap || own_refusal {
        Next::GiveUp(backoff)
    } else {
        Next::Retry(backoff)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn policy() -> RetryPolicy {
        RetryPolicy {
            max_retries: 2,
            base: 100 * MS,
            max: 1000 * MS,
            max_wait: 3000 * MS,
        }
    }

    fn attempt(status: u16) -> Attempt {
        Attempt {
            status: StatusCode::from_u16(status).unwrap(),
            failover: false,
            own_key: false,
            upstream_wait: None,
        }
    }

    fn fresh() -> Spent {
        Spent {
            attempt: 0,
            waited: Duration::ZERO,
            deadline_left: None,
        }
    }

    fn decide(a: Attempt, s: Spent) -> Next {
        decide_paused(a, s, Duration::ZERO)
    }

    fn decide_paused(a: Attempt, s: Spent, pool_pause: Duration) -> Next {
        let waits = || Waits {
            backoff: 100 * MS,
            pool_pause,
        };
        next(&policy(), a, s, waits)
    }

    #[test]
    fn success_and_other_statuses_are_passed_on_without_drawing_a_backoff() {
        for status in [200, 400, 404, 500, 504] {
            let n = next(&policy(), attempt(status), fresh(), || panic!("no backoff"));
            assert_eq!(n, Next::Answer, "{status}");
        }
    }

    #[test]
    fn a_failover_goes_at_once_whatever_is_spent() {
        let a = Attempt {
            failover: true,
            ..attempt(500)
        };
        let spent = Spent {
            attempt: 9,
            ..fresh()
        };
        assert_eq!(
            next(&policy(), a, spent, || panic!("no backoff")),
            Next::FailOver
        );
    }

    #[test]
    fn a_retry_waits_at_least_what_the_upstream_and_the_pool_ask() {
        assert_eq!(decide(attempt(503), fresh()), Next::Retry(100 * MS));
        let asked = Attempt {
            upstream_wait: Some(700 * MS),
            ..attempt(429)
        };
        assert_eq!(
            decide_paused(asked, fresh(), 300 * MS),
            Next::Retry(700 * MS)
        );
        assert_eq!(
            decide_paused(asked, fresh(), 900 * MS),
            Next::Retry(900 * MS)
        );
        // A tenant's own key does not wait for the pool's pause (a 502 on it is retried).
        let own = Attempt {
            own_key: true,
            ..attempt(502)
        };
        assert_eq!(decide_paused(own, fresh(), 900 * MS), Next::Retry(100 * MS));
    }

    #[test]
    fn it_gives_up_when_retries_time_or_the_cap_run_out_or_the_own_key_refused() {
        let spent = |attempt, waited, deadline_left| Spent {
            attempt,
            waited,
            deadline_left,
        };
        let a = attempt(429);
        assert_eq!(
            decide(a, spent(1, Duration::ZERO, None)),
            Next::Retry(100 * MS)
        );
        assert_eq!(
            decide(a, spent(2, Duration::ZERO, None)),
            Next::GiveUp(100 * MS)
        );
        assert_eq!(
            decide(a, spent(0, Duration::ZERO, Some(100 * MS))),
            Next::GiveUp(100 * MS)
        );
        assert_eq!(
            decide(a, spent(0, Duration::ZERO, Some(101 * MS))),
            Next::Retry(100 * MS)
        );
        assert_eq!(decide(a, spent(0, 2900 * MS, None)), Next::Retry(100 * MS));
        assert_eq!(decide(a, spent(0, 2901 * MS, None)), Next::GiveUp(100 * MS));
        let own = Attempt { own_key: true, ..a };
        assert_eq!(decide(own, fresh()), Next::GiveUp(100 * MS));
    }
}
