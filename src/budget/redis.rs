//! Budgets and the usage ledger shared by the replicas of a cluster (`[cluster]`): the spend of
//! every tenant's day and month, the reservations of requests in flight on every replica, and
//! the ledger rows, all in Redis, each update one Lua script.
//!
//! - [`RESERVE`] (one round trip per admission of a budgeted tenant, within `[cluster]
//!   timeout_ms`): admits iff, for every budget, `spent + Σ reserved + estimate ≤ amount`, the
//!   sum over the reservations of every live replica; then records this one (a field of the
//!   tenant's reservation hash, named by its replica's holder id). A reservation of a replica
//!   whose holder key expired (it died, or lost Redis for longer than the TTL) no longer counts
//!   and is deleted by the next reservation that sees it.
//! - [`FLUSH`] (every `[store] flush_ms`, one script per batch): adds the batch's ledger rows
//!   (HINCRBY per day hash), adds their spend to the tenants' day and month counters, and deletes
//!   the reservations the batch settles — in one step, so a settled request is counted once at
//!   every moment: at its estimate until the flush, at what it used after. It also renews the
//!   holder key, and is idempotent by batch id (a retry after a timeout whose script ran adds
//!   nothing).
//!
//! Hence the bound of one replica holds across the cluster: concurrent requests, wherever they
//! run, pass a budget by at most Σ max(0, actual − estimate). Money is summed in picodollars by
//! Redis's 64-bit `HINCRBY`; the admission test compares in Lua's doubles (exact up to $9,007).
//!
//! Keys under `{prefix}:budget`: `:d:DAY:TENANT` / `:m:MONTH:TENANT` (hash `t` tokens, `u`
//! picodollars), `:r:TENANT` (hash reservation → `tokens:usd`), `:live:HOLDER` (string, TTL),
//! `:u:DAY` (the ledger: hash `Xlen:TENANTMODEL` → count, X = r/i/c/o/u), `:done:BATCH`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};

use futures_util::future::BoxFuture;
use redis::{Script, Value};

use super::book::{Limit, Spend, Unit};
use super::ledger::{Batch, Query, Row, RowKey, Sink, SinkError};
use super::window::parse_day;
use crate::domain::{Period, Usd};
use crate::jobs::store::Redis;

/// KEYS: base. ARGV: holder, ttl ms, tenant, field, est tokens, est usd, day, month, n, then
/// n × (period d|m, unit t|u, amount). Returns {admitted 0|1, day t, day u, month t, month u,
/// reserved t, reserved u} (reserved: every other live reservation).
pub static RESERVE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local b = KEYS[1]
redis.call('SET', b .. ':live:' .. ARGV[1], 1, 'PX', tonumber(ARGV[2]))
local tenant, field = ARGV[3], ARGV[4]
local et, eu = tonumber(ARGV[5]), tonumber(ARGV[6])
local dk = b .. ':d:' .. ARGV[7] .. ':' .. tenant
local mk = b .. ':m:' .. ARGV[8] .. ':' .. tenant
local rk = b .. ':r:' .. tenant
local function num(k, f) return tonumber(redis.call('HGET', k, f) or '0') or 0 end
local dt, du, mt, mu = num(dk, 't'), num(dk, 'u'), num(mk, 't'), num(mk, 'u')
local rt, ru = 0, 0
local alive = {}
local all = redis.call('HGETALL', rk)
for i = 1, #all, 2 do
  local f = all[i]
  if f ~= field then
    local h = string.match(f, '^(.*):[^:]*$') or f
    local live = alive[h]
    if live == nil then
      live = redis.call('EXISTS', b .. ':live:' .. h) == 1
      alive[h] = live
    end
    if live then
      local t, u = string.match(all[i + 1], '^(%d+):(%d+)$')
      rt = rt + (tonumber(t) or 0)
      ru = ru + (tonumber(u) or 0)
    else
      redis.call('HDEL', rk, f)
    end
  end
end
local ok = 1
local i = 10
for j = 1, tonumber(ARGV[9]) do
  local p, unit, amount = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2])
  i = i + 3
  local spent
  if p == 'd' then
    if unit == 't' then spent = dt else spent = du end
  else
    if unit == 't' then spent = mt else spent = mu end
  end
  local r, e = rt, et
  if unit == 'u' then r, e = ru, eu end
  if spent + r + e > amount then ok = 0 end
end
if ok == 1 then
  redis.call('HSET', rk, field, ARGV[5] .. ':' .. ARGV[6])
  redis.call('PEXPIRE', rk, 604800000)
end
return {ok, dt, du, mt, mu, rt, ru}
",
    )
});

/// KEYS: base. ARGV: holder, ttl ms, batch id ('' = not deduplicated), ledger retention ms,
/// n rows, n × (tenant, day, month, model, requests, input, cached, output, cost), m, m ×
/// (tenant, reservation). Returns 1, or 0 when the batch was applied before.
pub static FLUSH: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local b = KEYS[1]
redis.call('SET', b .. ':live:' .. ARGV[1], 1, 'PX', tonumber(ARGV[2]))
if ARGV[3] ~= '' then
  if not redis.call('SET', b .. ':done:' .. ARGV[3], 1, 'NX', 'PX', 3600000) then return 0 end
end
local keep = tonumber(ARGV[4])
local i = 6
for j = 1, tonumber(ARGV[5]) do
  local tenant, day, month, model = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  local uk = b .. ':u:' .. day
  local f = string.len(tenant) .. ':' .. tenant .. model
  local names = {'r', 'i', 'c', 'o', 'u'}
  for k = 1, 5 do redis.call('HINCRBY', uk, names[k] .. f, ARGV[i + 3 + k]) end
  redis.call('PEXPIRE', uk, keep)
  for _, sk in ipairs({b .. ':d:' .. day .. ':' .. tenant, b .. ':m:' .. month .. ':' .. tenant}) do
    redis.call('HINCRBY', sk, 't', ARGV[i + 5])
    redis.call('HINCRBY', sk, 't', ARGV[i + 7])
    redis.call('HINCRBY', sk, 'u', ARGV[i + 8])
    redis.call('PEXPIRE', sk, 5356800000)
  end
  i = i + 9
end
local n = tonumber(ARGV[i])
i = i + 1
for j = 1, n do
  redis.call('HDEL', b .. ':r:' .. ARGV[i], ARGV[i + 1])
  i = i + 2
end
return 1
",
    )
});

/// KEYS: base. ARGV: days… Returns one flat HGETALL per day.
pub static READ: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local out = {}
for i = 1, #ARGV do out[i] = redis.call('HGETALL', KEYS[1] .. ':u:' .. ARGV[i]) end
return out
",
    )
});

/// What Redis counted for a tenant when a reservation was asked for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counted {
    /// Whether the reservation was admitted (and recorded).
    pub admitted: bool,
    /// Spent today.
    pub day: Spend,
    /// Spent this month.
    pub month: Spend,
    /// Reserved by every other live reservation.
    pub reserved: Spend,
}

/// The shared budget store and ledger sink; see the module docs.
pub struct Shared {
    redis: Arc<dyn Redis>,
    base: String,
    /// This process's holder id (`replica:nonce`): names its reservations.
    holder: String,
    ttl_ms: u64,
    retention_ms: u64,
    next: AtomicU64,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("holder", &self.holder)
            .finish_non_exhaustive()
    }
}

fn arg(v: impl ToString) -> Vec<u8> {
    v.to_string().into_bytes()
}

fn int(v: &Value) -> u64 {
    match v {
        Value::Int(i) => u64::try_from(*i).unwrap_or(0),
        Value::BulkString(b) => std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0),
        _ => 0,
    }
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

/// The month (`YYYY-MM`) of a day (`YYYY-MM-DD`).
pub fn month_of(day: &str) -> &str {
    day.get(..7).unwrap_or(day)
}

/// Parses a ledger field `Xlen:TENANTMODEL` into (counter, tenant, model).
fn parse_field(f: &str) -> Option<(char, &str, &str)> {
    let mut chars = f.chars();
    let counter = chars.next()?;
    let rest = chars.as_str();
    let (len, rest) = rest.split_once(':')?;
    let len: usize = len.parse().ok()?;
    let tenant = rest.get(..len)?;
    Some((counter, tenant, &rest[len..]))
}

impl Shared {
    /// The store for replica `replica`: reservations held while its holder key lives (`ttl_ms`,
    /// renewed by every reservation and flush), ledger days kept `retention_days`.
    pub fn new(redis: Arc<dyn Redis>, replica: &str, ttl_ms: u64, retention_days: u32) -> Self {
        Self {
            base: redis.key(&["budget"]),
            redis,
            holder: format!("{replica}:{:08x}", rand::random::<u32>()),
            ttl_ms,
            retention_ms: u64::from(retention_days.max(1)) * 86_400_000,
            next: AtomicU64::new(0),
        }
    }

    /// A new reservation's name.
    pub fn field(&self) -> String {
        format!(
            "{}:{}",
            self.holder,
            self.next.fetch_add(1, Ordering::Relaxed)
        )
    }

    /// Asks Redis to reserve `est` for `tenant` against `limits` in `day` (`YYYY-MM-DD`) and its
    /// month, as reservation `field`. `None`: Redis did not answer (budgets fail closed).
    pub async fn reserve(
        &self,
        tenant: &str,
        field: &str,
        limits: &[Limit],
        est: Spend,
        day: &str,
    ) -> Option<Counted> {
        let mut inv = RESERVE.prepare_invoke();
        inv.key(&self.base)
            .arg(&self.holder)
            .arg(self.ttl_ms)
            .arg(tenant)
            .arg(field)
            .arg(est.tokens)
            .arg(est.usd.0)
            .arg(day)
            .arg(month_of(day))
            .arg(limits.len());
        for l in limits {
            let p = match l.period {
                Period::Day => "d",
                Period::Month => "m",
            };
            let u = match l.unit {
                Unit::Tokens => "t",
                Unit::Usd => "u",
            };
            inv.arg(p).arg(u).arg(l.amount);
        }
        let v = self.redis.eval_fast(&inv).await?;
        let Value::Array(a) = v else { return None };
        let n = |i: usize| a.get(i).map_or(0, int);
        let spend = |t: usize| Spend {
            tokens: n(t),
            usd: Usd(n(t + 1)),
        };
        Some(Counted {
            admitted: n(0) == 1,
            day: spend(1),
            month: spend(3),
            reserved: spend(5),
        })
    }
}

impl Sink for Shared {
    fn write(&self, rows: Vec<(RowKey, Row)>) -> BoxFuture<'_, Result<(), SinkError>> {
        self.write_batch(Batch {
            rows,
            ..Batch::default()
        })
    }

    fn write_batch(&self, batch: Batch) -> BoxFuture<'_, Result<(), SinkError>> {
        Box::pin(async move {
            let mut inv = FLUSH.prepare_invoke();
            inv.key(&self.base)
                .arg(&self.holder)
                .arg(self.ttl_ms)
                .arg(&batch.id)
                .arg(self.retention_ms)
                .arg(batch.rows.len());
            for (k, r) in &batch.rows {
                inv.arg(&k.tenant)
                    .arg(&k.day)
                    .arg(month_of(&k.day))
                    .arg(&k.model)
                    .arg(r.requests)
                    .arg(r.input_tokens)
                    .arg(r.cached_input_tokens)
                    .arg(r.output_tokens)
                    .arg(r.cost.0);
            }
            inv.arg(batch.released.len());
            for (tenant, field) in &batch.released {
                inv.arg(tenant).arg(field);
            }
            match self.redis.eval(&inv).await {
                Some(_) => Ok(()),
                None => Err("Redis did not answer (the batch is kept for the next flush)".into()),
            }
        })
    }

    fn read(&self, q: Query) -> BoxFuture<'_, Result<Vec<(RowKey, Row)>, SinkError>> {
        Box::pin(async move {
            let (Some(mut d), Some(to)) = (parse_day(&q.from), parse_day(&q.to)) else {
                return Ok(Vec::new());
            };
            let mut days = Vec::new();
            while d <= to && days.len() < 4000 {
                days.push(super::window::day_string(d));
                let Ok(next) = d.tomorrow() else { break };
                d = next;
            }
            if days.is_empty() {
                return Ok(Vec::new());
            }
            let mut inv = READ.prepare_invoke();
            inv.key(&self.base);
            for day in &days {
                inv.arg(arg(day));
            }
            let Some(Value::Array(per_day)) = self.redis.eval(&inv).await else {
                return Err("Redis did not answer".into());
            };
            let mut rows: std::collections::BTreeMap<RowKey, Row> = Default::default();
            for (day, flat) in days.iter().zip(per_day) {
                let Value::Array(flat) = flat else { continue };
                for pair in flat.chunks(2) {
                    let (Some(f), Some(v)) = (pair.first().and_then(text), pair.get(1)) else {
                        continue;
                    };
                    let Some((c, tenant, model)) = parse_field(&f) else {
                        continue;
                    };
                    if q.tenant.as_ref().is_some_and(|t| t != tenant) {
                        continue;
                    }
                    let key = RowKey {
                        tenant: tenant.to_owned(),
                        day: day.clone(),
                        model: model.to_owned(),
                    };
                    let row = rows.entry(key).or_default();
                    let v = int(v);
                    match c {
                        'r' => row.requests = v,
                        'i' => row.input_tokens = v,
                        'c' => row.cached_input_tokens = v,
                        'o' => row.output_tokens = v,
                        'u' => row.cost = Usd(v),
                        _ => {}
                    }
                }
            }
            Ok(rows.into_iter().collect())
        })
    }

    fn prune(&self, _day: String) -> BoxFuture<'_, Result<u64, SinkError>> {
        // Every ledger day expires by itself, `usage_retention_days` after its last write.
        Box::pin(std::future::ready(Ok(0)))
    }
}

#[cfg(test)]
mod tests;
