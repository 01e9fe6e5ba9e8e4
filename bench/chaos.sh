#!/usr/bin/env bash
# Chaos soak (a benchmark, not a test): `evb chaos` over each transport for
# MINUTES/4 minutes (30 s runs, a fault every 2.5 s on average, seeds 1, 2,
# ...), then one table per transport and one over all: fault kind,
# injected, survived (the built rate came back to 90 % of its rate before
# the fault within the run), events lost per fault, recovery time (median
# and largest of the faults no other fault overlapped), violations.
# Usage: bench/chaos.sh [minutes] [evb chaos options...]   (default 8)
# TRANSPORTS="tcp shm" picks the transports (default: tcp shm ucx:tcp ofi:tcp).
# Needs root for the network faults (a namespace of its own per run).
# NO_BUILD=1 runs target/release/evb as it is; EVB=PATH runs that binary
# instead (a copy, so that a build meanwhile does not change the soak's).
set -euo pipefail
cd "$(dirname "$0")/.."
minutes=${1:-8}
shift || true
transports=${TRANSPORTS:-tcp shm ucx:tcp ofi:tcp}
n=$(wc -w <<<"$transports")
each=$(python3 -c "print(float('$minutes') / $n)")
evb=${EVB:-target/release/evb}
[ "${NO_BUILD:-0}" = 1 ] || [ -n "${EVB:-}" ] || cargo build --release --quiet --bin evb
out=${OUT:-$(mktemp -d)}
echo "chaos: $each minutes per transport ($transports); JSON in $out"
for t in $transports; do
    f="$out/chaos-${t//:/-}.json"
    nice -n 10 "$evb" chaos -t "$t" --minutes "$each" --json "$f" "$@" \
        > "$out/chaos-${t//:/-}.txt" 2> "$out/chaos-${t//:/-}.log" || true
    echo "== $t: $(tail -n 1 "$out/chaos-${t//:/-}.txt" | head -c 200)"
done
python3 - "$out" $transports <<'PY'
import json, sys, statistics
out, transports = sys.argv[1], sys.argv[2:]
def table(name, faults, violations, runs):
    print(f"\n{name}: {runs} runs, {len(faults)} faults, {len(violations)} violations")
    print(f"{'fault kind':<16} {'injected':>8} {'survived':>8} {'lost/fault':>11} {'recovery p50 s':>14} {'max s':>7} {'violations':>10}")
    kinds = sorted({f['kind'] for f in faults})
    for k in kinds:
        fs = [f for f in faults if f['kind'] == k and not f.get('not_done')]
        if not fs:
            continue
        rec = sorted(f['recovery_s'] for f in fs if f['recovery_s'] is not None and not f['overlapped'])
        p50 = f"{rec[len(rec)//2]:.2f}" if rec else "-"
        mx = f"{rec[-1]:.2f}" if rec else "-"
        v = sum(1 for x in violations if x.get('kind') == k)
        lost = sum(f['events_lost'] for f in fs) / len(fs)
        print(f"{k:<16} {len(fs):>8} {sum(f['survived'] for f in fs):>8} {lost:>11.0f} {p50:>14} {mx:>7} {v:>10}")
    other = [x for x in violations if not x.get('kind')]
    print(f"{'(run)':<16} {runs:>8} {'':>8} {'':>11} {'':>14} {'':>7} {len(other):>10}")
    for x in violations[:10]:
        print(f"  seed {x['seed']}: {x['what'][:160]}")
allf, allv, alln = [], [], 0
for t in transports:
    try:
        v = json.load(open(f"{out}/chaos-{t.replace(':', '-')}.json"))
    except (OSError, ValueError) as e:
        print(f"\n{t}: no result ({e})")
        continue
    s = v['summary']
    faults = [f for f in s['faults']]
    table(t, faults, s['violations'], s['runs'])
    allf += faults; allv += s['violations']; alln += s['runs']
table("all transports", allf, allv, alln)
PY
