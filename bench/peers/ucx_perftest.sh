#!/usr/bin/env bash
# Peer baseline for `evb bench p2p --transport ucx`: what UCX's own tool,
# Debian's ucx_perftest (package ucx-utils), gets for UCP tag-matching
# bandwidth (tag_bw) between two processes on loopback with a given UCX_TLS.
#
# ucx_perftest reports sender-side bandwidth, which short runs inflate (the
# last sends are counted before they arrive), and it has no duration option:
# each size is first probed briefly, then run with enough iterations for at
# least MIN_SECONDS.
#
# Usage: bench/peers/ucx_perftest.sh [UCX_TLS] [MIN_SECONDS]
#   UCX_TLS      tcp (default), or e.g. posix,sysv,cma,self for shared memory
#   MIN_SECONDS  length of each measured run (default 5)
#   SIZES="64 4096"  environment override of the sizes (default 64 B .. 4 MiB)
#   ERR_HANDLING=1   endpoints with error handling (ucx_perftest -e), as evb
#                    opens them on network transports to detect dead peers
# Prints one line per size on stdout, "<bytes> <MB/s>" (ucx_perftest's MB is
# 2^20 bytes), after a header line starting with '#'; progress goes to stderr.
set -euo pipefail

tls=${1:-tcp}
min_seconds=${2:-5}
command -v ucx_perftest >/dev/null || { echo "ucx_perftest not found: apt-get install ucx-utils (scripts/setup.sh does)" >&2; exit 2; }
[[ $min_seconds =~ ^[0-9]+$ ]] && (( min_seconds >= 1 )) || { echo "MIN_SECONDS must be a whole number >= 1, got '$min_seconds'" >&2; exit 2; }
sizes=${SIZES:-$(for p in $(seq 6 22); do echo $((1 << p)); done)}
port=$((20000 + RANDOM % 20000))
server_pid=""
trap '[ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null; true' EXIT

# One client/server run; prints ucx_perftest's final CSV line:
# iterations,lat50,overhead_avg_us,overhead_overall_us,bw_avg,bw_overall,rate_avg,rate_overall
run_once() {
  local size=$1 iters=$2 limit=$3 warmup=$(( $2 / 20 + 10 ))
  port=$((port + 1))
  UCX_TLS=$tls timeout "$limit" ucx_perftest -p "$port" ${ERR_HANDLING:+-e} >/dev/null 2>&1 &
  server_pid=$!
  for _ in $(seq 100); do   # until the server listens (at most ~5 s)
    ss -ltn "sport = :$port" 2>/dev/null | grep -q ":$port" && break
    sleep 0.05
  done
  local out
  if ! out=$(UCX_TLS=$tls timeout "$limit" ucx_perftest 127.0.0.1 -p "$port" ${ERR_HANDLING:+-e} -t tag_bw \
        -s "$size" -n "$iters" -w "$warmup" -v 2>&1); then
    echo "ucx_perftest failed (UCX_TLS=$tls, size $size, $iters iterations):" >&2
    echo "$out" | tail -5 >&2
    exit 1
  fi
  wait "$server_pid" 2>/dev/null || true
  server_pid=""
  echo "$out" | grep -E '^ *[0-9]+,' | tail -1 | tr -d ' '
}

echo "# ucx_perftest tag_bw, UCX_TLS=$tls, loopback, >= ${min_seconds} s per size; columns: bytes MB/s (ucx_perftest's MB = 2^20 B)"
for size in $sizes; do
  # Probe: about 0.3 s worth, starting from a guess of 1 GB/s.
  iters=$(( 300000000 / size )); (( iters < 200 )) && iters=200; (( iters > 200000 )) && iters=200000
  line=$(run_once "$size" "$iters" 120)
  for attempt in 1 2 3; do
    overhead_us=$(echo "$line" | cut -d, -f4)
    iters=$(awk -v s="$min_seconds" -v o="$overhead_us" 'BEGIN { n = int(s * 1.2e6 / (o > 0 ? o : 1)) + 1; if (n < 100) n = 100; print n }')
    line=$(run_once "$size" "$iters" $(( min_seconds * 10 + 60 )))
    secs=$(echo "$line" | awk -F, '{ printf "%.2f", $1 * $4 / 1e6 }')
    awk -v t="$secs" -v m="$min_seconds" 'BEGIN { exit !(t >= m) }' && break
  done
  echo "#   $size B: $iters iterations in $secs s" >&2
  echo "$line" | awk -F, -v s="$size" '{ printf "%d %.1f\n", s, $6 }'
done
