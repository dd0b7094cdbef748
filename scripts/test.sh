#!/usr/bin/env bash
# The full test suite: the README's second command and what CI (.ci/run) runs.
# Installs what it needs on a fresh Debian machine (as root): fuse3, fio, fuse-overlayfs, the real
# lowers (gcsfuse v3.11.2 and GKE's sidecar mounter v1.24.4 built with the machine's Go, rclone +
# fake-gcs-server, s3fs + moto), the manifest linters, umoci, skopeo, runc, buildah, numactl, promtool. Then:
# rustfmt, clippy with -D warnings, the layout limits, rustdoc with -D warnings, the docs' links
# and commands, unit tests,
# the mount tests (which really mount, as root), the offline Kubernetes/Docker checks, the monitoring checks, the
# images (static drainfs, built with umoci, the GKE overlay also from the Dockerfile with buildah,
# and run in runc in the pod's shape), and smoke runs
# of the benchmark harness (tmpfs, and the real gcsfuse and sidecar mounter), and gcsfuse's own
# integration tests as a parity test (fuse-tests/gcsfuse-suite/, test binaries built once from
# the Go module proxy and cached).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

step() { printf '\n==> %s\n' "$*"; }

need_apt=()
command -v fusermount3 >/dev/null || need_apt+=(fuse3)
command -v fio >/dev/null || need_apt+=(fio)
command -v python3 >/dev/null || need_apt+=(python3)
# A libfuse 3 daemon that serves /dev/fd/N, for the relay tests (fuse-tests/tests/relay.rs).
command -v fuse-overlayfs >/dev/null || need_apt+=(fuse-overlayfs)
# The images: built without a Docker engine (umoci, skopeo) and run in runc in the pod's shape;
# the Dockerfile's gke-overlay target built with buildah; numactl (with libnuma) for the stand-in
# of GKE's sidecar image; promtool checks the alert rules.
command -v umoci >/dev/null || need_apt+=(umoci)
command -v skopeo >/dev/null || need_apt+=(skopeo)
command -v runc >/dev/null || need_apt+=(runc)
command -v buildah >/dev/null || need_apt+=(buildah)
command -v numactl >/dev/null || need_apt+=(numactl)
command -v promtool >/dev/null || need_apt+=(prometheus)
if ((${#need_apt[@]})); then
  step "apt-get install ${need_apt[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi
if [[ $(id -u) -ne 0 ]]; then
  echo "scripts/test.sh: the mount tests need root (mount(2), /dev/fuse, other users)" >&2
  exit 2
fi

# The FUSE control filesystem (where a connection is aborted): systemd mounts it at boot, a
# bare VM or container may not have it. drainfs and the relay tests use it.
if [[ -d /sys/fs/fuse/connections ]] && ! mountpoint -q /sys/fs/fuse/connections; then
  mount -t fusectl fusectl /sys/fs/fuse/connections
fi

# FUSE mounts present before the run, so that the final check only blames mounts this run left
# behind, and only where its tests, benchmarks and image checks make their scratch directories:
# /tmp/drainfs-* and /tmp/.tmp* (the harness's and tempfile's), the checkout and its target/,
# and the kubelet node's root (smoke.sh holds it under a lock). A FUSE mount another user of the
# machine makes elsewhere meanwhile is printed, not counted.
fuse_mounts() { awk '$3 ~ /^fuse/ {print $2}' /proc/mounts | sort; }
mounts_before=$(fuse_mounts)
owned_roots=("/tmp/drainfs-" "/tmp/.tmp" "$PWD/" "$(readlink -f "$PWD/target" 2>/dev/null || echo "$PWD/target")/"
  "${K8S_NODE_ROOT:-/opt/drainfs-k8s}/")

# The relay tests run the workspace's binaries as the sidecar's uid 65534, which cannot reach
# into a checkout under a 0700 directory (root's home on Debian). There, target/ becomes a link
# to a directory it can reach (the tests find the binaries by their resolved path); a target/
# built before is moved there, not rebuilt.
as_sidecar_uid() { setpriv --reuid=65534 --regid=65534 --clear-groups -- "$@"; }
if ! as_sidecar_uid test -x "$PWD"; then
  target_dir="/var/tmp/drainfs-target-$(printf %s "$PWD" | sha256sum | cut -c1-16)"
  if [[ ! -L target ]]; then
    rm -rf "$target_dir"
    if [[ -d target ]]; then mv target "$target_dir"; else mkdir -p "$target_dir"; fi
    ln -s "$target_dir" target
  fi
  mkdir -p "$target_dir"
  chmod 0755 "$target_dir"
  if ! as_sidecar_uid test -x "$(readlink -f target)"; then
    echo "scripts/test.sh: uid 65534 (the sidecar's) cannot reach $(readlink -f target);" \
      "the relay tests run drainfs as that uid: clone the project where it can" >&2
    exit 2
  fi
  echo "note: uid 65534 cannot reach $PWD, so target/ -> $target_dir"
fi

step "real peers and lowers (gcsfuse, the GKE sidecar mounter, fake-gcs-server, rclone, s3fs + moto)"
bash scripts/install-lowers.sh

step "cargo fmt --check"
cargo fmt --all --check

step "cargo clippy -D warnings"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "layout: files within 800 lines, functions within 80, no import circle (scripts/check-layout.py)"
python3 scripts/check-layout.py --self-test
python3 scripts/check-layout.py

step "cargo doc -D warnings"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked --quiet

step "build"
cargo build --workspace --bins --locked

step "docs: relative links resolve, runnable commands run (scripts/check-docs.py), figures name their records (scripts/check-figures.py)"
DRAINFS_BIN="$PWD/target/debug/drainfs" python3 scripts/check-docs.py --self-test
DRAINFS_BIN="$PWD/target/debug/drainfs" python3 scripts/check-docs.py
# Every figure of a section marked `<!-- figures: checked -->` is in a record it links; the
# figures of sections not converted yet are counted (issue #35: that count goes to zero).
python3 scripts/check-figures.py --self-test
python3 scripts/check-figures.py

step "cargo test (unit tests and real mounts)"
# Two test threads: the machine has two cores and the mount tests start FUSE daemons.
cargo test --workspace --locked --no-fail-fast -- --test-threads=2

step "model check of the door and in-flight count (loom)"
# Its own target dir: --cfg changes every crate's build, which must not evict the main build.
RUSTFLAGS="--cfg drainfs_loom" cargo test --lib --locked --target-dir target/loom gate::loom_tests

step "Kubernetes manifests and Dockerfile (offline)"
DRAINFS_BIN="$PWD/target/debug/drainfs" bash docker/check.sh
# The Dockerfile's build context after .dockerignore, with BuildKit's parser and Docker's matcher.
bash docker/check-context.sh

step "monitoring: alert rules and their tests (promtool), dashboard expressions, metric names"
DRAINFS_BIN="$PWD/target/debug/drainfs" bash docker/monitoring/check.sh

step "images, amd64 and arm64: static drainfs, OCI indexes (umoci, skopeo), the GKE overlay (umoci and the Dockerfile with buildah), run in runc in the pod's shape (arm64 under qemu)"
bash docker/image/build.sh
bash docker/image/buildah-overlay.sh
bash docker/image/static-root-test.sh
bash docker/image/static-root-test.sh --arch arm64
# The lint virtualenv docker/check.sh installed has jsonschema, for the summary schema check.
"${DRAINFS_LINT_VENV:-/opt/drainfs-docker-lint/venv}/bin/python" docker/image/run-test.py

step "under the real kubelet v1.34.4 and containerd v2.2.9 (when built): the seed's Job pod, stock, relay, handoff, self-managed and the floor"
bash scripts/k8s-node/smoke.sh

step "benchmark harness, smoke mode"
bash fuse-tests/bench/run.sh --smoke

step "benchmark against the real gcsfuse and sidecar mounter, smoke mode"
bash fuse-tests/bench/gcsfuse.sh --smoke --no-build

step "gcsfuse v3.11.2's own integration tests as a parity test (raw gcsfuse, drainfs auto/never, relay), smoke mode"
bash fuse-tests/gcsfuse-suite/run.sh --smoke --no-build

new_mounts=$(comm -13 <(echo "$mounts_before") <(fuse_mounts))
leftover="" others=""
while IFS= read -r m; do
  [[ -n "$m" ]] || continue
  ours=0
  for r in "${owned_roots[@]}"; do [[ "$m/" == "$r"* ]] && ours=1; done
  if ((ours)); then leftover+="$m"$'\n'; else others+="$m"$'\n'; fi
done <<<"$new_mounts"
if [[ -n "$others" ]]; then
  echo "note: FUSE mounts made meanwhile outside this run's directories (not counted):"
  printf '%s' "$others"
fi
if [[ -n "$leftover" ]]; then
  echo "mounts left behind by the tests:" >&2
  printf '%s' "$leftover" >&2
  exit 1
fi
step "all checks passed"
