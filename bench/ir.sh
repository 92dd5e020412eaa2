#!/usr/bin/env bash
# Instructions fairgate executes per JSON chat request (issue 25, point 3), counted by
# valgrind's callgrind: repeatable on a shared, noisy host where CPU time is not. fairgate
# (under callgrind) in front of the bundled mock (not under it), rig.sh's JSON request (a
# 1.2 KB chat body, 16 tenants, drr, the request log line on); WARM requests first, then the
# counters are zeroed and N requests are counted on C keep-alive connections.
#
#   bench/ir.sh BIN [BIN...]        # prints "BIN Ir/request" per binary, in the order given
#
# Environment: N=2000 WARM=300 C=4 ROUNDS=1; MOCK_BIN (default: each BIN) runs the mock, for
# a BIN without `mock-upstream` (the ceiling, examples/ceiling.rs); (ROUNDS > 1 alternates the binaries that many
# times); KEEP=dir keeps each run's callgrind.out there (callgrind_annotate it: the profiling
# build has symbols). Needs valgrind (apt-get install -y valgrind).
set -euo pipefail
N=${N:-2000}
WARM=${WARM:-300}
C=${C:-4}
ROUNDS=${ROUNDS:-1}
DIR=$(mktemp -d)
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; [ -n "${KEEP_DIR:-}" ] || rm -rf "$DIR"' EXIT

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

run() {
    local bin=$1 tag=$2 mport fport out mock fg i
    mport=$(port); fport=$(port)
    "${MOCK_BIN:-$bin}" mock-upstream --listen "127.0.0.1:$mport" >/dev/null 2>&1 &
    mock=$!; PIDS+=("$mock")
    {
        printf '[server]\nlisten = "127.0.0.1:%s"\n\n' "$fport"
        printf '[scheduler]\npolicy = "drr"\nquantum = 4096\n\n'
        printf '[[upstreams]]\nname = "mock"\nbase_url = "http://127.0.0.1:%s/v1"\n' "$mport"
        printf 'max_concurrency = 1024\nmodels = ["*"]\n'
        for i in $(seq 0 15); do
            printf '\n[[tenants]]\nid = "bench-%s"\napi_keys = ["fg-bench-%s"]\n' "$i" "$i"
        done
    } >"$DIR/config.toml"
    out="$DIR/callgrind.$tag.out"
    valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$out" "$bin" serve --config "$DIR/config.toml" \
        >"$DIR/fg.$tag.log" 2>"$DIR/valgrind.$tag.log" &
    fg=$!; PIDS+=("$fg")
    for _ in $(seq 1200); do
        curl -s "http://127.0.0.1:$fport/healthz" >/dev/null 2>&1 && break
        sleep 0.25
    done
    python3 - "$fport" "$WARM" "$C" <<'PY'
import http.client, sys, threading
port, n, c = (int(a) for a in sys.argv[1:4])
filler = "The quick brown fox jumps over the lazy dog. " * 24
body = ('{"model":"gpt-4o-mini","max_tokens":256,"stream":false,"messages":['
        '{"role":"system","content":"You are a terse benchmark assistant."},'
        '{"role":"user","content":"' + filler + '"}]}').encode()
bad = []
def worker(k):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    for i in range(k, n, c):
        conn.request("POST", "/v1/chat/completions", body,
                     {"authorization": f"Bearer fg-bench-{i % 16}", "content-type": "application/json"})
        r = conn.getresponse(); r.read()
        if r.status != 200:
            bad.append(r.status)
ts = [threading.Thread(target=worker, args=(k,)) for k in range(c)]
for t in ts: t.start()
for t in ts: t.join()
if bad:
    sys.exit(f"non-200 answers: {bad[:5]} ({len(bad)})")
PY
    callgrind_control -i on "$fg" >/dev/null
    python3 - "$fport" "$N" "$C" <<'PY'
import http.client, sys, threading
port, n, c = (int(a) for a in sys.argv[1:4])
filler = "The quick brown fox jumps over the lazy dog. " * 24
body = ('{"model":"gpt-4o-mini","max_tokens":256,"stream":false,"messages":['
        '{"role":"system","content":"You are a terse benchmark assistant."},'
        '{"role":"user","content":"' + filler + '"}]}').encode()
bad = []
def worker(k):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    for i in range(k, n, c):
        conn.request("POST", "/v1/chat/completions", body,
                     {"authorization": f"Bearer fg-bench-{i % 16}", "content-type": "application/json"})
        r = conn.getresponse(); r.read()
        if r.status != 200:
            bad.append(r.status)
ts = [threading.Thread(target=worker, args=(k,)) for k in range(c)]
for t in ts: t.start()
for t in ts: t.join()
if bad:
    sys.exit(f"non-200 answers: {bad[:5]} ({len(bad)})")
PY
    callgrind_control -d "$fg" >/dev/null
    kill "$fg" "$mock" 2>/dev/null || true
    wait "$fg" 2>/dev/null || true
    local ir dump
    # The dump made after zeroing (the counted requests only): part 1.
    dump="$out.1"
    ir=$(awk '/^(summary|totals):/ {print $2; exit}' "$dump")
    echo "$bin $((ir / N)) Ir/request (round $tag)"
    if [ -n "${KEEP:-}" ]; then
        mkdir -p "$KEEP"
        cp "$dump" "$KEEP/$(basename "$bin").$tag.callgrind.out"
    fi
}

for round in $(seq 1 "$ROUNDS"); do
    i=0
    for bin in "$@"; do
        i=$((i + 1))
        run "$bin" "$round-$i"
    done
done
