#!/usr/bin/env bash
# Benchmark of `evb fabric conflicts` (not a test).
#
# Times the conflict analysis over all N-1 shift steps of
#   - a 648-host 2-level fat tree of 36-port switches, and
#   - a 10,000-host 3-level fat tree of 36-port switches,
# and, in the same run, how long the real OpenSM (ftree engine) takes to
# route the same 648-host fabric on ibsim; prints the ratios.
#
# Usage: bench/fabric-bench.sh [REPEATS]   (needs opensm, ibsim-utils)
set -euo pipefail
cd "$(dirname "$0")/.."
REPEATS=${1:-5}
cargo build --release -q -p evb-cli
EVB=$PWD/target/release/evb
WORK=$(mktemp -d /tmp/evb-fabric-bench.XXXXXX)
SIM_PID=""
cleanup() { [ -n "$SIM_PID" ] && kill "$SIM_PID" 2>/dev/null; rm -rf "$WORK"; }
trap cleanup EXIT INT TERM

# Best of REPEATS of the analysis time evb reports (excludes building the
# fabric and routing), and the whole command's wall time.
analysis() {
  local spec=$1 best=999999 wall_best=999999
  for _ in $(seq "$REPEATS"); do
    local t0 t1 out a
    t0=$(date +%s.%N)
    out=$("$EVB" fabric conflicts --topology "$spec" --order ftree --json "$WORK/c.json")
    t1=$(date +%s.%N)
    a=$(echo "$out" | sed -n 's/^analysis time \([0-9.]*\) s/\1/p')
    best=$(echo "$a $best" | awk '{print ($1<$2)?$1:$2}')
    wall_best=$(echo "$t1 - $t0 $wall_best" | awk '{w=$1-$3; print (w<$4)?w:$4}')
  done
  local flows conf
  flows=$(python3 -c "import json;print(json.load(open('$WORK/c.json'))['total']['flows'])")
  conf=$(python3 -c "import json;print(json.load(open('$WORK/c.json'))['total']['conflicts'])")
  echo "$best $wall_best $flows $conf"
}

read -r A648 W648 F648 C648 < <(analysis "fat-tree:radix=36,hosts=648")
read -r A10K W10K F10K C10K < <(analysis "fat-tree:radix=36,levels=3,hosts=10000,spread")

# OpenSM on ibsim, same 648-host fabric.
UMAD=$(dpkg -L libumad2sim0 2>/dev/null | grep 'libumad2sim.so$' | head -1 || true)
[ -n "$UMAD" ] || UMAD=/usr/lib/x86_64-linux-gnu/umad2sim/libumad2sim.so
"$EVB" fabric export --topology "fat-tree:radix=36,hosts=648" --ibsim "$WORK/net" >/dev/null
export IBSIM_SOCKNAME="evbbench$$"
# The net file names nodes by GUID; the SM attaches to the first host.
SIM_HOST=$(grep -m1 '^Hca' "$WORK/net" | cut -d'"' -f2)
ibsim -s -n "$WORK/net" >"$WORK/ibsim.log" 2>&1 &
SIM_PID=$!
for _ in $(seq 200); do grep -qs "simulator ready" "$WORK/ibsim.log" && break; sleep 0.05; done
grep -q "simulator ready" "$WORK/ibsim.log" || { echo "ibsim did not start"; cat "$WORK/ibsim.log"; exit 1; }
OSM_BEST=999999
for i in $(seq "$REPEATS"); do
  mkdir -p "$WORK/osm$i"
  t0=$(date +%s.%N)
  SIM_HOST="$SIM_HOST" OSM_CACHE_DIR="$WORK/osm$i" OSM_TMP_DIR="$WORK/osm$i" LD_PRELOAD="$UMAD" \
    timeout 300 opensm --once -R ftree -f "$WORK/osm$i/log" >/dev/null 2>&1
  t1=$(date +%s.%N)
  OSM_BEST=$(echo "$t1 - $t0 $OSM_BEST" | awk '{w=$1-$3; print (w<$4)?w:$4}')
done

printf '\n%-52s %10s %10s %12s %10s\n' "case (best of $REPEATS)" "analysis s" "command s" "flows" "conflicts"
printf '%-52s %10.4f %10.3f %12d %10d\n' "648 hosts, 2-level radix 36, ftree order" "$A648" "$W648" "$F648" "$C648"
printf '%-52s %10.4f %10.3f %12d %10d\n' "10000 hosts (spread), 3-level radix 36, ftree order" "$A10K" "$W10K" "$F10K" "$C10K"
printf '%-52s %10.3f\n' "OpenSM ftree on ibsim, 648 hosts (opensm --once)" "$OSM_BEST"
awk -v a="$A648" -v w="$W648" -v o="$OSM_BEST" -v k="$A10K" 'BEGIN {
  printf "\nratio OpenSM routing / evb analysis (648 hosts): %.1fx (analysis), %.1fx (whole evb command)\n", o/a, o/w;
  printf "ratio evb 10000-host analysis / OpenSM 648-host routing: %.2f\n", k/o;
  printf "goals: 648 hosts < 0.1 s: %s; 10000 hosts < 30 s: %s\n", (a<0.1)?"met":"MISSED", (k<30)?"met":"MISSED" }'
