#!/usr/bin/env bash
# drainfs benchmark: raw tmpfs lower vs drainfs (passthrough) vs drainfs (never).
#
#   fuse-tests/bench/run.sh            full run (~15 min): 3 interleaved reps, fio 10 s per job
#   fuse-tests/bench/run.sh --smoke    CI smoke: every part, tiny sizes
#
# Other options are passed to bench.py (--reps, --runtime, --ramp, --size, --md-files, --trigger-runs,
# --threads, --ttl, --results DIR); --no-build skips the cargo build. Needs root and /dev/fuse.
# Prints one table; writes it, the raw JSON and the daemons' logs to the results directory
# (default fuse-tests/bench/results/<time>[-smoke]/).
#
# Everything it mounts lives under one fresh temp dir; the EXIT trap stops the processes it
# started (by PID, from WORK/pids) and unmounts whatever is still mounted under that dir.
set -euo pipefail

# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
bench_args "$@"
bench_init run.sh fusermount3 mount
bench_workdir drainfs-bench
bench_python "$here/bench.py" --workdir "$work" --bin-dir "$bin_dir" "${args[@]}"
