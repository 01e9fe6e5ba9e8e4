#!/usr/bin/env bash
# Installs everything evb needs to build, run and test on Debian 12 (run as root).
# Safe to run again: it only installs what is missing.
set -euo pipefail

APT_PACKAGES=(
  build-essential pkg-config ca-certificates curl git
  iperf3                               # bench/: TCP peer for the event builder
  fonts-dejavu-core                    # text in PNG and SVG plots (evb-plot, evb fabric)
  opensm ibsim-utils infiniband-diags  # fabric tests against the real subnet manager
  libopenmpi-dev openmpi-bin           # the mpi transport, cluster launch tests (mpirun); bench/: the MPI_Alltoall peer
  libmpich-dev mpich                   # the same under MPICH (scripts/evb-mpich.sh builds evb against it; OpenMPI stays the default mpicc)
  libclang-dev clang                   # bindgen: the MPI bindings (mpi-sys) and UCX headers (evb-ucx)
  chromium                             # evb report tests: the HTML report in a real browser
  prometheus                           # metrics test: the real scraper
  iproute2 nftables                    # network-fault tests: namespaces, veth, packet loss
  libucx-dev ucx-utils                 # the ucx transport; bench/peers: ucx_perftest
  libfabric-dev libfabric-bin           # the ofi transport (bindgen against libfabric), fi_info; bench/peers/fi_bw.c
  slurmctld slurmd slurm-client munge   # cluster launch tests: a one-node Slurm and real srun (tests/cli/slurm.rs)
  python3                              # the evb Python package
)

"$(dirname "$0")/apt-install.sh" setup "${APT_PACKAGES[@]}"

if ! command -v cargo >/dev/null 2>&1; then
  [ -x "$HOME/.cargo/bin/cargo" ] || {
    echo "setup: no Rust toolchain; installing it with rustup"
    curl -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal --component clippy,rustfmt
  }
fi

# What only the tests need is installed by scripts/test.sh, not here, so
# that setting up to run `evb run` stays quick: MinIO (the real S3 server
# of the store tests, built from its Go module), the packaging tools and
# the Python modules of the libevb tests.
