#!/usr/bin/env bash
# Runs every cargo-fuzz target for a bounded time (FUZZ_SECONDS, default 60)
# from the committed corpus. Needs a nightly toolchain and cargo-fuzz
# (`cargo install cargo-fuzz`). New corpus entries stay in fuzz/corpus;
# a crash is written to fuzz/artifacts/<target>/ and fails this script.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
secs=${FUZZ_SECONDS:-60}
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
for target in wire_decode config_parse ibnetdiscover_parse lft_parse; do
  echo "== $target for ${secs}s"
  cargo +nightly fuzz run "$target" "corpus/$target" -- -max_total_time="$secs" -max_len=4096 2>&1 | tail -n 4
done
