#!/usr/bin/env bash
# The Dockerfile's build context, checked with Docker's own rules (no container engine needed):
# fuse-tests/dockerctx parses docker/Dockerfile with BuildKit's parser and applies .dockerignore
# with Docker's matcher (moby/patternmatcher), and fails when a COPY/ADD source from the context
# would be missing, as `docker buildx build -f docker/Dockerfile .` would at that step.
# A self-test first shows the checker catching that (a context whose .dockerignore leaves out
# the directory a COPY names) and passing its fix.
#
# Usage: bash docker/check-context.sh      Exit status: 0 when the context holds every source.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TOOLS="${DRAINFS_TOOLS:-/opt/drainfs-tools}"
SRC="$ROOT/fuse-tests/dockerctx"

# Built once per source version (go.mod, go.sum and main.go hashed into the name).
hash=$(cat "$SRC/go.mod" "$SRC/go.sum" "$SRC/main.go" | sha256sum | cut -c1-16)
bin="$TOOLS/dockerctx-$hash"
if [[ ! -x "$bin" ]]; then
  mkdir -p "$TOOLS"
  (cd "$SRC" && GOTOOLCHAIN=local GOFLAGS=-mod=readonly go build -trimpath -o "$bin.tmp" .)
  mv "$bin.tmp" "$bin"
fi

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
mkdir -p "$scratch/docker/image" "$scratch/src"
printf 'FROM scratch\nCOPY src/ /src/\nCOPY docker/image/ /image/\n' >"$scratch/Dockerfile"
touch "$scratch/docker/image/build.sh" "$scratch/src/main.rs"
printf 'docker/\n' >"$scratch/.dockerignore"
rc=0
"$bin" -f "$scratch/Dockerfile" -context "$scratch" >/dev/null 2>&1 || rc=$?
if [[ $rc -ne 1 ]]; then
  echo "FAIL: self-test: a COPY of an ignored directory was not caught (exit $rc)" >&2
  exit 1
fi
printf 'docker/\n!docker/image/\n' >"$scratch/.dockerignore"
"$bin" -f "$scratch/Dockerfile" -context "$scratch" >/dev/null
echo "self-test: an ignored COPY source is caught, its exception passes"

"$bin" -f "$ROOT/docker/Dockerfile" -context "$ROOT"
