# Shared preamble of the benchmark entry points (run.sh, relay.sh, gcsfuse.sh, admin_cost.sh);
# source it.
#
#   bench_args ARGS           the options every entry point takes: --no-build (sets $build to
#                             0), --smoke (sets $smoke to -smoke; passed on), -h/--help (prints
#                             the calling script's header comment); the rest in $args
#   bench_init NAME TOOL...   root check, the tools each script needs, fio (installed if
#                             missing), `cargo build --release` unless $build is 0; sets $repo
#                             and $bin_dir (the release binaries)
#   bench_workdir PREFIX      a fresh ${TMPDIR:-/tmp}/PREFIX.XXXXXX as $work (mode 755: sidecars run as
#                             uid 65534) with the EXIT trap below
#   bench_python SCRIPT ARGS  runs a Python driver in the background and waits for it, so a
#                             signal to the script runs the trap at once
#
# The EXIT trap stops the Python driver, then every process listed in $work/pids (by PID, and
# only while its command line still names $work/: SIGTERM, SIGKILL 8 s later), unmounts
# whatever is still mounted under $work (deepest first), removes the directories listed in
# $work/global-dirs (outside $work, e.g. the sidecar mounter's hard-coded /gcsfuse-tmp/.volumes/VOL
# and /gcsfuse-cache/.volumes/VOL),
# and removes $work. It exits 1 if a mount under $work survived.
# shellcheck shell=bash

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
build=${build:-1}
smoke=""
args=()
work=""
py_pid=""

bench_args() {
    local a
    for a in "$@"; do
        case "$a" in
            --no-build) build=0 ;;
            --smoke) smoke="-smoke"; args+=("$a") ;;
            -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1' "${BASH_SOURCE[1]}"; exit 0 ;;
            *) args+=("$a") ;;
        esac
    done
}

bench_init() {
    local name=$1 tool
    shift
    if [[ $(id -u) -ne 0 ]]; then
        echo "$name: must run as root (mounts, FUSE passthrough and fd=N mounts need CAP_SYS_ADMIN)" >&2
        exit 2
    fi
    for tool in python3 umount "$@"; do
        command -v "$tool" >/dev/null || { echo "$name: $tool not found" >&2; exit 2; }
    done
    if ! command -v fio >/dev/null; then
        echo "$name: installing fio" >&2
        export DEBIAN_FRONTEND=noninteractive
        apt-get install -y fio >/dev/null 2>&1 || { apt-get update >/dev/null && apt-get install -y fio >/dev/null; }
    fi
    if [[ $build -eq 1 ]]; then
        (cd "$repo" && cargo build --release -p drainfs -p fuse-tests --bins)
    fi
    bin_dir="${CARGO_TARGET_DIR:-$repo/target}/release"
}

bench_mounts_under() { # mount points under $work, deepest first
    awk -v w="$work/" 'index($5, w) == 1 { print $5 }' /proc/self/mountinfo | sort -r
}

bench_cleanup() {
    local rc=$?
    trap - EXIT INT TERM HUP
    if [[ -n $py_pid ]] && kill -0 "$py_pid" 2>/dev/null; then
        kill -TERM "$py_pid" 2>/dev/null || true
        for _ in $(seq 100); do kill -0 "$py_pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$py_pid" 2>/dev/null || true
    fi
    # Processes the driver started, by PID, only if still ours (command line names the work dir).
    if [[ -f $work/pids ]]; then
        local pid
        while read -r pid; do
            if [[ -r /proc/$pid/cmdline ]] && tr '\0' ' ' </proc/"$pid"/cmdline | grep -qF "$work/"; then
                kill -TERM "$pid" 2>/dev/null || true
                for _ in $(seq 80); do [[ -d /proc/$pid ]] || break; sleep 0.1; done
                [[ -d /proc/$pid ]] && kill -KILL "$pid" 2>/dev/null || true
            fi
        done <"$work/pids"
    fi
    local m
    for m in $(bench_mounts_under); do
        echo "bench: unmounting leftover $m" >&2
        fusermount3 -u -z "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
    done
    if [[ -f $work/global-dirs ]]; then
        local d
        while read -r d; do
            case "$d" in
                /gcsfuse-tmp/.volumes/drainfs-bench-*|/gcsfuse-buffer/.volumes/drainfs-bench-*|/gcsfuse-cache/.volumes/drainfs-bench-*) rm -rf -- "$d" ;;
            esac
        done <"$work/global-dirs"
    fi
    # The cgroups of --cpu-limit (gcsfuse.py), emptied by the stops above, children first.
    if [[ -f $work/cgroups ]]; then
        local g
        while read -r g; do
            case "$g" in
                /sys/fs/cgroup/*drainfs-bench-*) rmdir -- "$g" 2>/dev/null || true ;;
            esac
        done < <(sort -r "$work/cgroups")
    fi
    if [[ -n $(bench_mounts_under) ]]; then
        echo "bench: MOUNTS LEFT BEHIND under $work:" >&2
        bench_mounts_under >&2
        rc=1
    else
        rm -rf "$work"
    fi
    exit "$rc"
}

bench_workdir() {
    work=$(mktemp -d "${TMPDIR:-/tmp}/$1.XXXXXX")
    chmod 755 "$work"
    trap bench_cleanup EXIT
    trap 'exit 143' TERM
    trap 'exit 130' INT
    trap 'exit 129' HUP
}

bench_python() {
    python3 "$@" &
    py_pid=$!
    wait "$py_pid"
}
