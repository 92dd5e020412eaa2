#!/usr/bin/env bash
# Observability at 10,000 tenants (issue 16, point 5): generates a config of N tenants (half on a
# plan, half without), sends one request per tenant against the bundled mock, then scrapes
# /metrics (lines, bytes, time of each of 5 scrapes), reads /admin/state?top=50 (bytes, time)
# and fairgate's VmRSS before and after the load (right after it, split into anonymous and
# file-backed pages, and 2 s later, once freed pages are handed back), after the scrapes and
# after the reads.
#
#   bench/tenants10k.sh [BIN] [N] [EXTRA_METRICS_TOML]
#
# BIN defaults to target/profiling/fairgate (build it with `cargo build --profile profiling`; a debug build's
# timings mean nothing). EXTRA_METRICS_TOML is appended under [metrics], e.g.
# 'histograms = "tenant"' to see what per-tenant histograms cost.
set -euo pipefail
BIN=${1:-target/profiling/fairgate}
N=${2:-10000}
EXTRA=${3:-}
DIR=$(mktemp -d)
trap 'kill $MOCK $FG 2>/dev/null || true; rm -rf "$DIR"' EXIT

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
MPORT=$(port); FPORT=$(port)
"$BIN" mock-upstream --listen "127.0.0.1:$MPORT" >/dev/null 2>&1 &
MOCK=$!
{
  printf '[server]\nlisten = "127.0.0.1:%s"\n' "$FPORT"
  printf '[admin]\ntoken_env = "BENCH_ADMIN_TOKEN"\n'
  printf '[metrics]\n%s\n' "$EXTRA"
  printf '[plans.gold]\nweight = 2.0\n'
  printf '[[upstreams]]\nname = "mock"\nbase_url = "http://127.0.0.1:%s/v1"\nmax_concurrency = 64\n' "$MPORT"
  for i in $(seq 0 $((N - 1))); do
    printf '[[tenants]]\nid = "t%05d"\napi_keys = ["key-%05d"]\n' "$i" "$i"
    [ $((i % 2)) -eq 0 ] && printf 'plan = "gold"\n'
  done
} >"$DIR/config.toml"
BENCH_ADMIN_TOKEN=bench "$BIN" serve --config "$DIR/config.toml" >"$DIR/log" 2>&1 &
FG=$!
for _ in $(seq 200); do
  curl -s "http://127.0.0.1:$FPORT/healthz" >/dev/null 2>&1 && break
  sleep 0.1
done
rss() { awk '/VmRSS/ {print int($2 / 1024)}' /proc/$FG/status; }
# Of VmRSS, anonymous memory (the heap) and file-backed pages (the binary's code and data, which
# the kernel reclaims first), MiB.
split() { awk '/RssAnon/ {a = int($2 / 1024)} /RssFile/ {f = int($2 / 1024)} END {printf "anon %d, file %d", a, f}' /proc/$FG/status; }
BEFORE=$(rss)
python3 - "$FPORT" "$N" <<'PY'
import http.client, sys, threading, collections
port, n = int(sys.argv[1]), int(sys.argv[2])
body = b'{"model":"gpt-4o-mini","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}'
statuses, lock, nxt = collections.Counter(), threading.Lock(), iter(range(n))
def worker():
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    while True:
        with lock:
            i = next(nxt, None)
        if i is None:
            return
        c.request("POST", "/v1/chat/completions", body,
                  {"authorization": f"Bearer key-{i:05d}", "content-type": "application/json"})
        r = c.getresponse(); r.read()
        with lock:
            statuses[r.status] += 1
ts = [threading.Thread(target=worker) for _ in range(16)]
for t in ts: t.start()
for t in ts: t.join()
print("answers:", dict(statuses))
PY
AFTER=$(rss)
AFTER_SPLIT=$(split)
# Settled: memory.rs hands freed pages back once a second.
sleep 2
SETTLED=$(rss)
for _ in $(seq "${SCRAPES:-5}"); do
  curl -s -o "$DIR/metrics" -w 'scrape /metrics: %{time_total} s, %{size_download} bytes\n' \
    "http://127.0.0.1:$FPORT/metrics"
done
SCRAPED=$(rss)
echo "/metrics lines: $(wc -l <"$DIR/metrics") (of which fairgate_*_bucket: $(grep -c '_bucket{' "$DIR/metrics" || true))"
for _ in 1 2 3; do
  curl -s -o "$DIR/state" -H 'authorization: Bearer bench' \
    -w 'read /admin/state?top=50: %{time_total} s, %{size_download} bytes\n' \
    "http://127.0.0.1:$FPORT/admin/state?top=50&timeline=1"
done
curl -s -o /dev/null -H 'authorization: Bearer bench' \
  -w 'read /admin/state?top=50&q=t0999: %{time_total} s, %{size_download} bytes\n' \
  "http://127.0.0.1:$FPORT/admin/state?top=50&q=t0999"
READ=$(rss)
sleep 3
echo "tenants: $N; VmRSS before the load $BEFORE MiB; right after the load $AFTER MiB ($AFTER_SPLIT); 2 s later $SETTLED MiB; after ${SCRAPES:-5} scrapes $SCRAPED MiB; after the /admin/state reads $READ MiB; 3 s later $(rss) MiB"
