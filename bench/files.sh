#!/usr/bin/env bash
# Peak RSS of batch-file transfers (issue 28, point 1): two concurrent uploads of SIZE MB each
# (a valid batch JSONL of ~2 KB lines), then N concurrent downloads of one of them, all by one
# tenant, through fairgate with [jobs] on SQLite. Prints fairgate's VmHWM (peak RSS) when idle,
# after the uploads and after the downloads, the statuses, and the bytes moved.
#
#   bench/files.sh [BIN] [SIZE_MB] [N_DOWNLOADS] [MAX_TRANSFERS_PER_TENANT]
#
# BIN defaults to target/debug/fairgate (`cargo build`). MAX_TRANSFERS_PER_TENANT defaults to
# N_DOWNLOADS + 2 so that every transfer is admitted; pass 4 (fairgate's default) to see the
# cap refuse the rest (429). The tenant's byte rate (`transfer_bytes_per_second_per_tenant`) is
# off here (RATE=0): this measures memory, not pacing; RATE=25000000 runs it at the default.
set -euo pipefail
RATE=${RATE:-0}
BIN=${1:-target/debug/fairgate}
SIZE=${2:-100}
N=${3:-16}
CAP=${4:-$((N + 2))}
DIR=$(mktemp -d)
trap 'kill $MOCK $FG 2>/dev/null || true; rm -rf "$DIR"' EXIT

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
MPORT=$(port); FPORT=$(port)
"$BIN" mock-upstream --listen "127.0.0.1:$MPORT" >/dev/null 2>&1 &
MOCK=$!
cat >"$DIR/config.toml" <<TOML
[server]
listen = "127.0.0.1:$FPORT"
workers = 2
[[upstreams]]
name = "mock"
base_url = "http://127.0.0.1:$MPORT/v1"
[[tenants]]
id = "big"
api_keys = ["fg-big"]
[jobs]
path = "$DIR/jobs.sqlite"
max_transfers_per_tenant = $CAP
transfer_bytes_per_second_per_tenant = $RATE
max_stored_bytes_per_tenant = 4294967296
TOML
"$BIN" serve --config "$DIR/config.toml" >"$DIR/log" 2>&1 &
FG=$!
for _ in $(seq 100); do
  curl -s "http://127.0.0.1:$FPORT/healthz" >/dev/null 2>&1 && break
  sleep 0.1
done
hwm() { awk '/VmHWM/ {print int($2 / 1024)}' /proc/$FG/status; }
echo "VmHWM idle: $(hwm) MiB"
python3 - "$FPORT" "$SIZE" "$N" "$DIR" "$FG" <<'PY'
import http.client, json, os, sys, threading, collections
port, size, n, d, fg = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
def hwm():
    for l in open(f"/proc/{fg}/status"):
        if l.startswith("VmHWM"):
            return int(l.split()[1]) // 1024
# The file: ~2 KB batch lines up to SIZE MB, and the multipart form around it.
path = os.path.join(d, "in.jsonl")
pad = "x" * 1900
with open(path, "w") as f:
    written, i = 0, 0
    while written < size * 1000 * 1000 - 2200:
        line = json.dumps({"custom_id": f"r-{i}", "method": "POST", "url": "/v1/chat/completions",
                           "body": {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": pad}]}}) + "\n"
        f.write(line); written += len(line); i += 1
head = (b'--B\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n--B\r\n'
        b'Content-Disposition: form-data; name="file"; filename="in.jsonl"\r\n\r\n')
tail = b"\r\n--B--\r\n"
length = len(head) + os.path.getsize(path) + len(tail)
class Form:
    """The form read from disk as the client sends it (the client never holds the file)."""
    def __init__(self): self.parts = [head, open(path, "rb"), tail]
    def read(self, n=-1):
        while self.parts:
            p = self.parts[0]
            if isinstance(p, bytes):
                self.parts.pop(0)
                return p
            b = p.read(256 * 1024)
            if b: return b
            self.parts.pop(0)
        return b""
ids, statuses, lock = [], collections.Counter(), threading.Lock()
def up():
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("POST", "/v1/files", Form(), {"authorization": "Bearer fg-big",
              "content-type": "multipart/form-data; boundary=B", "content-length": str(length)})
    r = c.getresponse(); body = r.read()
    with lock:
        statuses[("upload", r.status)] += 1
        if r.status == 200: ids.append(json.loads(body)["id"])
        else: print(body[:300])
ts = [threading.Thread(target=up) for _ in range(2)]
for t in ts: t.start()
for t in ts: t.join()
print(f"uploads: 2 x {length / 1e6:.1f} MB ({i} lines each): {dict(statuses)}; VmHWM {hwm()} MiB")
moved = collections.Counter()
def down():
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("GET", f"/v1/files/{ids[0]}/content", headers={"authorization": "Bearer fg-big"})
    r = c.getresponse(); got = 0
    while True:
        b = r.read(64 * 1024)
        if not b: break
        got += len(b)
    with lock:
        statuses[("download", r.status)] += 1
        moved["bytes"] += got
ts = [threading.Thread(target=down) for _ in range(n)]
for t in ts: t.start()
for t in ts: t.join()
print(f"downloads: {n} concurrent: {dict(statuses)}; {moved['bytes'] / 1e6:.0f} MB read; VmHWM {hwm()} MiB")
PY
echo "VmHWM peak: $(hwm) MiB (fairgate $("$BIN" --version 2>/dev/null || echo ?), max_transfers_per_tenant = $CAP)"
