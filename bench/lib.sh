# Shell functions shared by the bench scripts (bench/overhead.sh, bench/ab.sh, bench/rig.sh).
# Source it after setting ROOT; it sets WORK (a fresh temporary directory), PIDS (processes to
# stop) and the EXIT trap that stops them and removes WORK. Everything binds 127.0.0.1.

WORK="$(mktemp -d -t fairgate-bench.XXXXXX)"
chmod 755 "$WORK"
PIDS=()

cleanup() {
    local pid
    for pid in "${PIDS[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
    for pid in "${PIDS[@]}"; do
        wait "$pid" 2>/dev/null || true
    done
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log() { echo "[${BENCH_NAME:-bench}] $*" >&2; }

# Installs the given programs with apt-get when missing (as root; else fails naming them).
need_tools() {
    local missing=() t
    for t in "$@"; do
        command -v "$t" >/dev/null || [ -x "/usr/sbin/$t" ] || missing+=("$t")
    done
    [ ${#missing[@]} -eq 0 ] && return
    log "installing ${missing[*]}"
    if [ "$(id -u)" -ne 0 ]; then
        log "need root to apt-get install ${missing[*]}"
        exit 1
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
}

nginx_bin() { command -v nginx || echo /usr/sbin/nginx; }

# A loopback port nothing listens on (bounded tries), below the ephemeral range (32768+) so a
# client socket of an earlier run cannot hold it.
free_port() {
    local port tries
    for tries in $(seq 1 200); do
        port=$((20000 + RANDOM % 12000))
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
            echo "$port"
            return
        fi
    done
    log "no free port found"
    exit 1
}

# Waits (at most 15 s) until something accepts connections on port $1; fails fast if the
# process that should listen (the last one started) has exited. $2 names it in the message.
wait_port() {
    local port=$1 name=${2:-server} pid=${PIDS[-1]:-} i
    for i in $(seq 1 150); do
        if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
            return 0
        fi
        if [ -n "$pid" ]; then kill -0 "$pid" 2>/dev/null || break; fi
        sleep 0.1
    done
    log "$name did not start listening on 127.0.0.1:$port (logs in $WORK)"
    return 1
}

# Stops one process started here (and forgets it).
stop_pid() {
    local pid=$1 p keep=()
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    for p in "${PIDS[@]}"; do [ "$p" = "$pid" ] || keep+=("$p"); done
    PIDS=("${keep[@]}")
}

# CPU ticks of pid $1 and its children (nginx's workers).
cpu_ticks() {
    local p t=0
    for p in "$1" $(pgrep -P "$1" || true); do
        t=$((t + $(awk '{ print $14 + $15 }' "/proc/$p/stat" 2>/dev/null || echo 0)))
    done
    echo "$t"
}

# Renders an nginx template ($1) to $2: __USER__, __WORK__, __NGINX_PORT__ ($3), __MOCK_PORT__
# ($4, the upstream it proxies to), __ROOT__ ($5, the static upstream's document root).
render_nginx() {
    local user=""
    [ "$(id -u)" -eq 0 ] && user="user root;"
    sed -e "s|__USER__|$user|" -e "s|__WORK__|$WORK|g" -e "s|__NGINX_PORT__|$3|" \
        -e "s|__MOCK_PORT__|${4:-0}|" -e "s|__ROOT__|${5:-}|g" "$1" >"$2"
}

# Starts nginx with config $1 (its own prefix under WORK/$2) listening on $3.
start_nginx_conf() {
    local conf=$1 name=$2 port=$3
    mkdir -p "$WORK/$name"
    "$(nginx_bin)" -p "$WORK/$name" -c "$conf" >"$WORK/$name.log" 2>&1 &
    PIDS+=($!)
    wait_port "$port" "$name"
}

# A fairgate config: listen on $1, one upstream pool at base URL $2 (max_concurrency 1024, so
# the queue never limits), 16 tenants fg-bench-0..15, policy drr. Written to stdout.
fairgate_config() {
    printf '[server]\nlisten = "127.0.0.1:%s"\n\n' "$1"
    printf '[scheduler]\npolicy = "drr"\nquantum = 4096\n\n'
    printf '[[upstreams]]\nname = "mock"\nbase_url = "%s"\n' "$2"
    printf 'max_concurrency = 1024\nmodels = ["*"]\n'
    local i
    for i in $(seq 0 15); do
        printf '\n[[tenants]]\nid = "bench-%s"\napi_keys = ["fg-bench-%s"]\n' "$i" "$i"
    done
}

# The FG_RESULT field $2 of line $1.
field() { sed -n "s/.* $2=\([^ ]*\).*/\1/p" <<<"$1"; }

# The rig's static answers (bench/rig.sh, bench/ir-sse.sh), under $WORK/root/<answer>/v1/chat/completions.
write_answers() {
    local d="$WORK/root" id='"id":"chatcmpl-bench","object":"chat.completion.chunk","created":1700000000,"model":"gpt-4o-mini","system_fingerprint":"fp_bench"'
    mkdir -p "$d/json/v1/chat" "$d/sse/v1/chat" "$d/sse-every/v1/chat"
    printf '%s' '{"id":"chatcmpl-bench","object":"chat.completion","created":1700000000,"model":"gpt-4o-mini","choices":[{"index":0,"message":{"role":"assistant","content":"Hello! This is the benchmark rig'"'"'s fixed answer, about twenty tokens long."},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":300,"completion_tokens":18,"total_tokens":318}}' \
        >"$d/json/v1/chat/completions"
    awk -v id="$id" 'BEGIN {
        for (i = 0; i < 200; i++)
            printf "data: {%s,\"choices\":[{\"index\":0,\"delta\":{\"content\":\" word%d\"},\"logprobs\":null,\"finish_reason\":null}],\"usage\":null}\n\n", id, i
        printf "data: {%s,\"choices\":[{\"index\":0,\"delta\":{},\"logprobs\":null,\"finish_reason\":\"length\"}],\"usage\":null}\n\n", id
        printf "data: {%s,\"choices\":[],\"usage\":{\"prompt_tokens\":300,\"completion_tokens\":400,\"total_tokens\":700}}\n\n", id
        printf "data: [DONE]\n\n"
    }' >"$d/sse/v1/chat/completions"
    awk -v id="$id" 'BEGIN {
        for (i = 0; i < 200; i++)
            printf "data: {%s,\"choices\":[{\"index\":0,\"delta\":{\"content\":\" word%d\"},\"logprobs\":null,\"finish_reason\":null}],\"usage\":{\"prompt_tokens\":300,\"completion_tokens\":%d,\"total_tokens\":%d}}\n\n", id, i, 2 * i + 2, 302 + 2 * i
        printf "data: {%s,\"choices\":[{\"index\":0,\"delta\":{},\"logprobs\":null,\"finish_reason\":\"length\"}],\"usage\":{\"prompt_tokens\":300,\"completion_tokens\":400,\"total_tokens\":700}}\n\n", id
        printf "data: [DONE]\n\n"
    }' >"$d/sse-every/v1/chat/completions"
}
