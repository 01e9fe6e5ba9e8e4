#!/usr/bin/env bash
# The whole test suite: installs what is needed, then format, lint and every test.
#
# Time on the 2-core CI machine goes to compiling and to the tests, and the
# order is chosen for that: MinIO's Go build (minutes, for the S3 tests)
# and evb's build against MPICH run in the background at low priority,
# taking the cores the Rust build and the tests leave idle (the tests use
# about one of the two). The tests that need them (names with `s3_` or
# `mpich`) run last, in a second pass, so that no test waits for a build
# while a core idles; each test runs exactly once. `cargo test` builds the
# binaries itself, with the tests' features: a separate `cargo build` first
# would compile the runtime crates and the evb binary a second time with
# other features. Each phase's time is printed (`test.sh: ... s`).
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
phase() { echo "test.sh: $1 done at $((SECONDS - start)) s" >&2; }
./scripts/setup.sh
phase "setup"
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
# The tests' own tools (packaging, Python modules) while the workspace
# compiles; the tests wait for them before they start.
in_background 0 ./scripts/test-deps.sh >target/test-deps.log 2>&1
test_deps=${background[-1]}
minio_log=target/minio-build.log
in_background 19 ./scripts/minio.sh install >"$minio_log" 2>&1
minio_build=${background[-1]}

cargo fmt --all -- --check
cargo clippy --workspace --all-targets --release -- -D warnings
phase "format and lint"
cargo test --release --workspace --no-run
phase "build"
wait "$test_deps" || { cat target/test-deps.log; exit 1; }
# evb linked against MPICH starts from a copy of what was just built.
in_background 10 ./scripts/evb-mpich.sh >target/evb-mpich-build.log 2>&1
mpich_build=${background[-1]}
late=(s3_ mpich)
skips=()
for t in "${late[@]}"; do skips+=(--skip "$t"); done
cargo test --release --workspace -- "${skips[@]}"
phase "tests"
# The tests that needed the background builds (they wait for them too:
# scripts/minio.sh and scripts/evb-mpich.sh take locks). A build that
# failed shows its log here.
wait "$mpich_build" || { cat target/evb-mpich-build.log; exit 1; }
wait "$minio_build" || { cat "$minio_log"; exit 1; }
phase "background builds"
cargo test --release --workspace -- "${late[@]}"
phase "MPICH and S3 tests"
