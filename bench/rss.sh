#!/usr/bin/env bash
# Peak RSS against bytes offered (issue 13, point 3): one tenant sends N bodies of SIZE MiB at
# once, each a chat request whose bulk is a big unknown field, to a pool of 4 slots in front of
# the mock upstream (200 ms per answer). Prints fairgate's VmHWM (peak RSS) after the burst,
# the bytes offered, the answers by status, and the ratio peak RSS / bytes offered.
#
#   bench/rss.sh [BIN] [N] [SIZE_MIB] [TENANT_BUDGET_BYTES]
#
# BIN defaults to target/debug/fairgate (build it with `cargo build`); TENANT_BUDGET_BYTES
# defaults to fairgate's default (64 MiB); pass a large value (e.g. 17179869184) to see the
# memory per admitted body with the budget out of the way.
set -euo pipefail
BIN=${1:-target/debug/fairgate}
N=${2:-200}
SIZE=${3:-6}
BUDGET=${4:-67108864}
DIR=$(mktemp -d)
trap 'kill $MOCK $FG 2>/dev/null || true; rm -rf "$DIR"' EXIT

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
MPORT=$(port); FPORT=$(port)
"$BIN" mock-upstream --listen "127.0.0.1:$MPORT" --base-latency-ms 200 >/dev/null 2>&1 &
MOCK=$!
cat >"$DIR/config.toml" <<TOML
[server]
listen = "127.0.0.1:$FPORT"
max_body_bytes = $(( (SIZE + 1) * 1024 * 1024 ))
workers = 2
[scheduler]
max_queued_bytes = 17179869184
max_queued_bytes_per_tenant = $BUDGET
[[upstreams]]
name = "mock"
base_url = "http://127.0.0.1:$MPORT/v1"
max_concurrency = 4
[[tenants]]
id = "flood"
api_keys = ["fg-flood"]
TOML
"$BIN" serve --config "$DIR/config.toml" >"$DIR/log" 2>&1 &
FG=$!
for _ in $(seq 100); do
  curl -s "http://127.0.0.1:$FPORT/healthz" >/dev/null 2>&1 && break
  sleep 0.1
done
BASE=$(awk '/VmHWM/ {print $2}' /proc/$FG/status)
python3 - "$FPORT" "$N" "$SIZE" <<'PY'
import http.client, json, sys, threading, collections
port, n, size = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
body = ('{"model":"gpt-4o-mini","max_tokens":4,"messages":[{"role":"user","content":"hi"}],"blob":"'
        + "x" * (size << 20) + '"}').encode()
statuses = collections.Counter()
lock = threading.Lock()
def one():
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        c.request("POST", "/v1/chat/completions", body,
                  {"authorization": "Bearer fg-flood", "content-type": "application/json"})
        s = c.getresponse().status
    except Exception as e:
        s = type(e).__name__
    with lock:
        statuses[s] += 1
threads = [threading.Thread(target=one) for _ in range(n)]
for t in threads: t.start()
for t in threads: t.join()
print("answers:", dict(statuses))
PY
PEAK=$(awk '/VmHWM/ {print $2}' /proc/$FG/status)
OFFERED=$(( N * SIZE * 1024 ))
echo "bodies: $N x $SIZE MiB = $(( OFFERED / 1024 )) MiB offered; tenant budget $(( BUDGET / 1048576 )) MiB"
echo "VmHWM: idle $(( BASE / 1024 )) MiB, peak $(( PEAK / 1024 )) MiB"
python3 -c "print(f'peak RSS / bytes offered = {$PEAK / $OFFERED:.3f}; (peak - idle) / offered = {($PEAK - $BASE) / $OFFERED:.3f}')"
