#!/usr/bin/env bash
# The whole test suite: installs what is needed, then format, lint and every test.
#
# Time on the 2-core CI machine goes to compiling and to the tests, and the
# order is chosen for that: MinIO's Go build (minutes, for the S3 tests)
# runs in the background at low priority from the start, taking the cores
# the Rust build and the tests leave idle; the S3 tests wait for it
# (scripts/minio.sh takes a lock). `cargo test` builds the binaries itself,
# with the tests' features: a separate `cargo build` first would compile
# the runtime crates and the evb binary a second time with other features.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
export PATH="$HOME/.cargo/bin:$PATH"

# Background builds run at a low CPU priority (NICE) and the idle I/O
# class, so that the tests' timing is not disturbed, each in a process
# group of its own that a failed or interrupted run stops whole.
background=()
stop_background() {
  for pid in "${background[@]}"; do kill -- "-$pid" 2>/dev/null || true; done
}
trap stop_background EXIT
in_background() { local nice=$1; shift; setsid nice -n "$nice" ionice -c 3 "$@" & background+=("$!"); }

mkdir -p target
minio_log=target/minio-build.log
in_background 19 ./scripts/minio.sh install >"$minio_log" 2>&1
minio_build=${background[-1]}

cargo fmt --all -- --check
cargo clippy --workspace --all-targets --release -- -D warnings
cargo test --release --workspace --no-run
# evb linked against MPICH (for the MPICH tests) starts from a copy of what
# was just built; built now in the background, it too takes idle cores while
# the first tests run, and the MPICH tests wait for it. Those come early
# (tests/cluster.rs is evb-cli's second test binary, the S3 tests among its last):
# a higher priority than MinIO's build, still below the tests'.
in_background 10 ./scripts/evb-mpich.sh >target/evb-mpich-build.log 2>&1
cargo test --release --workspace

# The S3 tests waited for MinIO; a build that failed shows its log here.
wait "$minio_build" || { cat "$minio_log"; exit 1; }
