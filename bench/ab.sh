#!/usr/bin/env bash
# A/B of fairgate builds against nginx on the overhead rig: starts the mock upstream (from the
# first binary), then for each round runs wrk against nginx and against every given fairgate
# binary in turn (one at a time, same port, same config as bench/overhead.sh), printing rps,
# p99 and the CPU each server used per request (utime + stime from /proc, all its processes).
# Alternating builds within one run is the only comparison that survives this shared host,
# whose speed drifts by 2x across hours.
#
#   bench/ab.sh target/profiling/fairgate /tmp/fairgate-old     # ROUNDS=2 DURATION=5s
#   bench/ab.sh target/profiling/fairgate:1 target/profiling/fairgate:2   # BIN:N sets [server] workers
#   bench/ab.sh target/profiling/fairgate target/profiling/examples/ceiling  # vs the hyper-only ceiling
#
# The first binary must be a fairgate build (it also runs the mock upstream); later ones may be
# anything that takes `serve --config FILE`, such as `examples/ceiling.rs`
# (`cargo build --profile profiling --example ceiling`).
#
# Needs wrk and nginx (bench/overhead.sh installs them). Everything binds 127.0.0.1 and is
# stopped on exit.
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 FAIRGATE_BIN [FAIRGATE_BIN ...]" >&2; exit 2; }
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
ROUNDS="${ROUNDS:-2}" DURATION="${DURATION:-5s}"
LUA="$ROOT/bench/chat.lua"
BENCH_NAME=ab
# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"

# wrk against port $1 while measuring the CPU of pid $2; prints "rps p99 cpu_us".
measure() {
    local url="http://127.0.0.1:$1/v1/chat/completions" c0 c1 out req
    wrk -t2 -c64 -d1s -s "$LUA" "$url" >/dev/null
    c0="$(cpu_ticks "$2")"
    out="$(wrk -t2 -c64 -d"$DURATION" --latency -s "$LUA" "$url" | grep '^FG_RESULT')"
    c1="$(cpu_ticks "$2")"
    req="$(sed 's/.*requests=\([0-9]*\).*/\1/' <<<"$out")"
    printf '%s %s %d\n' "$(sed 's/.*rps=\([0-9.]*\).*/\1/' <<<"$out")" \
        "$(sed 's/.*p99_ms=\([0-9.]*\).*/\1/' <<<"$out")" \
        $(((c1 - c0) * 1000000 / $(getconf CLK_TCK) / req))
}

MOCK=$(free_port)
"${1%%:*}" mock-upstream --listen "127.0.0.1:$MOCK" >"$WORK/mock.log" 2>&1 &
PIDS+=($!)
wait_port "$MOCK" "mock upstream"
NGINX=$(free_port)
render_nginx "$ROOT/bench/nginx.conf.tmpl" "$WORK/nginx.conf" "$NGINX" "$MOCK"
PORT=$(free_port)

echo "| round | server | rps | p99 ms | CPU µs / request |"
echo "|---|---|---:|---:|---:|"
for round in $(seq 1 "$ROUNDS"); do
    start_nginx_conf "$WORK/nginx.conf" nginx "$NGINX"
    pid=${PIDS[-1]}
    read -r rps p99 cpu < <(measure "$NGINX" "$pid")
    echo "| $round | nginx | $rps | $p99 | $cpu |"
    stop_pid "$pid"
    for arg in "$@"; do
        bin="${arg%%:*}"
        fairgate_config "$PORT" "http://127.0.0.1:$MOCK/v1" >"$WORK/fairgate.toml"
        [ "$bin" = "$arg" ] || sed -i "2a workers = ${arg##*:}" "$WORK/fairgate.toml"
        "$bin" serve --config "$WORK/fairgate.toml" >"$WORK/fairgate.log" 2>&1 &
        PIDS+=($!)
        pid=$!
        wait_port "$PORT" "$arg"
        read -r rps p99 cpu < <(measure "$PORT" "$pid")
        echo "| $round | $arg | $rps | $p99 | $cpu |"
        stop_pid "$pid"
    done
done
