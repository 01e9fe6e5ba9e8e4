#!/usr/bin/env bash
# Benchmark (not a test): does one slow link cost the event builder about
# its share, not a collapse? `evb sim --traffic eb` with the defaults on a
# two-level tree of 36-port switches whose node005 cable trained slower
# than the fabric file says (the slots are sized for 100 Gb/s and must be
# found by the EM's adaptive slots), at several rates. Every batch waits
# for that node's fragment, so the builder can keep at most what that link
# carries: the proportional figure is the clean tree's times the slow
# link's share. Printed per rate: built through the network as % of usable,
# the proportional figure, their ratio, the drift, the slots' length at the
# end against the nominal, the fragments that waited a rotation.
# Usage: [NODES=72] [DURATION_US=300000] [RATES="12xQDR 8xFDR10 8xQDR 2xEDR"] bench/eb-perturb.sh
#   RATES: ibnetdiscover widths x speeds for the slow cable (12xQDR 96,
#   8xFDR10 80, 8xQDR 64, 2xEDR 50 Gb/s of data).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet --bin evb
evb=$PWD/target/release/evb
nodes=${NODES:-72}
dur=${DURATION_US:-300000}
rates=${RATES:-12xQDR 8xFDR10 8xQDR 2xEDR}
out=$(mktemp -d /tmp/evb-eb-perturb.XXXXXX)
trap 'rm -rf "$out"' EXIT INT TERM

"$evb" fabric export --topology "fat-tree:radix=36,hosts=$nodes" --ibnetdiscover "$out/clean.ibnd" >/dev/null
run() { # tag file
  "$evb" sim --traffic eb --duration-us "$dur" --topology "$2" --order ftree \
    --set event_builder.slot_us=87.98 --json "$out/$1.json" >"$out/$1.txt" 2>&1 ||
    { cat "$out/$1.txt"; exit 1; }
}
run clean "$out/clean.ibnd"
printf '%-9s %6s %9s %13s %6s %7s %7s %7s %7s\n' cable "Gb/s" "% usable" "proportional" ratio drift "slot x" missed "wall s"
for rate in 4xEDR $rates; do
  if [ "$rate" != 4xEDR ]; then
    sed -e "/\"node005\"/s/4xEDR/$rate/" -e "/lid 5 lmc 0 \"leaf001\"/s/4xEDR/$rate/" "$out/clean.ibnd" >"$out/$rate.ibnd"
    [ "$(grep -c "$rate" "$out/$rate.ibnd")" = 2 ] || { echo "eb-perturb: $rate was not set at both ends" >&2; exit 1; }
    t0=$(date +%s.%N)
    run "$rate" "$out/$rate.ibnd"
    t1=$(date +%s.%N)
  else
    t0=0 t1=0
  fi
  tag=$([ "$rate" = 4xEDR ] && echo clean || echo "$rate")
  python3 - "$rate" "$out/clean.json" "$out/$tag.json" "$(echo "$t1 $t0" | awk '{print $1-$2}')" <<'PY'
import json, sys
rate, clean_path, path, wall = sys.argv[1:5]
lanes = {"1x": 1, "2x": 2, "4x": 4, "8x": 8, "12x": 12}
speeds = {"QDR": 8.0, "FDR10": 10.0, "FDR": 14.0625 * 64 / 66, "EDR": 25.0, "HDR": 50.0}
w, s = rate.split("x", 1)
gbps = lanes[w + "x"] * speeds[s]
clean = json.load(open(clean_path))["summary"]["eb"]["network_fraction_of_usable"] * 100
eb = json.load(open(path))["summary"]["eb"]
got = eb["network_fraction_of_usable"] * 100
prop = clean * min(1.0, gbps / 100.0)
sl = eb.get("slots", {})
nominal = eb.get("schedule", {}).get("slot_us") or 87.98
stretch = (sl.get("slot_us_end") or nominal) / nominal
frag = max(sl.get("fragments", 0), 1)
print(f"{rate:<9} {gbps:6.1f} {got:8.1f}% {prop:12.1f}% {got/prop:6.2f} {eb['drift']*100:+6.1f}% "
      f"{stretch:7.2f} {sl.get('slots_missed', 0)/frag*100:6.2f}% {float(wall):7.1f}")
PY
done
echo "nodes=$nodes duration=${dur} us; proportional: the clean tree's figure times the slow link's share of 100 Gb/s"
