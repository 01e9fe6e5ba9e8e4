#!/usr/bin/env bash
# Benchmark of `evb fabric diagnose` (not a test).
#
# A 648-host 2-level fat tree of 36-port switches with two up-link cables
# swapped (leaf003:20 and leaf007:25; OpenSM's ftree refuses it and falls
# back to minhop, as evb does): the simulator runs a linear shift on it for
# 300 us and writes its 2,592 ports' counters; then `evb fabric diagnose`
# reads them onto the fabric (utilisation, PortXmitWait, errors), maps the
# waiting onto the links the shift overloads, finds the crossed cables and
# ranks the remedies by the shift estimate. Prints the best of REPEATS for
#   - the analysis time evb reports, and the whole command (process start,
#     reading the ibnetdiscover dump and the snapshot, routing, writing the
#     JSON), with the order and route searches off (--search-s 0);
#   - the same with the default search budget (0.3 s, two searches side by side);
#   - one prediction with the simulator (the default configuration, 2 ms),
#     what --predict sim adds per remedy.
# Goal: the diagnosis of a 648-host fabric's counters within 1 s.
#
# Usage: bench/diagnose-bench.sh [REPEATS]
set -euo pipefail
cd "$(dirname "$0")/.."
REPEATS=${1:-5}
cargo build --release -q -p evb-cli
EVB=$PWD/target/release/evb
WORK=$(mktemp -d /tmp/evb-diagnose-bench.XXXXXX)
trap 'rm -rf "$WORK"' EXIT INT TERM

"$EVB" fabric export --topology fat-tree:radix=36,hosts=648 \
  --swap-cables leaf003:20,leaf007:25 --ibnetdiscover "$WORK/ibnetdiscover.out" >/dev/null
"$EVB" sim --topology "$WORK/ibnetdiscover.out" --traffic shift-fixed --duration-us 300 \
  --counters "$WORK/counters.json" >/dev/null 2>&1

# Best of REPEATS: analysis time (evb's own figure) and the wall time.
diagnose() {
  local best=999999 wall_best=999999 first=""
  for _ in $(seq "$REPEATS"); do
    local t0 t1 out a
    t0=$(date +%s.%N)
    out=$("$EVB" fabric diagnose --topology "$WORK/ibnetdiscover.out" --counters "$WORK/counters.json" \
      --json "$WORK/d.json" "$@" 2>/dev/null)
    t1=$(date +%s.%N)
    a=$(echo "$out" | sed -n 's/^analysis \([0-9.]*\) s.*/\1/p')
    first=$(echo "$out" | grep -m1 -A0 '^  1\. [a-z-]* \[' || true)
    best=$(echo "$a $best" | awk '{print ($1<$2)?$1:$2}')
    wall_best=$(echo "$t1 - $t0 $wall_best" | awk '{w=$1-$3; print (w<$4)?w:$4}')
  done
  echo "$best $wall_best $first"
}

read -r A0 W0 F0 < <(diagnose --predict estimate --search-s 0)
read -r A1 W1 _ < <(diagnose --predict estimate)
t0=$(date +%s.%N)
"$EVB" sim --topology "$WORK/ibnetdiscover.out" --duration-us 2000 >/dev/null 2>&1
t1=$(date +%s.%N)
SIM=$(echo "$t1 $t0" | awk '{print $1-$2}')

printf '\n%-60s %10s %10s\n' "648 hosts, crossed cables (best of $REPEATS)" "analysis s" "command s"
printf '%-60s %10.3f %10.3f\n' "diagnose, searches off (--predict estimate --search-s 0)" "$A0" "$W0"
printf '%-60s %10.3f %10.3f\n' "diagnose, default search budget (--predict estimate)" "$A1" "$W1"
printf '%-60s %10s %10.1f\n' "one prediction: evb sim, default configuration, 2 ms" "" "$SIM"
echo "first remedy: $F0"
awk -v w="$W0" 'BEGIN { printf "goal: 648-host diagnosis within 1 s: %s\n", (w<=1.0)?"met":"MISSED" }'
