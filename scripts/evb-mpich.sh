#!/usr/bin/env bash
# Builds evb linked against MPICH (Debian's libmpich-dev) and prints the
# binary's path: target/mpich/release/evb.
#
# The `mpi` crate binds the MPI that `mpicc` names when it is built, and
# Debian's default mpicc is OpenMPI's; MPI libraries differ in their ABI, so
# MPICH needs a build of its own. The first build starts from a copy of
# target/release, so that only the crates that link MPI are rebuilt.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
command -v mpicc.mpich >/dev/null || {
  echo "evb-mpich: mpicc.mpich is missing (scripts/setup.sh installs libmpich-dev)" >&2
  exit 1
}
dir=target/mpich
mkdir -p target
# Tests call this concurrently: one copies and builds, the others wait.
exec 9>target/.evb-mpich.lock
flock 9
if [ ! -d "$dir/release" ] && [ -d target/release ]; then
  # Copied aside and renamed only once complete and rid of OpenMPI's
  # bindings: a copy cut short (target/release changing under it) must not
  # be taken for a finished one by the next call.
  mkdir -p "$dir"
  rm -rf "$dir/release.partial"
  cp -a target/release "$dir/release.partial"
  # The copied MPI bindings were generated for OpenMPI: make cargo redo them
  # (mpi-sys does not rebuild when MPICC changes).
  rm -rf "$dir"/release.partial/.fingerprint/mpi-sys-* "$dir"/release.partial/build/mpi-sys-*
  mv "$dir/release.partial" "$dir/release"
fi
# Called from a test, this process has the variables cargo sets for the
# crate under test (CARGO_MANIFEST_DIR, CARGO_PKG_*, ...); some build scripts
# (ring's) track them, so the build would redo ring and everything above it
# (a minute) each time a caller's differ: build without them.
for v in $(compgen -e | grep -E '^CARGO_(MANIFEST_|PKG_|CRATE_|BIN_|PRIMARY_PACKAGE|TARGET_TMPDIR|RUSTC_CURRENT_DIR)'); do
  unset "$v"
done
MPICC=mpicc.mpich CARGO_TARGET_DIR="$dir" cargo build --release --quiet --bin evb >&2
bin="$PWD/$dir/release/evb"
libs=$(ldd "$bin")
if ! grep -q 'libmpich\.so' <<<"$libs" || grep -q 'libmpi\.so' <<<"$libs"; then
  echo "evb-mpich: $bin is not linked against MPICH alone:" >&2
  grep -i mpi <<<"$libs" >&2
  exit 1
fi
echo "$bin"
