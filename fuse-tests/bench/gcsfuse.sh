#!/usr/bin/env bash
# drainfs against the real gcsfuse (v3.11.2) on fake-gcs-server, and the end-of-Job tail through
# GKE's real sidecar mounter (gcs-fuse-csi-driver v1.24.4). See gcsfuse.py and README.md.
#
#   fuse-tests/bench/gcsfuse.sh            full run (5 reps, 8 targets: estimated 1.5-2 hours on a quiet 2-vCPU VM)
#   fuse-tests/bench/gcsfuse.sh --smoke    CI smoke: both parts, tiny sizes, no exit-file runs, no stock-b
#   fuse-tests/bench/gcsfuse.sh --targets stock,stock-b,handoff    the hand-off against stock gcsfuse only
#
# Other options go to gcsfuse.py (--reps, --runtime, --ramp, --size, --md-files, --numjobs 1,4,
# --md-threads 1,4, --tail-runs, --exit-file-runs, --tail-stop-delay S, --parts throughput,tail,
# --results DIR, --targets raw,relay,..., --cpu-limit CPUS: each target's processes in a cgroup limited to CPUS,
# as a sidecar's CPU limit), --caches off|on|off,on, --wan RTT_MS,MIBPS: the bucket over HTTPS behind
# toxiproxy (that round trip added, each connection capped at MIBPS each way); --no-build skips the cargo build; --gcsfuse-version X.Y.Z runs that
# gcsfuse release instead of v3.11.2 (built once with `go install` from the Go module proxy into
# /opt/drainfs-lowers/go/gobin-X.Y.Z; v3.13.0 needs Go 1.27, which the go command takes from the
# module proxy: the build runs with GOTOOLCHAIN=go1.27.3). Needs root, /dev/fuse and
# scripts/install-lowers.sh's binaries (it runs the installer, a no-op when they are in place).
# Prints its tables; writes them, the raw JSON and the daemons' logs to
# fuse-tests/bench/results/gcsfuse-<time>[-smoke]/.
#
# Everything it mounts lives under one fresh temp dir; the EXIT trap stops the processes it
# started (by PID, from WORK/pids) and unmounts whatever is still mounted under that dir.
set -euo pipefail

# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
gcsfuse_version=""
rest=()
while (($#)); do
    case "$1" in
        --gcsfuse-version)
            [[ ${2:-} =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || { echo "gcsfuse.sh: --gcsfuse-version takes X.Y.Z" >&2; exit 2; }
            gcsfuse_version=$2
            shift 2 ;;
        *) rest+=("$1"); shift ;;
    esac
done
bench_args "${rest[@]+"${rest[@]}"}"
bench_init gcsfuse.sh fusermount3
bash "$repo/scripts/install-lowers.sh" >/dev/null
if [[ -n $gcsfuse_version ]]; then
    gobin="${DRAINFS_LOWERS_ROOT:-/opt/drainfs-lowers}/go/gobin-$gcsfuse_version"
    if [[ ! -x $gobin/gcsfuse ]]; then
        echo "gcsfuse.sh: building gcsfuse v$gcsfuse_version" >&2
        GOTOOLCHAIN=go1.27.3 CGO_ENABLED=0 GOFLAGS=-buildvcs=false GOBIN="$gobin" go install \
            -ldflags "-s -w -X github.com/googlecloudplatform/gcsfuse/v3/common.gcsfuseVersion=$gcsfuse_version" \
            "github.com/googlecloudplatform/gcsfuse/v3@v$gcsfuse_version"
    fi
    args+=(--gcsfuse "$gobin/gcsfuse")
fi
for a in "${args[@]+"${args[@]}"}"; do
    # --wan: the bucket behind toxiproxy (built once from its Go module, then cached).
    if [[ $a == --wan || $a == --wan=* ]]; then bash "$repo/scripts/k8s-node/install.sh" toxiproxy >/dev/null; fi
done
bench_workdir drainfs-gcsfuse-bench
bench_python "$here/gcsfuse.py" --workdir "$work" --bin-dir "$bin_dir" "${args[@]}"
