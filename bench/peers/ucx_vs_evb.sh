#!/usr/bin/env bash
# `evb bench p2p -t ucx:<UCX_TLS>` against UCX's own ucx_perftest (tag_bw,
# via ucx_perftest.sh) at one message size, back to back, ROUNDS times
# alternating, so that both see the same machine load. Prints each pair and
# the ratio evb / ucx_perftest, then the median ratio.
#
# Usage: bench/peers/ucx_vs_evb.sh [UCX_TLS] [ROUNDS] [SECONDS]
#   UCX_TLS  tcp (default), or e.g. posix,cma,self
#   ROUNDS   alternations (default 3)
#   SECONDS  length of each run, both tools (default 5; ucx_perftest >= it)
# Environment: SIZE (default 1048576, a power of two), WINDOW (evb's
# messages in flight, default 64), PROGRESS (evb's transport.progress:
# blocking (default) or busy; ucx_perftest busy-polls, so on a loaded
# machine busy is the like-for-like one), SPLIT=BYTES (each round also runs
# evb with EVB_UCX_SPLIT_BODY_FROM=BYTES: bodies that large sent as their
# own contiguous message; the default sends one iov message), EVB (default
# target/release/evb).
# ERR_HANDLING: 1 runs ucx_perftest with error handling (-e), 0 without.
# The default is what evb does on these transports: it opens its endpoints
# with peer failure detection (UCP_ERR_HANDLING_MODE_PEER) wherever UCX_TLS
# names a network transport, and without it on shared memory only (where
# UCX 1.13 cannot do it). Over tcp that choice changes what UCX does:
# without error handling it adds rendezvous lanes (put zero-copy, one per
# interface: on loopback lo and eth0, two TCP connections to the same
# kernel), with it one lane and active-message rendezvous
# (`UCX_TLS=tcp ucx_info -e -u t -P inter` against `-u te`).
# Both figures are MiB/s (2^20 B): evb's at the receiver, ucx_perftest's at
# the sender (hence runs of >= 5 s).
set -euo pipefail

tls=${1:-tcp}
rounds=${2:-3}
seconds=${3:-5}
size=${SIZE:-1048576}
window=${WINDOW:-64}
progress=${PROGRESS:-blocking}
here=$(cd "$(dirname "$0")" && pwd)
evb=${EVB:-$here/../../target/release/evb}
[ -x "$evb" ] || { echo "no evb binary at $evb (cargo build --release -p evb-cli, or set EVB)" >&2; exit 2; }
export UCX_LOG_LEVEL=${UCX_LOG_LEVEL:-error}
# evb's rule (crates/evb-transport/src/ucx.rs): shared memory only
# when every word of UCX_TLS is a shared-memory transport.
shm_only=1
for t in ${tls//,/ }; do
  case $t in posix|sysv|cma|self|sm|shm|knem|xpmem) ;; *) shm_only=0 ;; esac
done
case ${ERR_HANDLING:-default} in
  default) if (( shm_only )); then ERR_HANDLING=""; else ERR_HANDLING=1; fi ;;
  0) ERR_HANDLING="" ;;
  *) ERR_HANDLING=1 ;;
esac
export ERR_HANDLING

echo "# evb bench p2p -t ucx:$tls vs ucx_perftest tag_bw${ERR_HANDLING:+ -e}, $size B, $seconds s runs, window $window, $progress progress, $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# round evb_MiB/s ucx_perftest_MiB/s ratio${SPLIT:+ evb_split_MiB/s split_ratio}"
ratios=()
p2p() {
  "$evb" bench p2p -t "ucx:$tls" --min-size "$size" --max-size "$size" \
        --seconds "$seconds" --window "$window" --progress "$progress" --pingpong 20 | awk -v s="$size" '$1 == s { print $3 }'
}
for r in $(seq "$rounds"); do
  e=$(EVB_UCX_SPLIT_BODY_FROM=never p2p)
  split=""
  [ -n "${SPLIT:-}" ] && split=$(EVB_UCX_SPLIT_BODY_FROM=$SPLIT p2p)
  p=$(SIZES=$size "$here/ucx_perftest.sh" "$tls" "$seconds" 2>/dev/null | awk '!/^#/ { print $2 }')
  [ -n "$e" ] && [ -n "$p" ] || { echo "round $r: a run failed (evb '$e', ucx_perftest '$p')" >&2; exit 1; }
  ratio=$(awk -v e="$e" -v p="$p" 'BEGIN { printf "%.2f", e / p }')
  ratios+=("$ratio")
  if [ -n "${SPLIT:-}" ]; then
    echo "$r $e $p $ratio $split $(awk -v e="$split" -v p="$p" 'BEGIN { printf "%.2f", e / p }')"
  else
    echo "$r $e $p $ratio"
  fi
done
median=$(printf '%s\n' "${ratios[@]}" | sort -n | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }')
echo "# median ratio $median (load now $(cut -d' ' -f1-3 /proc/loadavg))"
