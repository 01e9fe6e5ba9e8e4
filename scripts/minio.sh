#!/usr/bin/env bash
# MinIO, a real S3-compatible server, for the event store's S3 tests.
#
#   scripts/minio.sh install          build MinIO from its Go module into the cache (once;
#                                     a second caller waits for a build under way)
#   scripts/minio.sh path             print the binary's path (exit 1 if not installed)
#   scripts/minio.sh start DATA_DIR   start it on a free loopback port; prints
#                                     `endpoint=http://127.0.0.1:PORT pid=PID`
#
# Built from source with the Go toolchain because the only registries reachable
# from the build machines are package registries (no release downloads). The
# version is pinned so every machine tests against the same server; the cache
# directory is keyed by it, so changing MINIO_VERSION rebuilds.
set -euo pipefail

MINIO_VERSION="${MINIO_VERSION:-v0.0.0-20260212201848-7aac2a2c5b7c}"
CACHE_DIR="${EVB_MINIO_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/evb/minio}/$MINIO_VERSION"
BIN="$CACHE_DIR/minio"
# Credentials of the throwaway test server (loopback only, temp data dir).
export MINIO_ROOT_USER="${MINIO_ROOT_USER:-evbtest}"
export MINIO_ROOT_PASSWORD="${MINIO_ROOT_PASSWORD:-evbtest-secret}"

find_go() {
  if command -v go >/dev/null 2>&1; then command -v go; return; fi
  for g in /usr/local/go/bin/go "$HOME/go/bin/go" /usr/lib/go/bin/go; do
    [ -x "$g" ] && { echo "$g"; return; }
  done
  echo "minio.sh: no Go toolchain found (need Go >= 1.24 to build MinIO $MINIO_VERSION)" >&2
  exit 1
}

install() {
  if [ -x "$BIN" ]; then
    return 0
  fi
  # One build at a time: scripts/test.sh starts one in the background and
  # the S3 tests call `install` too; they wait here for it to end.
  mkdir -p "$CACHE_DIR"
  exec 9>"$CACHE_DIR.lock"
  flock 9
  if [ -x "$BIN" ]; then
    return 0
  fi
  local go; go="$(find_go)"
  echo "minio.sh: building MinIO $MINIO_VERSION with $("$go" version) (takes minutes, once)" >&2
  local start=$SECONDS
  # Build into a temp dir then move, so an interrupted build never leaves a
  # half-written binary that `install` would take as done.
  local tmp; tmp="$(mktemp -d "$CACHE_DIR/build.XXXXXX")"
  GOBIN="$tmp" GOFLAGS="${GOFLAGS:--buildvcs=false}" CGO_ENABLED=0 \
    "$go" install "github.com/minio/minio@$MINIO_VERSION"
  mv "$tmp/minio" "$BIN"
  rmdir "$tmp"
  echo "minio.sh: built $BIN in $((SECONDS - start)) s" >&2
}

free_port() {
  # Ask the kernel for a free loopback port (a small race with other users
  # of the port space is acceptable for tests).
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])' 2>/dev/null \
    || echo $((20000 + RANDOM % 20000))
}

start() {
  local data="${1:?usage: minio.sh start DATA_DIR}"
  [ -x "$BIN" ] || { echo "minio.sh: MinIO is not installed ($BIN); run scripts/minio.sh install" >&2; exit 1; }
  mkdir -p "$data"
  local port console
  port="$(free_port)"; console="$(free_port)"
  "$BIN" server --quiet --address "127.0.0.1:$port" --console-address "127.0.0.1:$console" "$data" \
    >"$data.log" 2>&1 &
  local pid=$!
  for _ in $(seq 1 300); do
    if curl -sf "http://127.0.0.1:$port/minio/health/live" >/dev/null 2>&1; then
      echo "endpoint=http://127.0.0.1:$port pid=$pid"
      return 0
    fi
    kill -0 "$pid" 2>/dev/null || { echo "minio.sh: MinIO exited; log:" >&2; cat "$data.log" >&2; exit 1; }
    sleep 0.1
  done
  kill "$pid" 2>/dev/null || true
  echo "minio.sh: MinIO did not answer on port $port within 30 s; log:" >&2
  cat "$data.log" >&2
  exit 1
}

case "${1:-}" in
  install) install ;;
  path) [ -x "$BIN" ] && echo "$BIN" || { echo "minio.sh: MinIO is not installed ($BIN); run scripts/minio.sh install" >&2; exit 1; } ;;
  start) shift; start "$@" ;;
  *) echo "usage: scripts/minio.sh install|path|start DATA_DIR" >&2; exit 2 ;;
esac
