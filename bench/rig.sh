#!/usr/bin/env bash
# The benchmark rig of what users see (issue 25): fairgate against nginx as a plain reverse
# proxy and against the hyper-only ceiling (examples/ceiling.rs), all in the same run, in front
# of one static upstream (nginx serving fixed answers: bench/upstream.conf.tmpl), so the
# provider costs the same in every row. One command:
#
#   bench/rig.sh                      # builds (profiling profile), runs every row, prints tables
#   SKIP_BUILD=1 ANSWERS=sse BODIES=identical ROUNDS=3 bench/rig.sh
#
# Answers (ANSWERS, comma-separated):
#   json       a 1.2 KB chat request, a ~300 B JSON answer with usage
#   sse        a chat stream of 200 content chunks then a usage chunk (~40 KB; OpenAI's shape
#              when usage is asked for: `"usage":null` on every chunk), asked for without
#              stream_options (the SDKs' default), so fairgate asks for usage and strips it
#   sse-every  200 chunks each carrying usage (providers with continuous usage stats)
# Request bodies (BODIES; fairgate only, the other two do not read them; bench/rig.lua):
#   identical  one body;  unique  a new body every request (the token-count cache never hits);
#   prefix     agent-shaped: a ~6 KB conversation shared by all, a new last message each time
#
# Per answer: nginx and the ceiling with identical bodies, then fairgate with each body kind;
# with ROUNDS > 1 the whole set alternates that many times (servers kept up) and the tables give
# every round and the median ratios. CPU µs per request is each server's utime + stime from /proc.
#
# Environment: THREADS=1 CONNS=32 DURATION=5s WARMUP=1s ROUNDS=1; SKIP_BUILD=1 reuses the
# binaries; FAIRGATE_BIN, CEILING_BIN override them (default: $CARGO_TARGET_DIR or target/,
# profiling/fairgate and profiling/examples/ceiling); BASELINE_BIN=path adds rows for another
# fairgate build (e.g. main's) in the same run, named `base:<bodies>`. Needs wrk and nginx (installed with
# apt-get when run as root). Binds 127.0.0.1 only; everything started is stopped on exit.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
THREADS="${THREADS:-1}"
CONNS="${CONNS:-32}"
DURATION="${DURATION:-5s}"
WARMUP="${WARMUP:-1s}"
ROUNDS="${ROUNDS:-1}"
ANSWERS="${ANSWERS:-json,sse,sse-every}"
BODIES="${BODIES:-identical,unique,prefix}"
TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
BIN="${FAIRGATE_BIN:-$TARGET_DIR/profiling/fairgate}"
CEILING_BIN="${CEILING_BIN:-$TARGET_DIR/profiling/examples/ceiling}"
LUA="$ROOT/bench/rig.lua"
BENCH_NAME=rig
# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"

# wrk against URL $2 with bodies $3, stream $4, measuring the CPU of pid $5; prints
# "name rps p50 p99 cpu_us errors".
measure() {
    local name=$1 url=$2 bodies=$3 stream=$4 pid=$5 c0 c1 out req
    if [ "$WARMUP" != "0" ]; then
        wrk -t"$THREADS" -c"$CONNS" -d"$WARMUP" -s "$LUA" "$url" -- "$bodies" "$stream" >/dev/null
    fi
    c0="$(cpu_ticks "$pid")"
    out="$(wrk -t"$THREADS" -c"$CONNS" -d"$DURATION" --latency -s "$LUA" "$url" -- "$bodies" "$stream" \
        | tee -a "$WORK/wrk.txt" | grep '^FG_RESULT')"
    c1="$(cpu_ticks "$pid")"
    req="$(field "$out" requests)"
    [ "${req:-0}" -gt 0 ] || { log "$name: no requests"; req=1; }
    printf '%s %s %s %s %d %d\n' "$name" "$(field "$out" rps)" "$(field "$out" p50_ms)" \
        "$(field "$out" p99_ms)" $(((c1 - c0) * 1000000 / $(getconf CLK_TCK) / req)) \
        $(($(field "$out" non2xx) + $(field "$out" socket_errors)))
}

main() {
    need_tools wrk nginx
    if [ "${SKIP_BUILD:-0}" != "1" ]; then
        log "cargo build --profile profiling --bin fairgate --example ceiling"
        (cd "$ROOT" && cargo build --profile profiling --locked --bin fairgate --example ceiling)
    fi
    [ -x "$BIN" ] || { log "missing $BIN"; exit 1; }
    [ -x "$CEILING_BIN" ] || { log "missing $CEILING_BIN"; exit 1; }
    write_answers
    UP=$(free_port)
    render_nginx "$ROOT/bench/upstream.conf.tmpl" "$WORK/upstream.conf" "$UP" 0 "$WORK/root"
    start_nginx_conf "$WORK/upstream.conf" upstream "$UP"
    NGINX=$(free_port)
    render_nginx "$ROOT/bench/nginx.conf.tmpl" "$WORK/nginx.conf" "$NGINX" "$UP"
    start_nginx_conf "$WORK/nginx.conf" nginx "$NGINX"
    local nginx_pid=${PIDS[-1]}
    local answer bodies round stream results=()
    for answer in ${ANSWERS//,/ }; do
        stream=false
        [ "$answer" = json ] || stream=true
        local fg_port ceil_port fg_pid ceil_pid base_port base_pid=""
        fg_port=$(free_port)
        fairgate_config "$fg_port" "http://127.0.0.1:$UP/$answer/v1" >"$WORK/fairgate-$answer.toml"
        "$BIN" serve --config "$WORK/fairgate-$answer.toml" >"$WORK/fairgate-$answer.log" 2>&1 &
        PIDS+=($!)
        fg_pid=$!
        wait_port "$fg_port" fairgate
        if [ -n "${BASELINE_BIN:-}" ]; then
            base_port=$(free_port)
            fairgate_config "$base_port" "http://127.0.0.1:$UP/$answer/v1" >"$WORK/base-$answer.toml"
            "$BASELINE_BIN" serve --config "$WORK/base-$answer.toml" >"$WORK/base-$answer.log" 2>&1 &
            PIDS+=($!)
            base_pid=$!
            wait_port "$base_port" baseline
        fi
        ceil_port=$(free_port)
        fairgate_config "$ceil_port" "http://127.0.0.1:$UP/$answer/v1" >"$WORK/ceiling-$answer.toml"
        "$CEILING_BIN" serve --config "$WORK/ceiling-$answer.toml" >"$WORK/ceiling-$answer.log" 2>&1 &
        PIDS+=($!)
        ceil_pid=$!
        wait_port "$ceil_port" ceiling
        for round in $(seq 1 "$ROUNDS"); do
            local n c
            n="$(measure nginx "http://127.0.0.1:$NGINX/$answer/v1/chat/completions" identical "$stream" "$nginx_pid")"
            c="$(measure ceiling "http://127.0.0.1:$ceil_port/v1/chat/completions" identical "$stream" "$ceil_pid")"
            results+=("$answer $round $n" "$answer $round $c")
            log "$answer round $round: $n | $c"
            for bodies in ${BODIES//,/ }; do
                local f
                f="$(measure "fairgate:$bodies" "http://127.0.0.1:$fg_port/v1/chat/completions" "$bodies" "$stream" "$fg_pid")"
                results+=("$answer $round $f")
                log "$answer round $round: $f"
                if [ -n "$base_pid" ]; then
                    f="$(measure "base:$bodies" "http://127.0.0.1:$base_port/v1/chat/completions" "$bodies" "$stream" "$base_pid")"
                    results+=("$answer $round $f")
                    log "$answer round $round: $f"
                fi
            done
        done
        [ -z "$base_pid" ] || stop_pid "$base_pid"
        stop_pid "$fg_pid"
        stop_pid "$ceil_pid"
    done

    echo
    echo "wrk -t$THREADS -c$CONNS -d$DURATION --latency (bench/rig.lua), $ROUNDS round(s)," \
        "$(nproc) cores: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')," \
        "fairgate $(cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null || echo '?')"
    echo
    echo "| answer | round | server | rps | p50 ms | p99 ms | CPU µs / req | errors | ÷ nginx rps | ÷ ceiling rps | p99 ÷ nginx |"
    echo "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"
    printf '%s\n' "${results[@]}" | awk '
        { key = $1 " " $2 }
        $3 == "nginx" { nr[key] = $4; np[key] = $6 }
        $3 == "ceiling" { cr[key] = $4 }
        { line[NR] = $0; k[NR] = key }
        END {
            for (i = 1; i <= NR; i++) {
                split(line[i], f, " ")
                printf "| %s | %s | %s | %.0f | %.2f | %.2f | %d | %d | %.2f | %.2f | %.2f |\n",
                    f[1], f[2], f[3], f[4], f[5], f[6], f[7], f[8],
                    f[4] / nr[k[i]], f[4] / cr[k[i]], f[6] / np[k[i]]
            }
        }'
    if [ "$ROUNDS" -gt 1 ]; then
        echo
        echo "Medians over $ROUNDS rounds:"
        echo
        echo "| answer | server | ÷ nginx rps | ÷ ceiling rps | p99 ÷ nginx |"
        echo "|---|---|---:|---:|---:|"
        printf '%s\n' "${results[@]}" | awk '
            { key = $1 " " $2 }
            $3 == "nginx" { nr[key] = $4; np[key] = $6 }
            $3 == "ceiling" { cr[key] = $4 }
            { line[NR] = $0; k[NR] = key }
            END {
                for (i = 1; i <= NR; i++) {
                    split(line[i], f, " ")
                    print f[1] "|" f[3] "|" f[4] / nr[k[i]] "|" f[4] / cr[k[i]] "|" f[6] / np[k[i]]
                }
            }' | sort -t'|' -k1,2 -s | awk -F'|' '
            function med(s,   a, n, i, j, t) {
                n = split(s, a, " ")
                for (i = 2; i <= n; i++) {
                    t = a[i] + 0; j = i - 1
                    while (j >= 1 && a[j] + 0 > t) { a[j + 1] = a[j]; j-- }
                    a[j + 1] = t
                }
                return a[int((n + 1) / 2)]
            }
            { g = $1 "|" $2; if (!(g in seen)) { order[++m] = g; seen[g] = 1 }
              a[g] = a[g] " " $3; b[g] = b[g] " " $4; c[g] = c[g] " " $5 }
            END { for (i = 1; i <= m; i++) { split(order[i], h, "|")
                  printf "| %s | %s | %.2f | %.2f | %.2f |\n", h[1], h[2], med(a[order[i]]), med(b[order[i]]), med(c[order[i]]) } }'
    fi
}

main "$@"
