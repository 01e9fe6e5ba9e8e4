#!/usr/bin/env bash
# How fast an external consumer (libevb) takes built batches, against
# evb's own Filter Unit in the same run: `evb run -n 2` with one consumer,
# over shm and tcp, the consumer being in turn
#   evb     evb's own FU process (`--consumers 1`, no busy time);
#   c       the C example (crates/evb-ffi/examples/c/consumer.c --no-check:
#           takes each batch, reads its description, releases it);
#   python  the Python example (crates/evb-py/examples/consumer.py
#           --no-check: takes each batch and reads the first event number
#           of every fragment in place with NumPy, zero copy).
# Rounds alternate the three; each line gives the medians of the consumed
# rate (Gb/s of batch payload, and batches/s), its ratio to evb's own, and
# the consumer process's CPU seconds per GB consumed (less sensitive than
# the rate to whatever else the machine runs).
#
#   bench/consumer-rate.sh [seconds=8] [rounds=3] [transports="shm tcp"]
#
# Needs a release build of evb, libevb and the Python module:
#   cargo build --release -p evb-cli -p evb-ffi -p evb-py
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-8}
rounds=${2:-3}
transports=${3:-shm tcp}
evb=target/release/evb
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# libevb installed under a scratch root, the C example built against it.
scripts/package.sh --prebuilt target/release --stage-only "$work/root" >/dev/null
multiarch=$(gcc -print-multiarch)
libdir=$work/root/usr/lib/$multiarch
cc -O2 crates/evb-ffi/examples/c/consumer.c \
  $(PKG_CONFIG_SYSROOT_DIR="$work/root" PKG_CONFIG_LIBDIR="$libdir/pkgconfig" pkg-config --cflags --libs evb) \
  -Wl,-rpath,"$libdir" -o "$work/consumer"
export PYTHONPATH=$work/root/usr/lib/python3/dist-packages

# run KIND TRANSPORT: one run; prints "gbps batches_per_s cpu_s_per_gb"
# (the consumer process's CPU time per GB it consumed).
run() {
  local kind=$1 t=$2 n=$((RANDOM))
  local json=$work/$kind-$t-$n.json rdv=$work/rdv-$n
  local common=(run -n 2 -d "$secs" -t "$t" --progress never --json "$json")
  case $kind in
    evb) "$evb" "${common[@]}" --consumers 1 >/dev/null ;;
    c | python)
      mkdir -p "$rdv"
      "$evb" "${common[@]}" --external-consumers 1 --rendezvous "$rdv" >/dev/null 2>&1 &
      local launcher=$!
      if [ "$kind" = c ]; then
        "$work/consumer" "$rdv" --no-check >/dev/null
      else
        python3 crates/evb-py/examples/consumer.py "$rdv" --no-check >/dev/null
      fi
      wait "$launcher"
      ;;
  esac
  python3 - "$json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))["summary"]
c = s["consumers"]
fu = json.load(open(sys.argv[1]))["nodes"][-1]
cpu = (fu["cpu_user_s"] + fu["cpu_system_s"]) / max(fu["bytes_consumed"] / 1e9, 1e-9)
print(f'{c["consumer_gbps"]:.3f} {c["batches_consumed"] / s["duration_s"]:.1f} {cpu:.3f}')
PY
}

median() { sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }

printf '%-4s %-7s %10s %11s %9s %12s   (%s s runs, %s rounds, medians)\n' \
  transport consumer "Gb/s" "batches/s" "vs evb" "CPU s/GB" "$secs" "$rounds"
for t in $transports; do
  declare -A gbps=() bps=() cpu=()
  for ((r = 0; r < rounds; r++)); do
    for kind in evb c python; do
      read -r g b u < <(run "$kind" "$t")
      gbps[$kind]+="$g "
      bps[$kind]+="$b "
      cpu[$kind]+="$u "
    done
  done
  base=$(tr ' ' '\n' <<<"${gbps[evb]}" | grep . | median)
  for kind in evb c python; do
    g=$(tr ' ' '\n' <<<"${gbps[$kind]}" | grep . | median)
    b=$(tr ' ' '\n' <<<"${bps[$kind]}" | grep . | median)
    u=$(tr ' ' '\n' <<<"${cpu[$kind]}" | grep . | median)
    printf '%-9s %-7s %10s %11s %8.0f%% %12s   [%s]\n' "$t" "$kind" "$g" "$b" \
      "$(awk -v g="$g" -v b="$base" 'BEGIN {print 100 * g / b}')" "$u" "${gbps[$kind]% }"
  done
  unset gbps bps cpu
done
