#!/usr/bin/env bash
# The whole test suite: installs what is needed, then format, lint and every test.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
# MinIO for the event-store S3 tests: built once from its Go module into
# ~/.cache/evb/minio, skipped when already there.
./scripts/minio.sh install
export PATH="$HOME/.cargo/bin:$PATH"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --release -- -D warnings
cargo build --release --workspace --bins
cargo test --release --workspace
