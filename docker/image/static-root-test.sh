#!/usr/bin/env bash
# The release binary runs in a root that holds nothing but itself:
#   1. `drainfs --version` in a root with only /drainfs: `drainfs 0.1.0+COMMIT`;
#   2. the gcsfuse drop-in: a root with only /gcsfuse (drainfs) and /gcsfuse.real (gcsfuse
#      v3.11.2): `/gcsfuse --version` answers with gcsfuse's version;
#   3. `drainfs run` in a root with only /drainfs (plus the mount points /proc, /dev/fuse,
#      /lower, /mnt): mounts over /lower, serves a write, stops on its exit file with exit 0,
#      and the file is in the lower.
#   4. `drainfs handoff --check-config -- /gcsfuse.real ...` in the drop-in's root (drainfs also
#      at /drainfs: as /gcsfuse it passes every argument to gcsfuse): exit 0.
# Everything happens in a private mount namespace (unshare -m), so no mount outlives the test.
# With --arch arm64: the same checks with the arm64 binaries build.sh staged (drainfs from
# target/images/dist-arm64, gcsfuse from install-lowers.sh --arm64), run under qemu's user-mode
# emulation through binfmt_misc (docker/image/binfmt-arm64.sh registers it).
# Usage (root): docker/image/static-root-test.sh [--arch amd64|arm64] [DRAINFS]
#               (default: target/images/dist/drainfs, this host's)
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
lowers="${DRAINFS_LOWERS_ROOT:-/opt/drainfs-lowers}/bin"
arch=""
if [[ ${1:-} == --arch ]]; then arch=${2:-}; shift 2 || true; fi
case "$arch" in
  "" | "$(dpkg --print-architecture)") bin="${1:-$repo/target/images/dist/drainfs}" gcsfuse="$lowers/gcsfuse" label="" run_opts="" ;;
  arm64)
    bin="${1:-$repo/target/images/dist-arm64/drainfs}" gcsfuse="$lowers/arm64/gcsfuse"
    label=" (arm64, under $(bash "$repo/docker/image/binfmt-arm64.sh"))"
    # qemu 7.2's user-mode emulation passes no FUSE ioctl: not FUSE_DEV_IOC_CLONE (the second
    # and later request threads' own connections) nor the passthrough ones. One thread, no
    # passthrough: the data path of a node kernel older than 6.9.
    run_opts="--threads 1 --passthrough never" ;;
  *) echo "static-root-test.sh: no --arch $arch (amd64, arm64)" >&2; exit 2 ;;
esac
[[ -x "$bin" ]] || { echo "static-root-test.sh: $bin missing: run docker/image/build.sh" >&2; exit 2; }
echo "==> static-root-test.sh: $bin$label"
work=$(mktemp -d "${TMPDIR:-/tmp}/drainfs-static-root-XXXXXX")
trap 'rm -rf "$work"' EXIT
fail=0
ok() { echo "  [ok] $*"; }
bad() { echo "  [FAIL] $*"; fail=1; }

mkdir "$work/empty"
install -m 0755 "$bin" "$work/empty/drainfs"
# VERSION+COMMIT (build.rs): a build in a git checkout names its commit, 12 hex digits.
if out=$(chroot "$work/empty" /drainfs --version 2>&1) \
  && [[ "$out" =~ ^drainfs\ [0-9]+\.[0-9]+\.[0-9]+\+[0-9a-f]{12}(-dirty)?$ ]]; then ok "drainfs --version in an empty root: $out"; else bad "drainfs --version in an empty root: $out"; fi

mkdir "$work/dropin"
install -m 0755 "$bin" "$work/dropin/gcsfuse"
install -m 0755 "$(readlink -f "$gcsfuse")" "$work/dropin/gcsfuse.real"
if out=$(chroot "$work/dropin" /gcsfuse --version 2>&1) && [[ "$out" == "gcsfuse version 3.11.2 "* ]]; then
  ok "/gcsfuse --version (drainfs as the drop-in): $out"
else
  bad "/gcsfuse --version (drainfs as the drop-in): $out"
fi

mkdir -p "$work/run"/{proc,dev,lower,mnt}
install -m 0755 "$bin" "$work/run/drainfs"
touch "$work/run/dev/fuse"
rc=0
unshare -m --propagation private bash -euo pipefail -c '
  r=$1
  mount -t proc proc "$r/proc"
  mount --bind /dev/fuse "$r/dev/fuse"
  mount -t tmpfs lower "$r/lower"
  # shellcheck disable=SC2086 # $2: the options, split
  chroot "$r" /drainfs run --lower /lower --mountpoint /mnt --exit-file /exit \
      --ready-file /ready --grace-period 20s $2 >"$r/log" 2>&1 &
  pid=$!
  for _ in $(seq 200); do [[ -e "$r/ready" ]] && break; sleep 0.1; done
  [[ -e "$r/ready" ]] || { echo "never ready"; cat "$r/log"; exit 3; }
  echo "written through drainfs" >"$r/mnt/hello.txt"
  : >"$r/exit"
  rc=0; wait "$pid" || rc=$?
  [[ $rc -eq 0 ]] || { echo "drainfs exited $rc"; cat "$r/log"; exit 4; }
  [[ "$(cat "$r/lower/hello.txt")" == "written through drainfs" ]] || { echo "not in the lower"; exit 5; }
  ! grep -q " $r/mnt " /proc/self/mounts || { echo "mount left behind"; exit 6; }
' bash "$work/run" "$run_opts" || rc=$?
if ((rc == 0)); then ok "drainfs run ${run_opts:+$run_opts }in a root holding only itself: mounted, served a write, exit 0 on its exit file"; else bad "drainfs run ${run_opts:+$run_opts }in a root holding only itself (step $rc)"; fi

# The drop-in's argv as GKE's sidecar mounter builds it (a /dev/fd/N mountpoint, its flags),
# checked without starting gcsfuse.
# As /gcsfuse drainfs is the drop-in and hands every argument to gcsfuse: its own verbs answer
# under another name.
install -m 0755 "$bin" "$work/dropin/drainfs"
if out=$(chroot "$work/dropin" /drainfs handoff --check-config -- /gcsfuse.real --app-name gke-gcs-fuse-csi \
    --foreground --uid 0 --gid 0 --prometheus-port 0 bucket /dev/fd/3 2>&1) \
  && [[ "$out" == *'"/gcsfuse.real"'* ]]; then
  ok "drainfs handoff --check-config for the sidecar mounter's gcsfuse argv: exit 0, the command printed"
else
  bad "drainfs handoff --check-config for the sidecar mounter's gcsfuse argv: $out"
fi
exit $fail
