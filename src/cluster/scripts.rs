//! The Lua scripts: every shared update is one of these, atomic on the Redis server, timed by
//! the server's clock (`TIME`), so replicas' clocks never need to agree.

use std::sync::LazyLock;

use redis::Script;

/// One lease-gate round trip for one pool: drop expired leases, release the given ones, renew
/// the held ones (reporting those that expired meanwhile), then grant new ones if the pool has
/// room — at most this replica's fair share while other replicas are waiting.
///
/// KEYS: leases (zset member `replica:id`, score expiry ms), active replicas (zset, score
/// expiry), waiting replicas (zset), shared learned limit (string, with a 60 s TTL; in force:
/// the published estimate + 1 per second since it was published, so an estimate below the
/// provider's capacity is probed back up like an additive increase, and a cut republishes).
/// ARGV: replica, ttl_ms, configured limit, demand, published limit (0: none),
/// n_release, ids…, n_renew, ids…, n_new, ids…
/// Returns {granted ids, lost ids, share, others waiting, limit in force, leases in the pool}.
pub static LEASE_SYNC: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local replica = ARGV[1]
local ttl = tonumber(ARGV[2])
local limit = tonumber(ARGV[3])
local demand = tonumber(ARGV[4])
local publish = tonumber(ARGV[5])
if publish > 0 then
  redis.call('SET', KEYS[4], publish, 'PX', 60000)
end
local shared = tonumber(redis.call('GET', KEYS[4]) or '')
if shared then
  -- Probing back up: +1 per second since the last cut (the key's age, from its TTL).
  local age = 60000 - redis.call('PTTL', KEYS[4])
  shared = shared + math.floor(math.max(age, 0) / 1000)
  if shared < limit then limit = math.max(shared, 1) end
end
for k = 1, 3 do redis.call('ZREMRANGEBYSCORE', KEYS[k], '-inf', now) end
local i = 6
local n = tonumber(ARGV[i]); i = i + 1
for j = 1, n do
  redis.call('ZREM', KEYS[1], replica .. ':' .. ARGV[i]); i = i + 1
end
n = tonumber(ARGV[i]); i = i + 1
local held, lost = 0, {}
for j = 1, n do
  local m = replica .. ':' .. ARGV[i]
  if redis.call('ZSCORE', KEYS[1], m) then
    redis.call('ZADD', KEYS[1], now + ttl, m); held = held + 1
  else
    table.insert(lost, ARGV[i])
  end
  i = i + 1
end
if demand > 0 or held > 0 then
  redis.call('ZADD', KEYS[2], now + ttl, replica)
else
  redis.call('ZREM', KEYS[2], replica)
end
local want = demand - held
if want > 0 then
  redis.call('ZADD', KEYS[3], now + ttl, replica)
else
  redis.call('ZREM', KEYS[3], replica)
end
local active = math.max(redis.call('ZCARD', KEYS[2]), 1)
local share = math.max(math.floor(limit / active), 1)
local others = redis.call('ZCARD', KEYS[3])
if want > 0 then others = others - 1 end
n = tonumber(ARGV[i]); i = i + 1
local grant = math.min(n, want, limit - redis.call('ZCARD', KEYS[1]))
if others > 0 then grant = math.min(grant, share - held) end
local granted = {}
for j = 1, grant do
  redis.call('ZADD', KEYS[1], now + ttl, replica .. ':' .. ARGV[i + j - 1])
  table.insert(granted, ARGV[i + j - 1])
end
for k = 1, 3 do redis.call('PEXPIRE', KEYS[k], ttl * 4) end
return {granted, lost, share, others, limit, redis.call('ZCARD', KEYS[1])}
"#,
    )
});

/// One pool's endpoint ejections, shared: publishes this replica's new ones and reads every
/// endpoint's (one key per endpoint, present while it is out; its TTL is the time left).
///
/// KEYS: each endpoint's ejection key. ARGV: for each, the ms this replica ejected it for (0:
/// nothing new); a shorter ejection never cuts a longer one short.
/// Returns, for each endpoint, the ms left of its ejection (0: not ejected).
pub static EJECT_SYNC: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local out = {}
for k = 1, #KEYS do
  local ms = tonumber(ARGV[k]) or 0
  if ms > 0 and redis.call('PTTL', KEYS[k]) < ms then
    redis.call('SET', KEYS[k], '1', 'PX', ms)
  end
  table.insert(out, math.max(redis.call('PTTL', KEYS[k]), 0))
end
return out
"#,
    )
});

/// Rate admission (GCRA) of one request on a tenant's token and request buckets, both or
/// neither charged. A bucket's state is its theoretical arrival time (TAT, µs); admitting n
/// cells moves it to max(TAT, now) + n·T and is allowed while that is ≤ now + B·T.
///
/// Idempotent: an admission carries a key of its own; its answer is kept for 10 s, so an
/// admission retried after a lost answer (a timeout) gets the first answer back and is not
/// charged twice.
///
/// KEYS: token TAT, request TAT, the admission's idempotency key. ARGV: cost, token T µs, token
/// B (0: no bucket), request T µs, request B (0: no bucket), idempotency TTL ms.
/// Returns {verdict (0 ok, 1 requests, 2 tokens, 3 larger than the bucket), retry µs,
/// token TAT − now µs, request TAT − now µs}.
pub static RATE_ADMIT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local done = redis.call('GET', KEYS[3])
if done then return cjson.decode(done) end
local cost = tonumber(ARGV[1])
local tT, tB, rT, rB = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local function probe(key, n, T, B)
  local tat = tonumber(redis.call('GET', key) or '0')
  if tat < now then tat = now end
  local new = tat + n * T
  return new, new - now - B * T, tat - now
end
local tnew, rnew
local tleft, rleft = 0, 0
if tB > 0 then
  if cost > tB then return {3, 0, 0, 0} end
  local new, over, before = probe(KEYS[1], cost, tT, tB)
  if over > 0 then return {2, math.ceil(over), math.floor(before), 0} end
  tnew = new
end
if rB > 0 then
  local new, over, before = probe(KEYS[2], 1, rT, rB)
  local tb = 0
  if tnew then tb = tnew - now end
  if over > 0 then return {1, math.ceil(over), math.floor(tb), math.floor(before)} end
  rnew = new
end
if tnew then
  redis.call('SET', KEYS[1], string.format('%.0f', tnew), 'PX', math.ceil((tnew - now) / 1000) + 1000)
  tleft = tnew - now
end
if rnew then
  redis.call('SET', KEYS[2], string.format('%.0f', rnew), 'PX', math.ceil((rnew - now) / 1000) + 1000)
  rleft = rnew - now
end
local answer = {0, 0, math.floor(tleft), math.floor(rleft)}
redis.call('SET', KEYS[3], cjson.encode(answer), 'PX', tonumber(ARGV[6]))
return answer
"#,
    )
});

/// One sync tick of a replica: weighted service deltas and rate-limit corrections, applied once
/// (a batch carries a sequence number per replica; a batch retried after a lost answer is not
/// applied twice), then every tenant's cluster-wide weighted service read back.
///
/// KEYS: service hash (field `pool␟tenant` → tokens/weight), applied-sequence hash, then the
/// token TAT key of each rate correction (every key shares the prefix's hash tag: one slot).
/// ARGV: replica, seq, n_service, (field, delta)…, n_rate, (delta cells, T µs, cap cells)…
/// (the i-th correction's key is KEYS[2 + i]; cap = bucket + debt bound).
/// A rate delta > 0 is credit (TAT moves back, never before now), < 0 debt (TAT moves ahead,
/// at most `cap` cells: one bucket plus `max_debt_minutes` of the rate). Returns {applied (0/1), HGETALL service, the replica's last applied
/// sequence (this one when applied)}: a batch not applied whose sequence is not the last
/// applied one was never applied (another run of this `replica_id` used its number).
pub static SYNC: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local seq = tonumber(ARGV[2])
local last = tonumber(redis.call('HGET', KEYS[2], ARGV[1]) or '-1')
local applied = 0
if seq > last then
  applied = 1
  last = seq
  redis.call('HSET', KEYS[2], ARGV[1], seq)
  redis.call('PEXPIRE', KEYS[2], 86400000)
  local i = 3
  local n = tonumber(ARGV[i]); i = i + 1
  for j = 1, n do
    redis.call('HINCRBYFLOAT', KEYS[1], ARGV[i], ARGV[i + 1]); i = i + 2
  end
  n = tonumber(ARGV[i]); i = i + 1
  for j = 1, n do
    local key, d, T, B = KEYS[2 + j], tonumber(ARGV[i]), tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2])
    i = i + 3
    local tat = tonumber(redis.call('GET', key) or '0')
    if tat < now then tat = now end
    tat = tat - d * T
    if tat < now then tat = now end
    if tat > now + B * T then tat = now + B * T end
    if tat > now then
      redis.call('SET', key, string.format('%.0f', tat), 'PX', math.ceil((tat - now) / 1000) + 1000)
    else
      redis.call('DEL', key)
    end
  end
end
return {applied, redis.call('HGETALL', KEYS[1]), last}
"#,
    )
});

/// The last sequence applied for a replica (0: none), read when its syncer starts so a
/// replica restarted under a fixed `replica_id` continues its numbering.
///
/// KEYS: applied-sequence hash. ARGV: replica.
pub static SYNC_RESUME: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
return tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0')
"#,
    )
});
