#!/usr/bin/env bash
# Builds fi_bw and runs it over loopback: the plain-libfabric reference that
# `evb bench p2p --transport ofi:PROVIDER` is compared with.
#
# usage: bench/peers/fi_bw.sh [PROVIDER] [fi_bw options...]
#   PROVIDER: tcp (default), udp, shm, verbs or an exact `fi_info -l` name.
#   Options go to both sides, e.g. -B (block on the wait fd), -w 16 (window).
# Prints one line per size: size_B MB/s lat_us. Needs libfabric-dev (scripts/setup.sh).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
provider="${1:-tcp}"
shift || true

command -v pkg-config >/dev/null && pkg-config --exists libfabric || {
  echo "fi_bw.sh: libfabric-dev is not installed (run scripts/setup.sh)" >&2; exit 1; }
make -s -C "$here" fi_bw >&2

domain=()
case "$provider" in tcp|udp|tcp\;ofi_rxm|udp\;ofi_rxd) domain=(-d lo) ;; esac
# A free port for the out-of-band address exchange.
port=$(( 40000 + RANDOM % 20000 ))

"$here/fi_bw" -p "$provider" "${domain[@]}" -P "$port" -t 600 "$@" &
server=$!
trap 'kill "$server" 2>/dev/null || true' EXIT
status=0
"$here/fi_bw" -p "$provider" "${domain[@]}" -P "$port" -t 600 "$@" 127.0.0.1 || status=$?
wait "$server" || status=$?
trap - EXIT
exit "$status"
