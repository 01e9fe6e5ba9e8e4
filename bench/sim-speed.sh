#!/usr/bin/env bash
# Benchmark (not a test) of the simulator's speed:
#  1. linear shift on a 648-host 2-level fat tree of 36-port switches:
#     simulated events per wall second, wall seconds per simulated ms;
#  2. the event builder (`eb`) on 512 hosts for 10 ms of simulated time
#     (goal: under 60 s of wall time on a 2-core machine);
#  3. flit-hops per wall second against BookSim2 on the same fat tree
#     (k=18, n=2: 324 hosts, 36-port switches) and uniform traffic at half
#     load, measured in the same run (goal: >= 100x). BookSim2 is not part
#     of evb: build it yourself outside this repository and point BOOKSIM at
#     the binary; without it this part is skipped, saying so.
# Usage: bench/sim-speed.sh            (BOOKSIM=/path/to/booksim for part 3)
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet --bin evb
evb=$PWD/target/release/evb
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
field() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))" "$@"; }

echo "== 1. linear shift, fat-tree:radix=36,hosts=648 (ftree routing, ftree order), 500 us"
"$evb" sim --topology fat-tree:radix=36,hosts=648 --order ftree --traffic shift-fixed --duration-us 500 --json "$out/shift.json" | head -2
field "$out/shift.json" "'events/s: %.3g   wall s per simulated ms: %.2f   (the reference OMNeT++ model: ~5400 s per ms, published)' % (d['summary']['events_processed']/d['summary']['wall_seconds'], d['summary']['wall_seconds']/d['summary']['simulated_seconds']/1000)"

echo "== 2. event builder, fat-tree:radix=36,hosts=512, 10 ms (256 events/MEP, 8 parallel sends)"
"$evb" sim --topology fat-tree:radix=36,hosts=512 --order ftree --traffic eb --duration-us 10000 \
  --set source.events_per_mep=256 --set event_builder.parallel_sends=8 --json "$out/eb.json" | head -3
field "$out/eb.json" "'wall seconds for 10 ms of a 512-host event builder: %.1f (goal < 60)' % d['summary']['wall_seconds']"

echo "== 3. flit-hops per wall second, fat-tree k=18 n=2 (324 hosts), uniform traffic at 0.5 load"
"$evb" sim --topology fat-tree:radix=36,hosts=324 --traffic uniform --load 0.5 --duration-us 2000 --json "$out/u.json" | head -1
# Every 64-byte block leaving a switch port is one flit-hop.
ours=$(field "$out/u.json" "sum(l['utilisation']*d['summary']['link_rate_gbps']*1e9/8*d['summary']['simulated_seconds'] for l in d['links'] if 'port' in l['link'])/64/d['summary']['wall_seconds']")
printf 'evb sim: %.3g flit-hops per wall second\n' "$ours"
if [ -z "${BOOKSIM:-}" ] || [ ! -x "${BOOKSIM:-}" ]; then
  echo "BookSim2: skipped (set BOOKSIM to a booksim binary built outside this repository)"
  exit 0
fi
cat > "$out/booksim.cfg" <<'CFG'
topology = fattree; k = 18; n = 2; routing_function = nca;
num_vcs = 4; vc_buf_size = 64; wait_for_tail_credit = 0;
vc_allocator = separable_input_first; sw_allocator = separable_input_first; alloc_iters = 1;
credit_delay = 2; routing_delay = 0; vc_alloc_delay = 1; sw_alloc_delay = 1; st_final_delay = 1;
input_speedup = 1; output_speedup = 1; internal_speedup = 1.0;
traffic = uniform; injection_rate = 0.5; injection_rate_uses_flits = 1; packet_size = 64;
warmup_periods = 0; sample_period = 2000; max_samples = 1; sim_count = 1; priority = none; watch_out = -;
CFG
start=$(date +%s.%N)
"$BOOKSIM" "$out/booksim.cfg" > "$out/booksim.txt" 2>&1
end=$(date +%s.%N)
python3 - "$out/booksim.txt" "$start" "$end" "$ours" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
accepted = float(re.findall(r"Accepted flit rate average\s*=\s*([0-9.]+)", text)[-1])
wall = float(sys.argv[3]) - float(sys.argv[2])
hosts, cycles = 324, 2000
# Uniform traffic on a 2-level tree of 18 leaves of 18 hosts: a flit crosses
# 3 routers, or 1 when source and destination share a leaf.
hops = 3 * (1 - 17 / 323) + 1 * 17 / 323
booksim = accepted * hosts * cycles * hops / wall
ours = float(sys.argv[4])
print(f"BookSim2: {booksim:.3g} flit-hops per wall second ({accepted:.3f} flits/cycle/node over {cycles} cycles in {wall:.2f} s)")
print(f"ratio evb sim / BookSim2: {ours / booksim:.0f}x (goal >= 100x)")
PY
