#!/usr/bin/env bash
# Starts a single-node standalone kubelet (no API server: static pods from a manifest
# directory) and its CRI runtime, containerd, with their own config, root, state and socket:
#   $K8S_NODE_WORK (default /opt/drainfs-k8s/work): containerd's root, the kubelet's root-dir,
#       manifests/ (the static pod path), logs/ (containerd.log, kubelet.log), pids/ (one
#       file per process this script started; down.sh stops exactly those)
#   /run/drainfs-k8s: containerd's state and its socket containerd.sock
# Pods are host-network (no CNI is configured). The pause image and the test image
# (images.sh) are imported into containerd's k8s.io namespace; containerd's CRI pins the
# pause image as the sandbox image. The kubelet serves /pods on 127.0.0.1:$K8S_NODE_RO_PORT
# (read-only port, default 10255) and its authenticated port 127.0.0.1:10250 with anonymous
# access allowed (loopback only).
# Needs: bash scripts/k8s-node/install.sh first.
#
# Usage: bash scripts/k8s-node/up.sh [--containerd-only]      (as root)
# Exit codes: 0 containerd and the kubelet are up (the kubelet's /healthz answers ok);
#   1 one of them did not come up (the end of its log is printed); 2 already running.
set -euo pipefail
only_containerd=0
[[ "${1:-}" == --containerd-only ]] && only_containerd=1
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/env.sh"
for b in containerd containerd-shim-runc-v2 ctr crictl runc; do
  command -v "$b" >/dev/null || { echo "up.sh: $b missing: run scripts/k8s-node/install.sh" >&2; exit 1; }
done
for p in "$work"/pids/*.pid; do
  [[ -e "$p" ]] || continue
  if kill -0 "$(cat "$p")" 2>/dev/null; then
    echo "up.sh: $(basename "$p" .pid) is running (pid $(cat "$p")): run down.sh first" >&2; exit 2
  fi
  rm -f "$p"
done
mkdir -p "$work"/{containerd,kubelet,manifests,logs,pids,etc,hostpath} "$run"

cat > "$work/etc/containerd.toml" <<TOML
# Written by scripts/k8s-node/up.sh
version = 3
root = "$work/containerd"
state = "$run/containerd"
disabled_plugins = ["io.containerd.nri.v1.nri", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.blockfile", "io.containerd.tracing.processor.v1.otlp"]

[grpc]
  address = "$sock"
[ttrpc]
  address = "$run/containerd.sock.ttrpc"
[debug]
  level = "info"

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "$pause_image"
# This sandbox drops CAP_SYS_RESOURCE (CapEff 000001fffeffffff), so no process may lower its
# oom_score_adj below its parent's; runc fails on the pause container's -998 ("nsexec: failed
# to update /proc/self/oom_score_adj: Permission denied") unless CRI clamps the value to
# containerd's own, which is what this option (meant for rootless) does.
[plugins.'io.containerd.cri.v1.runtime']
  restrict_oom_score_adj = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = "${K8S_NODE_RUNC:-$(command -v runc)}"
        SystemdCgroup = false
        Root = "$run/runc"
[plugins.'io.containerd.grpc.v1.cri']
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
TOML

cat > "$work/etc/kubelet.yaml" <<YAML
# Written by scripts/k8s-node/up.sh
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
staticPodPath: $work/manifests
fileCheckFrequency: 1s
containerRuntimeEndpoint: $endpoint
imageServiceEndpoint: $endpoint
cgroupDriver: cgroupfs
cgroupsPerQOS: false
enforceNodeAllocatable: []
failSwapOn: false
address: 127.0.0.1
port: 10250
readOnlyPort: $ro_port
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous:
    enabled: true
  webhook:
    enabled: false
authorization:
  mode: AlwaysAllow
resolvConf: /etc/resolv.conf
serializeImagePulls: false
# The node's images are imported, never pulled (imagePullPolicy: Never): the kubelet must not
# garbage-collect them or evict pods because the host's disk, shared with builds, passes its
# default 85 % / 15 % marks (100 turns image GC off; eviction only when nearly full). smoke.sh
# checks the free space before it starts.
imageGCHighThresholdPercent: 100
evictionHard:
  memory.available: "100Mi"
  nodefs.available: "1Gi"
  nodefs.inodesFree: "1%"
  imagefs.available: "1Gi"
  imagefs.inodesFree: "1%"
YAML

# start NAME LOG CMD...: runs CMD in its own session, records its PID
start() {
  local name=$1 log=$2; shift 2
  setsid "$@" >>"$log" 2>&1 < /dev/null &
  echo $! > "$work/pids/$name.pid"
  echo "up.sh: $name pid $!"
}
fail() { echo "up.sh: $1 did not come up; end of $2:" >&2; tail -40 "$2" >&2; exit 1; }

start containerd "$work/logs/containerd.log" containerd --config "$work/etc/containerd.toml"
for _ in $(seq 100); do
  ctr --address "$sock" version >/dev/null 2>&1 && break
  kill -0 "$(cat "$work/pids/containerd.pid")" 2>/dev/null || fail containerd "$work/logs/containerd.log"
  sleep 0.2
done
ctr --address "$sock" version >/dev/null 2>&1 || fail containerd "$work/logs/containerd.log"

for img in pause testbin; do
  ctr_ images import "$root/images/$img.tar" >>"$work/logs/import.log" 2>&1 \
    || fail "import of $img" "$work/logs/import.log"
done
ctr_ images ls -q >> "$work/logs/import.log"

if ((only_containerd)); then echo "up.sh: containerd up (no kubelet)"; exit 0; fi
command -v kubelet >/dev/null || { echo "up.sh: kubelet missing: run scripts/k8s-node/install.sh" >&2; exit 1; }
start kubelet "$work/logs/kubelet.log" kubelet --config "$work/etc/kubelet.yaml" \
  --root-dir "$work/kubelet" --hostname-override drainfs-k8s-node --v 2 \
  ${K8S_NODE_KUBELET_FLAGS:-}
for _ in $(seq 150); do
  [[ "$(curl -fsS http://127.0.0.1:10248/healthz 2>/dev/null)" == ok ]] && break
  kill -0 "$(cat "$work/pids/kubelet.pid")" 2>/dev/null || fail kubelet "$work/logs/kubelet.log"
  sleep 0.2
done
[[ "$(curl -fsS http://127.0.0.1:10248/healthz 2>/dev/null)" == ok ]] || fail kubelet "$work/logs/kubelet.log"
echo "up.sh: kubelet $(kubelet --version | cut -d' ' -f2) and containerd up; manifests: $work/manifests"
