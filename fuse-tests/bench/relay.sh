#!/usr/bin/env bash
# drainfs relay benchmark: bucketfs served directly on its /dev/fd/N connection vs
# through `drainfs relay` (128 KiB default message cap, and the largest cap the buffers allow),
# mounts made by fake-node-driver as GKE's CSI driver makes them, socket buffers 212992.
#
#   fuse-tests/bench/relay.sh            full run (~13 min): 3 interleaved reps, fio 8 s per job
#   fuse-tests/bench/relay.sh --smoke    quick check (~30 s after the build): every part, tiny sizes
#
# Other options are passed to relay.py (--reps, --runtime, --ramp, --size, --md-files,
# --trigger-runs, --direct-runs); --no-build skips the cargo build. Needs root and /dev/fuse.
# Prints one table; writes it, the raw JSON and the sidecars' logs to
# fuse-tests/bench/results/relay-<time>[-smoke]/.
#
# Everything it mounts lives under one fresh temp dir; the EXIT trap stops the processes it
# started (by PID, from WORK/pids) and unmounts whatever is still mounted under that dir.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
build=1
smoke=""
args=()
for a in "$@"; do
    case "$a" in
        --no-build) build=0 ;;
        --smoke) smoke="-smoke"; args+=("$a") ;;
        -h|--help) sed -n '2,15p' "${BASH_SOURCE[0]}"; exit 0 ;;
        *) args+=("$a") ;;
    esac
done

if [[ $(id -u) -ne 0 ]]; then
    echo "relay.sh: must run as root (fake-node-driver mounts with fd=N)" >&2
    exit 2
fi
for tool in python3 umount; do
    command -v "$tool" >/dev/null || { echo "relay.sh: $tool not found" >&2; exit 2; }
done
if ! command -v fio >/dev/null; then
    echo "relay.sh: installing fio" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y fio >/dev/null 2>&1 || { apt-get update >/dev/null && apt-get install -y fio >/dev/null; }
fi

if [[ $build -eq 1 ]]; then
    (cd "$repo" && cargo build --release -p drainfs -p fuse-tests --bins)
fi
bin_dir="${CARGO_TARGET_DIR:-$repo/target}/release"
results="$here/results/relay-$(date +%Y%m%d-%H%M%S)$smoke"

work=$(mktemp -d /tmp/drainfs-relay-bench.XXXXXX)
# The sidecars run as uid 65534: they must reach their directories.
chmod 755 "$work"
py_pid=""

mounts_under() { # mount points under $work, deepest first
    awk -v w="$work/" 'index($5, w) == 1 { print $5 }' /proc/self/mountinfo | sort -r
}

cleanup() {
    local rc=$?
    trap - EXIT INT TERM HUP
    if [[ -n $py_pid ]] && kill -0 "$py_pid" 2>/dev/null; then
        kill -TERM "$py_pid" 2>/dev/null || true
        for _ in $(seq 100); do kill -0 "$py_pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$py_pid" 2>/dev/null || true
    fi
    # fake-node-drivers relay.py started, by PID, only if still ours (command line names the
    # work dir). SIGTERM makes each stop its sidecar and unmount.
    if [[ -f $work/pids ]]; then
        while read -r pid; do
            if [[ -r /proc/$pid/cmdline ]] && tr '\0' ' ' </proc/"$pid"/cmdline | grep -qF "$work/"; then
                kill -TERM "$pid" 2>/dev/null || true
                for _ in $(seq 80); do [[ -d /proc/$pid ]] || break; sleep 0.1; done
                [[ -d /proc/$pid ]] && kill -KILL "$pid" 2>/dev/null || true
            fi
        done <"$work/pids"
    fi
    local m
    for m in $(mounts_under); do
        echo "relay.sh: unmounting leftover $m" >&2
        umount -l "$m" 2>/dev/null || true
    done
    if [[ -n $(mounts_under) ]]; then
        echo "relay.sh: MOUNTS LEFT BEHIND under $work:" >&2
        mounts_under >&2
        rc=1
    else
        rm -rf "$work"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 143' TERM
trap 'exit 130' INT
trap 'exit 129' HUP

# In the background + wait, so a signal to this script runs the trap at once.
python3 "$here/relay.py" --work "$work" --results "$results" --bin-dir "$bin_dir" "${args[@]}" &
py_pid=$!
wait "$py_pid"
