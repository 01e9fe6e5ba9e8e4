#!/usr/bin/env bash
# The event builder on one machine against MPI_Alltoall, in one run:
# `evb run` with RANKS folded RU+BU nodes over a transport (default shm),
# MEP fragments of BLOCK bytes, against bench/peers/mpi_alltoall.c moving
# the same block size between the same number of ranks under OpenMPI.
# Both move fresh data every time. Prints both figures and the ratio.
#
#   bench/evb-vs-mpi-alltoall.sh [RANKS=4] [BLOCK=1048576] [SECONDS=5] [TRANSPORT=shm] [ROUNDS=1] [evb run options...]
#
# evb runs with its defaults (the ring readout: buffers filled once, per
# MEP only the event numbers written; verify = sample; over shm the BUs
# read the RUs' buffers in place) unless the options say otherwise; what
# it ran is printed with its CPU seconds per GB built. The MPI program
# writes fresh data into its send buffer every iteration and copies: for
# evb's equivalent pass `--set source.readout=fresh --set
# event_builder.verify=crc --set transport.shm_zero_copy=false`.
#
# With ROUNDS > 1 the two alternate that many times and the median ratio of
# the rounds is printed last: on a shared machine both figures drift by
# 20 % or more within minutes, and only runs next to each other compare.
#
# Environment: PROGRESS=busy runs evb with transport.progress=busy (spin,
# yielding the core between polls), which is how OpenMPI waits: it
# busy-polls and, oversubscribed (more ranks than cores, as here), calls
# sched_yield. The default is evb's default, blocking. evb puts its 1 MiB
# and larger buffers on transparent huge pages (event_builder.huge_pages,
# on by default); PEER_HUGEPAGES=1 gives the MPI program's buffers huge
# pages too (a plain MPI program mallocs them: the default here).
set -euo pipefail
ranks=${1:-4}
block=${2:-1048576}
seconds=${3:-5}
transport=${4:-shm}
rounds=${5:-1}
shift $(( $# < 5 ? $# : 5 ))
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

command -v mpicc >/dev/null || { echo "needs mpicc (apt install libopenmpi-dev openmpi-bin)" >&2; exit 2; }
mpicc -O2 -o "$work/mpi_alltoall" "$here/peers/mpi_alltoall.c"
# EVB=path runs that binary instead of building this tree's (before/after).
if [ -z "${EVB:-}" ]; then cargo build --release -q -p evb-cli --manifest-path "$root/Cargo.toml"; fi
evb="${EVB:-$root/target/release/evb}"

# One fragment per source per MEP of exactly BLOCK bytes: 4-byte size
# table entry + (BLOCK/EVENTS - 4) bytes per event.
events=4096
mean=$(( block / events - 4 ))
[ "$mean" -gt 0 ] || { echo "BLOCK too small for $events events per MEP" >&2; exit 2; }

ratios=()
for round in $(seq "$rounds"); do
echo "== evb run: $ranks nodes over $transport, fragments of $block bytes, $seconds s, ${PROGRESS:-blocking} progress"
"$evb" run --progress never -n "$ranks" -t "$transport" -d "$seconds" --json "$work/evb.json" \
  --set source.size=fixed --set source.mean_bytes="$mean" --set source.events_per_mep="$events" \
  --set transport.progress="\"${PROGRESS:-blocking}\"" "$@" > "$work/evb.txt"
grep -E "^built |^readout " "$work/evb.txt"
evb_gbps=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['summary']['built_gbps'])" "$work/evb.json")

echo "== MPI_Alltoall: $ranks ranks, blocks of $block bytes, $seconds s (OpenMPI)"
mpi_line=$(/usr/bin/time -f "%U %S" -o "$work/mpi.time" \
  mpirun --allow-run-as-root --oversubscribe --bind-to none -np "$ranks" \
  -x PEER_HUGEPAGES="${PEER_HUGEPAGES:-0}" \
  "$work/mpi_alltoall" "$block" "$seconds")
echo "$mpi_line"
python3 - "$mpi_line" "$work/mpi.time" "$ranks" "$block" <<'PY'
import sys
line, times, ranks, block = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
f = dict(kv.split("=") for kv in line.split()[1:])
gb = int(f["iterations"]) * ranks * ranks * block / 1e9
user, system = (float(x) for x in open(times).read().split())
print(f"MPI CPU per GB moved (all blocks, mpirun and its ranks): {user / gb:.3f} s user + {system / gb:.3f} s system")
PY
mpi_gbps=$(echo "$mpi_line" | sed -n 's/.* gbps_with_local=\([0-9.]*\).*/\1/p')

ratios+=("$(python3 - "$evb_gbps" "$mpi_gbps" <<'PY'
import sys
e, m = float(sys.argv[1]), float(sys.argv[2])
print(f"{e/m:.2f}")
print(f"evb built {e:.2f} Gb/s, MPI_Alltoall {m:.2f} Gb/s (all blocks, own included): ratio evb/MPI = {e/m:.2f}", file=sys.stderr)
PY
)")
done
if [ "$rounds" -gt 1 ]; then
  python3 - "${ratios[@]}" <<'PY'
import statistics, sys
r = [float(x) for x in sys.argv[1:]]
print(f"ratios {' '.join(f'{x:.2f}' for x in r)}: median {statistics.median(r):.2f}")
PY
fi
