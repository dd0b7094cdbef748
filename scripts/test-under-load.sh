#!/usr/bin/env bash
# The full test suite (./scripts/test.sh, the README's test command) N times in a row on this
# machine with a CPU hog beside it, each run reported: its exit status, its time, the tests
# cargo counted, and the failures it named. This is how "the suite never hangs and never
# flakes" is shown: green runs while the machine is busy, as CI and developer machines are.
#
# Usage: scripts/test-under-load.sh [--runs N] [--hog "CMD"] [--clone]
#   --runs N     how many runs (default 3); all are made, a failure does not stop the rest
#   --hog CMD    the load (default: stress-ng --cpu 2, two busy workers on a 2-core machine)
#   --clone      run each in a fresh clone of HEAD (as CI does) instead of this tree
# Logs: $DRAINFS_LOAD_DIR (default /tmp/drainfs-under-load)/run-K.log, and summary.txt.
# Exit status: 0 when every run passed, 1 otherwise, 2 on usage errors. Needs root (as test.sh).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
runs=3
hog="stress-ng --cpu 2 --quiet"
clone=0
while (($#)); do
  case "$1" in
    --runs) runs="$2"; shift 2 ;;
    --hog) hog="$2"; shift 2 ;;
    --clone) clone=1; shift ;;
    -h|--help) sed -n '2,13p' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) echo "test-under-load.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[[ "$runs" =~ ^[1-9][0-9]*$ ]] || { echo "test-under-load.sh: --runs needs a positive number" >&2; exit 2; }
if [[ $hog == stress-ng* ]] && ! command -v stress-ng >/dev/null; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq stress-ng >/dev/null
fi
out="${DRAINFS_LOAD_DIR:-/tmp/drainfs-under-load}"
mkdir -p "$out"
summary="$out/summary.txt"
: >"$summary"

hog_pid=""
stop_hog() {
  if [[ -n "$hog_pid" ]]; then
    # The hog's own process group (setsid below): its workers go with it.
    kill -TERM -- "-$hog_pid" 2>/dev/null || true
    wait "$hog_pid" 2>/dev/null || true
    hog_pid=""
  fi
}
trap stop_hog EXIT

# shellcheck disable=SC2086  # the hog is a command line
setsid $hog >/dev/null 2>&1 &
hog_pid=$!
echo "load: $hog (pid $hog_pid); $(nproc) cores" | tee -a "$summary"

failed=0
for ((k = 1; k <= runs; k++)); do
  log="$out/run-$k.log"
  tree="$ROOT"
  if ((clone)); then
    tree="$out/clone-$k"
    rm -rf "$tree"
    git clone -q "$ROOT" "$tree"
  fi
  t0=$(date +%s)
  rc=0
  (cd "$tree" && CI=true ./scripts/test.sh) >"$log" 2>&1 </dev/null || rc=$?
  secs=$(($(date +%s) - t0))
  # (grep finds nothing in a run that stopped before the tests: not an error here)
  passed=$({ grep -Eo '^test result: [a-zA-Z]+\. [0-9]+ passed' "$log" || true; } | awk '{s += $4} END {print s + 0}')
  nfailed=$({ grep -Eo '^test result: [a-zA-Z]+\. [0-9]+ passed; [0-9]+ failed' "$log" || true; } | awk '{s += $6} END {print s + 0}')
  load=$(cut -d' ' -f1-3 /proc/loadavg)
  line="run $k: exit $rc in ${secs}s, cargo tests: $passed passed, $nfailed failed; load average now $load"
  echo "$line" | tee -a "$summary"
  if ((rc != 0)); then
    failed=1
    { grep -E '^(---- .* stdout ----|test .* \.\.\. FAILED|fuse-tests bound:|error)' "$log" || true; } \
      | head -20 | sed 's/^/    /' | tee -a "$summary"
    echo "    last lines:" | tee -a "$summary"
    tail -5 "$log" | sed 's/^/    /' | tee -a "$summary"
  fi
  if ((clone)) && ((rc == 0)); then rm -rf "$tree"; fi
done
stop_hog
echo "summary: $summary"
exit "$failed"
