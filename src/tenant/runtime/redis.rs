//! The Redis backend of the runtime tenants (`[cluster]`): every replica reads and writes the
//! same records, and learns what the others changed by polling one change log.
//!
//! Keys under `{prefix}:rt` (one hash tag, one slot): `:v` (counter) the version; `:t` (hash)
//! tenant id → JSON record (tombstones kept); `:k` (hash) key id → JSON record (revoked ones
//! kept); `:tk:ID` (set) a tenant's key ids; `:log` (zset) `t:ID` / `k:ID` by the version of
//! the record's last write. Each write is one Lua script: it checks its precondition, bumps
//! the version and moves the record to that score in the log, atomically.
//!
//! How a change reaches every replica: each replica's sync (`server`, every `[cluster]
//! sync_interval_ms`, default 100 ms) runs [`CHANGES`], which answers the version alone when
//! nothing changed (one round trip) and otherwise the records written since the version it
//! last applied. So a revocation made on one replica is refused by every other within one
//! sync interval plus a round trip while Redis is reachable (measured in tests/e2e/cluster).
//! A replica that cannot reach Redis keeps serving what it last read, and applies everything
//! it missed at its first sync after (the log holds every record's latest write).

use std::sync::{Arc, LazyLock};

use redis::{Script, Value};

use super::record::{Change, KeyRecord, TenantRecord, Versioned};
use super::StoreError;
use crate::jobs::store::Redis;

/// Records read per sync round trip (a replica far behind catches up over a few).
const CHANGES_BATCH: usize = 1000;

/// KEYS[1] base; ARGV id, doc, create ('1'|'0') → version, or 'exists' / 'missing'.
static PUT_TENANT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local b = KEYS[1]
local old = redis.call('HGET', b .. ':t', ARGV[1])
local live = old and not cjson.decode(old).deleted
if ARGV[3] == '1' and live then return 'exists' end
if ARGV[3] == '0' and not live then return 'missing' end
local v = redis.call('INCR', b .. ':v')
redis.call('HSET', b .. ':t', ARGV[1], ARGV[2])
redis.call('ZADD', b .. ':log', v, 't:' .. ARGV[1])
return v
",
    )
});

/// KEYS[1] base; ARGV id, tombstone doc, at → version, or 'missing'. Revokes the keys.
static DELETE_TENANT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local b = KEYS[1]
local old = redis.call('HGET', b .. ':t', ARGV[1])
if not old or cjson.decode(old).deleted then return 'missing' end
local v = redis.call('INCR', b .. ':v')
redis.call('HSET', b .. ':t', ARGV[1], ARGV[2])
redis.call('ZADD', b .. ':log', v, 't:' .. ARGV[1])
for _, kid in ipairs(redis.call('SMEMBERS', b .. ':tk:' .. ARGV[1])) do
  local doc = redis.call('HGET', b .. ':k', kid)
  if doc then
    local k = cjson.decode(doc)
    if k.revoked_at == nil or k.revoked_at == cjson.null then
      k.revoked_at = tonumber(ARGV[3])
      v = redis.call('INCR', b .. ':v')
      redis.call('HSET', b .. ':k', kid, cjson.encode(k))
      redis.call('ZADD', b .. ':log', v, 'k:' .. kid)
    end
  end
end
return v
",
    )
});

/// KEYS[1] base; ARGV key id, doc, create ('1'|'0'), tenant → version, or 'exists' /
/// 'missing'. A revoked key is never written again.
static PUT_KEY: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local b = KEYS[1]
local t = redis.call('HGET', b .. ':t', ARGV[4])
if not t or cjson.decode(t).deleted then return 'missing' end
local old = redis.call('HGET', b .. ':k', ARGV[1])
if ARGV[3] == '1' then
  if old then return 'exists' end
else
  if not old then return 'missing' end
  local o = cjson.decode(old)
  if o.tenant ~= ARGV[4] or (o.revoked_at ~= nil and o.revoked_at ~= cjson.null) then
    return 'missing'
  end
end
local v = redis.call('INCR', b .. ':v')
redis.call('HSET', b .. ':k', ARGV[1], ARGV[2])
redis.call('SADD', b .. ':tk:' .. ARGV[4], ARGV[1])
redis.call('ZADD', b .. ':log', v, 'k:' .. ARGV[1])
return v
",
    )
});

/// KEYS[1] base; ARGV since, limit → {version} when nothing changed, else {version, kind,
/// score, doc, kind, score, doc, …} (at most `limit` records, oldest first).
pub static CHANGES: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local b = KEYS[1]
local ver = tonumber(redis.call('GET', b .. ':v') or '0')
if ver <= tonumber(ARGV[1]) then return {ver} end
local m = redis.call('ZRANGEBYSCORE', b .. ':log', '(' .. ARGV[1], '+inf', 'WITHSCORES',
  'LIMIT', 0, tonumber(ARGV[2]))
local out = {ver}
for i = 1, #m, 2 do
  local kind, id = string.sub(m[i], 1, 1), string.sub(m[i], 3)
  local doc = redis.call('HGET', b .. (kind == 't' and ':t' or ':k'), id)
  out[#out + 1] = kind
  out[#out + 1] = m[i + 1]
  out[#out + 1] = doc or ''
end
return out
",
    )
});

/// The Redis runtime store (cheap to clone).
#[derive(Debug, Clone)]
pub struct RedisStore {
    redis: Arc<dyn Redis>,
    base: String,
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Int(i) => Some(i.to_string()),
        _ => None,
    }
}

fn version(v: Value) -> Result<u64, StoreError> {
    match text(&v).as_deref() {
        Some("exists") => Err(StoreError::Exists),
        Some("missing") => Err(StoreError::Missing),
        Some(n) => n.parse().map_err(|_| StoreError::Redis),
        None => Err(StoreError::Redis),
    }
}

impl RedisStore {
    /// The store on `redis`, keys under `{prefix}:rt`.
    pub fn new(redis: Arc<dyn Redis>) -> Self {
        let base = redis.key(&["rt"]);
        Self { redis, base }
    }

    async fn call(&self, script: &Script, args: &[&str]) -> Result<Value, StoreError> {
        let mut inv = script.key(&self.base);
        for a in args {
            inv.arg(*a);
        }
        self.redis.eval(&inv).await.ok_or(StoreError::Redis)
    }

    /// See [`super::Store::put_tenant`].
    pub async fn put_tenant(&self, t: &TenantRecord, create: bool) -> Result<u64, StoreError> {
        let doc = serde_json::to_string(t).unwrap_or_default();
        let flag = if create { "1" } else { "0" };
        version(self.call(&PUT_TENANT, &[&t.id, &doc, flag]).await?)
    }

    /// See [`super::Store::delete_tenant`].
    pub async fn delete_tenant(&self, id: &str, at: u64) -> Result<u64, StoreError> {
        let tombstone = TenantRecord {
            id: id.to_owned(),
            spec: serde_json::Map::new(),
            created_at: at,
            updated_at: at,
            deleted: true,
        };
        let doc = serde_json::to_string(&tombstone).unwrap_or_default();
        version(
            self.call(&DELETE_TENANT, &[id, &doc, &at.to_string()])
                .await?,
        )
    }

    /// See [`super::Store::put_key`].
    pub async fn put_key(&self, k: &KeyRecord, create: bool) -> Result<u64, StoreError> {
        let doc = serde_json::to_string(k).unwrap_or_default();
        let flag = if create { "1" } else { "0" };
        version(self.call(&PUT_KEY, &[&k.id, &doc, flag, &k.tenant]).await?)
    }

    /// See [`super::Store::changes`].
    pub async fn changes(&self, since: u64) -> Result<(u64, Vec<Versioned>, bool), StoreError> {
        let limit = CHANGES_BATCH.to_string();
        let Value::Array(items) = self.call(&CHANGES, &[&since.to_string(), &limit]).await? else {
            return Err(StoreError::Redis);
        };
        let mut it = items.into_iter();
        let head = it
            .next()
            .and_then(|v| text(&v))
            .and_then(|v| v.parse().ok());
        let mut latest: u64 = head.ok_or(StoreError::Redis)?;
        let rest: Vec<Value> = it.collect();
        let mut out = Vec::with_capacity(rest.len() / 3);
        let mut last = since;
        for rec in rest.chunks(3) {
            let [kind, score, doc] = rec else { break };
            let Some(v) = text(score).and_then(|s| s.parse::<f64>().ok()) else {
                continue;
            };
            last = last.max(v as u64);
            let (Some(kind), Some(doc)) = (text(kind), text(doc)) else {
                continue;
            };
            let change = match kind.as_str() {
                "t" => serde_json::from_str(&doc).ok().map(Change::Tenant),
                _ => serde_json::from_str(&doc).ok().map(Change::Key),
            };
            if let Some(c) = change {
                out.push((v as u64, c));
            }
        }
        // A full batch: continue after its last record next time, not after the head.
        let more = rest.len() / 3 >= CHANGES_BATCH;
        if more {
            latest = last;
        }
        Ok((latest, out, more))
    }
}
