#!/bin/bash
# A link outage between two evb nodes, by hand (root; iproute2, python3).
#
#   scripts/netns-outage.sh [TRANSPORT] [OUTAGE_S] [DURATION_S] [--set k=v ...]
#   scripts/netns-outage.sh ofi:tcp 30 36 --set event_builder.em_lost_wait_ms=60000
#
# Two network namespaces joined by a veth pair, one `evb node` in each (ranks
# 0 and 1 as under mpirun, found through a rendezvous directory), the link
# set down 1.5 s into the run for OUTAGE_S seconds. Prints both nodes'
# messages and, from their final reports, the accounting, the losses and
# rejoins (times in Unix seconds). What tests/cli/netfaults.rs checks, with the
# outage and transport yours to choose. Namespaces and files are removed at
# the end.
set -euo pipefail
transport=${1:-tcp}
outage=${2:-2.5}
duration=${3:-9}
shift $(( $# < 3 ? $# : 3 ))
extra=("$@")
evb=${EVB:-$(dirname "$0")/../target/release/evb}
[ -x "$evb" ] || { echo "no $evb: cargo build --release first (or set EVB)" >&2; exit 1; }
id=$$
a=evbout${id}a b=evbout${id}b va=vo${id}a vb=vo${id}b
work=$(mktemp -d)
cleanup() { ip netns del "$a" 2>/dev/null || true; ip netns del "$b" 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
ip netns add "$a"; ip netns add "$b"
ip link add "$va" type veth peer name "$vb"
ip link set "$va" netns "$a"; ip link set "$vb" netns "$b"
ip -n "$a" addr add 10.79.0.1/24 dev "$va"; ip -n "$b" addr add 10.79.0.2/24 dev "$vb"
ip -n "$a" link set "$va" up; ip -n "$a" link set lo up
ip -n "$b" link set "$vb" up; ip -n "$b" link set lo up
mkdir "$work/rdv"
pids=()
for rank in 1 0; do
  ns=$a; [ "$rank" = 1 ] && ns=$b
  OMPI_COMM_WORLD_RANK=$rank OMPI_COMM_WORLD_SIZE=2 UCX_LOG_LEVEL=error EVB_STATS_LINES=1 \
    timeout $(( ${duration%.*} + 120 )) ip netns exec "$ns" "$evb" node --control launcher \
    --rendezvous "$work/rdv" --set nodes.count=2 --set "transport.kind=\"$transport\"" \
    --set "run.duration_s=$duration" --set source.events_per_mep=64 \
    --set event_builder.batch_timeout_ms=1500 "${extra[@]}" \
    > "$work/n$rank.out" 2> "$work/n$rank.err" &
  pids+=($!)
done
sleep 1.5
ip -n "$a" link set "$va" down
sleep "$outage"
ip -n "$a" link set "$va" up
wait "${pids[@]}" || true
cat "$work/n0.err" "$work/n1.err"
for rank in 0 1; do
  grep '^FINAL ' "$work/n$rank.out" | python3 -c '
import json, sys
line = sys.stdin.read()
if not line:
    print("no final report"); sys.exit()
v = json.loads(line[6:])
keys = ["node", "events_built", "events_incomplete", "meps_assigned", "em_meps_built",
        "em_meps_incomplete", "em_meps_lost_bu_gone", "drain_timed_out"]
print({k: v.get(k) for k in keys})
lost = [(p["peer"], round(p["at_unix_s"], 3), p["reason"]) for p in v.get("peers_lost") or []]
back = [(p["peer"], round(p["at_unix_s"], 3)) for p in v.get("rejoins") or []]
print("  lost:", lost, " rejoined:", back)
if lost and back:
    print("  rejoined %.2f s after the loss" % (back[0][1] - lost[0][1]))'
done
