#!/usr/bin/env bash
# Builds gcsfuse v3.11.2's own integration tests (tools/integration_tests/<package>) as test
# binaries, for run.sh. The module comes from the Go module proxy (its zip holds
# tools/integration_tests/); a copy of it gets gcsfuse-v3.11.2-emulator.patch (helpers only:
# unauthenticated storage clients of fake-gcs-server when STORAGE_EMULATOR_HOST is set), then
# `go test -c` per package with the machine's Go (GOTOOLCHAIN=local, CGO_ENABLED=0).
#
# Run as root. Idempotent and cached: a no-op when a build with the same stamp (version, patch,
# Go version, packages) exists; concurrent builds wait on $ROOT/.lock. Prints the build's
# directory on success, $ROOT/v-<hash of the stamp>/:
#   src/                   the patched module (tests run from its package dirs)
#   bin/<package>.test     the test binaries
#   stamp
#   .inuse                 run.sh holds a shared flock on it while it runs the tests
# A build is never changed once made; other builds are removed only when nobody holds their
# .inuse. ROOT is $DRAINFS_GCSFUSE_SUITE_ROOT, default ${DRAINFS_LOWERS_ROOT:-/opt/drainfs-lowers}/gcsfuse-suite.
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
V="$ROOT/v-$(printf '%s' "$STAMP" | sha256sum | cut -c1-12)"
have_all() {
    local p
    [ "$(cat "$V/stamp" 2>/dev/null)" = "$STAMP" ] && [ -d "$V/src/tools/integration_tests" ] || return 1
    for p in "${PACKAGES[@]}"; do [ -x "$V/bin/$p.test" ] || return 1; done
}
# prune: other builds nobody is using (run.sh holds a shared lock on .inuse while it runs).
prune() {
    local d
    for d in "$ROOT"/v-* "$ROOT"/src "$ROOT"/bin "$ROOT"/src.new "$ROOT"/bin.new; do
        [ -e "$d" ] && [ "$d" != "$V" ] || continue
        if [ -f "$d/.inuse" ]; then
            ( flock -n -x 8 && rm -rf -- "$d" ) 8<"$d/.inuse" || true
        else
            rm -rf -- "$d"
        fi
    done
    rm -f "$ROOT/stamp"
}
if have_all; then
    prune
    echo "$V"
    exit 0
fi

LOG="$(mktemp /tmp/gcsfuse-suite-build.XXXXXX.log)"
trap 'rm -f "$LOG"; rm -rf "$V.new"' EXIT
run() {
    local what="$1"; shift
    if ! "$@" >"$LOG" 2>&1; then
        { echo "gcsfuse-suite build: FAILED: $what"; echo "----- output -----"; tail -n 60 "$LOG"; } >&2
        exit 1
    fi
}

# Outside any module, so that `go mod download` only fetches (into the module cache).
run "go mod download $MODULE@v$VERSION" sh -c 'cd / && go mod download -json "$1"' sh "$MODULE@v$VERSION"
DIR="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["Dir"])' "$LOG")"
[ -d "$DIR/tools/integration_tests" ] || die "$DIR has no tools/integration_tests"

rm -rf "$V.new" "$V"
mkdir -p "$V.new/bin"
cp -a "$DIR" "$V.new/src"
chmod -R u+w "$V.new/src"
run "apply $PATCH" sh -c 'cd "$1" && patch -p1 --forward --batch <"$2"' sh "$V.new/src" "$PATCH"
for p in "${PACKAGES[@]}"; do
    run "go test -c ./tools/integration_tests/$p" \
        sh -c 'cd "$1" && go test -c -o "$2" "./tools/integration_tests/$3"' sh "$V.new/src" "$V.new/bin/$p.test" "$p"
done
: >"$V.new/.inuse"
echo "$STAMP" >"$V.new/stamp"
mv "$V.new" "$V"
prune
echo "$V"
