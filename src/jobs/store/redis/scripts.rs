//! The Lua scripts of the Redis job store: every update that touches more than one key is one
//! script, so it is atomic. `KEYS[1]` is the store's base key (`{prefix}:jobs`, hash-tagged:
//! every key below shares its slot); the keys a script touches are built from it:
//!
//! - `:j:ID` (hash): a job — tenant, batch, line, custom_id, method, path, body, state, seq,
//!   created, attempt, token (while running), status, resp_type, response, finished;
//! - `:q:TENANT` (zset): the tenant's queued job ids by `seq` (insertion order);
//! - `:tenants` (set): tenants with a queued job;
//! - `:run` (zset): running job ids by lease expiry (ms, Redis `TIME`);
//! - `:tok`, `:seq` (counters): fencing tokens, insertion order;
//! - `:u:TENANT` (hash): `n` jobs queued or running, `b` bytes stored (limits hold
//!   cluster-wide);
//! - `:f:ID` (hash): a file — tenant, purpose, filename, bytes, created (`content`: the whole
//!   file, only for a file stored by an earlier version);
//! - `:fc:ID` (hash): the file's chunks by `seq` (0, 1, …; `CHUNK_BYTES` each, the last
//!   shorter), expiring while the upload is not committed;
//! - `:ft:TENANT` (zset): the tenant's file ids by `seq` (listing);
//! - `:b:ID` (hash), `:bl:ID` (list): a batch — tenant, doc, status, total, completed, failed,
//!   unfinished — and its job ids in line order;
//! - `:bt:TENANT` (zset): the tenant's batch ids by creation;
//! - `:open` (set): batches not in a final status;
//! - `:bexp` (zset): `in_progress` batch ids by `expires_at` (completion windows);
//! - `:exp` (zset): `j:ID`, `b:ID`, `f:ID` by finish (files: creation) time, for retention;
//! - `:age` (zset): queued job ids by creation time (oldest queued);
//! - `:st` (hash): `TENANT\nSTATE` → jobs (`fairgate_jobs`).
//!
//! The scripts declare only `KEYS[1]` and build the others from it: every one shares its hash
//! tag, so they all live in one slot of a Redis Cluster too.

use std::sync::LazyLock;

use redis::Script;

/// Helpers every script starts with.
const PRELUDE: &str = r"
local K = KEYS[1]
local function st(tenant, from, to, n)
  n = n or 1
  if from then redis.call('HINCRBY', K..':st', tenant..'\n'..from, -n) end
  if to then redis.call('HINCRBY', K..':st', tenant..'\n'..to, n) end
end
local function nowms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function enqueue(id, j, tenant)
  redis.call('ZADD', K..':q:'..tenant, redis.call('HGET', j, 'seq'), id)
  redis.call('SADD', K..':tenants', tenant)
  redis.call('ZADD', K..':age', redis.call('HGET', j, 'created'), id)
end
local function unqueue(id, tenant)
  redis.call('ZREM', K..':q:'..tenant, id)
  redis.call('ZREM', K..':age', id)
end
";

fn script(body: &str) -> Script {
    Script::new(&format!("{PRELUDE}{body}"))
}

/// ARGV: tenant, now, batch id or '', batch doc, max jobs, max bytes, then per job: id, line,
/// custom_id, method, path, body. → jobs inserted, or -1 (jobs limit), -2 (bytes limit).
pub static INSERT: LazyLock<Script> = LazyLock::new(|| {
    script(
        r"
local tenant, now, bid = ARGV[1], ARGV[2], ARGV[3]
local u = K..':u:'..tenant
local n, bytes = 0, 0
for i = 7, #ARGV, 6 do
  n = n + 1
  bytes = bytes + string.len(ARGV[i + 5])
end
local have = redis.call('HMGET', u, 'n', 'b')
if (tonumber(have[1]) or 0) + n > tonumber(ARGV[5]) then return -1 end
if (tonumber(have[2]) or 0) + bytes > tonumber(ARGV[6]) then return -2 end
if bid ~= '' then
  redis.call('HSET', K..':b:'..bid, 'tenant', tenant, 'doc', ARGV[4], 'status', 'in_progress',
    'created', now, 'total', n, 'completed', 0, 'failed', 0, 'unfinished', n)
  redis.call('ZADD', K..':bt:'..tenant, redis.call('INCR', K..':seq'), bid)
  redis.call('SADD', K..':open', bid)
  local ok, doc = pcall(cjson.decode, ARGV[4])
  local expires = ok and type(doc) == 'table' and tonumber(doc.expires_at)
  if expires then redis.call('ZADD', K..':bexp', expires, bid) end
end
for i = 7, #ARGV, 6 do
  local id = ARGV[i]
  local j = K..':j:'..id
  redis.call('HSET', j, 'tenant', tenant, 'batch', bid, 'line', ARGV[i + 1],
    'custom_id', ARGV[i + 2], 'method', ARGV[i + 3], 'path', ARGV[i + 4], 'body', ARGV[i + 5],
    'state', 'queued', 'created', now, 'seq', redis.call('INCR', K..':seq'), 'attempt', 0)
  if bid ~= '' then redis.call('RPUSH', K..':bl:'..bid, id) end
  enqueue(id, j, tenant)
end
redis.call('HINCRBY', u, 'n', n)
redis.call('HINCRBY', u, 'b', bytes)
st(tenant, nil, 'queued', n)
return n
",
    )
});

/// ARGV: tenant → {jobs queued or running, bytes}.
pub static USAGE: LazyLock<Script> =
    LazyLock::new(|| script("return redis.call('HMGET', K..':u:'..ARGV[1], 'n', 'b')"));

/// ARGV: tenant, id → {state, status, resp_type, response} of a job (not a batch line), or nil.
pub static JOB: LazyLock<Script> = LazyLock::new(|| {
    script(
        r"
local h = redis.call('HMGET', K..':j:'..ARGV[2], 'tenant', 'batch', 'state', 'status',
  'resp_type', 'response')
if h[1] ~= ARGV[1] or h[2] ~= '' then return false end
return {h[3], h[4], h[5], h[6]}
",
    )
});

/// ARGV: tenant, id, now → the job's state after, or nil (no such job of this tenant).
pub static CANCEL: LazyLock<Script> = LazyLock::new(|| {
    script(
        r"
local tenant, id = ARGV[1], ARGV[2]
local j = K..':j:'..id
local h = redis.call('HMGET', j, 'tenant', 'batch', 'state')
if h[1] ~= tenant or h[2] ~= '' then return false end
if h[3] == 'queued' then
  unqueue(id, tenant)
  redis.call('HSET', j, 'state', 'cancelled', 'finished', ARGV[3])
  redis.call('HINCRBY', K..':u:'..tenant, 'n', -1)
  redis.call('ZADD', K..':exp', ARGV[3], 'j:'..id)
  st(tenant, 'queued', 'cancelled')
end
return redis.call('HGET', j, 'state')
",
    )
});

/// → tenants with a queued job.
pub static TENANTS: LazyLock<Script> =
    LazyLock::new(|| script("return redis.call('SMEMBERS', K..':tenants')"));

/// ARGV: tenant, n, lease_ms, max_inflight → {{id, token, batch, method, path, body}, …}: up
/// to `n` of the tenant's oldest queued jobs, now running under a fresh token until Redis time +
/// lease — and no more than keeps the tenant's running jobs, on every replica together, within
/// `max_inflight` (`[jobs] max_inflight_per_tenant` holds cluster-wide).
pub static CLAIM: LazyLock<Script> = LazyLock::new(|| {
    script(
        r"
local tenant = ARGV[1]
local q = K..':q:'..tenant
local running = tonumber(redis.call('HGET', K..':st', tenant..'\nrunning')) or 0
local want = math.min(tonumber(ARGV[2]), tonumber(ARGV[4]) - running)
if want <= 0 then return {} end
local ids = redis.call('ZRANGE', q, 0, want - 1)
local exp = nowms() + tonumber(ARGV[3])
local out = {}
for _, id in ipairs(ids) do
  unqueue(id, tenant)
  local j = K..':j:'..id
  local tok = redis.call('INCR', K..':tok')
  redis.call('HSET', j, 'state', 'running', 'token', tok)
  redis.call('ZADD', K..':run', exp, id)
  st(tenant, 'queued', 'running')
  local h = redis.call('HMGET', j, 'batch', 'method', 'path', 'body')
  table.insert(out, {id, tok, h[1], h[2], h[3], h[4]})
end
if redis.call('ZCARD', q) == 0 then redis.call('SREM', K..':tenants', tenant) end
return out
",
    )
});

/// ARGV: lease_ms, then id, token pairs → claims lost (the job is queued again, or running
/// under another claim). A job that finished meanwhile (most often: this very claim, between
/// the runner's snapshot of its claims and this script) is not renewed and not counted.
pub static RENEW: LazyLock<Script> = LazyLock::new(|| {
    script(
        r"
local exp = nowms() + tonumber(ARGV[1])
local lost = 0
for i = 2, #ARGV, 2 do
  local h = redis.call('HMGET', K..':j:'..ARGV[i], 'state', 'token')
  if h[1] == 'running' and h[2] == ARGV[i + 1] then
    redis.call('ZADD', K..':run', 'XX', exp, ARGV[i])
  elseif h[1] == 'queued' or h[1] == 'running' then
    lost = lost + 1
  end
end
return lost
",
    )
});

/// ARGV: max, lease_ms, then the caller's own `id, token` claims → jobs whose lease expired
/// (Redis time), queued again (token dropped, attempt bumped): at most `max` a call. The
/// caller's own claims still running under their tokens are renewed first, in the same script:
/// a replica that stalled past its leases never reclaims (and sends again) lines it is still
/// running itself; only another replica can, once they expired.
pub static RECLAIM: LazyLock<Script> = LazyLock::new(|| {
    script(
        r"
local now = nowms()
local exp = now + tonumber(ARGV[2])
for i = 3, #ARGV, 2 do
  local h = redis.call('HMGET', K..':j:'..ARGV[i], 'state', 'token')
  if h[1] == 'running' and h[2] == ARGV[i + 1] then
    redis.call('ZADD', K..':run', 'XX', exp, ARGV[i])
  end
end
local ids = redis.call('ZRANGEBYSCORE', K..':run', '-inf', now, 'LIMIT', 0,
  tonumber(ARGV[1]))
local n = 0
for _, id in ipairs(ids) do
  redis.call('ZREM', K..':run', id)
  local j = K..':j:'..id
  local h = redis.call('HMGET', j, 'state', 'tenant')
  if h[1] == 'running' then
    redis.call('HSET', j, 'state', 'queued')
    redis.call('HDEL', j, 'token')
    redis.call('HINCRBY', j, 'attempt', 1)
    enqueue(id, j, h[2])
    st(h[2], 'running', 'queued')
    n = n + 1
  end
end
return n
",
    )
});

/// ARGV: id, token → 1 if the job ran under `token` and is queued again, else 0.
pub static REQUEUE: LazyLock<Script> = LazyLock::new(|| {
    script(
        r"
local j = K..':j:'..ARGV[1]
local h = redis.call('HMGET', j, 'state', 'token', 'tenant')
if h[1] ~= 'running' or h[2] ~= ARGV[2] then return 0 end
redis.call('ZREM', K..':run', ARGV[1])
redis.call('HSET', j, 'state', 'queued')
redis.call('HDEL', j, 'token')
enqueue(ARGV[1], j, h[3])
st(h[3], 'running', 'queued')
return 1
",
    )
});

/// ARGV: id, token, status, state, resp_type, body, now → 1 recorded, 0 discarded: the job is
/// not running under `token` (it was reclaimed, and perhaps claimed again, or it already
/// finished). A lease that ran out but was not reclaimed yet still records: no other claim
/// exists (a reclaim drops the token), and discarding the answer would only send the line
/// again.
pub static FINISH: LazyLock<Script> = LazyLock::new(|| {
    script(
        r"
local id = ARGV[1]
local j = K..':j:'..id
local h = redis.call('HMGET', j, 'state', 'token', 'tenant', 'batch')
if h[1] ~= 'running' or h[2] ~= ARGV[2] then return 0 end
redis.call('ZREM', K..':run', id)
redis.call('HSET', j, 'state', ARGV[4], 'status', ARGV[3], 'resp_type', ARGV[5],
  'response', ARGV[6], 'finished', ARGV[7])
redis.call('HDEL', j, 'token')
redis.call('HINCRBY', K..':u:'..h[3], 'n', -1)
redis.call('HINCRBY', K..':u:'..h[3], 'b', string.len(ARGV[6]))
st(h[3], 'running', ARGV[4])
if h[4] == '' then
  redis.call('ZADD', K..':exp', ARGV[7], 'j:'..id)
else
  local b = K..':b:'..h[4]
  redis.call('HINCRBY', b, ARGV[4], 1)
  redis.call('HINCRBY', b, 'unfinished', -1)
end
return 1
",
    )
});

/// ARGV: id, seq, data, ttl (seconds) → 1: stores chunk `seq` of the file `id` being
/// uploaded. Until the file is committed its chunks expire `ttl` after the last one came: an
/// upload whose replica died mid-way leaves nothing behind for long.
pub static CHUNK_PUT: LazyLock<Script> = LazyLock::new(|| {
    script(
        r"
local fc = K..':fc:'..ARGV[1]
redis.call('HSET', fc, ARGV[2], ARGV[3])
if redis.call('EXISTS', K..':f:'..ARGV[1]) == 0 then
  redis.call('EXPIRE', fc, tonumber(ARGV[4]))
end
return 1
",
    )
});

/// ARGV: tenant, id, purpose, filename, bytes, created, max bytes → 1, or -2 (the tenant's
/// bytes limit): makes the uploaded file `id`, its chunks stored, one of the tenant's files
/// (its chunks no longer expire).
pub static FILE_COMMIT: LazyLock<Script> = LazyLock::new(|| {
    script(
        r"
local u = K..':u:'..ARGV[1]
if (tonumber(redis.call('HGET', u, 'b')) or 0) + tonumber(ARGV[5]) > tonumber(ARGV[7]) then
  return -2
end
redis.call('HSET', K..':f:'..ARGV[2], 'tenant', ARGV[1], 'purpose', ARGV[3],
  'filename', ARGV[4], 'bytes', ARGV[5], 'created', ARGV[6])
redis.call('PERSIST', K..':fc:'..ARGV[2])
redis.call('HINCRBY', u, 'b', ARGV[5])
redis.call('ZADD', K..':exp', ARGV[6], 'f:'..ARGV[2])
redis.call('ZADD', K..':ft:'..ARGV[1], redis.call('INCR', K..':seq'), ARGV[2])
return 1
",
    )
});

/// ARGV: id → 1: drops the chunks of an upload that was not committed (a committed file's
/// stay).
pub static CHUNK_ABORT: LazyLock<Script> = LazyLock::new(|| {
    script(
        r"
if redis.call('EXISTS', K..':f:'..ARGV[1]) == 0 then
  redis.call('DEL', K..':fc:'..ARGV[1])
end
return 1
",
    )
});

/// ARGV: tenant, id, seq → {chunk}, {} past the file's end, or nil (no such file of this
/// tenant). A file stored whole by an earlier version (its `content` field) is its one chunk 0.
pub static CHUNK_GET: LazyLock<Script> = LazyLock::new(|| {
    script(
        r"
local f = K..':f:'..ARGV[2]
if redis.call('HGET', f, 'tenant') ~= ARGV[1] then return false end
local whole = redis.call('HGET', f, 'content')
if whole then
  if ARGV[3] == '0' then return {whole} end
  return {}
end
local c = redis.call('HGET', K..':fc:'..ARGV[2], ARGV[3])
if c then return {c} end
return {}
",
    )
});

/// ARGV: tenant, id → {purpose, filename, bytes, created} or nil.
pub static FILE_GET: LazyLock<Script> = LazyLock::new(|| {
    script(
        r"
local f = K..':f:'..ARGV[2]
if redis.call('HGET', f, 'tenant') ~= ARGV[1] then return false end
return redis.call('HMGET', f, 'purpose', 'filename', 'bytes', 'created')
",
    )
});

/// ARGV: tenant, after (id or ''), limit, purpose (or '') → {{id, purpose, filename, bytes,
/// created}, …}: the tenant's files newest first, after `after`, of `purpose`. One call reads
/// at most `limit` + 10,000 index entries, so a tenant with a million small files of another
/// purpose cannot make one listing block Redis (it gets fewer rows; `after` goes on from them).
pub static FILES: LazyLock<Script> = LazyLock::new(|| {
    script(
        r"
local z = K..':ft:'..ARGV[1]
local max = '+inf'
if ARGV[2] ~= '' then
  local s = redis.call('ZSCORE', z, ARGV[2])
  if not s then return {} end
  max = '(' .. s
end
local want, purpose = tonumber(ARGV[3]), ARGV[4]
local out, offset = {}, 0
while #out < want and offset < want + 10000 do
  local ids = redis.call('ZREVRANGEBYSCORE', z, max, '-inf', 'LIMIT', offset, 200)
  if #ids == 0 then break end
  offset = offset + #ids
  for _, id in ipairs(ids) do
    local h = redis.call('HMGET', K..':f:'..id, 'purpose', 'filename', 'bytes', 'created')
    if h[1] and (purpose == '' or h[1] == purpose) and #out < want then
      table.insert(out, {id, h[1], h[2], h[3], h[4]})
    end
  end
end
return out
",
    )
});

/// ARGV: tenant, id → 1 deleted, 0 no such file of this tenant.
pub static FILE_DELETE: LazyLock<Script> = LazyLock::new(|| {
    script(
        r"
local f = K..':f:'..ARGV[2]
local h = redis.call('HMGET', f, 'tenant', 'bytes')
if h[1] ~= ARGV[1] then return 0 end
redis.call('HINCRBY', K..':u:'..ARGV[1], 'b', -tonumber(h[2]))
redis.call('ZREM', K..':exp', 'f:'..ARGV[2])
redis.call('ZREM', K..':ft:'..ARGV[1], ARGV[2])
redis.call('DEL', f, K..':fc:'..ARGV[2])
return 1
",
    )
});

/// ARGV: tenant or '' (any), id → the batch document (or its tenant when `tenant` is ''), or
/// nil.
pub static BATCH: LazyLock<Script> = LazyLock::new(|| {
    script(
        r"
local h = redis.call('HMGET', K..':b:'..ARGV[2], 'tenant', 'doc')
if not h[1] then return false end
if ARGV[1] == '' then return h[1] end
if h[1] ~= ARGV[1] then return false end
return h[2]
",
    )
});

/// ARGV: tenant, after id or '', limit → batch documents, newest first.
pub static BATCHES: LazyLock<Script> = LazyLock::new(|| {
    script(
        r"
local z = K..':bt:'..ARGV[1]
local max = '+inf'
if ARGV[2] ~= '' then
  local s = redis.call('ZSCORE', z, ARGV[2])
  if not s then return {} end
  max = '(' .. s
end
local out = {}
for _, id in ipairs(redis.call('ZREVRANGEBYSCORE', z, max, '-inf', 'LIMIT', 0,
    tonumber(ARGV[3]))) do
  table.insert(out, redis.call('HGET', K..':b:'..id, 'doc'))
end
return out
",
    )
});

/// ARGV: tenant, id, doc, now → 1 if the batch went `in_progress` → `cancelling` (its queued
/// lines cancelled), else 0.
pub static BATCH_CANCEL: LazyLock<Script> = LazyLock::new(|| {
    script(
        r"
local tenant, bid = ARGV[1], ARGV[2]
local b = K..':b:'..bid
local h = redis.call('HMGET', b, 'tenant', 'status')
if h[1] ~= tenant or h[2] ~= 'in_progress' then return 0 end
redis.call('HSET', b, 'doc', ARGV[3], 'status', 'cancelling')
local n = 0
for _, id in ipairs(redis.call('LRANGE', K..':bl:'..bid, 0, -1)) do
  local j = K..':j:'..id
  if redis.call('HGET', j, 'state') == 'queued' then
    unqueue(id, tenant)
    redis.call('HSET', j, 'state', 'cancelled', 'finished', ARGV[4])
    n = n + 1
  end
end
if redis.call('ZCARD', K..':q:'..tenant) == 0 then redis.call('SREM', K..':tenants', tenant) end
redis.call('HINCRBY', b, 'unfinished', -n)
redis.call('HINCRBY', K..':u:'..tenant, 'n', -n)
st(tenant, 'queued', 'cancelled', n)
return 1
",
    )
});

/// ARGV: tenant, id, doc, now → a batch that failed validation, stored final.
pub static BATCH_FAILED: LazyLock<Script> = LazyLock::new(|| {
    script(
        r"
redis.call('HSET', K..':b:'..ARGV[2], 'tenant', ARGV[1], 'doc', ARGV[3], 'status', 'failed',
  'created', ARGV[4], 'finished', ARGV[4], 'total', 0, 'completed', 0, 'failed', 0,
  'unfinished', 0)
redis.call('ZADD', K..':bt:'..ARGV[1], redis.call('INCR', K..':seq'), ARGV[2])
redis.call('ZADD', K..':exp', ARGV[4], 'b:'..ARGV[2])
return 1
",
    )
});

/// ARGV: id → {total, completed, failed, unfinished}.
pub static COUNTS: LazyLock<Script> = LazyLock::new(|| {
    script(
        "return redis.call('HMGET', K..':b:'..ARGV[1], 'total', 'completed', 'failed', \
         'unfinished')",
    )
});

/// ARGV: id → {{job id, custom_id, state, status, response}, …} in line order.
pub static LINES: LazyLock<Script> = LazyLock::new(|| {
    script(
        r"
local out = {}
for _, id in ipairs(redis.call('LRANGE', K..':bl:'..ARGV[1], 0, -1)) do
  local h = redis.call('HMGET', K..':j:'..id, 'custom_id', 'state', 'status', 'response')
  table.insert(out, {id, h[1], h[2], h[3], h[4]})
end
return out
",
    )
});

/// ARGV: now (unix seconds), max → {{tenant, id, doc}, …} of `in_progress` batches whose
/// completion window ended; ids of batches no longer `in_progress` leave `:bexp` on the way.
pub static DUE: LazyLock<Script> = LazyLock::new(|| {
    script(
        r"
local out = {}
for _, id in ipairs(redis.call('ZRANGEBYSCORE', K..':bexp', '-inf', ARGV[1], 'LIMIT', 0,
    tonumber(ARGV[2]))) do
  local h = redis.call('HMGET', K..':b:'..id, 'status', 'tenant', 'doc')
  if h[1] == 'in_progress' then
    table.insert(out, {h[2], id, h[3]})
  else
    redis.call('ZREM', K..':bexp', id)
  end
end
return out
",
    )
});

/// → ids of batches not in a final status whose lines all finished (to finalize).
pub static OPEN: LazyLock<Script> = LazyLock::new(|| {
    script(
        r"
local out = {}
for _, id in ipairs(redis.call('SMEMBERS', K..':open')) do
  if redis.call('HGET', K..':b:'..id, 'unfinished') == '0' then table.insert(out, id) end
end
return out
",
    )
});

/// ARGV: id, expected status, doc, status, now, chunk bytes, then per file: id, purpose,
/// filename, bytes, created, content → 1 if this call finalized the batch (status was
/// `expected`, no line unfinished), else 0: the compare-and-set that makes finalization happen
/// once. Each file is stored in chunks of `chunk bytes`, as uploads are.
pub static FINALIZE: LazyLock<Script> = LazyLock::new(|| {
    script(
        r"
local bid = ARGV[1]
local b = K..':b:'..bid
local h = redis.call('HMGET', b, 'status', 'unfinished', 'tenant')
if h[1] ~= ARGV[2] or tonumber(h[2]) ~= 0 then return 0 end
local tenant = h[3]
local ch = tonumber(ARGV[6])
for i = 7, #ARGV, 6 do
  redis.call('HSET', K..':f:'..ARGV[i], 'tenant', tenant, 'purpose', ARGV[i + 1],
    'filename', ARGV[i + 2], 'bytes', ARGV[i + 3], 'created', ARGV[i + 4])
  local content, seq = ARGV[i + 5], 0
  for off = 1, #content, ch do
    redis.call('HSET', K..':fc:'..ARGV[i], seq, string.sub(content, off, off + ch - 1))
    seq = seq + 1
  end
  redis.call('HINCRBY', K..':u:'..tenant, 'b', ARGV[i + 3])
  redis.call('ZADD', K..':exp', ARGV[i + 4], 'f:'..ARGV[i])
  redis.call('ZADD', K..':ft:'..tenant, redis.call('INCR', K..':seq'), ARGV[i])
end
redis.call('HSET', b, 'doc', ARGV[3], 'status', ARGV[4], 'finished', ARGV[5])
redis.call('SREM', K..':open', bid)
redis.call('ZREM', K..':bexp', bid)
redis.call('ZADD', K..':exp', ARGV[5], 'b:'..bid)
return 1
",
    )
});

/// ARGV: before (unix seconds), max → entries of `:exp` older than `before` deleted (at most
/// `max`), with their bytes and state counts.
pub static CLEANUP: LazyLock<Script> = LazyLock::new(|| {
    script(
        r"
local function drop_job(id)
  local j = K..':j:'..id
  local h = redis.call('HMGET', j, 'tenant', 'state')
  if not h[1] then return end
  local bytes = redis.call('HSTRLEN', j, 'body') + redis.call('HSTRLEN', j, 'response')
  redis.call('HINCRBY', K..':u:'..h[1], 'b', -bytes)
  st(h[1], h[2], nil)
  redis.call('DEL', j)
end
local items = redis.call('ZRANGEBYSCORE', K..':exp', '-inf', '('..ARGV[1], 'LIMIT', 0,
  tonumber(ARGV[2]))
for _, m in ipairs(items) do
  redis.call('ZREM', K..':exp', m)
  local kind, id = string.sub(m, 1, 1), string.sub(m, 3)
  if kind == 'j' then
    drop_job(id)
  elseif kind == 'f' then
    local f = K..':f:'..id
    local h = redis.call('HMGET', f, 'tenant', 'bytes')
    if h[1] then
      redis.call('HINCRBY', K..':u:'..h[1], 'b', -tonumber(h[2]))
      redis.call('ZREM', K..':ft:'..h[1], id)
      redis.call('DEL', f, K..':fc:'..id)
    end
  else
    local b = K..':b:'..id
    for _, jid in ipairs(redis.call('LRANGE', K..':bl:'..id, 0, -1)) do drop_job(jid) end
    local tenant = redis.call('HGET', b, 'tenant')
    if tenant then redis.call('ZREM', K..':bt:'..tenant, id) end
    redis.call('ZREM', K..':bexp', id)
    redis.call('DEL', b, K..':bl:'..id)
  end
end
return #items
",
    )
});

/// → creation time (unix seconds) of the oldest queued job, or nil.
pub static OLDEST: LazyLock<Script> = LazyLock::new(|| {
    script(
        r"
local r = redis.call('ZRANGE', K..':age', 0, 0, 'WITHSCORES')
if #r == 0 then return false end
return r[2]
",
    )
});

/// → the `:st` hash, flat (field, count, …).
pub static STATES: LazyLock<Script> =
    LazyLock::new(|| script("return redis.call('HGETALL', K..':st')"));
