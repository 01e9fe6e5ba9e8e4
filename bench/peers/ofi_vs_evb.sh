#!/usr/bin/env bash
# `evb bench p2p -t ofi:<PROVIDER>` against fi_bw (bench/peers/fi_bw.c,
# plain libfabric, same RDM tagged recipe) at one message size, back to
# back, ROUNDS times alternating, so that both see the same machine load.
# Prints each pair and the ratio evb / fi_bw, then the median ratio.
#
# Usage: bench/peers/ofi_vs_evb.sh [PROVIDER] [ROUNDS] [SECONDS]
#   PROVIDER  tcp (default), shm, udp, ...
#   ROUNDS    alternations (default 3)
#   SECONDS   length of evb's run; fi_bw streams about as long (default 5)
# Environment: SIZE (default 1048576, a power of two), WINDOW (messages in
# flight, both tools, default 64), PROGRESS (evb's transport.progress:
# blocking (default) or busy; fi_bw busy-polls unless BLOCKING=1, which
# gives it -B), EVB (default target/release/evb).
# Both figures are MB/s (10^6 B) at the receiver's end of the stream: fi_bw
# times until the receiver's acknowledgement, evb counts at the receiver.
set -euo pipefail

provider=${1:-tcp}
rounds=${2:-3}
seconds=${3:-5}
size=${SIZE:-1048576}
window=${WINDOW:-64}
progress=${PROGRESS:-blocking}
here=$(cd "$(dirname "$0")" && pwd)
evb=${EVB:-$here/../../target/release/evb}
[ -x "$evb" ] || { echo "no evb binary at $evb (cargo build --release -p evb-cli, or set EVB)" >&2; exit 2; }
fi_args=(-s "$size" -m "$size" -w "$window")
fi_wait=busy-poll
if [ -n "${BLOCKING:-}" ]; then fi_args+=(-B); fi_wait=blocking; fi

echo "# evb bench p2p -t ofi:$provider vs fi_bw, $size B, window $window, evb $progress progress, fi_bw $fi_wait, $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# round evb_MB/s fi_bw_MB/s ratio"
ratios=()
volume_mib=""
for r in $(seq "$rounds"); do
  e=$("$evb" bench p2p -t "ofi:$provider" --min-size "$size" --max-size "$size" \
        --seconds "$seconds" --window "$window" --progress "$progress" --pingpong 20 \
        | awk -v s="$size" '$1 == s { printf "%.1f", $3 * 1048576 / 1e6 }')
  [ -n "$e" ] || { echo "round $r: evb bench p2p failed" >&2; exit 1; }
  # fi_bw streams a volume, not a time: as much as evb moved in its run.
  [ -n "$volume_mib" ] || volume_mib=$(awk -v e="$e" -v t="$seconds" 'BEGIN { v = int(e * 1e6 * t / 1048576); print (v < 64 ? 64 : v) }')
  f=$("$here/fi_bw.sh" "$provider" "${fi_args[@]}" -V "$volume_mib" 2>/dev/null | awk -v s="$size" '$1 == s { print $2 }')
  [ -n "$f" ] || { echo "round $r: fi_bw failed" >&2; exit 1; }
  ratio=$(awk -v e="$e" -v f="$f" 'BEGIN { printf "%.2f", e / f }')
  ratios+=("$ratio")
  echo "$r $e $f $ratio"
done
median=$(printf '%s\n' "${ratios[@]}" | sort -n | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }')
echo "# median ratio $median (fi_bw streamed $volume_mib MiB a round; load now $(cut -d' ' -f1-3 /proc/loadavg))"
