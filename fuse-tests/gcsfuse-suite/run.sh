#!/usr/bin/env bash
# gcsfuse v3.11.2's own integration tests (tools/integration_tests, mounted-directory mode) over
# fake-gcs-server, against raw gcsfuse and drainfs's data paths: `drainfs run` with
# --passthrough auto and never, and the relay (drainfs as the gcsfuse drop-in under GKE's real
# sidecar mounter). Parity: every test that passes on raw gcsfuse passes on each drainfs path.
# See suite.py and README.md.
#
#   fuse-tests/gcsfuse-suite/run.sh            full run: 9 packages, their flag sets, 5 paths
#   fuse-tests/gcsfuse-suite/run.sh --smoke    CI: every package but concurrent_operations and
#                                              read_large_files, first flag set each, paths
#                                              raw/auto/never/relay (a few minutes; the first
#                                              build of the test binaries some more)
#
# Other options go to suite.py (--packages a,b --paths raw,auto,... --all-flag-sets
# --first-flag-set --timeout S --full-table --results DIR); --no-build skips the cargo build.
# Needs root, /dev/fuse, Go (>= 1.26.5) and scripts/install-lowers.sh's binaries (it runs the
# installer, a no-op when they are in place). The test binaries are built once by build.sh
# (cached under /opt/drainfs-lowers/gcsfuse-suite, from the Go module proxy). Prints the parity
# table; writes it, the raw JSON and every log to fuse-tests/gcsfuse-suite/results/<time>[-smoke]/.
# Exit 0 with parity, 1 when a test passes on raw gcsfuse but not on a drainfs path, or on an
# infrastructure error (a mount that does not come up, a mount left behind).
#
# Everything it mounts lives under one fresh temp dir; the EXIT trap stops the processes it
# started (by PID, from WORK/pids), unmounts whatever is still mounted under that dir (a plain
# unmount, else an abort of that mount's own FUSE connection and a lazy unmount).
set -euo pipefail

# shellcheck source=../bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../bench/lib.sh"
suite_here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
bench_args "$@"
bench_init gcsfuse-suite fusermount3 go
bash "$repo/scripts/install-lowers.sh" >/dev/null
# The test binaries (built once, cached); a shared lock on the build keeps a concurrent rebuild
# (another checkout with another patch) from removing it while the tests run.
for _ in 1 2 3; do
    suite_root=$(bash "$suite_here/build.sh")
    [[ -f $suite_root/.inuse ]] || continue
    exec 8<"$suite_root/.inuse"
    flock -s 8
    [[ -f $suite_root/stamp ]] && break
done
[[ -f $suite_root/stamp ]] || { echo "gcsfuse-suite: the test build $suite_root went away" >&2; exit 1; }
bench_workdir drainfs-gcsfuse-suite

# Before lib.sh's cleanup (which stops the processes and lazily unmounts what is left): stop
# the driver (its own cleanup stops each stack the way it stops), then the processes it
# started (by PID, only while their command line names the work dir, as lib.sh does), then a
# mount under the work dir that a plain unmount cannot remove (its daemon hung or gone) gets
# its own FUSE connection aborted (the device number of that very mount, from mountinfo), so
# that lib.sh's lazy unmount leaves no process blocked on it.
suite_cleanup() {
    local rc=$? m dev pid
    set +e  # the cleanup runs to its end whatever fails in it
    if [[ -n $py_pid ]] && kill -0 "$py_pid" 2>/dev/null; then
        kill -TERM "$py_pid" 2>/dev/null || true
        for _ in $(seq 300); do kill -0 "$py_pid" 2>/dev/null || break; sleep 0.1; done
    fi
    if [[ -f $work/pids ]]; then
        while read -r pid; do
            if [[ -r /proc/$pid/cmdline ]] && tr '\0' ' ' </proc/"$pid"/cmdline | grep -qF "$work/"; then
                kill -TERM "$pid" 2>/dev/null || true
                for _ in $(seq 80); do [[ -d /proc/$pid ]] || break; sleep 0.1; done
                [[ -d /proc/$pid ]] && kill -KILL "$pid" 2>/dev/null || true
            fi
        done <"$work/pids"
    fi
    for m in $(bench_mounts_under); do
        timeout 20 fusermount3 -u "$m" 2>/dev/null && continue
        dev=$(awk -v m="$m" '$5 == m { d = $3 } END { print d }' /proc/self/mountinfo)
        if [[ $dev == 0:* && -w /sys/fs/fuse/connections/${dev#0:}/abort ]]; then
            echo "gcsfuse-suite: aborting the FUSE connection $dev of $m" >&2
            echo 1 >"/sys/fs/fuse/connections/${dev#0:}/abort" || true
        fi
    done
    (exit "$rc")
    bench_cleanup
}
trap suite_cleanup EXIT
bench_python "$suite_here/suite.py" --workdir "$work" --bin-dir "$bin_dir" --suite-root "$suite_root" "${args[@]}"
