#!/usr/bin/env bash
# Checks the monitoring files against their own tool and against a real drainfs:
#   1. promtool check rules alerts.yaml, promtool test rules alerts.test.yaml;
#   2. every PromQL expression of the Grafana dashboard parses (promtool check rules on them as
#      recording rules) and evaluates over the recorded series (promtool test rules);
#   3. every drainfs_* metric the rules, their tests and the dashboard name is one a real drainfs
#      exports: a drainfs (DRAINFS_BIN, default target/debug/drainfs) is mounted over a tmpfs,
#      drained (POST /drain, so the deadline gauge appears), scraped and stopped.
# Usage (root): bash docker/monitoring/check.sh      Exit 0 when every check passed.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
bin="${DRAINFS_BIN:-$repo/target/debug/drainfs}"
command -v promtool >/dev/null || {
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus >/dev/null
}
work=$(mktemp -d /tmp/drainfs-monitoring-XXXXXX)
pid=
cleanup() {
  [[ -n "$pid" ]] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
  mountpoint -q "$work/m" 2>/dev/null && umount -l "$work/m"
  mountpoint -q "$work/l" 2>/dev/null && umount -l "$work/l"
  rm -rf "$work"
}
trap cleanup EXIT

cd "$here"
promtool check rules alerts.yaml
promtool test rules alerts.test.yaml

python3 - "$work" <<'PY'
import json, sys
work = sys.argv[1]
d = json.load(open("dashboard.json"))
exprs = [t["expr"] for p in d["panels"] for t in p["targets"]]
assert exprs, "no expressions in the dashboard"
def concrete(e):  # Grafana's variables, as Grafana expands them for one instance
    return (e.replace("$__rate_interval", "1m").replace("$__range", "5m")
             .replace('instance=~"$instance"', 'instance=~".+"'))
with open(f"{work}/dashboard-rules.yaml", "w") as f:
    f.write("groups:\n  - name: dashboard\n    rules:\n")
    for i, e in enumerate(exprs):
        f.write(f"      - record: dashboard:panel_{i}\n        expr: {json.dumps(concrete(e))}\n")
# Evaluated over a short recorded run: a drain in progress.
with open(f"{work}/dashboard-rules.test.yaml", "w") as f:
    f.write(f"""rule_files: [dashboard-rules.yaml]
evaluation_interval: 15s
tests:
  - interval: 15s
    input_series:
      - series: 'drainfs_phase{{instance="p:9090", phase="door_closed"}}'
        values: '0 1 1'
      - series: 'drainfs_deadline_remaining_seconds{{instance="p:9090"}}'
        values: '_ 20 5'
    promql_expr_test:
      - expr: dashboard:panel_0
        eval_time: 30s
        exp_samples:
          - labels: 'dashboard:panel_0{{instance="p:9090", phase="door_closed"}}'
            value: 1
      - expr: dashboard:panel_5
        eval_time: 30s
        exp_samples:
          - labels: 'dashboard:panel_5{{instance="p:9090"}}'
            value: 5
""")
names = set()
import re
for text in [*exprs, open("alerts.yaml").read(), open("alerts.test.yaml").read()]:
    names |= set(re.findall(r"\bdrainfs_[a-z_]+", text))
open(f"{work}/names", "w").write("\n".join(sorted(names)) + "\n")
PY
(cd "$work" && promtool check rules dashboard-rules.yaml && promtool test rules dashboard-rules.test.yaml)

[[ -x "$bin" ]] || { echo "check.sh: $bin missing (cargo build --workspace --bins)" >&2; exit 1; }
mkdir -p "$work/l" "$work/m"
mount -t tmpfs drainfs-monitoring "$work/l"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$bin" run --lower "$work/l" --mountpoint "$work/m" --admin-addr "127.0.0.1:$port" \
  --ready-file "$work/ready" --exit-file "$work/exit" --grace-period 60 >"$work/log" 2>&1 &
pid=$!
for _ in $(seq 200); do [[ -e "$work/ready" ]] && break; sleep 0.05; done
[[ -e "$work/ready" ]] || { cat "$work/log" >&2; echo "check.sh: drainfs never served" >&2; exit 1; }
curl -fsS -X POST "http://127.0.0.1:$port/drain" >/dev/null
curl -fsS "http://127.0.0.1:$port/metrics" >"$work/metrics"
: >"$work/exit"
wait "$pid"
pid=
missing=0
while read -r name; do
  # A histogram's series are NAME_bucket/_sum/_count; counters end in _total.
  if ! grep -Eq "^${name}(\{| )" "$work/metrics"; then
    echo "check.sh: $name is not exported by drainfs" >&2
    missing=1
  fi
done <"$work/names"
((missing == 0))
echo "docker/monitoring/check.sh: rules, rule tests and dashboard expressions pass; $(wc -l <"$work/names") metric names all exported by drainfs"
