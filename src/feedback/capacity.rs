//! A pool's effective capacity, learned from the upstream's answers: the [`Aimd`] limiter fed by
//! every upstream response, applied to the pool's [`FairQueue`] with `set_capacity`.
//!
//! - 429/503 → `on_overload` (decrease, once per cooldown ≈ one round trip); success →
//!   `on_success` (additive increase up to `max_concurrency`). The decrease goes to the number
//!   of requests that were sent to the upstream *before* the refused one and are still on the
//!   wire ([`WireTicket`]): a provider that caps concurrency at K accepted exactly those and
//!   refused the next. The pool's in-flight count would overstate K (it counts requests waiting
//!   out a retry backoff, and the rest of a burst sent at the same moment), and cutting by one
//!   per round trip from there took seconds to settle. The first overload of
//!   a round trip only *slows* dispatch (the decrease); another one within the same round trip
//!   (or one at the minimum limit) means the cut was not enough, and the pool is *paused* for
//!   the wait the upstream asked for (`retry-after-ms`, `Retry-After` seconds, else the nearest
//!   `x-ratelimit-reset-*`). Pausing on every probe's 429 would idle the whole pool for each
//!   one-request overshoot (measured: goodput 65% of capacity instead of ~90%).
//! - A success that says a budget is spent (`x-ratelimit-remaining-requests|tokens: 0`) pauses
//!   until its `x-ratelimit-reset-*` without lowering the limit.
//! - While paused, the pool's capacity is the recovery reservation only (ordinary dispatch
//!   stops); one spawned timer per pause restores the learned limit and pumps the queue at the
//!   reset — no polling.
//!
//! Invariants: effective capacity ≤ configured `max_concurrency`; outside a pause it is at least
//! `reserved_slots + 1`, so recovery keeps its reservation and ordinary traffic keeps a slot;
//! when the limit is below the configured size, the batch class's share shrinks in proportion
//! (batch is slowed first). Lock order: this controller's mutex, then the queue's.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use http::{HeaderMap, HeaderName, StatusCode};

use super::aimd::Aimd;
use crate::queue::FairQueue;

struct State {
    aimd: Aimd,
    timer: bool,
    applied: u32,
    /// Slots only recovery requests may use (`[scheduler] reserved_slots`).
    reserved: u32,
}

/// One pool's learned capacity; see the module docs.
pub struct PoolCapacity {
    queue: Arc<FairQueue>,
    state: Mutex<State>,
    epoch: tokio::time::Instant,
    /// 429 answers seen from the upstream.
    overloads: std::sync::atomic::AtomicU64,
    /// Send order of the requests on the wire to the upstream (see [`WireTicket`]).
    wire: Mutex<Wire>,
}

#[derive(Default)]
struct Wire {
    next: u64,
    outstanding: BTreeSet<u64>,
}

/// One request on the wire to the upstream, from send until its answer is refused or its body
/// ends (attach it to the response body); dropping it takes it off the wire.
pub struct WireTicket {
    pool: Arc<PoolCapacity>,
    seq: u64,
}

impl std::fmt::Debug for WireTicket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WireTicket")
            .field("seq", &self.seq)
            .finish()
    }
}

impl Drop for WireTicket {
    fn drop(&mut self) {
        self.pool.wire().outstanding.remove(&self.seq);
    }
}

impl std::fmt::Debug for PoolCapacity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PoolCapacity")
            .field("limit", &self.limit())
            .field("configured", &self.configured())
            .finish()
    }
}

impl PoolCapacity {
    /// A controller for `queue`, configured with `max` slots of which `reserved` are recovery's.
    pub fn new(queue: Arc<FairQueue>, max: u32, reserved: u32) -> Arc<Self> {
        Arc::new(Self {
            queue,
            state: Mutex::new(State {
                aimd: Aimd::new(max).with_cooldown(Duration::from_millis(250)),
                timer: false,
                applied: max,
                reserved,
            }),
            epoch: tokio::time::Instant::now(),
            overloads: std::sync::atomic::AtomicU64::new(0),
            wire: Mutex::new(Wire::default()),
        })
    }

    fn wire(&self) -> std::sync::MutexGuard<'_, Wire> {
        self.wire.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A request is being sent to the upstream now.
    pub fn send(self: &Arc<Self>) -> WireTicket {
        let mut w = self.wire();
        let seq = w.next;
        w.next += 1;
        w.outstanding.insert(seq);
        WireTicket {
            pool: self.clone(),
            seq,
        }
    }

    /// Requests sent before `ticket` that are still on the wire.
    fn ahead_of(&self, ticket: &WireTicket) -> u32 {
        let w = self.wire();
        u32::try_from(w.outstanding.range(..ticket.seq).count()).unwrap_or(u32::MAX)
    }

    fn now(&self) -> Duration {
        self.epoch.elapsed()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Applies a reloaded `max_concurrency` and `reserved_slots` in place: the learned limit is
    /// kept (clamped to the new size, or following it if nothing was learned below the old one)
    /// and the queue's capacity is set again at once. In-flight requests keep their slots.
    pub fn reconfigure(self: &Arc<Self>, max: u32, reserved: u32) {
        let mut st = self.lock();
        st.aimd.set_max(max);
        st.reserved = reserved;
        // Forces `apply` to push the capacity and batch share to the queue.
        st.applied = u32::MAX;
        let now = self.now();
        self.apply(&mut st, now);
    }

    /// The configured pool size (`max_concurrency`).
    pub fn configured(&self) -> u32 {
        self.lock().aimd.max()
    }

    /// The learned concurrency limit.
    pub fn limit(&self) -> u32 {
        self.lock().aimd.limit()
    }

    /// The capacity currently applied to the queue.
    pub fn effective(&self) -> u32 {
        self.lock().applied
    }

    /// Time left in the current upstream-requested pause (zero when not paused).
    pub fn paused_for(&self) -> Duration {
        self.lock().aimd.paused_until().saturating_sub(self.now())
    }

    /// 429 answers the upstream has sent so far.
    pub fn throttled(&self) -> u64 {
        self.overloads.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Feeds one upstream answer to the request sent with `ticket` (`None`: order unknown, the
    /// decrease is the blind multiplicative one).
    pub fn observe(
        self: &Arc<Self>,
        ticket: Option<&WireTicket>,
        status: StatusCode,
        headers: &HeaderMap,
    ) {
        let now = self.now();
        let overload =
            status == StatusCode::TOO_MANY_REQUESTS || status == StatusCode::SERVICE_UNAVAILABLE;
        // Those ahead were accepted; this one was refused: the wall is at ahead + 1.
        let in_flight = ticket.filter(|_| overload).map(|t| self.ahead_of(t) + 1);
        let mut st = self.lock();
        if overload {
            if status == StatusCode::TOO_MANY_REQUESTS {
                self.overloads
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            let before = st.aimd.limit();
            st.aimd.on_overload_at(now, None, in_flight);
            if let Some(wait) = upstream_wait(headers).filter(|_| st.aimd.limit() == before) {
                st.aimd.pause(now, wait);
            }
        } else if status.is_success() {
            st.aimd.on_success();
            if let Some(reset) = spent_until(headers) {
                st.aimd.pause(now, reset);
            }
        } else {
            return;
        }
        self.apply(&mut st, now);
    }

    fn apply(self: &Arc<Self>, st: &mut State, now: Duration) {
        let cap = if st.aimd.paused(now) {
            if !st.timer {
                if let Ok(rt) = tokio::runtime::Handle::try_current() {
                    st.timer = true;
                    let wait = st.aimd.paused_until().saturating_sub(now);
                    let weak: Weak<Self> = Arc::downgrade(self);
                    rt.spawn(async move {
                        tokio::time::sleep(wait).await;
                        if let Some(this) = weak.upgrade() {
                            let mut st = this.lock();
                            st.timer = false;
                            let now = this.now();
                            this.apply(&mut st, now);
                        }
                    });
                }
            }
            st.reserved
        } else {
            st.aimd
                .limit()
                .max(st.reserved + 1)
                .min(st.aimd.max().max(st.reserved + 1))
        };
        if cap != st.applied {
            st.applied = cap;
            self.queue.set_capacity(cap);
            self.queue
                .set_batch_share(f64::from(st.aimd.limit()) / f64::from(st.aimd.max()));
        }
    }
}

const RETRY_AFTER_MS: HeaderName = HeaderName::from_static("retry-after-ms");
const RESET_REQUESTS: HeaderName = HeaderName::from_static("x-ratelimit-reset-requests");
const RESET_TOKENS: HeaderName = HeaderName::from_static("x-ratelimit-reset-tokens");
const REMAINING_REQUESTS: HeaderName = HeaderName::from_static("x-ratelimit-remaining-requests");
const REMAINING_TOKENS: HeaderName = HeaderName::from_static("x-ratelimit-remaining-tokens");

/// A header's trimmed text (names are constants: looked up without parsing a name per call).
fn text<'h>(h: &'h HeaderMap, name: &HeaderName) -> Option<&'h str> {
    h.get(name).and_then(|v| v.to_str().ok()).map(str::trim)
}

/// How long the upstream asked us to wait: `retry-after-ms`, `Retry-After` (seconds), else the
/// shortest `x-ratelimit-reset-*`.
pub fn upstream_wait(h: &HeaderMap) -> Option<Duration> {
    if let Some(ms) = text(h, &RETRY_AFTER_MS).and_then(|v| v.parse::<f64>().ok()) {
        if ms.is_finite() && ms >= 0.0 {
            return Some(Duration::from_secs_f64(ms.min(3.6e6) / 1000.0));
        }
    }
    if let Some(s) = text(h, &http::header::RETRY_AFTER).and_then(|v| v.parse::<u64>().ok()) {
        return Some(Duration::from_secs(s.min(3600)));
    }
    [RESET_REQUESTS, RESET_TOKENS]
        .iter()
        .filter_map(|n| text(h, n).and_then(parse_go_duration))
        .min()
}

/// The reset of a budget the upstream reports as spent (`x-ratelimit-remaining-*: 0`).
pub(crate) fn spent_until(h: &HeaderMap) -> Option<Duration> {
    [
        (REMAINING_REQUESTS, RESET_REQUESTS),
        (REMAINING_TOKENS, RESET_TOKENS),
    ]
    .iter()
    .filter(|(remaining, _)| text(h, remaining) == Some("0"))
    .filter_map(|(_, reset)| text(h, reset).and_then(parse_go_duration))
    .max()
}

/// Parses OpenAI's reset format (Go durations: `1s`, `6m0s`, `20ms`, `1.5s`); plain numbers are
/// seconds.
pub fn parse_go_duration(s: &str) -> Option<Duration> {
    if let Ok(secs) = s.parse::<f64>() {
        return (secs.is_finite() && secs >= 0.0)
            .then(|| Duration::from_secs_f64(secs.min(3600.0)));
    }
    let mut total = 0.0;
    let mut rest = s;
    while !rest.is_empty() {
        let split = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .filter(|&i| i > 0)?;
        let value: f64 = rest[..split].parse().ok()?;
        rest = &rest[split..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_len] {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 1e-3,
            "us" | "µs" => 1e-6,
            "ns" => 1e-9,
            _ => return None,
        };
        total += value * scale;
        rest = &rest[unit_len..];
    }
    Some(Duration::from_secs_f64(total.min(3600.0)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, http::HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn waits_are_parsed_in_order_of_precision() {
        let ms = |m| Some(Duration::from_millis(m));
        assert_eq!(
            upstream_wait(&headers(&[("retry-after", "2"), ("retry-after-ms", "150")])),
            ms(150)
        );
        assert_eq!(upstream_wait(&headers(&[("retry-after", "2")])), ms(2000));
        assert_eq!(
            upstream_wait(&headers(&[
                ("x-ratelimit-reset-requests", "6m0s"),
                ("x-ratelimit-reset-tokens", "1.5s")
            ])),
            ms(1500)
        );
        assert_eq!(upstream_wait(&headers(&[])), None);
        assert_eq!(parse_go_duration("20ms"), ms(20));
        assert_eq!(parse_go_duration("1m30s"), ms(90_000));
        assert_eq!(parse_go_duration("abc"), None);
    }

    fn pool(max: u32, reserved: u32) -> Arc<PoolCapacity> {
        let queue = crate::queue::FairQueue::new(
            crate::queue::QueueSettings {
                scheduler: crate::scheduler::Config {
                    capacity: 16,
                    reserved_slots: 1,
                    ..Default::default()
                },
                estimator: std::sync::Arc::new(crate::estimate::Estimator::new(
                    &Default::default(),
                    &Default::default(),
                )),
            },
            &[],
        );
        PoolCapacity::new(queue, max, reserved)
    }

    #[tokio::test]
    async fn a_refusal_cuts_the_limit_to_the_requests_sent_before_it_still_on_the_wire() {
        let cap = pool(16, 0);
        // A burst of 16: the provider (K = 4) holds the first four and refuses the rest at once.
        let tickets: Vec<_> = (0..16).map(|_| cap.send()).collect();
        let h = HeaderMap::new();
        cap.observe(Some(&tickets[15]), StatusCode::TOO_MANY_REQUESTS, &h);
        assert_eq!(cap.limit(), 15, "the 16th came back first: 15 ahead of it");
        // The rest come back out of order; the lowest count wins, in the same round trip.
        for i in [9, 4, 12, 7] {
            cap.observe(Some(&tickets[i]), StatusCode::TOO_MANY_REQUESTS, &h);
        }
        assert_eq!(
            cap.limit(),
            4,
            "the fifth was refused behind four accepted ones"
        );
        drop(tickets);
    }

    #[tokio::test]
    async fn a_ticket_leaves_the_wire_when_dropped() {
        let cap = pool(16, 0);
        let first = cap.send();
        let second = cap.send();
        drop(first);
        cap.observe(
            Some(&second),
            StatusCode::TOO_MANY_REQUESTS,
            &HeaderMap::new(),
        );
        assert_eq!(
            cap.limit(),
            11,
            "nothing ahead: no concurrency signal, the blind cut"
        );
        assert!(cap.wire().outstanding.len() == 1);
        drop(second);
        assert!(cap.wire().outstanding.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn overload_lowers_capacity_pauses_and_the_timer_restores_it() {
        let cap = pool(16, 1);
        let h = headers(&[("retry-after-ms", "300")]);
        cap.observe(None, StatusCode::TOO_MANY_REQUESTS, &h);
        assert_eq!(cap.limit(), 11);
        assert_eq!(
            cap.effective(),
            11,
            "the first overload of a round trip only slows"
        );
        cap.observe(None, StatusCode::TOO_MANY_REQUESTS, &h);
        assert_eq!(cap.limit(), 11);
        assert_eq!(cap.effective(), 1, "paused: only the recovery reservation");
        tokio::time::sleep(Duration::from_millis(301)).await;
        tokio::task::yield_now().await;
        assert_eq!(cap.effective(), 11, "the timer restored the learned limit");
        assert_eq!(cap.paused_for(), Duration::ZERO);
        // Repeated overloads never take ordinary traffic's last slot.
        for _ in 0..20 {
            tokio::time::advance(Duration::from_secs(1)).await;
            cap.observe(None, StatusCode::SERVICE_UNAVAILABLE, &HeaderMap::new());
        }
        assert_eq!(cap.limit(), 1);
        assert_eq!(cap.effective(), 2, "reserved + 1");
        // Successes climb back, at most to the configured size.
        for _ in 0..5000 {
            cap.observe(None, StatusCode::OK, &HeaderMap::new());
        }
        assert_eq!(cap.effective(), 16);
    }

    #[tokio::test]
    async fn reconfigure_resizes_in_place_and_keeps_a_learned_limit() {
        let cap = pool(16, 0);
        cap.reconfigure(32, 1);
        assert_eq!(
            (cap.limit(), cap.effective()),
            (32, 32),
            "nothing learned: follows"
        );
        cap.observe(None, StatusCode::TOO_MANY_REQUESTS, &HeaderMap::new());
        let learned = cap.limit();
        assert!(learned < 32);
        cap.reconfigure(64, 1);
        assert_eq!(cap.limit(), learned, "a learned limit is kept");
        cap.reconfigure(4, 1);
        assert_eq!((cap.limit(), cap.effective(), cap.configured()), (4, 4, 4));
    }
}
