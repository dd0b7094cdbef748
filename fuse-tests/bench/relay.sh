#!/usr/bin/env bash
# drainfs relay benchmark: bucketfs served directly on its /dev/fd/N connection vs
# through `drainfs relay` (128 KiB default message cap, and the largest cap the buffers allow),
# mounts made by fake-node-driver as GKE's CSI driver makes them, socket buffers 212992.
#
#   fuse-tests/bench/relay.sh            full run: 3 interleaved reps, fio 8 s per job
#   fuse-tests/bench/relay.sh --smoke    quick check: every part, tiny sizes
#
# Other options are passed to relay.py (--reps, --runtime, --ramp, --size, --md-files,
# --trigger-runs, --direct-runs); --no-build skips the cargo build. Needs root and /dev/fuse.
# Prints one table; writes it, the raw JSON and the sidecars' logs to
# fuse-tests/bench/results/relay-<time>[-smoke]/.
#
# Everything it mounts lives under one fresh temp dir; the EXIT trap stops the processes it
# started (by PID, from WORK/pids) and unmounts whatever is still mounted under that dir.
set -euo pipefail

# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
bench_args "$@"
bench_init relay.sh
results="$here/results/relay-$(date +%Y%m%d-%H%M%S)$smoke"
bench_workdir drainfs-relay-bench
bench_python "$here/relay.py" --work "$work" --results "$results" --bin-dir "$bin_dir" "${args[@]}"
