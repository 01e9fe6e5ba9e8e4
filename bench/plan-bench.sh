#!/usr/bin/env bash
# Benchmark of `evb plan` (not a test; docs/plan.md, "Speed").
#
# Times the issue's three plans:
#   - 540 nodes x 100 Gb/s        (target: the table in <= 60 s)
#   - 163 nodes x 200 Gb/s        (target: <= 60 s)
#   - 1000 nodes x 400 Gb/s       (target: <= 5 min)
# and, in the same run, the peer: the `evb fabric schedule` and `evb sim`
# commands each plan prints for the designs it simulated, run one after
# the other by hand (what a user did before `evb plan`). Prints each
# plan's wall time, how the plan spent it, the hand-run commands' time
# and the ratio plan / hand. The plan simulates on every core; the hand
# runs use one core at a time, as typed.
#
# Usage: bench/plan-bench.sh [CASES]   CASES: any of 540 163 1000 (default all)
set -euo pipefail
cd "$(dirname "$0")/.."
CASES=${*:-540 163 1000}
cargo build --release -q -p evb-cli
EVB=$PWD/target/release/evb
WORK=$(mktemp -d /tmp/evb-plan-bench.XXXXXX)
trap 'rm -rf "$WORK"' EXIT INT TERM

# The `evb fabric schedule` / `evb sim` commands of the simulated designs
# (one per distinct fabric), from the plan's JSON.
hand_commands() {
  python3 - "$1" <<'PY'
import json, sys
plan = json.load(open(sys.argv[1]))
seen = set()
for d in plan["designs"]:
    # Every design simulated, settled or not (the plan ran it all the same).
    if d.get("sim") is None or d["topology"] in seen:
        continue
    seen.add(d["topology"])
    for c in d["commands"]:
        print(c)
PY
}

now() { date +%s.%N; }

for c in $CASES; do
  case $c in
    540) args=(--nodes 540 --gbps 100) ;;
    163) args=(--nodes 163 --gbps 200) ;;
    1000) args=(--nodes 1000 --gbps 400) ;;
    *) echo "unknown case $c"; exit 2 ;;
  esac
  t0=$(now)
  "$EVB" plan "${args[@]}" --json "$WORK/$c.json" >"$WORK/$c.txt"
  t1=$(now)
  plan_s=$(echo "$t1 $t0" | awk '{printf "%.1f", $1-$2}')
  echo "== evb plan ${args[*]}: ${plan_s} s wall"
  grep -E '^time:|^  sim of' "$WORK/$c.txt"
  head -6 "$WORK/$c.txt" | cut -c1-170
  # The peer: the same simulations (and schedules) by hand, in the plan's
  # scratch directory, one at a time.
  hand_commands "$WORK/$c.json" >"$WORK/$c.cmds"
  n=$(wc -l <"$WORK/$c.cmds")
  t0=$(now)
  (cd "$WORK" && while read -r cmd; do eval "$EVB${cmd#evb}" >/dev/null; done <"$WORK/$c.cmds")
  t1=$(now)
  hand_s=$(echo "$t1 $t0" | awk '{printf "%.1f", $1-$2}')
  echo "   peer: the $n evb fabric schedule / evb sim commands of its simulated designs, by hand: ${hand_s} s; plan / hand = $(echo "$plan_s $hand_s" | awk '{printf "%.2f", $1/$2}')"
  echo "   load average at the end: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"
done
