#!/usr/bin/env bash
# The release binary runs in a root that holds nothing but itself:
#   1. `drainfs --version` in a root with only /drainfs: `drainfs 0.1.0+COMMIT`;
#   2. the gcsfuse drop-in: a root with only /gcsfuse (drainfs) and /gcsfuse.real (gcsfuse
#      v3.11.2): `/gcsfuse --version` answers with gcsfuse's version;
#   3. `drainfs run` in a root with only /drainfs (plus the mount points /proc, /dev/fuse,
#      /lower, /mnt): mounts over /lower, serves a write, stops on its exit file with exit 0,
#      and the file is in the lower.
# Everything happens in a private mount namespace (unshare -m), so no mount outlives the test.
# Usage (root): docker/image/static-root-test.sh [DRAINFS]   (default: target/images/dist/drainfs)
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
bin="${1:-$repo/target/images/dist/drainfs}"
gcsfuse="${DRAINFS_LOWERS_ROOT:-/opt/drainfs-lowers}/bin/gcsfuse"
[[ -x "$bin" ]] || { echo "static-root-test.sh: $bin missing: run docker/image/build.sh" >&2; exit 2; }
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
  chroot "$r" /drainfs run --lower /lower --mountpoint /mnt --exit-file /exit \
      --ready-file /ready --grace-period 20s >"$r/log" 2>&1 &
  pid=$!
  for _ in $(seq 200); do [[ -e "$r/ready" ]] && break; sleep 0.1; done
  [[ -e "$r/ready" ]] || { echo "never ready"; cat "$r/log"; exit 3; }
  echo "written through drainfs" >"$r/mnt/hello.txt"
  : >"$r/exit"
  rc=0; wait "$pid" || rc=$?
  [[ $rc -eq 0 ]] || { echo "drainfs exited $rc"; cat "$r/log"; exit 4; }
  [[ "$(cat "$r/lower/hello.txt")" == "written through drainfs" ]] || { echo "not in the lower"; exit 5; }
  ! grep -q " $r/mnt " /proc/self/mounts || { echo "mount left behind"; exit 6; }
' bash "$work/run" || rc=$?
if ((rc == 0)); then ok "drainfs run in a root holding only itself: mounted, served a write, exit 0 on its exit file"; else bad "drainfs run in a root holding only itself (step $rc)"; fi
exit $fail
