#!/usr/bin/env bash
# drainfs against the real gcsfuse (v3.11.2) on fake-gcs-server, and the end-of-Job tail through
# GKE's real sidecar mounter (gcs-fuse-csi-driver v1.24.4). See gcsfuse.py and README.md.
#
#   fuse-tests/bench/gcsfuse.sh            full run (about 40 minutes on a quiet 2-vCPU VM)
#   fuse-tests/bench/gcsfuse.sh --smoke    CI smoke: every part once, tiny sizes (about a minute)
#
# Other options go to gcsfuse.py (--reps, --runtime, --ramp, --size, --md-files, --numjobs 1,4,
# --md-threads 1,4, --tail-runs, --exit-file-runs, --parts throughput,tail, --results DIR);
# --no-build skips the cargo build. Needs root, /dev/fuse and scripts/install-lowers.sh's
# binaries (it runs the installer, a no-op when they are in place). Prints two tables; writes
# them, the raw JSON and the daemons' logs to fuse-tests/bench/results/gcsfuse-<time>[-smoke]/.
#
# Everything it mounts lives under one fresh temp dir; the EXIT trap stops the processes it
# started (by PID, from WORK/pids) and unmounts whatever is still mounted under that dir.
set -euo pipefail

# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
bench_args "$@"
bench_init gcsfuse.sh fusermount3
bash "$repo/scripts/install-lowers.sh" >/dev/null
bench_workdir drainfs-gcsfuse-bench
bench_python "$here/gcsfuse.py" --workdir "$work" --bin-dir "$bin_dir" "${args[@]}"
