#!/usr/bin/env bash
# Benchmark (not a test): the simulator against the published test benches
# (../shared/docs/domain.md, "Published figures"), the table of docs/sim.md's
# "Validation" section. Each row runs the shipped configuration the way a
# user would, several seeds (the seeds draw the fragment sizes, the host
# latencies and the consumers' busy times), and prints the published figure,
# evb's mean with the seeds' range, the gap, and the command.
#
# Usage: [SEEDS="1 2 3"] [DURATION_US=60000] bench/validation.sh
#
# Which rows are predictions and which are fitted is printed with them: the
# busy pattern of the benches' consumers and the software of their
# producers are not published; each is one figure of the shipped
# configurations (configs/distribution-*.toml), fitted to one row and used
# unchanged in the others.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet --bin evb
evb=$PWD/target/release/evb
seeds=${SEEDS:-1 2 3}
dur=${DURATION_US:-60000}
out=$(mktemp -d /tmp/evb-validation.XXXXXX)
trap 'rm -rf "$out"' EXIT INT TERM

# reference | published | kind | jq path of evb's figure | evb sim arguments
rows=(
  "LSEB, 16 EDR nodes, local fragment in memory, per node through the network|95.95|prediction|.summary.eb.network_gbps_per_node|--topology switch:hosts=16 --duration-us 100000"
  "LSEB, 16 EDR nodes, local fragment through the NIC, per node through the network|92.93|prediction|.summary.eb.network_gbps_per_node|--topology switch:hosts=16 --duration-us 100000 --set event_builder.local='\"nic\"'"
  "RoCE distribution 18 -> 14 at 100G, per producer|74|prediction|.summary.consumers.producer_gbps_per_producer|--config configs/distribution-18x14.toml --topology switch:hosts=18 --duration-us $dur"
  "RoCE distribution 18 -> 14 at 100G, per consumer|95.2|prediction|.summary.consumers.consumer_gbps_per_consumer|--config configs/distribution-18x14.toml --topology switch:hosts=18 --duration-us $dur"
  "RoCE distribution 18 -> 14, busy consumers, per producer|63.3|fitted: consumers' busy time|.summary.consumers.producer_gbps_per_producer|--config configs/distribution-18x14-busy.toml --topology switch:hosts=18 --duration-us $dur"
  "RoCE distribution 14 at 100G -> 72 at 25G, busy, per producer|86|fitted: producers' copy rate|.summary.consumers.producer_gbps_per_producer|--config configs/distribution-14x72.toml --topology switch:hosts=14 --duration-us $dur"
)

printf '| %s | %s | %s | %s | %s | %s |\n' reference published "evb (seeds' range)" gap kind command
printf '| --- | --- | --- | --- | --- | --- |\n'
i=0
for r in "${rows[@]}"; do
  IFS='|' read -r what published kind path args <<<"$r"
  i=$((i + 1))
  vals=()
  for seed in $seeds; do
    # shellcheck disable=SC2086  # the arguments split as written
    eval "\"$evb\" sim --traffic eb $args --set run.seed=$seed --json \"$out/$i-$seed.json\"" \
      >"$out/$i-$seed.txt" 2>&1 || { cat "$out/$i-$seed.txt"; exit 1; }
    vals+=("$(jq -r "$path" "$out/$i-$seed.json")")
  done
  python3 - "$what" "$published" "$kind" "evb sim $args" "${vals[@]}" <<'EOF'
import sys
what, published, kind, cmd, *vals = sys.argv[1:]
v = [float(x) for x in vals]
mean = sum(v) / len(v)
gap = (mean / float(published) - 1) * 100
print(f"| {what} | {published} | {mean:.2f} ({min(v):.2f}-{max(v):.2f}) | {gap:+.1f} % | {kind} | `{cmd}` |")
EOF
done
echo "seeds: $seeds"
