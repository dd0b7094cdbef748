#!/usr/bin/env bash
# drainfs benchmark: raw tmpfs lower vs drainfs (passthrough) vs drainfs (never).
#
#   fuse-tests/bench/run.sh            full run (~16 min): 3 interleaved reps, fio 10 s per job
#   fuse-tests/bench/run.sh --smoke    CI smoke (< 1 min after the build): every part, tiny sizes
#
# Other options are passed to bench.py (--reps, --runtime, --ramp, --size, --md-files, --trigger-runs,
# --threads, --ttl, --results DIR); --no-build skips the cargo build. Needs root and /dev/fuse.
# Prints one table; writes it, the raw JSON and the daemons' logs to the results directory
# (default fuse-tests/bench/results/<time>[-smoke]/).
#
# Everything it mounts lives under one fresh temp dir; the EXIT trap stops the processes it
# started (by PID, from WORK/pids) and unmounts whatever is still mounted under that dir.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
build=1
args=()
for a in "$@"; do
    case "$a" in
        --no-build) build=0 ;;
        -h|--help) sed -n '2,14p' "${BASH_SOURCE[0]}"; exit 0 ;;
        *) args+=("$a") ;;
    esac
done

if [[ $(id -u) -ne 0 ]]; then
    echo "run.sh: must run as root (mounts a tmpfs; FUSE passthrough needs CAP_SYS_ADMIN)" >&2
    exit 2
fi
for tool in fusermount3 python3 mount umount; do
    command -v "$tool" >/dev/null || { echo "run.sh: $tool not found" >&2; exit 2; }
done
if ! command -v fio >/dev/null; then
    echo "run.sh: installing fio" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y fio >/dev/null 2>&1 || { apt-get update >/dev/null && apt-get install -y fio >/dev/null; }
fi

if [[ $build -eq 1 ]]; then
    (cd "$repo" && cargo build --release -p drainfs -p fuse-tests --bins)
fi
bin_dir="${CARGO_TARGET_DIR:-$repo/target}/release"

work=$(mktemp -d /tmp/drainfs-bench.XXXXXX)
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
    # Processes bench.py started, by PID, only if still ours (command line names the work dir).
    if [[ -f $work/pids ]]; then
        while read -r pid; do
            if [[ -r /proc/$pid/cmdline ]] && tr '\0' ' ' </proc/"$pid"/cmdline | grep -qF "$work/"; then
                kill -TERM "$pid" 2>/dev/null || true
                for _ in $(seq 50); do [[ -d /proc/$pid ]] || break; sleep 0.1; done
                [[ -d /proc/$pid ]] && kill -KILL "$pid" 2>/dev/null || true
            fi
        done <"$work/pids"
    fi
    local m
    for m in $(mounts_under); do
        echo "run.sh: unmounting leftover $m" >&2
        fusermount3 -u -z "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
    done
    if [[ -n $(mounts_under) ]]; then
        echo "run.sh: MOUNTS LEFT BEHIND under $work:" >&2
        mounts_under >&2
        rc=1
    else
        rm -rf "$work"
    fi
    if grep -qF "$work" /proc/mounts; then rc=1; fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 143' TERM
trap 'exit 130' INT
trap 'exit 129' HUP

# In the background + wait, so a signal to this script runs the trap at once.
python3 "$here/bench.py" --workdir "$work" --bin-dir "$bin_dir" "${args[@]}" &
py_pid=$!
wait "$py_pid"
