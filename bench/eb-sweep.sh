#!/usr/bin/env bash
# Benchmark (not a test): does the event builder hold its rate off the shape
# it was tuned on? `evb sim --traffic eb` with the defaults (EM in node 0,
# slotted barrel on the EM's clock, the fabric's slot schedule, adaptive
# slots, credits 3), one step at a time away from them:
#   node counts 16 .. 540 on two-level trees of 36-port switches (leaves
#   full, and 540 on a 540-host tree: no spare leaf for the EM), the EM on a
#   host of its own, the hosts' clocks (`clock = "system"`), LHCb's HDR
#   design (configs/lhcb-163-hdr.toml: 163 nodes at 200 Gb/s on 40-port
#   switches, the last leaf short), and one host link trained to half width
#   that the fabric file does not tell (the slots are sized for 100 Gb/s,
#   the adaptive slots must find it).
# Every run lasts at least five rotations of the barrel (the first two are
# warm-up), so the figure is a steady state. Printed per case: built Gb/s
# per node through the network and as % of the link, its 95 % interval over
# batch means, the drift (last third against the first third of the steady
# window), the fragments that missed their slot, the EM's slot changes,
# the simulator's wall time. Goal: >= 90 % of the link on every full-rate
# case; the half-rate link proportional (its node can carry 50 %).
# Usage: [CASES="72 288"] [SEEDS="1 2 3"] [TRAIN=1] [SHIFT=1] [PLOT=out.svg] [ROWS=rows.tsv] [X5=X5.topofile] bench/eb-sweep.sh
#   CASES: tags to run (default: all but 540, 540-sep and 1024-ndr, which
#   take many minutes each; CASES=all for every one). TRAIN: sim.train_packets (default: evb's
#   default, auto: trains of 8 for the slotted builder from 128 hosts up,
#   which give the figures of single packets; TRAIN=1 for packet by packet). SEEDS:
#   run.seed values, each case once per seed (default 1); the row gives the
#   mean and the seeds' range. PLOT: an SVG bar chart of the table. X5: the
#   public PSMN X5 ibnetdiscover dump (infiniband/X5.topofile in
#   github.com/ltaulell/HPC_toolset, not in this repository) adds its case
#   (89 hosts, QDR and DDR, minhop routing, order lid).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet --bin evb
evb=$PWD/target/release/evb
train=${TRAIN:-0}
seeds=${SEEDS:-1}
shift=${SHIFT:-1}
out=$(mktemp -d /tmp/evb-eb-sweep.XXXXXX)
trap 'rm -rf "$out"' EXIT INT TERM

# A 72-host tree with node005's cable at half width (2x instead of 4x EDR).
"$evb" fabric export --topology fat-tree:radix=36,hosts=72 --ibnetdiscover "$out/t72.ibnd" >/dev/null
sed -e '/"node005"/s/4xEDR/2xEDR/' -e '/lid 5 lmc 0 "leaf001"/s/4xEDR/2xEDR/' "$out/t72.ibnd" >"$out/t72-half.ibnd"
grep -c 2xEDR "$out/t72-half.ibnd" | grep -qx 2 || { echo "eb-sweep: the half-width cable was not made" >&2; exit 1; }

# tag | description | duration us | evb sim arguments
cases=(
  "16|16 nodes, one switch|20000|--topology switch:hosts=16"
  "36|36 nodes, 2 full leaves|30000|--topology fat-tree:radix=36,hosts=36 --order ftree"
  "72|72 nodes, 4 full leaves|40000|--topology fat-tree:radix=36,hosts=72 --order ftree"
  "144|144 nodes, 8 full leaves|70000|--topology fat-tree:radix=36,hosts=144 --order ftree"
  "288|288 nodes, 16 full leaves|130000|--topology fat-tree:radix=36,hosts=288 --order ftree"
  "288-sep|288 nodes + EM on a 289th host|130000|--topology fat-tree:radix=36,hosts=289 --order ftree --set nodes.count=288 --set nodes.em=\"separate\""
  "288-sys|288 nodes, hosts' clocks (clock = system)|130000|--topology fat-tree:radix=36,hosts=288 --order ftree --set event_builder.clock=\"system\""
  "100-part|100 nodes, leaves of 18 and a short one of 10|50000|--topology fat-tree:radix=36,hosts=100 --order ftree"
  "163-hdr|LHCb HDR: 163 nodes at 200G, 40-port switches|80000|--config configs/lhcb-163-hdr.toml --topology fat-tree:radix=40,hosts=163,gbps=200 --order ftree"
  "72-half|72 nodes, one cable at half width the file does not tell|200000|--topology $out/t72-half.ibnd --order ftree --set event_builder.slot_us=87.98"
  "540|540 nodes on a 540-host tree (30 full leaves)|240000|--topology fat-tree:radix=36,hosts=540 --order ftree"
  "1024-ndr|1024 nodes at 400G (NDR), 64-port switches|140000|--topology fat-tree:radix=64,hosts=1024,gbps=400 --order ftree"
  "540-sep|540 nodes + EM alone on a 31st leaf (configs/lhcb-540.toml)|240000|--config configs/lhcb-540.toml --topology fat-tree:radix=36,hosts=541 --order ftree"
)
if [ -n "${X5:-}" ]; then
  cases+=("x5|PSMN X5 dump: 89 hosts (23 DDR), 11 switches, minhop, lid|600000|--topology $X5 --routing minhop --order lid")
fi
want=${CASES:-16 36 72 144 288 288-sep 288-sys 100-part 163-hdr 72-half}
[ "$want" = all ] && want=$(printf '%s\n' "${cases[@]}" | cut -d'|' -f1 | tr '\n' ' ')

printf '%-9s %-58s %8s %7s %6s %6s %7s %6s %5s %7s %8s %s\n' case shape "Gb/s" "% link" "+-" drift missed "slot x" chg "wall s" "shift %" "seeds (range)"
# ROWS: a file that keeps the rows for the plot across runs of this script.
rows=${ROWS:-$out/rows.tsv}
[ -n "${ROWS:-}" ] || : >"$rows"
for c in "${cases[@]}"; do
  IFS='|' read -r tag what dur args <<<"$c"
  case " $want " in *" $tag "*) ;; *) continue ;; esac
  jsons=()
  t0=$(date +%s.%N)
  for seed in $seeds; do
    # shellcheck disable=SC2086  # the arguments split as written
    eval "\"$evb\" sim --traffic eb --duration-us $dur --set sim.train_packets=$train --set run.seed=$seed --json \"$out/$tag-$seed.json\" $args" \
      >"$out/$tag-$seed.txt" 2>&1 || { cat "$out/$tag-$seed.txt"; exit 1; }
    jsons+=("$out/$tag-$seed.json")
  done
  t1=$(date +%s.%N)
  ref="-"
  if [ "$shift" = 1 ]; then
    # The same fabric and order under the windowed shift: its steady rate.
    eval "\"$evb\" sim --traffic shift-window --duration-us $((dur / 2)) --json \"$out/$tag-shift.json\" $args" \
      >"$out/$tag-shift.txt" 2>&1 || { cat "$out/$tag-shift.txt"; exit 1; }
    ref=$(python3 -c 'import json,sys; print("%.1f" % (json.load(open(sys.argv[1]))["summary"]["fraction_of_link"]*100))' "$out/$tag-shift.json")
  fi
  python3 - "$tag" "$what" "$(echo "$t1 $t0 ${#jsons[@]}" | awk '{print ($1-$2)/$3}')" "$ref" "$rows" "${jsons[@]}" <<'PY'
import json, sys
tag, what, wall, ref, rows = sys.argv[1:6]
ebs = [json.load(open(p))["summary"]["eb"] for p in sys.argv[6:]]
def mean(f):
    return sum(f(e) for e in ebs) / len(ebs)
fr = [e["network_fraction_of_link"] * 100 for e in ebs]
eb = ebs[0]
sl = eb.get("slots", {})
nominal = eb.get("schedule", {}).get("slot_us") or 0
stretch = sl.get("slot_us_end", nominal) / nominal if nominal and sl.get("slot_us_end") else 1.0
frag = max(sl.get("fragments", 0), 1)
steady = all(e.get("steady", True) for e in ebs)
spread = f"{len(ebs)}: {min(fr):.1f}-{max(fr):.1f}" + ("" if steady else " NOT STEADY")
print(f"{tag:<9} {what:<58} {mean(lambda e: e['network_gbps_per_node']):8.2f} "
      f"{sum(fr)/len(fr):6.1f}% {mean(lambda e: e['built_ci95_gbps']):6.2f} "
      f"{mean(lambda e: e['drift'])*100:+5.1f}% {sl.get('slots_missed', 0)/frag*100:6.2f}% {stretch:6.2f} "
      f"{sl.get('slot_changes', 0):5d} {float(wall):7.1f} {ref:>8} {spread}")
with open(rows, "a") as f:
    f.write(f"{tag}\t{sum(fr)/len(fr):.2f}\t{min(fr):.2f}\t{max(fr):.2f}\t{ref}\n")
PY
done
if [ -n "${PLOT:-}" ]; then
  python3 - "$rows" "$PLOT" <<'PY'
import sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
w, h, left, bottom, top = 80 + 70 * len(rows), 360, 60, 60, 30
plot_h = h - bottom - top
y = lambda pct: top + plot_h * (1 - pct / 100.0)
svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11">',
       f'<text x="{w/2}" y="16" text-anchor="middle" font-size="13">Event building through the network, % of link (bench/eb-sweep.sh)</text>']
for pct in (0, 25, 50, 75, 90, 100):
    svg.append(f'<line x1="{left}" x2="{w-10}" y1="{y(pct)}" y2="{y(pct)}" stroke="#ddd"/>')
    svg.append(f'<text x="{left-5}" y="{y(pct)+4}" text-anchor="end">{pct}</text>')
for i, (tag, m, lo, hi, ref) in enumerate(rows):
    x = left + 10 + 70 * i
    m, lo, hi = float(m), float(lo), float(hi)
    svg.append(f'<rect x="{x}" y="{y(m)}" width="26" height="{y(0)-y(m)}" fill="#3a6ea5"><title>{tag}: {m:.1f} %</title></rect>')
    svg.append(f'<line x1="{x+13}" x2="{x+13}" y1="{y(hi)}" y2="{y(lo)}" stroke="black"/>')
    if ref != "-":
        r = float(ref)
        svg.append(f'<rect x="{x+28}" y="{y(r)}" width="26" height="{y(0)-y(r)}" fill="#bbb"><title>{tag} shift-window: {r:.1f} %</title></rect>')
    svg.append(f'<text x="{x+27}" y="{h-bottom+15}" text-anchor="middle">{tag}</text>')
svg.append(f'<rect x="{left}" y="{h-25}" width="10" height="10" fill="#3a6ea5"/><text x="{left+14}" y="{h-16}">event builder, defaults (mean, seeds range)</text>')
svg.append(f'<rect x="{left+260}" y="{h-25}" width="10" height="10" fill="#bbb"/><text x="{left+274}" y="{h-16}">same fabric, --traffic shift-window</text>')
svg.append('</svg>')
open(sys.argv[2], "w").write("\n".join(svg) + "\n")
print(f"plot: {sys.argv[2]}")
PY
fi
echo "train_packets=$train; missed: fragments that waited a rotation for their slot; slot x: the slot length at the end against the nominal"
