# Sourced by the k8s-node scripts: where things live. Not a command.
root="${K8S_NODE_ROOT:-/opt/drainfs-k8s}"          # binaries, images (install.sh)
work="${K8S_NODE_WORK:-$root/work}"                # one node's state, logs, manifests, PIDs
run="${K8S_NODE_RUN:-/run/drainfs-k8s}"            # containerd's state and sockets
sock="$run/containerd.sock"
endpoint="unix://$sock"
pause_image="local.drainfs/pause:1"
test_image="local.drainfs/testbin:1"
ro_port="${K8S_NODE_RO_PORT:-10255}"               # the kubelet's read-only port (loopback)
export PATH="$root/bin:/usr/sbin:/usr/bin:/sbin:/bin"
crictl_() { crictl --runtime-endpoint "$endpoint" --image-endpoint "$endpoint" --timeout 10s "$@"; }
ctr_() { ctr --address "$sock" -n k8s.io "$@"; }
