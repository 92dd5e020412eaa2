//! Cluster mode's hold on the endpoints (driven by `cluster::endpoints`): the slots of each
//! endpoint this replica leased in Redis cap what picks may put on it here, and an ejection
//! another replica saw holds it out here too. Pure, like the rest of the balancer.
//!
//! Invariants: with a cap set, an endpoint is given no request while its in-flight count is at
//! min(limit, cap); lowering a cap ([`Balancer::keep_cluster`]) never goes below what is on the
//! endpoint's wire, so no request runs on a lease being given back; a hold-out obeys the pool's
//! rule that its last endpoint in service is never ejected.

use std::time::Duration;

use super::Balancer;

/// One endpoint's load as the cluster's lease rounds see it.
#[derive(Clone, Debug, PartialEq)]
pub struct Load {
    /// Requests on its wire here.
    pub in_flight: u32,
    /// Its learned limit (AIMD), whatever its health: a drop is what gets published.
    pub learned: u32,
    /// What picks may put on it now, leases aside: 0 while out or paused, 1 while due a probe,
    /// else its learned limit.
    pub room: u32,
    /// Priority level.
    pub priority: u32,
    /// Weight.
    pub weight: f64,
    /// This replica's own ejections of it so far.
    pub ejections: u64,
    /// While out: the time left until its probe is due.
    pub out_for: Option<Duration>,
    /// Picks waiting that only this replica's leases keep from it ([`Balancer::wait_on`]).
    pub waiting: u32,
}

impl Balancer {
    /// Every endpoint's [`Load`] at `now`, in config order.
    pub fn loads(&self, now: Duration) -> Vec<Load> {
        self.endpoints
            .iter()
            .map(|e| {
                let out = e.health.out(now);
                let room = if out || e.aimd.paused(now) {
                    0
                } else {
                    e.limit(now)
                };
                Load {
                    in_flight: e.in_flight,
                    learned: e.aimd.limit(),
                    room,
                    priority: e.spec.priority,
                    weight: e.spec.weight,
                    ejections: e.health.ejections(),
                    out_for: e
                        .health
                        .until()
                        .filter(|_| out)
                        .map(|u| u.saturating_sub(now)),
                    waiting: e.waiting,
                }
            })
            .collect()
    }

    /// Sets endpoint `i`'s cap (`None`: no cluster limit).
    pub fn set_cluster_cap(&mut self, i: usize, cap: Option<u32>) {
        if let Some(e) = self.endpoints.get_mut(i) {
            e.cluster_cap = cap;
        }
    }

    /// Before leases of endpoint `i` are given back: lowers its cap to
    /// `min(max(target, in flight), held)`, capped at `cap` for picks, and returns how many
    /// leases to keep (never fewer than the requests on its wire, if held).
    pub fn keep_cluster(&mut self, i: usize, target: u32, held: u32, cap: u32) -> u32 {
        let Some(e) = self.endpoints.get_mut(i) else {
            return 0;
        };
        let keep = target.max(e.in_flight).min(held);
        e.cluster_cap = Some(keep.min(cap));
        keep
    }

    /// A pick for `model` outside `exclude` found every candidate full: counts it as waiting on
    /// the endpoints of the lowest priority level whose learned limit has room but whose leases
    /// do not (so the next lease round asks for a slot there; a failover needs one on another
    /// endpoint than the one it had). Returns those endpoints (bit i), for [`Balancer::unwait`].
    pub fn wait_on(&mut self, now: Duration, model: &str, exclude: u64) -> u64 {
        let blocked = |i: usize, e: &super::Endpoint| {
            i < 64
                && exclude & (1 << i) == 0
                && e.in_service(now)
                && e.paused_until(model, now).is_zero()
                && e.limit(now) > e.in_flight
                && e.cluster_cap.is_some_and(|c| c <= e.in_flight)
        };
        let Some(level) = self
            .endpoints
            .iter()
            .enumerate()
            .filter(|(i, e)| blocked(*i, e))
            .map(|(_, e)| e.spec.priority)
            .min()
        else {
            return 0;
        };
        let mut mask = 0;
        for (i, e) in self.endpoints.iter_mut().enumerate() {
            if blocked(i, e) && e.spec.priority == level {
                e.waiting += 1;
                mask |= 1 << i;
            }
        }
        mask
    }

    /// The pick counted by [`Balancer::wait_on`] as `mask` waits no more.
    pub fn unwait(&mut self, mask: u64) {
        for (i, e) in self.endpoints.iter_mut().enumerate().take(64) {
            if mask & (1 << i) != 0 {
                e.waiting = e.waiting.saturating_sub(1);
            }
        }
    }

    /// Whether a pick waits on an endpoint's leases.
    pub fn waiting(&self) -> bool {
        self.endpoints.iter().any(|e| e.waiting > 0)
    }

    /// Another replica ejected endpoint `i` until `until`: out here too (then due a probe),
    /// unless it is the pool's last endpoint in service. Returns whether it is out now.
    pub fn hold_out(&mut self, i: usize, now: Duration, until: Duration) -> bool {
        let others = self
            .endpoints
            .iter()
            .enumerate()
            .any(|(j, e)| j != i && e.in_service(now));
        let Some(e) = self.endpoints.get_mut(i) else {
            return false;
        };
        if others && until > now {
            e.health.hold_out(until);
        }
        e.health.out(now)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::super::{health::Rules, NoPick, Signal, Spec};
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn two() -> Balancer {
        let spec = |name: &str| Spec {
            name: Arc::from(name),
            max: 4,
            priority: 0,
            weight: 1.0,
        };
        Balancer::new(vec![spec("a"), spec("b")], 8, Rules::default(), ms(250))
    }

    #[test]
    fn picks_stay_within_the_leased_slots() {
        let mut b = two();
        b.set_cluster_cap(0, Some(1));
        b.set_cluster_cap(1, Some(0));
        let t = b.pick(ms(0), "m", 0).unwrap();
        assert_eq!(t.endpoint, 0);
        assert_eq!(b.pick(ms(0), "m", 0), Err(NoPick::Busy));
        // Lowering below the wire keeps the wire's lease; raising lets the next one through.
        assert_eq!(b.keep_cluster(0, 0, 3, 5), 1);
        assert_eq!(b.pick(ms(0), "m", 0), Err(NoPick::Busy));
        assert_eq!(b.keep_cluster(1, 2, 2, 5), 2);
        assert_eq!(b.pick(ms(0), "m", 0).unwrap().endpoint, 1);
        b.release(t);
        assert_eq!(
            b.keep_cluster(0, 0, 1, 5),
            0,
            "nothing on the wire: all go back"
        );
    }

    #[test]
    fn a_pick_kept_out_by_the_leases_waits_on_the_endpoints_it_could_use() {
        let mut b = two();
        b.set_cluster_cap(0, Some(0));
        b.set_cluster_cap(1, Some(0));
        // A failover from endpoint 0: it waits on endpoint 1 only.
        let mask = b.wait_on(ms(0), "m", 1);
        assert_eq!(mask, 2);
        assert_eq!(b.loads(ms(0))[1].waiting, 1);
        assert!(b.waiting());
        b.unwait(mask);
        assert!(!b.waiting());
        // Not kept out by its leases: nothing to wait on.
        b.set_cluster_cap(1, Some(4));
        assert_eq!(b.wait_on(ms(0), "m", 1), 0);
    }

    #[test]
    fn a_hold_out_ejects_here_until_the_probe_but_never_the_last_endpoint() {
        let mut b = two();
        assert!(b.hold_out(1, ms(0), ms(1000)));
        let l = b.loads(ms(10));
        assert_eq!(
            (l[1].room, l[1].out_for, l[1].ejections),
            (0, Some(ms(990)), 0)
        );
        for _ in 0..4 {
            assert_eq!(b.pick(ms(10), "m", 0).map(|t| t.endpoint), Ok(0));
        }
        assert_eq!(
            b.pick(ms(10), "m", 0),
            Err(NoPick::Busy),
            "nothing goes to the one out"
        );
        assert!(!b.hold_out(0, ms(10), ms(1000)), "the last endpoint stays");
        // Due a probe at its end; a success brings it back.
        assert_eq!(b.loads(ms(1000))[1].room, 1);
        let t = b.pick(ms(1000), "m", 1).unwrap();
        b.observe(&t, ms(1001), Signal::Success { spent: None });
        assert_eq!(b.loads(ms(1002))[1].room, 4);
    }
}
