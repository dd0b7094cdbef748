#!/usr/bin/env bash
# Check: do the admin server's probes and metrics cost anything on the data path?
# Runs the same fio jobs against drainfs over a tmpfs lower, interleaved, with and without
# `--admin-addr` plus a scraper hitting /metrics, /livez, /readyz and /status every second
# over one keep-alive connection (already more than a kubelet, which probes every 5-10 s, and
# Prometheus, which scrapes every 15-30 s). A scraper that forks a curl per request measures
# the cost of forking on a 2-core machine, not drainfs.
# Prints the medians and the ratio. Needs root, fio, python3, bc; builds drainfs (release)
# unless --no-build. Everything lives under one fresh temp dir, cleaned up by lib.sh's EXIT trap.
#   fuse-tests/bench/admin_cost.sh [--no-build] [REPS (default 3)] [RUNTIME (default 5s)]
set -euo pipefail
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
bench_args "$@"
reps=${args[0]:-3}
runtime=${args[1]:-5s}
bench_init admin_cost.sh bc fusermount3 mount mountpoint
bin="$bin_dir/drainfs"
bench_workdir drainfs-admincost
mkdir -p "$work/lower" "$work/mnt"
mount -t tmpfs -o size=3g drainfs-admincost "$work/lower"
# The scraper, run from the work directory so that the EXIT trap recognises it by its command
# line.
cat >"$work/scraper.py" <<'EOF_PY'
import http.client, time
c = http.client.HTTPConnection("127.0.0.1", 19733, timeout=5)
while True:
    for p in ("/metrics", "/livez", "/readyz", "/status"):
        c.request("GET", p); c.getresponse().read()
    time.sleep(1)
EOF_PY

run_case() { # $1 = plain|admin ; prints "job value" lines
    local args=(run --lower "$work/lower" --mountpoint "$work/mnt" --native-sidecar)
    [[ $1 == admin ]] && args+=(--admin-addr 127.0.0.1:19733)
    "$bin" "${args[@]}" 2>"$work/log" &
    local df=$!
    echo "$df" >>"$work/pids"
    for _ in $(seq 100); do mountpoint -q "$work/mnt" && break; sleep 0.05; done
    local scraper=
    if [[ $1 == admin ]]; then
        python3 "$work/scraper.py" &
        scraper=$!
        echo "$scraper" >>"$work/pids"
    fi
    for job in "read 1M" "randwrite 4k" "randread 4k"; do
        set -- $job
        local v
        v=$(fio --name=j --directory="$work/mnt" --filename=f --rw="$1" --bs="$2" --size=1G --ioengine=psync \
            --runtime="$runtime" --time_based --output-format=json 2>/dev/null |
            python3 -c 'import json,sys; j=json.load(sys.stdin)["jobs"][0]; r=j["read"] if j["read"]["io_bytes"] else j["write"]; print(round(r["iops"]))')
        echo "$1-$2 $v"
    done
    [[ -n $scraper ]] && kill "$scraper"
    kill -TERM "$df"; wait "$df" || true
}

declare -A vals
for r in $(seq "$reps"); do
    for c in plain admin; do
        while read -r job v; do vals["$c $job"]+="$v "; done < <(run_case "$c")
    done
done
median() { tr ' ' '\n' | grep -v '^$' | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
printf '%-14s %14s %14s %7s\n' "fio job (IOPS)" "no admin" "admin+scrape" "ratio"
for job in read-1M randwrite-4k randread-4k; do
    p=$(echo "${vals["plain $job"]}" | median); a=$(echo "${vals["admin $job"]}" | median)
    printf '%-14s %14s %14s %7.3f\n' "$job" "$p" "$a" "$(echo "$a / $p" | bc -l)"
done
umount "$work/lower"
