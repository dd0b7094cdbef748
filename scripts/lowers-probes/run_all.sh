#!/usr/bin/env bash
# Re-run every probe behind scripts/LOWERS-NOTES.md against both real lowers.
# Needs scripts/install-lowers.sh to have run; root; about 10 minutes on 2 cores.
# Output: one log per probe in $PROBE_DIR (default /tmp/drainfs-probes).
# drainfs_over_lower.py also needs a built drainfs (DRAINFS=path, default target/debug/drainfs).
set -u
cd "$(dirname "$0")"
export PROBE_DIR="${PROBE_DIR:-/tmp/drainfs-probes}"
mkdir -p "$PROBE_DIR"
run() { echo "== $*"; timeout 300 python3 "$@" 2>&1; }
for k in gcs s3; do
    run visibility.py $k
    run fsync.py $k
    for s in SIGINT SIGTERM SIGKILL; do for ph in none write idle close; do run signals.py $k $s $ph; done; done
    for m in written read rdonly-open cwd; do for s in SIGINT SIGTERM; do run exit_status.py $k $s $m; done; done
    for w in opath-file opath-root dirfd-root; do run busy_fds.py $k $w; done
    run open_modes.py $k
    run two_handles.py $k
    for s in SIGKILL SIGINT; do run partial.py $k $s; done
    run tools.py $k
    run throughput.py $k
    if [ -x "${DRAINFS:-../../target/debug/drainfs}" ]; then
        for pt in auto never; do run drainfs_over_lower.py $k $pt; done
    fi
done > "$PROBE_DIR/run_all.log"
echo "wrote $PROBE_DIR/run_all.log"
grep -E 'fuse\.(rclone|s3fs)' /proc/mounts && echo "WARNING: a lower is still mounted" >&2 || true
