#!/bin/bash
# Regenerates control/link-order/symbols.txt: the functions `switchyard server` runs from start
# to idle, then those one HTTP request, one CONNECT tunnel, one SOCKS5 connection and one API
# call add, in that order. control/build.rs hands the file to the linker (release builds), which
# places those functions first and together in .text. Every page of the binary that start-up
# touches stays resident (file-backed RSS), and start-up runs ~1 MB of code scattered over
# ~30 MB; together it is a few hundred KiB of pages.
#
# Run after changes that move start-up code (new start-up work, dependency updates): symbols
# the file names that no longer exist are ignored by the linker, so a stale file only costs
# memory, never correctness. Needs valgrind (callgrind), curl, python3.
#
#   cargo build --release -p switchyard && control/link-order/regenerate.sh
#
# Known gap (valgrind 3.19 here): the server stops making progress once it starts the glommio
# data plane (the last log line is "data-plane cores decided"), so the file covers start-up up
# to there and the requests time out; what the server ran is still written from the dumps that
# exist (the server's log is kept in /tmp/link-order-server.log). `server` gives the start-up
# pages back once it is up (switchyard_dataplane::text_pages), which matters more than the order.
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=$(realpath "${1:-target/release/switchyard}")
OUT=control/link-order/symbols.txt
D=$(mktemp -d)
trap 'kill $ORIGIN $PID 2>/dev/null; cp "$D/log.txt" /tmp/link-order-server.log 2>/dev/null; rm -rf "$D"' EXIT
port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
HTTP=$(port); SOCKS=$(port); API=$(port); WEB=$(port)
mkdir -p "$D/www" && echo hello > "$D/www/index.html"
python3 -m http.server --bind 127.0.0.1 --directory "$D/www" "$WEB" >/dev/null 2>&1 &
ORIGIN=$!
cat > "$D/server.yaml" <<YAML
server:
  http: {listen: "127.0.0.1:$HTTP"}
  socks5: {listen: "127.0.0.1:$SOCKS"}
  data_dir: "$D/data"
api: {listen: "127.0.0.1:$API"}
YAML
valgrind --tool=callgrind --callgrind-out-file="$D/cg" --dump-instr=no --compress-strings=no \
  --demangle=no "$BIN" server --config "$D/server.yaml" >"$D/log.txt" 2>&1 &
PID=$!
for _ in $(seq 1 600); do (echo >/dev/tcp/127.0.0.1/$API) 2>/dev/null && break; sleep 0.2; done
sleep 3
callgrind_control -d $PID >/dev/null          # dump 1: start-up and idle
sleep 2
URL=http://127.0.0.1:$WEB/index.html
# under valgrind a request may time out; what ran until then still counts
for args in "-x http://127.0.0.1:$HTTP" "-p -x http://127.0.0.1:$HTTP" \
            "--socks5-hostname 127.0.0.1:$SOCKS"; do
  # shellcheck disable=SC2086
  curl -sS -o /dev/null --max-time 20 $args "$URL" || echo "request ($args) failed, continuing"
done
curl -sS -o /dev/null --max-time 20 "http://127.0.0.1:$API/api/v1/health" || true
callgrind_control -d $PID >/dev/null          # dump 2: what the first requests added
sleep 2
# dumps in order; "cg" is what the server wrote at exit if it ended before the second dump
DUMPS=(); for f in "$D/cg.1" "$D/cg.2" "$D/cg"; do [ -s "$f" ] && DUMPS+=("$f"); done
python3 - "$BIN" "${DUMPS[@]}" > "$D/symbols.txt" <<'PY'
import re, subprocess, sys
binary, dumps = sys.argv[1], sys.argv[2:]
defined = set()
for line in subprocess.run(["nm", "--defined-only", binary], capture_output=True, text=True).stdout.splitlines():
    parts = line.split()
    if len(parts) == 3 and parts[1] in "tTwW":
        defined.add(parts[2])
seen, order = set(), []
for dump in dumps:
    ob = fn = None
    for line in open(dump, errors="replace"):
        if line.startswith("ob="):
            ob = line[3:].strip()
        elif line.startswith("fn="):
            # callgrind marks recursion levels with 'N
            fn = re.sub(r"'\d+$", "", line[3:].strip())
            if ob == binary and fn in defined and fn not in seen:
                seen.add(fn)
                order.append(fn)
print("\n".join(order))
PY
mv "$D/symbols.txt" "$OUT"
echo "$(wc -l < "$OUT") functions in $OUT"
