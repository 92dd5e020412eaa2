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
WORK="$(mktemp -d -t fairgate-ab.XXXXXX)"
chmod 755 "$WORK"
PIDS=()
cleanup() {
    local p
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
    rm -rf "$WORK"
}
trap cleanup EXIT

port() { echo $((20000 + RANDOM % 12000)); }
wait_port() {
    local i
    for i in $(seq 1 100); do
        (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
        sleep 0.1
    done
    echo "nothing listens on $1" >&2
    return 1
}
# CPU ticks of pid $1 and its children (nginx's workers).
cpu_ticks() {
    local p t=0
    for p in "$1" $(pgrep -P "$1" || true); do
        t=$((t + $(awk '{ print $14 + $15 }' "/proc/$p/stat" 2>/dev/null || echo 0)))
    done
    echo "$t"
}
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

MOCK=$(port)
"${1%%:*}" mock-upstream --listen "127.0.0.1:$MOCK" >"$WORK/mock.log" 2>&1 &
PIDS+=($!)
wait_port "$MOCK"
NGINX=$(port)
sed -e "s#__USER__#$([ "$(id -u)" -eq 0 ] && echo 'user root;')#" -e "s#__WORK__#$WORK#g" \
    -e "s#__NGINX_PORT__#$NGINX#" -e "s#__MOCK_PORT__#$MOCK#" \
    "$ROOT/bench/nginx.conf.tmpl" >"$WORK/nginx.conf"
PORT=$(port)
{
    printf '[scheduler]\npolicy = "drr"\nquantum = 4096\n\n'
    printf '[[upstreams]]\nname = "mock"\nbase_url = "http://127.0.0.1:%s/v1"\n' "$MOCK"
    printf 'max_concurrency = 1024\nmodels = ["*"]\n'
    for i in $(seq 0 15); do
        printf '\n[[tenants]]\nid = "bench-%s"\napi_keys = ["fg-bench-%s"]\n' "$i" "$i"
    done
} >"$WORK/fairgate-rest.toml"

echo "| round | server | rps | p99 ms | CPU µs / request |"
echo "|---|---|---:|---:|---:|"
for round in $(seq 1 "$ROUNDS"); do
    "$(command -v nginx || echo /usr/sbin/nginx)" -p "$WORK" -c "$WORK/nginx.conf" >/dev/null 2>&1 &
    pid=$!
    wait_port "$NGINX"
    read -r rps p99 cpu < <(measure "$NGINX" "$pid")
    echo "| $round | nginx | $rps | $p99 | $cpu |"
    kill "$pid"; wait "$pid" 2>/dev/null || true
    for arg in "$@"; do
        bin="${arg%%:*}"
        {
            printf '[server]\nlisten = "127.0.0.1:%s"\n' "$PORT"
            [ "$bin" = "$arg" ] || printf 'workers = %s\n' "${arg##*:}"
            printf '\n'
            cat "$WORK/fairgate-rest.toml"
        } >"$WORK/fairgate.toml"
        "$bin" serve --config "$WORK/fairgate.toml" >"$WORK/fairgate.log" 2>&1 &
        pid=$!
        wait_port "$PORT"
        read -r rps p99 cpu < <(measure "$PORT" "$pid")
        echo "| $round | $arg | $rps | $p99 | $cpu |"
        kill "$pid"; wait "$pid" 2>/dev/null || true
    done
done
