#!/usr/bin/env bash
# Benchmark (not a test): evb's event builder over TCP against iperf3 on the
# same loopback, in one run on the same machine.
#   iperf3 -l 1M -P 2 over loopback                          -> peer Gb/s
#   evb run --nodes 2 over tcp, ~1 MiB MEP fragments:
#     event_builder.local=nic: every fragment through TCP, the node's own
#       too (what the comparison means: the default, goal >= 0.9)
#     event_builder.local=memory: the node's own fragments handed over in
#       memory (a second line: half the bytes never touch TCP)
# Prints each figure, the ratios evb built-event Gb/s / iperf3 Gb/s and the
# CPU seconds per GB of each (user + system, all processes: iperf3's client
# and server, evb's nodes), and with ROUNDS > 1 the median ratios.
#
# Usage: bench/tcp-vs-iperf3.sh [seconds] [evb run options...]   (default 10 s)
# Environment: ROUNDS=N alternates iperf3 and the two evb runs N times
# (default 1); EVB=path runs that binary instead of building this tree's
# (before/after comparisons). evb runs with its defaults (the ring readout,
# verify = sample) unless the options say otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-10}
shift || true
rounds=${ROUNDS:-1}
command -v iperf3 >/dev/null || { echo "iperf3 is missing: run scripts/setup.sh" >&2; exit 2; }
# EVB=path runs that binary instead of building this tree's (before/after).
if [ -z "${EVB:-}" ]; then cargo build --release --quiet --bin evb; fi
evb=${EVB:-target/release/evb}
out=$(mktemp -d)
srv=
trap 'kill $srv 2>/dev/null || true; rm -rf "$out"' EXIT

# iperf3 with its CPU time (client and server, user + system): Gb/s, CPU s/GB.
run_iperf3() {
    local port=$((20000 + RANDOM % 20000))
    /usr/bin/time -f "%U %S" -o "$out/srv.time" iperf3 -s -1 -p "$port" -B 127.0.0.1 >/dev/null 2>&1 & srv=$!
    sleep 0.5
    /usr/bin/time -f "%U %S" -o "$out/cli.time" \
        iperf3 -c 127.0.0.1 -p "$port" -l 1M -P 2 -t "$secs" -J > "$out/iperf3.json"
    wait "$srv" 2>/dev/null || true
    srv=
    python3 - "$out" <<'PY'
import json, sys
d = sys.argv[1]
e = json.load(open(f"{d}/iperf3.json"))["end"]["sum_received"]
cpu = sum(float(x) for f in ("srv.time", "cli.time") for x in open(f"{d}/{f}").read().split())
print(e["bits_per_second"] / 1e9, cpu / (e["bytes"] / 1e9))
PY
}

# One evb run with local=$1: Gb/s, CPU s/GB (its nodes and the launcher,
# measured like iperf3's), fragment KiB, the mode line.
run_evb() {
    /usr/bin/time -f "%U %S" -o "$out/evb.time" \
      "$evb" run --nodes 2 --transport tcp --duration "$secs" --progress never --json "$out/evb.json" \
      --set event_builder.local="$1" --set source.events_per_mep=4096 --set source.mean_bytes=256 \
      "${@:2}" > "$out/evb.txt"
    python3 - "$out/evb.json" "$out/evb.time" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
s = d["summary"]
n = d["nodes"][0]
cpu = sum(float(x) for x in open(sys.argv[2]).read().split())
# An evb from before the readout modes: fresh data, every CRC.
mode = f'{s.get("readout") or "fresh"}/{s.get("verify") or "crc"}'
print(s["built_gbps"], cpu / (s["bytes_built"] / 1e9),
      n["bytes_sent"] / max(n["fragments_sent"], 1) / 1024, mode)
PY
}

nic_ratios=()
mem_ratios=()
for round in $(seq "$rounds"); do
    read -r peer peer_cpu <<<"$(run_iperf3)"
    read -r nic nic_cpu frag mode <<<"$(run_evb nic "$@")"
    read -r mem mem_cpu _ _ <<<"$(run_evb memory "$@")"
    load=$(cut -d' ' -f1 /proc/loadavg)
    printf '\nround %d (load %s)\n' "$round" "$load"
    printf 'iperf3 -l 1M -P 2 (loopback):                  %6.2f Gb/s, %.3f CPU s/GB\n' "$peer" "$peer_cpu"
    printf 'evb run --nodes 2 (tcp, local=nic, %s):    %6.2f Gb/s built, %.3f CPU s/GB (%.0f KiB fragments)\n' "$mode" "$nic" "$nic_cpu" "$frag"
    printf 'evb run --nodes 2 (tcp, local=memory):         %6.2f Gb/s built, %.3f CPU s/GB\n' "$mem" "$mem_cpu"
    nic_ratios+=("$(echo "$nic/$peer" | bc -l)")
    mem_ratios+=("$(echo "$mem/$peer" | bc -l)")
    printf 'ratio evb/iperf3: local=nic %.2f (goal >= 0.9), local=memory %.2f\n' "${nic_ratios[-1]}" "${mem_ratios[-1]}"
done
if [ "$rounds" -gt 1 ]; then
    python3 - "${nic_ratios[*]}" "${mem_ratios[*]}" <<'PY'
import statistics, sys
nic = [float(x) for x in sys.argv[1].split()]
mem = [float(x) for x in sys.argv[2].split()]
f = lambda r: " ".join(f"{x:.2f}" for x in r)
print(f"\nlocal=nic ratios {f(nic)}: median {statistics.median(nic):.2f} (goal >= 0.9)")
print(f"local=memory ratios {f(mem)}: median {statistics.median(mem):.2f}")
PY
fi
