#!/usr/bin/env bash
# Memory of a queued request, connection included (issue 25, point 4): N small chat requests,
# each on its own connection, from T tenants, queued behind one slot that a first request holds
# (the mock upstream answers after 10 minutes). Prints fairgate's VmRSS with only that first
# request in flight and after all N are queued, and the difference per queued request.
#
#   bench/queued.sh [BIN] [N] [T]
#
# BIN defaults to target/profiling/fairgate (`cargo build --profile profiling`); N to 10000, T to
# 100. The client (Python asyncio) and fairgate each hold N sockets: the script raises `ulimit -n`
# (to at most the hard limit).
set -euo pipefail
BIN=${1:-target/profiling/fairgate}
N=${2:-10000}
T=${3:-100}
DIR=$(mktemp -d)
MOCK= FG=
trap 'kill $MOCK $FG 2>/dev/null || true; rm -rf "$DIR"' EXIT
WANT=$((N + 1000)); HARD=$(ulimit -Hn)
[ "$HARD" != unlimited ] && [ "$HARD" -lt "$WANT" ] && WANT=$HARD
ulimit -n "$WANT"

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
MPORT=$(port); FPORT=$(port)
"$BIN" mock-upstream --listen "127.0.0.1:$MPORT" --base-latency-ms 600000 >/dev/null 2>&1 &
MOCK=$!
{
  printf '[server]\nlisten = "127.0.0.1:%s"\nworkers = 2\n' "$FPORT"
  printf 'max_connections = %s\nmax_connections_per_ip = %s\n' $((N + 100)) $((N + 100))
  printf '[scheduler]\nmax_queued = %s\nmax_queued_per_tenant = %s\n' $((N + 10)) "$N"
  printf '[metrics]\ntop_tenants = %s\n' $((T + 1))
  printf '[[upstreams]]\nname = "mock"\nbase_url = "http://127.0.0.1:%s/v1"\n' "$MPORT"
  printf 'max_concurrency = 1\nfirst_byte_timeout_ms = 900000\n'
  for i in $(seq 0 $((T - 1))); do
    printf '[[tenants]]\nid = "t%03d"\napi_keys = ["key-%03d"]\n' "$i" "$i"
  done
} >"$DIR/config.toml"
"$BIN" serve --config "$DIR/config.toml" >"$DIR/log" 2>&1 &
FG=$!
for _ in $(seq 200); do
  curl -s "http://127.0.0.1:$FPORT/healthz" >/dev/null 2>&1 && break
  sleep 0.1
done
rss() { awk '/VmRSS/ {print $2}' /proc/$FG/status; }
python3 - "$FPORT" "$N" "$T" "$FG" <<'PY'
import asyncio, re, sys, time, urllib.request
port, n, t, pid = (int(a) for a in sys.argv[1:5])
body = b'{"model":"gpt-4o-mini","max_tokens":16,"messages":[{"role":"user","content":"Say hello to the queue, please."}]}'

def rss():
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1))

def queued():
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
    q = sum(float(v) for v in re.findall(r'^fairgate_queue_depth\{[^}]*\} (\S+)$', text, re.M))
    f = sum(float(v) for v in re.findall(r'^fairgate_inflight\{[^}]*\} (\S+)$', text, re.M))
    return int(q), int(f)

def request(i):
    return (f"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n"
            f"authorization: Bearer key-{i % t:03d}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n\r\n").encode() + body

async def wait_for(cond, what, secs=120):
    end = time.time() + secs
    while time.time() < end:
        got = queued()
        if cond(got):
            return got
        await asyncio.sleep(0.5)
    sys.exit(f"timed out waiting for {what}: {got}")

async def main():
    held = []
    async def one(i):
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(request(i)); await w.drain()
        held.append((r, w))
    await one(0)  # takes the one slot and keeps it
    await wait_for(lambda g: g[1] == 1, "the first request in flight")
    await asyncio.sleep(2.5)  # memory.rs collects once a second
    before = rss()
    for start in range(1, n + 1, 500):
        await asyncio.gather(*(one(i) for i in range(start, min(start + 500, n + 1))))
    got = await wait_for(lambda g: g[0] >= n, f"{n} queued")
    await asyncio.sleep(2.5)
    after = rss()
    print(f"queued {got[0]}, in flight {got[1]}, connections held {len(held)}")
    print(f"VmRSS: one in flight {before // 1024} MiB; {n} queued {after // 1024} MiB; "
          f"per queued request {(after - before) / n:.1f} KiB")

asyncio.run(main())
PY
