#!/usr/bin/env bash
# drainfs demo: the main job on a built-in default, with no cloud account.
#
#   scripts/demo.sh                    both runs below, one after the other, and the difference
#   scripts/demo.sh --with-drainfs     with drainfs only
#   scripts/demo.sh --without-drainfs  the same workload on the bare FUSE client, stopped the way
#                                      GKE's sidecar stops gcsfuse today
#   scripts/demo.sh --managed          only the second act: GKE's managed sidecar, stock vs the
#                                      hand-off vs the relay
#
# Second act (also run by default): the managed-sidecar arrangement. fake-node-driver (the test
# suite's stand-in for GKE's CSI node driver) mounts a volume with fd=N and hands the fd over the
# sidecar's unix socket to the REAL sidecar mounter, which runs as uid 65534 with no capabilities
# and execs `--gcsfuse-path`: stock (the real gcsfuse), the hand-off (drainfs as the gcsfuse
# drop-in, its default: the real gcsfuse gets the kernel's fd and serves it, drainfs owns only
# the stop) or the relay (drainfs as the drop-in with `drainfs-mode=relay`, in the data path, the
# real gcsfuse behind it). The workload runs and exits; then the stop comes the
# GKE way: SIGTERM to the sidecar (NATIVE_SIDECAR=TRUE), or the exit file the sidecar polls
# every 5 s (a regular sidecar container). Printed side by side: time from the stop to the
# sidecar's exit, the objects in the bucket, gcsfuse's end, the lines of the sidecar's error file.
#
# Run as root on Debian with the Rust and Go toolchains. It installs what it needs
# (scripts/install-lowers.sh: fuse3, the real gcsfuse v3.11.2 and GKE's sidecar mounter v1.24.4
# built from source, a venv with fake-gcs-server), builds drainfs (release), and starts
# fake-gcs-server on 127.0.0.1 as the bucket. gcsfuse runs with streaming writes (its default):
# blocks upload while a file is written, and the object is finalized inside close().
#
# A run: start the server (fresh bucket), start `drainfs run ... -- gcsfuse ...` (or gcsfuse
# alone), run a short workload through the mount (a config file, a `cp -r` of a directory tree,
# a CSV written by Python, a 24 MiB model, a 200 MiB checkpoint last), and stop everything at the
# worst moment: while the application is inside close() of the checkpoint, i.e. while its upload
# is being finalized. With drainfs the stop is the Kubernetes exit file (written atomically);
# without it, it is what GKE's sidecar does to gcsfuse: SIGTERM, then SIGKILL 5 s later. Then
# every object is read back from the server (not through a mount) and its sha256 compared with
# the source. Everything the demo started is stopped on exit, and nothing is left mounted.
#
# Environment: DEMO_BIG_MIB (size of the last file, default 200), DEMO_KEEP=1 (keep the work
# directory with logs and summaries), TMPDIR (where the work directory goes).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
LOWERS="$HERE/lowers.py"
HELPER="$HERE/demo-helper.py"

# drainfs runs with its default flags: `--passthrough auto` sees a fuse.gcsfuse lower, which keeps
# write state per inode, so writers get kernel passthrough. DEMO_GCS_PASSTHROUGH=<mode> passes an
# explicit --passthrough.
GCS_PASSTHROUGH="${DEMO_GCS_PASSTHROUGH:-}"
BIG_MIB="${DEMO_BIG_MIB:-200}"
SIDECAR_KILL_AFTER_S=5   # GKE's sidecar: SIGTERM to gcsfuse, SIGKILL 5 s later

usage() {
    sed -n '2,9p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
}

MODE=compare
case "${1:-}" in
    "" | --compare) ;;
    --with-drainfs) MODE=with ;;
    --without-drainfs) MODE=without ;;
    --managed) MODE=managed ;;
    -h | --help) usage; exit 0 ;;
    *) usage >&2; exit 2 ;;
esac
[ $# -le 1 ] || { usage >&2; exit 2; }

die() { echo "demo: error: $*" >&2; exit 1; }
say() { printf '%s\n' "$*"; }
now_ms() { date +%s%3N; }
secs() { printf '%d.%02d s' $(($1 / 1000)) $((($1 % 1000) / 10)); }   # ms -> "1.23 s"

[ "$(id -u)" = 0 ] || die "run as root (it installs packages and mounts FUSE filesystems)"
[ "$(uname -s)" = Linux ] || die "Linux only"
case "$(uname -m)" in
    x86_64) CLOSE_NR=3 ;;
    aarch64 | arm64) CLOSE_NR=57 ;;
    *) die "unsupported architecture $(uname -m) (the close() detection knows x86_64 and aarch64)" ;;
esac
if ! command -v cargo >/dev/null && [ -x "$HOME/.cargo/bin/cargo" ]; then
    PATH="$HOME/.cargo/bin:$PATH"
fi
command -v cargo >/dev/null || die "cargo not found: install the Rust toolchain (https://rustup.rs)"

# ---------------------------------------------------------------- process and mount helpers

# alive PID: the process exists and is not a zombie.
alive() {
    local st
    st="$(cat "/proc/$1/stat" 2>/dev/null)" || return 1
    st="${st##*) }"
    case "${st:0:1}" in Z | X | "") return 1 ;; *) return 0 ;; esac
}

# mounted PATH: PATH is a mount point (per /proc/self/mountinfo).
mounted() {
    awk -v p="$1" '$5 == p { found = 1 } END { exit !found }' /proc/self/mountinfo
}

# detach PATH: remove whatever is mounted there (also a dead FUSE mount); fails if it cannot.
detach() {
    local p="$1" n=0
    while mounted "$p" && [ $n -lt 5 ]; do
        fusermount3 -u -z "$p" 2>/dev/null || umount -l "$p" 2>/dev/null || true
        n=$((n + 1))
    done
    ! mounted "$p"
}

# stop_pid PID SECONDS: SIGTERM, wait up to SECONDS, SIGKILL. Only for processes this script
# started; it reaps them (they are its children).
stop_pid() {
    local pid="$1" t="$2" end
    [ -n "$pid" ] || return 0
    if alive "$pid"; then
        kill -TERM "$pid" 2>/dev/null || true
        end=$(($(now_ms) + t * 1000))
        while alive "$pid" && [ "$(now_ms)" -lt "$end" ]; do sleep 0.05; done
        alive "$pid" && kill -KILL "$pid" 2>/dev/null
    fi
    wait "$pid" 2>/dev/null || true
}

# wait_in_close PID PATH: returns once PID is inside close() of the fd it has open on PATH
# (read from /proc/PID/fd and /proc/PID/syscall); returns 1 if PID exits first.
wait_in_close() {
    local pid="$1" path="$2" fd="" hexfd="" f nr a0 rest
    while alive "$pid"; do
        if [ -z "$fd" ]; then
            for f in /proc/"$pid"/fd/*; do
                if [ "$(readlink "$f" 2>/dev/null)" = "$path" ]; then
                    fd="${f##*/}"
                    hexfd="$(printf '0x%x' "$fd")"
                fi
            done
        elif read -r nr a0 rest <"/proc/$pid/syscall" 2>/dev/null \
            && [ "$nr" = "$CLOSE_NR" ] && [ "$a0" = "$hexfd" ]; then
            return 0
        fi
        sleep 0.01
    done
    return 1
}

# ---------------------------------------------------------------- cleanup (always runs)

WORK=""
DF_PID=""      # drainfs
ND_PID=""      # fake-node-driver (second act)
RC_PID=""      # gcsfuse started directly (run without drainfs)
APP_PID=""     # the application's last cp
RUN_DIRS=()    # lowers.py work dirs (their servers)
MOUNTS=()      # every mountpoint this demo uses

cleanup() {
    local rc=$? m left=""
    set +e
    trap - EXIT INT TERM
    [ -n "$APP_PID" ] && alive "$APP_PID" && kill -KILL "$APP_PID" 2>/dev/null
    if [ -n "$DF_PID" ] && alive "$DF_PID"; then
        # SIGTERM: drain and exit; a second SIGTERM: stop waiting.
        kill -TERM "$DF_PID" 2>/dev/null
        local end=$(($(now_ms) + 10000))
        while alive "$DF_PID" && [ "$(now_ms)" -lt "$end" ]; do sleep 0.05; done
        alive "$DF_PID" && kill -TERM "$DF_PID" 2>/dev/null
        stop_pid "$DF_PID" 5
    fi
    stop_pid "$RC_PID" 3
    stop_pid "$ND_PID" 40
    [ -n "$APP_PID" ] && wait "$APP_PID" 2>/dev/null
    for m in "${MOUNTS[@]}"; do
        if mounted "$m"; then
            detach "$m" || left="$left $m"
        fi
    done
    for d in "${RUN_DIRS[@]}"; do
        python3 "$LOWERS" stop --workdir "$d" >/dev/null 2>&1
    done
    if [ -n "$WORK" ] && [ -d "$WORK" ]; then
        if [ "${DEMO_KEEP:-0}" = 1 ]; then
            say "kept the work directory (logs, summaries, sources): $WORK"
        else
            rm -rf "$WORK"
        fi
    fi
    if [ -n "$left" ]; then
        echo "demo: WARNING: could not unmount:$left" >&2
        [ "$rc" = 0 ] && rc=1
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ---------------------------------------------------------------- set-up

T_START=$(now_ms)
say "drainfs demo: drainfs in front of the real gcsfuse (and inside GKE's real sidecar mounter)"
say "over a local fake-gcs-server; a workload, a Kubernetes-style stop, every object checked."
say ""

step_start() { printf '%-62s' "$1 ..."; STEP_T=$(now_ms); }
step_ok() { say "ok ($(secs $(($(now_ms) - STEP_T))))${1:+, $1}"; }

NEED_APT=()
command -v python3 >/dev/null || NEED_APT+=(python3)
command -v cc >/dev/null || NEED_APT+=(gcc libc6-dev)   # the linker cargo needs
if ((${#NEED_APT[@]})); then
    step_start "installing ${NEED_APT[*]} (apt-get)"
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${NEED_APT[@]}" >/dev/null
    step_ok
fi

step_start "installing the lowers (scripts/install-lowers.sh)"
INSTALL_LOG="$(mktemp "${TMPDIR:-/tmp}/drainfs-demo-install.XXXXXX")"
if ! bash "$HERE/install-lowers.sh" >"$INSTALL_LOG" 2>&1; then
    say "FAILED"
    cat "$INSTALL_LOG" >&2
    rm -f "$INSTALL_LOG"
    die "scripts/install-lowers.sh failed (output above)"
fi
rm -f "$INSTALL_LOG"
step_ok "$("${DRAINFS_LOWERS_ROOT:-/opt/drainfs-lowers}/bin/gcsfuse" --version | cut -d' ' -f1-3), sidecar mounter v1.24.4, fake-gcs-server"

step_start "building drainfs (cargo build --release)"
BUILD_LOG="$(mktemp "${TMPDIR:-/tmp}/drainfs-demo-build.XXXXXX")"
if ! (cd "$REPO" && cargo build --release --locked -p drainfs --bin drainfs \
    && cargo build --release --locked -p fuse-tests --bin fake-node-driver) >"$BUILD_LOG" 2>&1; then
    say "FAILED"
    tail -n 40 "$BUILD_LOG" >&2
    rm -f "$BUILD_LOG"
    die "cargo build failed (output above)"
fi
rm -f "$BUILD_LOG"
TARGET_DIR="$(cd "$REPO" && cargo metadata --format-version 1 --no-deps \
    | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')"
DRAINFS="$TARGET_DIR/release/drainfs"
[ -x "$DRAINFS" ] || die "$DRAINFS not found after the build"
NODE_DRIVER="$TARGET_DIR/release/fake-node-driver"
LOWERS_BIN="${DRAINFS_LOWERS_ROOT:-/opt/drainfs-lowers}/bin"
step_ok

WORK="$(mktemp -d "${TMPDIR:-/tmp}/drainfs-demo.XXXXXX")"
chmod 755 "$WORK"
SRC="$WORK/src"
step_start "generating the workload's input files"
GEN_INFO="$(python3 "$HELPER" gen "$SRC" "$BIG_MIB")"
step_ok "$GEN_INFO"
BIG_REL="job/checkpoint-${BIG_MIB}MiB.bin"

# ---------------------------------------------------------------- the workload

# A Python script that writes a file line by line through buffered text I/O, as a training
# loop logs its metrics.
PY_WRITER='
import sys
with open(sys.argv[1]) as src, open(sys.argv[2], "w") as out:
    for line in src:
        out.write(line)
'

# wl_step LOG LABEL CMD...: one workload step, timed. A failure is reported, not fatal.
wl_step() {
    local log="$1" label="$2" t rc=0
    shift 2
    t=$(now_ms)
    "$@" 2>>"$log" || rc=$?
    if [ "$rc" = 0 ]; then
        printf '    %-58s %s\n' "$label" "$(secs $(($(now_ms) - t)))"
    else
        printf '    %-58s FAILED (exit %s): %s\n' "$label" "$rc" "$(tail -n 1 "$log")"
    fi
}

# workload MNT LOG: everything but the last file, one step after the other. Only tools that
# write each file once, sequentially, through a fresh O_TRUNC open: what an object store's FUSE
# client supports (scripts/LOWERS-NOTES.md, section 7).
workload() {
    local mnt="$1" log="$2"
    wl_step "$log" "mkdir -p        job/" mkdir -p "$mnt/job"
    # shellcheck disable=SC2016  # expanded by the inner sh
    wl_step "$log" "shell redirect  > job/config.json" \
        sh -c 'cat "$1" >"$2"' sh "$SRC/job/config.json" "$mnt/job/config.json"
    wl_step "$log" "cp -r           job/dataset/ (10 files, 3 directories)" \
        cp -r "$SRC/job/dataset" "$mnt/job/dataset"
    wl_step "$log" "python3 writes  job/metrics.csv (buffered, line by line)" \
        python3 -c "$PY_WRITER" "$SRC/job/metrics.csv" "$mnt/job/metrics.csv"
    wl_step "$log" "cp              job/model-24MiB.bin" \
        cp "$SRC/job/model-24MiB.bin" "$mnt/job/model-24MiB.bin"
}

# start_last_upload MNT LOG: the last file, in the background (sets APP_PID).
start_last_upload() {
    cp "$SRC/$BIG_REL" "$1/$BIG_REL" 2>>"$2" &
    APP_PID=$!
}

# reap_app: waits for the last cp; sets APP_RC.
reap_app() {
    APP_RC=0
    wait "$APP_PID" 2>/dev/null || APP_RC=$?
    APP_PID=""
}

# app_result LOG: what the last cp's close() returned, into APP_RESULT.
app_result() {
    if [ "$APP_RC" = 0 ]; then
        APP_RESULT="cp exited 0: its close() returned once the upload was complete"
    else
        APP_RESULT="cp FAILED (exit $APP_RC): $(grep -v '^$' "$1" | tail -n 1)"
    fi
}

# start_server DIR: a fresh fake-gcs-server (and bucket) for one run; sets PORT.
start_server() {
    local d="$1" info
    mkdir -p "$d"
    RUN_DIRS+=("$d")
    info="$(python3 "$LOWERS" start-server gcsfuse --workdir "$d")" || die "cannot start fake-gcs-server"
    PORT="$(python3 -c 'import json, sys; print(json.load(sys.stdin)["port"])' <<<"$info")"
    say "  fake-gcs-server on 127.0.0.1:$PORT, bucket drainfs-test (empty)"
}

# gcsfuse_argv DIR MOUNTPOINT: gcsfuse's argv (from lowers.py), into GCSFUSE_ARGV.
gcsfuse_argv() {
    local json
    json="$(python3 "$LOWERS" mount-cmd gcsfuse --workdir "$1" --mountpoint "$2" --log "$1/gcsfuse.log")"
    mapfile -t GCSFUSE_ARGV < <(python3 -c 'import json, sys; print("\n".join(json.load(sys.stdin)))' <<<"$json")
}

show_cmd() {   # prints a command line, quoted where needed, wrapped for reading
    local line="  \$" a
    for a in "$@"; do
        case "$a" in
            *\"* | *\$* | *\`*) a="'${a//\'/\'\\\'\'}'" ;;
            *[[:space:]\']*) a="\"$a\"" ;;
        esac
        if [ $((${#line} + ${#a})) -gt 96 ] && [ "$line" != "  \$" ]; then
            say "$line \\"
            line="      "
        fi
        line="$line $a"
    done
    say "$line"
}

# fetch_objects DIR OUT: every object in the run's bucket, with size and sha256, from the server.
fetch_objects() {
    python3 "$LOWERS" objects gcsfuse --workdir "$1" >"$2" || die "cannot list the bucket"
}

# ---------------------------------------------------------------- run 1: with drainfs

run_with_drainfs() {
    local d="$WORK/with-drainfs" log t_ready t_trig t_app="" t_df="" df_rc end
    say ""
    say "=== Run: with drainfs ====================================================================="
    start_server "$d"
    local lower="$d/lower" mnt="$d/mnt" vol="$d/volumes"
    mkdir -p "$lower" "$mnt" "$vol"
    MOUNTS+=("$mnt" "$lower")
    log="$d/app.log"
    : >"$log"
    gcsfuse_argv "$d" "$lower"
    local pt=()
    if [ -n "$GCS_PASSTHROUGH" ]; then pt=(--passthrough "$GCS_PASSTHROUGH"); fi
    local cmd=("$DRAINFS" run --lower "$lower" --mountpoint "$mnt" "${pt[@]}"
        --exit-file "$vol/exit" --summary-file "$d/summary.json" --ready-file "$d/ready"
        --grace-period 30s --lower-ready-timeout 30s -- "${GCSFUSE_ARGV[@]}")
    say "  drainfs starts gcsfuse on LOWER, waits for its mount, then mounts"
    say "  itself on MNT, where the application writes:"
    show_cmd "${cmd[@]}"
    if [ -z "$GCS_PASSTHROUGH" ]; then
        say "  (default flags: gcsfuse keeps write state per inode, so --passthrough auto gives"
        say "   writers kernel passthrough; drainfs's FLUSH still makes the upload happen in close())"
    fi
    t_ready=$(now_ms)
    "${cmd[@]}" >"$d/drainfs.out" 2>"$d/drainfs.log" &
    DF_PID=$!
    end=$(($(now_ms) + 60000))
    while [ ! -e "$d/ready" ]; do
        alive "$DF_PID" || { tail -n 30 "$d/drainfs.log" >&2; die "drainfs exited before serving"; }
        [ "$(now_ms)" -lt "$end" ] || { tail -n 30 "$d/drainfs.log" >&2; die "drainfs not ready after 60 s"; }
        sleep 0.05
    done
    say "  drainfs is serving ($(secs $(($(now_ms) - t_ready))) after start; it wrote its --ready-file)"
    say "  the application's workload through MNT:"
    workload "$mnt" "$log"
    start_last_upload "$mnt" "$log"
    say "    cp              $BIG_REL (the last upload) ..."
    if wait_in_close "$APP_PID" "$mnt/$BIG_REL"; then
        say "    ... cp is now inside close() of it (the upload is being finalized): STOP"
    else
        say "    ... cp finished before it was seen inside close(): stopping now"
    fi
    # Kubernetes signals the end of the workload with an exit file, written atomically.
    : >"$vol/exit.tmp"
    mv -f "$vol/exit.tmp" "$vol/exit"
    t_trig=$(now_ms)
    say "  trigger: exit file $vol/exit written (temp file + rename)"
    end=$((t_trig + 60000))
    while [ -z "$t_app" ] || [ -z "$t_df" ]; do
        [ -z "$t_app" ] && ! alive "$APP_PID" && t_app=$(now_ms)
        [ -z "$t_df" ] && ! alive "$DF_PID" && t_df=$(now_ms)
        [ "$(now_ms)" -lt "$end" ] || break
        sleep 0.01
    done
    reap_app
    df_rc=0
    if [ -n "$t_df" ]; then
        wait "$DF_PID" || df_rc=$?
        DF_PID=""
    else
        say "  drainfs did not exit within 60 s of the trigger (stopping it)"
        df_rc="(still running)"
    fi
    app_result "$log"
    if [ "$APP_RC" = 0 ]; then
        APP_RESULT="$APP_RESULT, $(secs $((t_app - t_trig))) after the trigger"
    fi
    say "  application: $APP_RESULT"
    WITH_APP="$APP_RESULT"
    case "$df_rc" in
        0) say "  drainfs exited 0 (clean: everything drained and uploaded, gcsfuse stopped cleanly)" ;;
        75) say "  drainfs exited 75 (deadline forced or a flush failed: data may be incomplete)" ;;
        69) say "  drainfs exited 69 (the lower failed or died)" ;;
        *) say "  drainfs exited $df_rc" ;;
    esac
    if [ -n "$t_df" ]; then
        say "  time from trigger to drainfs exit: $(secs $((t_df - t_trig))) (measured by this script)"
    fi
    if [ -s "$d/summary.json" ]; then
        python3 "$HELPER" summary "$d/summary.json"
    else
        say "  (no summary file was written)"
    fi
    if mounted "$mnt" || mounted "$lower"; then
        say "  left mounted: $(mounted "$mnt" && echo MNT) $(mounted "$lower" && echo LOWER) (cleaning up)"
        LEFT_MOUNTED=yes
        detach "$mnt"; detach "$lower"
    else
        say "  left mounted: nothing (neither drainfs's mount nor gcsfuse's)"
    fi
    fetch_objects "$d" "$WORK/objects-with.json"
    python3 "$LOWERS" stop --workdir "$d" >/dev/null
    WITH_TRIGGER_TO_EXIT="-"
    [ -z "$t_df" ] || WITH_TRIGGER_TO_EXIT="$(secs $((t_df - t_trig)))"
    WITH_RC=$df_rc
    WITH_MOUNT="nothing left mounted"
    [ "${LEFT_MOUNTED:-no}" = no ] || WITH_MOUNT="MOUNTS LEFT BEHIND (removed by the demo)"
}

# ---------------------------------------------------------------- run 2: without drainfs

run_without_drainfs() {
    local d="$WORK/without-drainfs" log t0 t_trig t_gone="" killed=no rc_rc end state
    say ""
    say "=== Run: without drainfs (how GKE's sidecar stops gcsfuse today) ==========================="
    start_server "$d"
    local mnt="$d/mnt"
    mkdir -p "$mnt"
    MOUNTS+=("$mnt")
    log="$d/app.log"
    : >"$log"
    gcsfuse_argv "$d" "$mnt"
    say "  gcsfuse mounts the bucket on MNT; the application writes there:"
    show_cmd "${GCSFUSE_ARGV[@]}"
    t0=$(now_ms)
    "${GCSFUSE_ARGV[@]}" </dev/null >"$d/gcsfuse.out" 2>&1 &
    RC_PID=$!
    python3 "$LOWERS" wait-mount --mountpoint "$mnt" --fstype fuse.gcsfuse --timeout 30 >/dev/null \
        || { tail -n 20 "$d/gcsfuse.log" >&2; die "gcsfuse did not mount"; }
    say "  gcsfuse is mounted ($(secs $(($(now_ms) - t0))) after start)"
    say "  the application's workload through MNT (identical):"
    workload "$mnt" "$log"
    start_last_upload "$mnt" "$log"
    say "    cp              $BIG_REL (the last upload) ..."
    if wait_in_close "$APP_PID" "$mnt/$BIG_REL"; then
        say "    ... cp is now inside close() of it (the upload is being finalized): STOP"
    else
        say "    ... cp finished before it was seen inside close(): stopping now"
    fi
    # What the GKE sidecar does once it decides the workload is over: SIGTERM, SIGKILL 5 s later.
    kill -TERM "$RC_PID"
    t_trig=$(now_ms)
    say "  trigger: SIGTERM to gcsfuse; SIGKILL follows in ${SIDECAR_KILL_AFTER_S} s if it is still running"
    end=$((t_trig + SIDECAR_KILL_AFTER_S * 1000))
    while alive "$RC_PID" && [ "$(now_ms)" -lt "$end" ]; do sleep 0.01; done
    if alive "$RC_PID"; then
        kill -KILL "$RC_PID"
        killed=yes
    fi
    t_gone=$(now_ms)
    rc_rc=0
    wait "$RC_PID" 2>/dev/null || rc_rc=$?
    RC_PID=""
    if [ "$killed" = yes ]; then
        say "  gcsfuse was still running after ${SIDECAR_KILL_AFTER_S} s: SIGKILLed (exit $rc_rc)"
    else
        say "  gcsfuse exited by itself $(secs $((t_gone - t_trig))) after SIGTERM, with status $rc_rc" \
            "(its exit status says nothing about uploads)"
    fi
    end=$(($(now_ms) + 30000))
    while alive "$APP_PID" && [ "$(now_ms)" -lt "$end" ]; do sleep 0.05; done
    reap_app
    app_result "$log"
    say "  application: $APP_RESULT"
    WITHOUT_APP="$APP_RESULT"
    if mounted "$mnt"; then
        # What anyone who looks at the directory now sees (ls's own error message).
        # shellcheck disable=SC2012
        state="$(ls "$mnt" 2>&1 >/dev/null | tail -n 1 || true)"
        if [ -n "$state" ]; then
            say "  MNT is still mounted but dead: $state"
        else
            say "  MNT is still mounted"
        fi
        detach "$mnt" && say "  (removed it with fusermount3 -uz / umount -l)"
        WITHOUT_MOUNT="left a dead mount behind (Transport endpoint is not connected)"
        [ -n "$state" ] || WITHOUT_MOUNT="left its mount behind"
    else
        say "  MNT: gcsfuse unmounted itself (no dead mount this time)"
        WITHOUT_MOUNT="unmounted itself"
    fi
    # Give a cancelled upload a moment to settle on the server before reading the bucket.
    sleep 1
    fetch_objects "$d" "$WORK/objects-without.json"
    python3 "$LOWERS" stop --workdir "$d" >/dev/null
    WITHOUT_LOWER="exited $rc_rc $(secs $((t_gone - t_trig))) after SIGTERM"
    [ "$killed" = no ] || WITHOUT_LOWER="was SIGKILLed ${SIDECAR_KILL_AFTER_S} s after SIGTERM"
}


# ---------------------------------------------------------------- second act: GKE's managed sidecar

# managed_run NAME STOP GCSFUSE: one run through the real sidecar mounter. STOP: native |
# exit-file; GCSFUSE: stock | handoff | relay. Appends a row to MANAGED_ROWS.
MANAGED_ROWS=()
managed_run() {
    local name="$1" stop="$2" how="$3" d="$WORK/managed-$1" port opts=() gpath env=() end
    local t_trig t_exit="" nd_rc=0 sc_exit gc_exit errs objs
    mkdir -p "$d"
    chmod 755 "$d"
    start_server "$d" >/dev/null
    port="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["servers"]["gcsfuse"]["port"])' "$d/lowers-state.json")"
    local mnt="$d/mnt" base="$d/volumes" var="$d/var"
    mkdir -p "$mnt" "$var"
    chown 65534:65534 "$var"
    # Its stdin stays open (fake-node-driver takes EOF on stdin as a stop): fd 7, a FIFO held here.
    mkfifo "$d/stdin"
    exec 7<>"$d/stdin"
    MOUNTS+=("$mnt")
    # The mount options a user writes in the volume's mountOptions (REAL-PEERS.md §2.2, §4.3).
    for o in "custom-endpoint=http://localhost:$port/storage/v1/" anonymous-access enable-hns=false \
        enable-atomic-rename-object=false disable-autoconfig implicit-dirs \
        disable-metrics-for-gke:true logging:format:text; do
        opts+=("--mount-option=$o")
    done
    if [ "$how" != stock ]; then
        mkdir -p "$d/dropin"
        ln -sfn "$DRAINFS" "$d/dropin/gcsfuse"   # drainfs runs as the gcsfuse drop-in by its name
        gpath="$d/dropin/gcsfuse"
        env=(DRAINFS_REAL_GCSFUSE="$LOWERS_BIN/gcsfuse" DRAINFS_SUMMARY_FILE="$var/summary.json")
        # The hand-off is the drop-in's default; the relay is chosen per volume (a user writes
        # drainfs-mode=relay in mountOptions) and runs with the kernel's default socket buffer.
        [ "$how" = relay ] && env+=(DRAINFS_SOCKET_BUFFER=212992 DRAINFS_DROPIN_MODE=relay)
    else
        gpath="$LOWERS_BIN/gcsfuse"
    fi
    env "${env[@]}" "$NODE_DRIVER" --mountpoint "$mnt" --volume-base-path "$base" \
        --volume-name "vol-$name" --bucket drainfs-test --stop "$stop" --grace-period 30s \
        "${opts[@]}" -- "$LOWERS_BIN/gcs-fuse-csi-driver-sidecar-mounter" --v=5 \
        "--gcsfuse-path=$gpath" >"$d/node-driver.out" 2>"$d/node-driver.log" <&7 7>&- &
    ND_PID=$!
    end=$(($(now_ms) + 60000))
    until grep -qx ready "$d/node-driver.out" 2>/dev/null; do
        alive "$ND_PID" || { tail -n 30 "$d/node-driver.log" >&2; die "the sidecar did not mount ($name)"; }
        [ "$(now_ms)" -lt "$end" ] || { tail -n 30 "$d/node-driver.log" >&2; die "the sidecar not ready after 60 s ($name)"; }
        sleep 0.05
    done
    : >"$d/app.log"
    workload "$mnt" "$d/app.log" >/dev/null
    cp "$SRC/$BIG_REL" "$mnt/$BIG_REL" 2>>"$d/app.log" || true
    # The workload has exited: the kubelet (native) or the node driver (exit file) stops the sidecar.
    kill -TERM "$ND_PID"
    t_trig=$(now_ms)
    wait "$ND_PID" || nd_rc=$?
    ND_PID=""
    exec 7>&-
    sc_exit="$(sed -n 's/^sidecar exit: //p' "$d/node-driver.out" | tail -n 1)"
    gc_exit="$(sed -n 's/^gcsfuse exit: //p' "$d/node-driver.out" | tail -n 1)"
    errs="$(grep -c '^error file: ' "$d/node-driver.out" || true)"
    fetch_objects "$d" "$d/objects.json"
    objs="$(python3 "$HELPER" count "$SRC/expected.json" "$d/objects.json")"
    python3 "$LOWERS" stop --workdir "$d" >/dev/null
    local outcome="-"
    if [ -s "$var/summary.json" ]; then
        outcome="$(python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); print(s["exit_code"], s["outcome"])' "$var/summary.json")"
    fi
    MANAGED_ROWS+=("$name|$stop|${sc_exit:-?}|$objs|${gc_exit:-?}|$errs|$outcome")
    printf '  %-22s sidecar exit: %s; gcsfuse: %s; error file: %s line(s)\n' "$name" "${sc_exit:-?}" "${gc_exit:-?}" "$errs"
    if [ "$errs" != 0 ]; then
        grep '^error file: ' "$d/node-driver.out" | head -n 3 | sed 's/^/      /'
    fi
}

run_managed() {
    say ""
    say "=== Second act: GKE's managed sidecar (the real sidecar mounter v1.24.4, uid 65534, no capabilities)"
    say "  the node-driver stand-in mounts the volume with fd=N and hands the fd over the sidecar's socket;"
    say "  the sidecar mounter execs --gcsfuse-path: stock = gcsfuse; handoff = drainfs as the gcsfuse"
    say "  drop-in (its default: gcsfuse serves the kernel's fd, drainfs ends it once idle); relay = the"
    say "  drop-in with drainfs-mode=relay (in the data path). The workload runs to its end, then the stop"
    say "  comes the GKE way, at once: the hand-off then waits out its idle window after the last I/O."
    managed_run stock-native native stock
    managed_run handoff-native native handoff
    managed_run relay-native native relay
    managed_run stock-exit-file exit-file stock
    managed_run handoff-exit-file exit-file handoff
    managed_run relay-exit-file exit-file relay
    say ""
    printf '  %-18s %-10s %-28s %-16s %-22s %-6s %s\n' run stop "stop -> sidecar exit" objects "gcsfuse's end" errors "drainfs"
    local r
    for r in "${MANAGED_ROWS[@]}"; do
        IFS='|' read -r a b c e f g h <<<"$r"
        printf '  %-18s %-10s %-28s %-16s %-22s %-6s %s\n' "$a" "$b" "$c" "$e" "$f" "$g" "$h"
    done
    say "  (stop: native = SIGTERM to the sidecar (NATIVE_SIDECAR=TRUE); exit-file = <base>/exit, polled"
    say "   every 5 s. The sidecar mounter SIGKILLs its child 5 s after its SIGTERM. errors: lines in the"
    say "   sidecar's error file, which the node driver reports as mount errors. drainfs: its exit code"
    say "   and outcome: the hand-off's is idle (it saw gcsfuse idle; it counts no request), the relay's"
    say "   clean (every request counted, nothing open, nothing failed))"
}

# ---------------------------------------------------------------- go

say ""
if [ "$MODE" != managed ]; then
    say "The stop arrives at the same moment in every run: while the application is inside close()"
    say "of its last file ($BIG_REL), whose upload is being finalized."
fi

case "$MODE" in
    with) run_with_drainfs ;;
    without) run_without_drainfs ;;
    compare) run_with_drainfs; run_without_drainfs ;;
    managed) run_managed ;;
esac

if [ "$MODE" != managed ]; then
say ""
say "=== Objects in the bucket, read back from fake-gcs-server and compared with the source (sha256)"
say ""
TABLE_ARGS=()
[ "$MODE" != without ] && TABLE_ARGS+=("with drainfs=$WORK/objects-with.json")
[ "$MODE" != with ] && TABLE_ARGS+=("without drainfs=$WORK/objects-without.json")
python3 "$HELPER" table "$SRC/expected.json" "${TABLE_ARGS[@]}"
say ""
say "In short:"
if [ "$MODE" != without ]; then
    say "  with drainfs:    $WITH_APP;"
    say "                   drainfs exited $WITH_RC, $WITH_TRIGGER_TO_EXIT after the trigger; $WITH_MOUNT"
fi
if [ "$MODE" != with ]; then
    say "  without drainfs: $WITHOUT_APP;"
    say "                   gcsfuse $WITHOUT_LOWER and $WITHOUT_MOUNT"
fi
if [ "$MODE" = with ]; then
    say "(scripts/demo.sh with no option also runs the same workload without drainfs, stopped as GKE does)"
fi
fi
[ "$MODE" = compare ] && run_managed
say ""
if [ "${DEMO_KEEP:-0}" = 1 ]; then
    say "cleaning up: stopping every process this demo started, unmounting (keeping $WORK)"
else
    say "cleaning up: stopping every process this demo started, unmounting, removing $WORK"
    say "(DEMO_KEEP=1 keeps it: drainfs's and gcsfuse's logs, the summaries, the sources)"
fi
say "demo took $(secs $(($(now_ms) - T_START)))"
