//! [`Syncer`]: global fairness and rate-limit corrections, one script call per tick.
//!
//! Every `sync_interval_ms` (~100 ms) the replica flushes, in one atomic call ([`SYNC`]):
//! - the weighted service its pools delivered since the last flush — per (pool, tenant),
//!   reconciled tokens ÷ weight, added to a shared hash (`HINCRBYFLOAT`);
//! - the rate-limit corrections accumulated by [`RedisStore::adjust`];
//!
//! and reads back every tenant's cluster-wide weighted service. What a tenant received on the
//! *other* replicas since the last read (global now − global before − this replica's own
//! delta) is charged to its DRR credit in this replica's pool (× its weight there now, back to
//! tokens), like an under-estimate — only while the tenant has work here
//! ([`FairQueue::charge_remote`]). Weights and tenants are the pools' own: a tenant added or
//! re-weighted by a new generation (a reload, an API tenant's create or `PATCH` on any replica)
//! is charged at its new weight from the first tick after that generation is applied here.
//! Each replica's DRR then equalises *cluster-wide* weighted service among the tenants
//! backlogged on it, instead of its local service alone.
//!
//! Bound: on top of each replica's DRR bound (2Q + Max/wᵢ + Max/wⱼ per unit of weight, see
//! `scheduler::drr`), remote service is seen late by at most one tick plus one round trip, so a
//! tenant's weighted service can run ahead of its fair share by at most what the cluster serves
//! it in ~2 ticks, ÷ its weight, plus the N replicas' DRR bounds (N·(2Q + Max/wᵢ + Max/wⱼ)).
//! It does not grow with time: every tick's excess is charged at the next one.
//!
//! No double counting: a batch carries a per-replica sequence number and is retried unchanged
//! until Redis confirms it, and the script applies a sequence once. No batch silently skipped:
//! the numbering resumes from the last sequence Redis applied for this `replica_id` (a replica
//! restarted under a fixed id continues it), and a batch the script did not apply although it
//! was never applied before (its number was used by another run of this id: Redis was
//! unreachable at start, or two processes share the id) is logged, counted in
//! `fairgate_cluster_sync_unapplied_total`, renumbered after the last applied one and sent
//! again. After an outage (new
//! [`Link::epoch`]) the service baseline is read afresh and nothing is charged for the gap.
//! Everything is bounded: at most one batch in flight, deltas accumulate per tenant.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use redis::Value;
use tokio::sync::watch;

use super::link::Link;
use super::rate::RedisStore;
use super::scripts::{SYNC, SYNC_RESUME};
use crate::domain::TenantId;
use crate::queue::FairQueue;

const SEP: char = '\u{1f}';

struct Batch {
    seq: u64,
    /// Sent before without an answer (a lost answer: it may have been applied).
    resent: bool,
    service: HashMap<String, f64>,
    rate: Vec<(String, i64, f64, u64)>,
    /// Ledger corrections merged into `rate`.
    corrections: u64,
}

/// The sync task's state; see the module docs.
pub struct Syncer {
    link: Arc<Link>,
    pools: Vec<(String, Arc<FairQueue>)>,
    store: Option<Arc<RedisStore>>,
    interval: Duration,
    keys: [String; 2],
    unapplied: metrics::Counter,
}

/// What a flush learned: whether its batch was applied, every tenant's global service, and the
/// replica's last applied sequence.
struct Flushed {
    applied: bool,
    global: HashMap<String, f64>,
    last: u64,
}

impl std::fmt::Debug for Syncer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Syncer").finish_non_exhaustive()
    }
}

impl Syncer {
    /// A syncer for these pools (by name) and rate store.
    pub fn new(
        link: Arc<Link>,
        pools: Vec<(String, Arc<FairQueue>)>,
        store: Option<Arc<RedisStore>>,
        interval: Duration,
        unapplied: metrics::Counter,
    ) -> Self {
        let keys = [link.key(&["service"]), link.key(&["service-seq"])];
        Self {
            link,
            pools,
            store,
            interval,
            keys,
            unapplied,
        }
    }

    /// The last sequence Redis applied for this replica id (0: none, or Redis unreachable:
    /// then a collision is caught at the first flush).
    async fn resume(&self) -> u64 {
        let mut inv = SYNC_RESUME.prepare_invoke();
        inv.key(&self.keys[1]).arg(&self.link.replica);
        self.link.run::<u64>(&inv).await.unwrap_or(0)
    }

    fn next_batch(&self, seq: u64) -> Batch {
        let mut service = HashMap::new();
        for (name, q) in &self.pools {
            for (tenant, weight, tokens) in q.take_served() {
                let field = format!("{name}{SEP}{tenant}");
                *service.entry(field).or_insert(0.0) += tokens as f64 / weight.get();
            }
        }
        let (pending, corrections) = self
            .store
            .as_ref()
            .map_or_else(Default::default, |s| s.take_pending());
        let rate = self.store.as_ref().map_or_else(Vec::new, |s| {
            pending
                .into_iter()
                .filter_map(|(t, d)| {
                    let (key, g) = s.token_bucket(&t)?;
                    Some((key, d, g.t_us, g.size + g.debt))
                })
                .collect()
        });
        Batch {
            seq,
            resent: false,
            service,
            rate,
            corrections,
        }
    }

    /// Ticks until `stop`, with one final flush.
    pub async fn run(self, mut stop: watch::Receiver<bool>) {
        let mut seq = self.resume().await;
        let mut batch: Option<Batch> = None;
        let mut seen: Option<(u64, HashMap<String, f64>)> = None;
        let mut stopping = false;
        loop {
            tokio::select! {
                _ = tokio::time::sleep(self.interval) => {}
                _ = stop.wait_for(|s| *s), if !stopping => stopping = true,
            }
            let mut b = batch.take().unwrap_or_else(|| {
                seq += 1;
                self.next_batch(seq)
            });
            let mut answer = self.flush(&b).await;
            if let Some(f) = answer.as_ref().filter(|f| !f.applied) {
                // Not applied: a duplicate of our own earlier attempt (its answer was lost) is
                // fine; anything else was never applied — say so and send it again, renumbered.
                if !(b.resent && f.last == b.seq) {
                    self.unapplied.increment(1);
                    tracing::warn!(
                        replica = %self.link.replica,
                        seq = b.seq,
                        last_applied = f.last,
                        "cluster: a sync batch was not applied (its sequence was already used \
                         under this replica_id); renumbered and sent again"
                    );
                    seq = seq.max(f.last) + 1;
                    b.seq = seq;
                    b.resent = false;
                    answer = self.flush(&b).await.filter(|f| f.applied);
                }
            }
            match answer {
                Some(Flushed { global, .. }) => {
                    if let Some(s) = &self.store {
                        s.applied(b.corrections);
                    }
                    // Across an outage (the epoch moved) the baseline is read afresh.
                    let epoch = self.link.epoch();
                    if let Some((e, prev)) = &seen {
                        if *e == epoch {
                            self.charge(prev, &global, &b.service);
                        }
                    }
                    seen = Some((epoch, global));
                }
                None => {
                    b.resent = true;
                    batch = Some(b);
                }
            }
            if stopping {
                return;
            }
        }
    }

    async fn flush(&self, b: &Batch) -> Option<Flushed> {
        let mut inv = SYNC.prepare_invoke();
        inv.key(&self.keys[0])
            .key(&self.keys[1])
            .arg(&self.link.replica)
            .arg(b.seq)
            .arg(b.service.len());
        for (field, delta) in &b.service {
            inv.arg(field).arg(*delta);
        }
        inv.arg(b.rate.len());
        for (key, d, t, size) in &b.rate {
            inv.key(key).arg(*d).arg(*t).arg(*size);
        }
        let v: Value = self.link.run(&inv).await?;
        let Value::Array(items) = v else {
            return None;
        };
        let int = |i: usize| -> Option<i64> { redis::from_redis_value_ref(items.get(i)?).ok() };
        let applied = int(0)? == 1;
        let last = u64::try_from(int(2)?).unwrap_or(0);
        let Some(Value::Array(pairs)) = items.get(1) else {
            return None;
        };
        let mut global = HashMap::new();
        for kv in pairs.chunks(2) {
            let (Some(k), Some(v)) = (kv.first(), kv.get(1)) else {
                continue;
            };
            let k: Option<String> = redis::from_redis_value_ref(k).ok();
            let v: Option<String> = redis::from_redis_value_ref(v).ok();
            if let (Some(k), Some(v)) = (k, v.and_then(|v| v.parse::<f64>().ok())) {
                global.insert(k, v);
            }
        }
        Some(Flushed {
            applied,
            global,
            last,
        })
    }

    /// Charges every tenant what it received on other replicas since `prev`.
    fn charge(
        &self,
        prev: &HashMap<String, f64>,
        global: &HashMap<String, f64>,
        mine: &HashMap<String, f64>,
    ) {
        for (field, now) in global {
            let before = prev.get(field).copied().unwrap_or(0.0);
            let own = mine.get(field).copied().unwrap_or(0.0);
            let remote = now - before - own;
            if remote < 0.5 {
                continue;
            }
            let Some((pool, tenant)) = field.split_once(SEP) else {
                continue;
            };
            let Some((_, q)) = self.pools.iter().find(|(n, _)| n == pool) else {
                continue;
            };
            q.charge_remote(&TenantId::new(tenant), remote);
        }
    }
}
