#!/usr/bin/env bash
# Stops what up.sh started, each by the PID it recorded, and nothing else: first the kubelet,
# then the pods (through crictl on this node's own containerd socket: they are this
# containerd's only), then containerd; then any containerd-shim of this node still alive (PIDs
# read from this containerd's own state directory, /run/drainfs-k8s/containerd), and unmounts
# whatever is left mounted under the node's work and state directories. Keeps logs and state.
#
# Usage: bash scripts/k8s-node/down.sh     (as root)
# Exit codes: 0 nothing of the node is left running or mounted; 1 something is (printed).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/env.sh"

alive() { [[ -f "$work/pids/$1.pid" ]] && kill -0 "$(cat "$work/pids/$1.pid")" 2>/dev/null; }
# stop NAME: SIGTERM, up to 20 s, then SIGKILL
stop() {
  local name=$1 pid
  [[ -f "$work/pids/$name.pid" ]] || return 0
  pid=$(cat "$work/pids/$name.pid")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid"
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    if kill -0 "$pid" 2>/dev/null; then echo "down.sh: $name ($pid) ignored SIGTERM: SIGKILL"; kill -KILL "$pid"; sleep 0.2; fi
    echo "down.sh: stopped $name ($pid)"
  fi
  rm -f "$work/pids/$name.pid"
}

# The kubelet first, so that it restarts no static pod; then this containerd's pods.
if alive kubelet; then stop kubelet; fi
if alive containerd; then
  for p in $(crictl_ pods -q 2>/dev/null); do
    crictl_ stopp "$p" >/dev/null 2>&1 || true
    crictl_ rmp -f "$p" >/dev/null 2>&1 || true
  done
fi
stop containerd
# Shims outlive containerd by design; this node's are under its own state directory.
left=0
for f in "$run"/containerd/io.containerd.runtime.v2.task/*/*/shim.pid; do
  [[ -f "$f" ]] || continue
  pid=$(cat "$f")
  if [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null \
     && tr '\0' ' ' < "/proc/$pid/cmdline" | grep -q -- "-address $sock"; then
    echo "down.sh: stopping shim $pid ($(dirname "$f"))"
    kill -TERM "$pid" || true
    sleep 1
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
  fi
done
# Mounts left by the kubelet (volumes) or containerd (rootfs, shm): deepest first.
{ findmnt -rn -o TARGET | grep -E "^($work|$run)/" || true; } | sort -r | while read -r m; do
  umount "$m" 2>/dev/null || umount -l "$m" || true
done
if findmnt -rn -o TARGET | grep -qE "^($work|$run)/"; then
  echo "down.sh: still mounted:" >&2; findmnt -rn -o TARGET | grep -E "^($work|$run)/" >&2; left=1
fi
for p in "$work"/pids/*.pid; do
  [[ -e "$p" ]] || continue
  if kill -0 "$(cat "$p")" 2>/dev/null; then echo "down.sh: still running: $p" >&2; left=1; fi
done
exit "$left"
