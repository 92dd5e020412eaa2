#!/usr/bin/env bash
# Instructions fairgate executes per streamed chat request (issue 25, point 2), counted by
# valgrind's callgrind: repeatable on a shared, noisy host where CPU time is not. fairgate
# (under callgrind) in front of bench/rig.sh's static nginx upstream (not under it) and its SSE
# answers (`sse`: 200 content chunks with `"usage":null`, then the usage chunk; `sse-every`:
# usage on every chunk), asked for with a chat request without `stream_options` (fairgate asks
# for usage and strips it, as in the rig); WARM requests first, then the counters are zeroed
# and N requests are counted, on one keep-alive connection (curl).
#
#   bench/ir-sse.sh BIN [BIN...]     # prints "BIN ANSWER Ir/request" per binary and answer
#
# Environment: N=200 WARM=20 ANSWERS=sse,sse-every; KEEP=dir keeps each run's callgrind.out
# there (callgrind_annotate it: the profiling build has symbols). A BIN may be the ceiling
# (examples/ceiling.rs: it takes the same config). Needs valgrind, nginx and curl.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
N="${N:-200}"
WARM="${WARM:-20}"
ANSWERS="${ANSWERS:-sse,sse-every}"
BENCH_NAME=ir-sse
# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"

# N requests (same body) on one connection to port $1.
requests() {
    local port=$1 n=$2 urls=() i
    for i in $(seq 1 "$n"); do urls+=("http://127.0.0.1:$port/v1/chat/completions"); done
    curl -sf -o /dev/null -H 'Authorization: Bearer fg-bench-1' -H 'Content-Type: application/json' \
        --data-binary @"$WORK/body.json" "${urls[@]}"
}

main() {
    need_tools valgrind nginx curl
    write_answers
    printf '%s' '{"model":"gpt-4o-mini","max_tokens":256,"stream":true,"messages":[{"role":"system","content":"You are a terse benchmark assistant."},{"role":"user","content":"The quick brown fox jumps over the lazy dog."}]}' \
        >"$WORK/body.json"
    UP=$(free_port)
    render_nginx "$ROOT/bench/upstream.conf.tmpl" "$WORK/upstream.conf" "$UP" 0 "$WORK/root"
    start_nginx_conf "$WORK/upstream.conf" upstream "$UP"
    local bin answer port pid out ir
    for bin in "$@"; do
        for answer in ${ANSWERS//,/ }; do
            port=$(free_port)
            fairgate_config "$port" "http://127.0.0.1:$UP/$answer/v1" >"$WORK/fairgate.toml"
            out="$WORK/callgrind.$(basename "$bin").$answer.out"
            valgrind --tool=callgrind --callgrind-out-file="$out" \
                "$bin" serve --config "$WORK/fairgate.toml" >"$WORK/fairgate.log" 2>&1 &
            pid=$!
            PIDS+=("$pid")
            # Under valgrind, start-up takes a while (the tokenizer's ranks are loaded).
            for _ in $(seq 1 600); do
                (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
                sleep 0.2
            done
            requests "$port" "$WARM"
            callgrind_control -z "$pid" >/dev/null 2>&1
            requests "$port" "$N"
            callgrind_control -d "$pid" >/dev/null 2>&1
            stop_pid "$pid"
            # The dump after the zeroing: the N requests alone.
            ir=$(grep -h '^summary' "$out".1 | awk '{print $2}')
            echo "$bin $answer $((ir / N)) Ir/request"
            if [ -n "${KEEP:-}" ]; then mkdir -p "$KEEP" && cp "$out".1 "$KEEP/"; fi
        done
    done
}

main "$@"
