#!/usr/bin/env bash
# Benchmark (not a test): CPU seconds per GB built by `evb run`, over tcp
# and shm, for each step from fresh data checked in full to the defaults
# (the ring readout, sampled CRCs, shm zero copy), and for an older evb.
#   tcp: evb run --nodes 2 --transport tcp, event_builder.local=nic (every
#        byte through TCP, as bench/tcp-vs-iperf3.sh)
#   shm: evb run --nodes 4 --transport shm (evb run's defaults)
# both with the default source: 4096 events of 256 B (normal, sd 64) a
# MEP, ~1 MiB fragments. CPU is that of the whole `evb run` (its nodes and
# the launcher, user and system, /usr/bin/time: start-up and drain
# included) over the bytes built (the run JSON's bytes_built, 10^9 B).
#
# Usage: bench/cpu-per-gb.sh [seconds=10] [rounds=1]
# Environment: EVB=path runs that binary instead of building this tree's;
# BEFORE=path adds the rows of an older evb (e.g. one built from main
# before the readout modes: fresh data, every CRC, one copy over shm).
# Rounds alternate the cases; with rounds > 1 each figure is the median.
# Prints one markdown table.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-10}
rounds=${2:-1}
if [ -z "${EVB:-}" ]; then cargo build --release --quiet --bin evb; fi
evb=${EVB:-target/release/evb}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

fresh=(--set source.readout=fresh --set event_builder.verify=crc)
# name | binary | transport | options
cases=()
if [ -n "${BEFORE:-}" ]; then
    cases+=("before (BEFORE=$(basename "$BEFORE"))|$BEFORE|tcp|" "before (BEFORE=$(basename "$BEFORE"))|$BEFORE|shm|")
fi
cases+=(
    "fresh, crc, copy|$evb|tcp|${fresh[*]}"
    "fresh, crc, copy|$evb|shm|${fresh[*]} --set transport.shm_zero_copy=false"
    "ring, crc, copy|$evb|tcp|--set event_builder.verify=crc"
    "ring, crc, copy|$evb|shm|--set event_builder.verify=crc --set transport.shm_zero_copy=false"
    "ring, sample 1/64, copy|$evb|shm|--set transport.shm_zero_copy=false"
    "ring, sample 1/64 (defaults)|$evb|tcp|"
    "ring, sample 1/64, zero copy (defaults)|$evb|shm|"
)

for round in $(seq "$rounds"); do
    for i in "${!cases[@]}"; do
        IFS='|' read -r name bin transport opts <<<"${cases[$i]}"
        if [ "$transport" = tcp ]; then
            shape=(--nodes 2 --transport tcp --set event_builder.local=nic)
        else
            shape=(--nodes 4 --transport shm)
        fi
        # shellcheck disable=SC2086 # opts is a list of words
        /usr/bin/time -f "%U %S" -o "$out/time" \
            "$bin" run "${shape[@]}" --duration "$secs" --progress never \
            --json "$out/run.json" $opts > "$out/run.txt"
        python3 - "$out/run.json" "$out/time" "$i" >> "$out/rows" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))["summary"]
user, system = (float(x) for x in open(sys.argv[2]).read().split())
gb = s["bytes_built"] / 1e9
print(sys.argv[3], s["built_gbps"], user / gb, system / gb)
PY
        echo "round $round: ${cases[$i]%%|*} over $transport: $(tail -n 1 "$out/rows" | cut -d' ' -f2-)" >&2
    done
done

python3 - "$out/rows" "${cases[@]}" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    i, *v = line.split()
    rows.setdefault(int(i), []).append([float(x) for x in v])
cases = [c.split("|") for c in sys.argv[2:]]
print("| transport | readout, verify, copy | built Gb/s | CPU s/GB user | system | total |")
print("| --- | --- | ---: | ---: | ---: | ---: |")
for transport in ("tcp", "shm"):
    for i, (name, _, t, _) in enumerate(cases):
        if t != transport:
            continue
        gbps, user, system = (statistics.median(x) for x in zip(*rows[i]))
        print(f"| {t} | {name} | {gbps:.2f} | {user:.3f} | {system:.3f} | {user + system:.3f} |")
PY
