#!/usr/bin/env bash
# The real-kubelet step of ./scripts/test.sh: starts the node (up.sh), imports the project's
# images (drainfs-images.sh: the OCI archives docker/image/build.sh wrote, and the stock
# sidecar, and the managed path's overlay image), runs drainfs-pods.py for each arrangement
# (stock, relay, handoff, self-managed, and the floor: the Job without a sidecar): PODS Job
# pods (checked: phase Succeeded, exit codes and termination messages as the kubelet records
# them, every object read back), then one pod of each other scenario (legacy: a regular
# sidecar and the exit file, with airflow-pod-template.yaml too; delete: the pod deleted while
# it writes; stalled: deleted with the bucket stopped, drainfs's grace deadline), and stops the
# node (down.sh) on every exit path, failing if anything of it is left.
#
# It needs the kubelet, containerd and crictl that install.sh builds and caches (tens of
# minutes on 2 cores the first time, seconds afterwards). When they are not built, it builds
# them only with DRAINFS_K8S_BUILD=1; otherwise it prints NOT RUN with the reason and exits 0,
# so that the suite stays within CI's budget on a machine without them (the step's line in the
# suite's output says which happened).
#
# Owns the node while it runs (flock on $K8S_NODE_ROOT/node.lock; fails if a node is already
# up) and the self-managed pod's admin port 9090 on the host network (fails if it is taken).
#
# Usage: bash scripts/k8s-node/smoke.sh [PODS]     (as root; PODS per arrangement, default 2)
# Exit codes: 0 every pod passed (or NOT RUN, printed); 1 a pod or the node failed.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/env.sh"
pods="${1:-2}"
missing=()
for b in kubelet containerd containerd-shim-runc-v2 ctr crictl; do
  [[ -x "$root/bin/$b" ]] || missing+=("$b")
done
if ((${#missing[@]})); then
  if [[ "${DRAINFS_K8S_BUILD:-0}" != 1 ]]; then
    echo "kubelet smoke: NOT RUN: ${missing[*]} not built under $root/bin" \
      "(bash scripts/k8s-node/install.sh, or DRAINFS_K8S_BUILD=1 ./scripts/test.sh)"
    exit 0
  fi
  K8S_NODE_JOBS=2 bash "$here/install.sh" crictl containerd kubelet
fi
bash "$here/install.sh" images
mkdir -p "$root"
# The images (about 1 GB in containerd's store), the pods' logs and their buckets' files need
# room; below 4 GiB free the step stops here and says so, instead of failing pods.
free_kib=$(df -Pk "$root" | awk 'NR==2 {print $4}')
if ((free_kib < 4 * 1024 * 1024)); then
  echo "smoke.sh: only $((free_kib / 1024)) MiB free on the filesystem of $root; the node needs 4 GiB" >&2
  exit 1
fi
exec 9>"$root/node.lock"
flock -n 9 || { echo "smoke.sh: another user of the node holds $root/node.lock" >&2; exit 1; }
if (exec 3<>/dev/tcp/127.0.0.1/9090) 2>/dev/null; then
  echo "smoke.sh: 127.0.0.1:9090 is taken; the self-managed pod's admin port needs it" >&2
  exit 1
fi
down() {
  local rc=$?
  bash "$here/down.sh" || rc=1
  exit "$rc"
}
bash "$here/up.sh"
trap down EXIT
bash "$here/drainfs-images.sh" 2>&1 | grep -v DEPRECATION
# PyYAML (the self-managed pod is read from job-native-sidecar.yaml): the manifest linters'
# virtualenv has it (docker/check.sh installs it), else the system's python3.
py="${DRAINFS_LINT_VENV:-/opt/drainfs-docker-lint/venv}/bin/python"
[[ -x "$py" ]] || py=python3
"$py" "$here/drainfs-pods.py" --pods "$pods" --files 4 --kib 512
"$py" "$here/drainfs-pods.py" --arrangements stock,relay,handoff,self-managed,airflow \
  --scenarios legacy,delete,stalled --pods 1 --files 4 --kib 512 --pace-ms 2000
