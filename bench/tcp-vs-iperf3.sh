#!/usr/bin/env bash
# Benchmark (not a test): evb's event builder over TCP against iperf3 on the
# same loopback, in one run on the same machine.
#   iperf3 -l 1M -P 2 over loopback                  -> peer Gb/s
#   evb run --nodes 2, ~1 MiB MEP fragments, local traffic in memory -> built Gb/s
# Prints both and the ratio evb built-event Gb/s / iperf3 Gb/s (goal >= 0.8).
# Usage: bench/tcp-vs-iperf3.sh [seconds] [evb run options...]   (default 10 s)
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-10}
shift || true
command -v iperf3 >/dev/null || { echo "iperf3 is missing: run scripts/setup.sh" >&2; exit 2; }
# EVB=path runs that binary instead of building this tree's (before/after).
if [ -z "${EVB:-}" ]; then cargo build --release --quiet --bin evb; fi
evb=${EVB:-target/release/evb}
out=$(mktemp -d)
trap 'kill $srv 2>/dev/null || true; rm -rf "$out"' EXIT

port=$((20000 + RANDOM % 20000))
iperf3 -s -1 -p "$port" -B 127.0.0.1 >/dev/null 2>&1 & srv=$!
sleep 0.5
iperf3 -c 127.0.0.1 -p "$port" -l 1M -P 2 -t "$secs" -J > "$out/iperf3.json"
peer=$(python3 -c "import json,sys; d=json.load(open('$out/iperf3.json')); print(d['end']['sum_received']['bits_per_second']/1e9)")

"$evb" run --nodes 2 --transport tcp --duration "$secs" --progress never --json "$out/evb.json" \
  --set event_builder.local=memory --set source.events_per_mep=4096 --set source.mean_bytes=256 \
  "$@" > "$out/evb.txt"
cat "$out/evb.txt"
read -r built per_node frag <<<"$(python3 - "$out/evb.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
s = d["summary"]
n = d["nodes"][0]
print(s["built_gbps"], s["built_gbps_per_node"], n["bytes_sent"] / max(n["fragments_sent"], 1))
PY
)"
printf '\niperf3 -l 1M -P 2 (loopback): %.2f Gb/s\n' "$peer"
printf 'evb run --nodes 2 (tcp, local=memory, %.0f KiB fragments): %.2f Gb/s built (%.2f per node)\n' "$(echo "$frag/1024" | bc -l)" "$built" "$per_node"
printf 'ratio evb/iperf3: %.2f (goal >= 0.8)\n' "$(echo "$built/$peer" | bc -l)"
