#!/usr/bin/env bash
# Builds gcsfuse v3.11.2's own integration tests (tools/integration_tests/<package>) as test
# binaries, for run.sh. The module comes from the Go module proxy (its zip holds
# tools/integration_tests/); a copy of it gets gcsfuse-v3.11.2-emulator.patch (helpers only:
# unauthenticated storage clients of fake-gcs-server when STORAGE_EMULATOR_HOST is set), then
# `go test -c` per package with the machine's Go (GOTOOLCHAIN=local, CGO_ENABLED=0).
#
# Run as root. Idempotent and cached: a no-op when the stamp (version, patch, Go version,
# packages) matches; concurrent runs wait on a lock. Prints the root on success:
#   $ROOT/src/                                  the patched module (tests run from its package dirs)
#   $ROOT/bin/<package>.test                    the test binaries
#   $ROOT/stamp
# ROOT is $DRAINFS_GCSFUSE_SUITE_ROOT, default ${DRAINFS_LOWERS_ROOT:-/opt/drainfs-lowers}/gcsfuse-suite.
set -euo pipefail

VERSION=3.11.2
MODULE=github.com/googlecloudplatform/gcsfuse/v3
PACKAGES=(operations implicit_dir explicit_dir local_file streaming_writes rename_dir_limit readonly
          concurrent_operations read_large_files)
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PATCH="$HERE/gcsfuse-v$VERSION-emulator.patch"
ROOT="${DRAINFS_GCSFUSE_SUITE_ROOT:-${DRAINFS_LOWERS_ROOT:-/opt/drainfs-lowers}/gcsfuse-suite}"

die() { echo "gcsfuse-suite build: error: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "must run as root (writes $ROOT)"
command -v go >/dev/null || die "go not found (gcsfuse v$VERSION needs go >= 1.26.5)"
command -v patch >/dev/null || die "patch not found (apt-get install patch)"
GO_VER="$(go env GOVERSION)"
case "$GO_VER" in
    go1.2[6-9]*|go1.[3-9][0-9]*) ;;
    *) die "go is $GO_VER; gcsfuse v$VERSION needs go >= 1.26.5 (GOTOOLCHAIN=local: no toolchain download)" ;;
esac
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS="-mod=mod -buildvcs=false"

mkdir -p "$ROOT"
exec 9>"$ROOT/.lock"
flock -w 1800 9 || die "could not lock $ROOT/.lock within 1800 s"

STAMP="gcsfuse v$VERSION; patch $(sha256sum "$PATCH" | cut -d' ' -f1); $GO_VER; ${PACKAGES[*]}"
have_all() {
    local p
    [ -d "$ROOT/src/tools/integration_tests" ] || return 1
    for p in "${PACKAGES[@]}"; do [ -x "$ROOT/bin/$p.test" ] || return 1; done
}
if [ "$(cat "$ROOT/stamp" 2>/dev/null)" = "$STAMP" ] && have_all; then
    echo "$ROOT"
    exit 0
fi

LOG="$(mktemp /tmp/gcsfuse-suite-build.XXXXXX.log)"
trap 'rm -f "$LOG"' EXIT
run() {
    local what="$1"; shift
    if ! "$@" >"$LOG" 2>&1; then
        { echo "gcsfuse-suite build: FAILED: $what"; echo "----- output -----"; tail -n 60 "$LOG"; } >&2
        exit 1
    fi
}

rm -f "$ROOT/stamp"
# Outside any module, so that `go mod download` only fetches (into the module cache).
run "go mod download $MODULE@v$VERSION" sh -c 'cd / && go mod download -json "$1"' sh "$MODULE@v$VERSION"
DIR="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["Dir"])' "$LOG")"
[ -d "$DIR/tools/integration_tests" ] || die "$DIR has no tools/integration_tests"

rm -rf "$ROOT/src.new" "$ROOT/bin.new"
cp -a "$DIR" "$ROOT/src.new"
chmod -R u+w "$ROOT/src.new"
run "apply $PATCH" sh -c 'cd "$1" && patch -p1 --forward --batch <"$2"' sh "$ROOT/src.new" "$PATCH"
mkdir -p "$ROOT/bin.new"
for p in "${PACKAGES[@]}"; do
    run "go test -c ./tools/integration_tests/$p" \
        sh -c 'cd "$1" && go test -c -o "$2" "./tools/integration_tests/$3"' sh "$ROOT/src.new" "$ROOT/bin.new/$p.test" "$p"
done
rm -rf "$ROOT/src" "$ROOT/bin"
mv "$ROOT/src.new" "$ROOT/src"
mv "$ROOT/bin.new" "$ROOT/bin"
echo "$STAMP" >"$ROOT/stamp"
echo "$ROOT"
