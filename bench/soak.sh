#!/usr/bin/env bash
# Soak (a benchmark, not a test): a 4-node event builder for a long time.
# Reports resident memory of the node processes at the start (after 10 s of
# warm-up) and at the end (goal: flat within 5%), built throughput per 10 s
# window (min / median / max), and the loss accounting (goal: zero).
# Usage: bench/soak.sh [minutes] [evb run options...]   (default 30 minutes)
# A paced readout (`--set source.mep_rate_hz=R`) soaks at a steady rate and
# leaves CPU to the rest of a shared machine; unpaced, it runs flat out.
set -euo pipefail
cd "$(dirname "$0")/.."
minutes=${1:-30}
shift || true
cargo build --release --quiet --bin evb
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
secs=$(python3 -c "print(float('$minutes') * 60)")
target/release/evb run --nodes 4 --duration "$secs" --progress never --json "$out/soak.json" "$@" > "$out/summary.txt" || true
tail -n 4 "$out/summary.txt"
python3 - "$out/soak.json" <<'PY'
import json, statistics, sys
d = json.load(open(sys.argv[1]))
t = d["timeline"]
s = d["summary"]
warm = [x for x in t if x["t_s"] >= 10] or t
rss0, rss1 = warm[0]["rss_bytes"], t[-1]["rss_bytes"]
windows = {}
for x in t:
    windows.setdefault(int(x["t_s"] // 10), []).append(x["built_gbps"])
full = [sum(v) / len(v) for k, v in sorted(windows.items()) if len(v) >= 9]
print(f"resident memory: {rss0 / 2**20:.1f} MiB after 10 s, {rss1 / 2**20:.1f} MiB at the end ({(rss1 - rss0) / max(rss0, 1) * 100:+.1f}%, goal within 5%)")
# Bounded bookkeeping fills during the first minutes (the BUs' filter of
# 8192 finished MEPs, histogram pages, hash tables): growth after that is
# what would be a leak.
later = [x for x in t if x["t_s"] >= 120]
if later and t[-1]["t_s"] >= 240:
    rss2 = later[0]["rss_bytes"]
    print(f"resident memory: {rss2 / 2**20:.1f} MiB after 120 s, {rss1 / 2**20:.1f} MiB at the end ({(rss1 - rss2) / max(rss2, 1) * 100:+.1f}%)")
if full:
    print(f"built Gb/s per 10 s window ({len(full)} windows): min {min(full):.2f}, median {statistics.median(full):.2f}, max {max(full):.2f}")
if s.get("throttle_episodes", 0) or s.get("events_vetoed", 0):
    print(f"paced readout: throttled {s['throttled_s']:.3f} s in {s['throttle_episodes']} episodes, {s['events_vetoed']} events vetoed at the source")
print(f"events: generated {s['events_generated']}, built {s['events_built']}, incomplete {s['events_incomplete']}, corrupt {s['events_corrupt']}, lost {s['events_lost']}")
PY
