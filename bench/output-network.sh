#!/bin/bash
# The output network between real hosts whose links have a rate (root;
# iproute2 with tbf, python3).
#
#   bench/output-network.sh [RATE_MBIT] [SECONDS] [--set k=v ...]
#   bench/output-network.sh 500 5
#
# Two builder nodes (RU+BU, the EM on node 0) and two consumers, each in a
# network namespace with two links: `eb0` to the event-building switch
# (10.81.0.0/24) and `out0` to the output switch (10.82.0.0/24), the
# switches bridges in a namespace of their own. Every link runs at
# RATE_MBIT each way (tbf on both ends; this kernel has no netem). The
# event builder runs twice as under mpirun (ranks from OpenMPI's variables,
# a rendezvous directory), over tcp:
#
#   shared    no output network: the BUs deliver over their event-building
#             link, next to the fragments (the consumers' eb0 addresses);
#   separate  --set output.interface=out0: the deliveries on the second link.
#
# The event builder's defaults (the slotted barrel; `schedule = "all"` with
# 4 credits gives the same figures here: 0.309 and 0.470 Gb/s per node at
# 500 Mbit/s). Prints for each run the
# built Gb/s per node, the deliveries per producer and per consumer (each
# node's bytes over its own run time, drain included), and what each node
# sent on each link (interface counters). Expected: shared, eb0 carries
# the fragments that cross (half) and every delivery, 1.5 times the built
# data, so a node builds at most 2/3 of the link rate; separate, out0
# carries the deliveries and eb0 half as much: the link rate. Namespaces
# and files are removed at the end.
set -euo pipefail
rate=${1:-500}
secs=${2:-5}
shift $(( $# < 2 ? $# : 2 ))
extra=("$@")
evb=${EVB:-$(dirname "$0")/../target/release/evb}
[ -x "$evb" ] || { echo "no $evb: cargo build --release first (or set EVB)" >&2; exit 1; }
p=evbon$$
sw=${p}sw
work=$(mktemp -d)
cleanup() {
  for ns in "$sw" "${p}h0" "${p}h1" "${p}h2" "${p}h3"; do ip netns del "$ns" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
limit() { # namespace device
  ip netns exec "$1" tc qdisc add dev "$2" root tbf rate "${rate}mbit" burst 256kb latency 50ms
}
ip netns add "$sw"
ip -n "$sw" link set lo up
for net in eb out; do
  ip -n "$sw" link add "br$net" type bridge stp_state 0 forward_delay 0
  ip -n "$sw" link set "br$net" up
done
port=0
for h in 0 1 2 3; do
  ns=${p}h$h
  ip netns add "$ns"
  ip -n "$ns" link set lo up
  for net in eb out; do
    port=$((port + 1))
    subnet=81; [ "$net" = out ] && subnet=82
    ip link add name "${net}0" netns "$ns" type veth peer name "p$port" netns "$sw"
    ip -n "$sw" link set "p$port" master "br$net"
    ip -n "$sw" link set "p$port" up
    ip -n "$ns" addr add "10.$subnet.0.$((h + 1))/24" dev "${net}0"
    ip -n "$ns" link set "${net}0" up
    limit "$ns" "${net}0"
    limit "$sw" "p$port"
  done
done

tx_bytes() { # host device
  ip netns exec "${p}h$1" cat "/sys/class/net/$2/statistics/tx_bytes"
}

run() { # mode, extra settings...
  local mode=$1
  shift
  local rdv=$work/rdv-$mode
  mkdir -p "$rdv"
  local before=()
  for h in 0 1 2 3; do before+=("$(tx_bytes "$h" eb0)" "$(tx_bytes "$h" out0)"); done
  local pids=()
  for rank in 0 1 2 3; do
    OMPI_COMM_WORLD_RANK=$rank OMPI_COMM_WORLD_SIZE=4 \
      timeout $(( ${secs%.*} + 120 )) ip netns exec "${p}h$rank" "$evb" node \
      --control launcher --rendezvous "$rdv" --set transport.kind=tcp \
      --set nodes.count=2 --set output.consumers=2 --set "run.duration_s=$secs" \
      --set "transport.bind=10.81.0.$((rank + 1))" "$@" "${extra[@]}" \
      > "$work/$mode-$rank.out" 2> "$work/$mode-$rank.err" &
    pids+=($!)
  done
  wait "${pids[@]}" || { cat "$work/$mode"-*.err >&2; echo "$mode: a rank failed" >&2; exit 1; }
  local after=()
  for h in 0 1 2 3; do after+=("$(tx_bytes "$h" eb0)" "$(tx_bytes "$h" out0)"); done
  python3 - "$mode" "$secs" "$rdv/run1" "${before[*]}" "${after[*]}" <<'PY'
import json, sys
mode, run_dir = sys.argv[1], sys.argv[3]
before = [int(x) for x in sys.argv[4].split()]
after = [int(x) for x in sys.argv[5].split()]
r = [json.load(open(f"{run_dir}/final-{i}.json")) for i in range(4)]
gbps = lambda n, key: n[key] * 8 / n["elapsed_s"] / 1e9
em = r[0]
built = [gbps(n, "bytes_built") for n in r[:2]]
prod = [gbps(n, "bytes_delivered") for n in r[:2]]
cons = [gbps(n, "bytes_consumed") for n in r[2:]]
sent = lambda h, dev: (after[2 * h + dev] - before[2 * h + dev]) / 1e6
print(f"{mode:>8}: built {sum(built) / 2:.3f} Gb/s per node; deliveries {sum(prod) / 2:.3f} Gb/s "
      f"per producer, {sum(cons) / 2:.3f} per consumer; MEPs assigned {em['meps_assigned']}, "
      f"built {em['em_meps_built']}, consumed {sum(n['batches_consumed'] for n in r[2:])}")
for h in range(2):
    t = r[h]["elapsed_s"]
    print(f"          node {h} sent {sent(h, 0):7.1f} MB on eb0 ({sent(h, 0) * 8 / t:5.0f} Mbit/s), "
          f"{sent(h, 1):7.1f} MB on out0 ({sent(h, 1) * 8 / t:5.0f} Mbit/s) in {t:.2f} s")
PY
}

echo "2 nodes, 2 consumers, every link ${rate} Mbit/s each way, ${secs} s"
run shared
run separate --set output.interface=out0
