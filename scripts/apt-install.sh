#!/usr/bin/env bash
# Installs the Debian packages named that are not installed yet (one
# apt-get run for all of them; nothing when all are there). Used by
# scripts/setup.sh and scripts/test-deps.sh.
#   scripts/apt-install.sh WHO PACKAGE...   (WHO prefixes the message)
set -euo pipefail
who=$1
shift
missing=()
for p in "$@"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "$who: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
