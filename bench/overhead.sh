#!/usr/bin/env bash
# Proxy-overhead benchmark: how much does fairgate cost compared with nginx as a plain reverse
# proxy, both in front of the same zero-latency mock upstream?
#
# Runs wrk (bench/chat.lua: ~1.2 KB chat body, 16 rotating tenant keys) up to four ways, one after
# the other: direct to the mock, through nginx, through fairgate (16 tenants, policy drr, pool of
# 1024 so the queue never limits), and through a fairgate cluster (`cluster`: one
# `redis-server --save '' --appendonly no` on a free port and three `fairgate serve` replicas with
# `[cluster] redis_url`, same config otherwise). Prints a markdown table and the fairgate/nginx and
# cluster/fairgate ratios. Everything binds 127.0.0.1 and everything started here is stopped on
# exit.
#
# `ceiling` adds a row for `examples/ceiling.rs`: fairgate's transport (per-core runtimes, the
# same hyper-util server and client) forwarding and nothing else, on the fairgate config — the
# best any proxy built from these pieces does on this rig, so fairgate's own cost is the gap
# between its row and this one.
#
# Cluster load: wrk keeps each connection on the one address it was given, so a Lua script cannot
# rotate replicas per request; instead three wrk processes run at once, one per replica, each with
# a third of THREADS (at least 1) and of CONNS (rounded down). The row's rps is their sum; its
# latency percentiles are the worst of the three (an upper bound of the merged distribution's),
# errors are summed.
#
# Environment knobs:
#   TARGETS=direct,nginx,fairgate   which rows to run (add ceiling and/or cluster, e.g.
#                                   TARGETS=nginx,fairgate,ceiling)
#   THREADS=2 CONNS=64 DURATION=10s wrk settings   WARMUP=2s  (0 to skip)
#   ROUNDS=1                        with nginx and fairgate both run: repeat their two rows
#                                   alternately this many times (servers kept up) and print
#                                   every round's ratios and their median (noisy shared hosts)
#   SKIP_BUILD=1                    reuse target/profiling/fairgate as is
#   FAIRGATE_BIN=path               use another fairgate binary (implies nothing about SKIP_BUILD)
#   CEILING_BIN=path                likewise for the ceiling (default target/profiling/examples/ceiling)
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
TARGETS="${TARGETS:-direct,nginx,fairgate}"
THREADS="${THREADS:-2}"
CONNS="${CONNS:-64}"
DURATION="${DURATION:-10s}"
WARMUP="${WARMUP:-2s}"
BIN="${FAIRGATE_BIN:-$ROOT/target/profiling/fairgate}"
CEILING_BIN="${CEILING_BIN:-$ROOT/target/profiling/examples/ceiling}"
LUA="$ROOT/bench/chat.lua"

BENCH_NAME=overhead
# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"

want() { [[ ",$TARGETS," == *",$1,"* ]]; }

start_mock() {
    MOCK_PORT="$(free_port)"
    "$BIN" mock-upstream --listen "127.0.0.1:$MOCK_PORT" >"$WORK/mock.log" 2>&1 &
    PIDS+=($!)
    wait_port "$MOCK_PORT" "mock upstream"
}

start_nginx() {
    NGINX_PORT="$(free_port)"
    render_nginx "$ROOT/bench/nginx.conf.tmpl" "$WORK/nginx.conf" "$NGINX_PORT" "$MOCK_PORT"
    start_nginx_conf "$WORK/nginx.conf" nginx "$NGINX_PORT"
}

# The single-process config (the cluster replicas reuse all but its [server] block).
write_fairgate_config() {
    fairgate_config "$1" "http://127.0.0.1:$MOCK_PORT/v1" >"$WORK/fairgate.toml"
}

start_fairgate() {
    FAIRGATE_PORT="$(free_port)"
    write_fairgate_config "$FAIRGATE_PORT"
    "$BIN" serve --config "$WORK/fairgate.toml" >"$WORK/fairgate.log" 2>&1 &
    PIDS+=($!)
    wait_port "$FAIRGATE_PORT" fairgate || {
        sed 's/^/[fairgate] /' "$WORK/fairgate.log" >&2
        return 1
    }
}

start_ceiling() {
    CEILING_PORT="$(free_port)"
    [ -f "$WORK/fairgate.toml" ] || write_fairgate_config 0
    sed "s|^listen = .*|listen = \"127.0.0.1:$CEILING_PORT\"|" "$WORK/fairgate.toml" \
        >"$WORK/ceiling.toml"
    "$CEILING_BIN" serve --config "$WORK/ceiling.toml" >"$WORK/ceiling.log" 2>&1 &
    PIDS+=($!)
    wait_port "$CEILING_PORT" ceiling
}

start_redis() {
    REDIS_PORT="$(free_port)"
    redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no \
        >"$WORK/redis.log" 2>&1 &
    PIDS+=($!)
    wait_port "$REDIS_PORT" redis-server
}

# Three replicas of the fairgate config above, sharing the pool through Redis.
start_cluster() {
    start_redis || return 1
    CLUSTER_PORTS=()
    local r port
    for r in 0 1 2; do
        port="$(free_port)"
        {
            printf '[server]\nlisten = "127.0.0.1:%s"\n\n' "$port"
            sed '1,/^$/d' "$WORK/fairgate.toml"
            printf '\n[cluster]\nredis_url = "redis://127.0.0.1:%s"\n' "$REDIS_PORT"
            printf 'replica_id = "bench-%s"\nexpected_replicas = 3\n' "$r"
        } >"$WORK/cluster-$r.toml"
        "$BIN" serve --config "$WORK/cluster-$r.toml" >"$WORK/cluster-$r.log" 2>&1 &
        PIDS+=($!)
        wait_port "$port" "fairgate replica $r" || {
            sed "s/^/[replica $r] /" "$WORK/cluster-$r.log" >&2
            return 1
        }
        CLUSTER_PORTS+=("$port")
    done
}

# Three wrk processes at once, one per replica (see the header); prints one summed FG_RESULT.
run_wrk_cluster() {
    local path=$1 t c i pids=()
    t=$((THREADS / 3)); [ "$t" -ge 1 ] || t=1
    c=$((CONNS / 3)); [ "$c" -ge "$t" ] || c=$t
    if [ "$WARMUP" != "0" ]; then
        for i in 0 1 2; do
            wrk -t"$t" -c"$c" -d"$WARMUP" -s "$LUA" \
                "http://127.0.0.1:${CLUSTER_PORTS[$i]}$path" >/dev/null &
            pids+=($!)
        done
        wait "${pids[@]}"
        pids=()
    fi
    log "cluster: 3 × wrk -t$t -c$c -d$DURATION --latency -s bench/chat.lua, one per replica"
    for i in 0 1 2; do
        wrk -t"$t" -c"$c" -d"$DURATION" --latency -s "$LUA" \
            "http://127.0.0.1:${CLUSTER_PORTS[$i]}$path" >"$WORK/wrk-cluster-$i.txt" &
        pids+=($!)
    done
    wait "${pids[@]}"
    cat "$WORK"/wrk-cluster-*.txt >&2
    grep -h '^FG_RESULT' "$WORK"/wrk-cluster-*.txt | awk '
        function f(name,   i, kv) {
            for (i = 2; i <= NF; i++) { split($i, kv, "="); if (kv[1] == name) return kv[2] + 0 }
        }
        { rps += f("rps"); req += f("requests"); bad += f("non2xx"); err += f("socket_errors")
          if (f("p50_ms") > p50) p50 = f("p50_ms"); if (f("p90_ms") > p90) p90 = f("p90_ms")
          if (f("p99_ms") > p99) p99 = f("p99_ms"); n++ }
        END {
            if (n != 3) exit 1
            printf "FG_RESULT rps=%.1f p50_ms=%.3f p90_ms=%.3f p99_ms=%.3f requests=%d non2xx=%d socket_errors=%d\n",
                rps, p50, p90, p99, req, bad, err
        }'
}

# Runs wrk against a URL; prints the FG_RESULT line.
run_wrk() {
    local name=$1 url=$2
    if [ "$WARMUP" != "0" ]; then
        wrk -t"$THREADS" -c"$CONNS" -d"$WARMUP" -s "$LUA" "$url" >/dev/null
    fi
    log "$name: wrk -t$THREADS -c$CONNS -d$DURATION --latency -s bench/chat.lua $url"
    wrk -t"$THREADS" -c"$CONNS" -d"$DURATION" --latency -s "$LUA" "$url" | tee "$WORK/wrk-$name.txt" >&2
    grep '^FG_RESULT' "$WORK/wrk-$name.txt"
}

# "nginx rps | fairgate rps | rps ratio | nginx p99 | fairgate p99 | p99 ratio" of one round.
ratio() {
    awk -v fr="$(field "$1" rps)" -v nr="$(field "$2" rps)" \
        -v fp="$(field "$1" p99_ms)" -v np="$(field "$2" p99_ms)" \
        'BEGIN { printf "%.0f | %.0f | %.2f | %.2f | %.2f | %.2f", nr, fr, fr / nr, np, fp, fp / np }'
}

declare -A RESULT
row() {
    local name=$1 r=${RESULT[$1]:-}
    if [ -z "$r" ]; then
        printf '| %s | pending | pending | pending | pending | - |\n' "$name"
        return
    fi
    printf '| %s | %.0f | %s | %s | %s | %s |\n' "$name" "$(field "$r" rps)" \
        "$(field "$r" p50_ms)" "$(field "$r" p90_ms)" "$(field "$r" p99_ms)" \
        "$(($(field "$r" non2xx) + $(field "$r" socket_errors)))"
}

main() {
    local tools=(wrk)
    want nginx && tools+=(nginx)
    want cluster && tools+=(redis-server)
    need_tools "${tools[@]}"
    if [ "${SKIP_BUILD:-0}" != "1" ]; then
        log "cargo build --profile profiling"
        (cd "$ROOT" && cargo build --profile profiling --locked)
        if want ceiling; then
            (cd "$ROOT" && cargo build --profile profiling --locked --example ceiling)
        fi
    fi
    [ -x "$BIN" ] || { log "missing $BIN"; exit 1; }

    start_mock
    local path="/v1/chat/completions"
    if want direct; then
        RESULT[direct]="$(run_wrk direct "http://127.0.0.1:$MOCK_PORT$path")"
    fi
    if want nginx; then
        start_nginx
        RESULT[nginx]="$(run_wrk nginx "http://127.0.0.1:$NGINX_PORT$path")"
    fi
    if want fairgate; then
        if start_fairgate; then
            RESULT[fairgate]="$(run_wrk fairgate "http://127.0.0.1:$FAIRGATE_PORT$path")"
        else
            log "fairgate serve did not start: row left pending"
        fi
    fi

    if want ceiling; then
        if start_ceiling; then
            RESULT[ceiling]="$(run_wrk ceiling "http://127.0.0.1:$CEILING_PORT$path")"
        else
            log "ceiling did not start: row left pending"
        fi
    fi

    local rounds="${ROUNDS:-1}" i ratios=()
    if [ "$rounds" -gt 1 ] && [ -n "${RESULT[nginx]:-}" ] && [ -n "${RESULT[fairgate]:-}" ]; then
        ratios+=("$(ratio "${RESULT[fairgate]}" "${RESULT[nginx]}")")
        for i in $(seq 2 "$rounds"); do
            local n f
            n="$(run_wrk nginx "http://127.0.0.1:$NGINX_PORT$path")"
            f="$(run_wrk fairgate "http://127.0.0.1:$FAIRGATE_PORT$path")"
            ratios+=("$(ratio "$f" "$n")")
        done
    fi

    if want cluster; then
        [ -f "$WORK/fairgate.toml" ] || write_fairgate_config 0
        if start_cluster; then
            RESULT[cluster]="$(run_wrk_cluster "$path")"
        else
            log "fairgate cluster did not start: row left pending"
        fi
    fi

    echo
    echo "wrk -t$THREADS -c$CONNS -d$DURATION --latency, bench/chat.lua (~1.2 KB chat, 16 keys)," \
        "$(nproc) cores: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')"
    echo
    echo "| target | rps | p50 ms | p90 ms | p99 ms | errors |"
    echo "|---|---:|---:|---:|---:|---:|"
    local t
    for t in direct nginx fairgate ceiling cluster; do
        if want "$t"; then row "$t"; fi
    done
    if [ -n "${RESULT[fairgate]:-}" ] && [ -n "${RESULT[nginx]:-}" ]; then
        awk -v fr="$(field "${RESULT[fairgate]}" rps)" -v nr="$(field "${RESULT[nginx]}" rps)" \
            -v fp="$(field "${RESULT[fairgate]}" p99_ms)" -v np="$(field "${RESULT[nginx]}" p99_ms)" \
            'BEGIN { printf "\nfairgate/nginx: rps %.2fx, p99 %.2fx\n", fr / nr, fp / np }'
    fi
    if [ -n "${RESULT[ceiling]:-}" ] && [ -n "${RESULT[nginx]:-}" ]; then
        awk -v cr="$(field "${RESULT[ceiling]}" rps)" -v nr="$(field "${RESULT[nginx]}" rps)" \
            -v cp="$(field "${RESULT[ceiling]}" p99_ms)" -v np="$(field "${RESULT[nginx]}" p99_ms)" \
            'BEGIN { printf "ceiling/nginx: rps %.2fx, p99 %.2fx\n", cr / nr, cp / np }'
    fi
    if [ ${#ratios[@]} -gt 1 ]; then
        echo
        echo "| round | nginx rps | fairgate rps | rps ratio | nginx p99 ms | fairgate p99 ms | p99 ratio |"
        echo "|---|---:|---:|---:|---:|---:|---:|"
        for i in "${!ratios[@]}"; do echo "| $((i + 1)) | ${ratios[$i]} |"; done
        local mr mp
        mr="$(printf '%s\n' "${ratios[@]}" | awk -F' [|] ' '{ print $3 }' | sort -n)"
        mp="$(printf '%s\n' "${ratios[@]}" | awk -F' [|] ' '{ print $6 }' | sort -n)"
        echo "median of ${#ratios[@]} rounds: rps $(sed -n "$(((${#ratios[@]} + 1) / 2))p" <<<"$mr")x," \
            "p99 $(sed -n "$(((${#ratios[@]} + 1) / 2))p" <<<"$mp")x"
    fi
    if [ -n "${RESULT[cluster]:-}" ] && [ -n "${RESULT[fairgate]:-}" ]; then
        awk -v cr="$(field "${RESULT[cluster]}" rps)" -v fr="$(field "${RESULT[fairgate]}" rps)" \
            -v cp="$(field "${RESULT[cluster]}" p99_ms)" -v fp="$(field "${RESULT[fairgate]}" p99_ms)" \
            'BEGIN { printf "cluster (3 replicas + Redis)/fairgate: rps %.2fx, p99 %.2fx\n", cr / fr, cp / fp }'
    fi
}

main "$@"
