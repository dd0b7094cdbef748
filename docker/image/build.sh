#!/usr/bin/env bash
# Builds the two images without a Docker engine, from the binaries this project builds and
# tests, and writes them as OCI archives that `skopeo copy` pushes:
#   target/images/drainfs-sidecar.tar   the self-managed sidecar (entrypoint drainfs)
#   target/images/gcsfuse-relay.tar     laid out as GKE's sidecar-mounter image: entrypoint
#                                       /gcs-fuse-csi-driver-sidecar-mounter, /gcsfuse = drainfs,
#                                       /gcsfuse.real = gcsfuse
# and the OCI layout both came from (target/images/oci, tags `sidecar` and `relay`). In the same
# layout, the managed path's image as docker/Dockerfile's gke-overlay target makes it, on a
# stand-in for GKE's sidecar image (which cannot be pulled here):
#   gke-standin   the layout of the driver's cmd/sidecar_mounter/Dockerfile at v1.24.4
#                 (stage-gke-standin.sh): a distroless-like glibc layer, then numactl, true,
#                 libnuma, the loader, gcsfuse v3.11.2 at /gcsfuse and the sidecar mounter
#                 v1.24.4; entrypoint the sidecar mounter, no USER
#   gke-overlay   gke-standin plus one layer: the base's own /gcsfuse as /gcsfuse.real and
#                 drainfs as /gcsfuse (the Dockerfile's two COPYs); config unchanged
# docker/image/buildah-overlay.sh then builds the Dockerfile's gke-overlay target on gke-standin
# with buildah and checks it holds the same files as gke-overlay.
#
# Inputs: drainfs built here with `-C target-feature=+crt-static` (a static-pie binary, no
# shared libraries, checked), gcsfuse v3.11.2 and the sidecar mounter v1.24.4 as
# scripts/install-lowers.sh builds them from their Go modules (CGO_ENABLED=0, static; found in
# $DRAINFS_LOWERS_ROOT/bin, default /opt/drainfs-lowers/bin), and Debian's CA bundle.
# Files and modes come from files.txt, staged by stage-rootfs.sh (the Dockerfile runs the
# same script). Tools: umoci (writes the layers and the config into an OCI layout, as an
# unprivileged file operation: no daemon, no storage driver, no mounts) and skopeo (layout to
# archive, and what a user pushes with). Installs them with apt-get when missing.
#
# The relay image's environment reaches drainfs (the sidecar mounter passes its own to /gcsfuse;
# the webhook discards the pod's env for the sidecar): it sets DRAINFS_ADMIN_ADDR from
# $DRAINFS_RELAY_ADMIN_ADDR (default 0.0.0.0:29090; empty: no admin server).
#
# Usage: bash docker/image/build.sh        (as root, from anywhere)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
cd "$repo"
out="$repo/target/images"
lowers="${DRAINFS_LOWERS_ROOT:-/opt/drainfs-lowers}/bin"
GCSFUSE_VERSION=3.11.2
SIDECAR_VERSION=v1.24.4
relay_admin_addr="${DRAINFS_RELAY_ADMIN_ADDR-0.0.0.0:29090}"
# The relay image runs the drop-in as the relay (its own default is the hand-off).
relay_env=(--config.env "DRAINFS_DROPIN_MODE=relay")
[[ -z "$relay_admin_addr" ]] || relay_env+=(--config.env "DRAINFS_ADMIN_ADDR=$relay_admin_addr")
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)

need=()
command -v umoci >/dev/null || need+=(umoci)
command -v skopeo >/dev/null || need+=(skopeo)
[[ -f /etc/ssl/certs/ca-certificates.crt ]] || need+=(ca-certificates)
if ((${#need[@]})); then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

triple=$(rustc -vV | sed -n 's/^host: //p')
echo "==> static drainfs ($triple, +crt-static)"
# --target keeps the flag off build scripts and proc macros (which must stay dynamic) and
# gives the static build a directory of its own (target/$triple), next to the normal one.
RUSTFLAGS="-C target-feature=+crt-static" cargo build --release --locked -p drainfs --target "$triple"
drainfs="$repo/target/$triple/release/drainfs"
if readelf -lW "$drainfs" | grep -q INTERP || readelf -dW "$drainfs" | grep -q NEEDED; then
  echo "build.sh: $drainfs is not static:" >&2
  readelf -dW "$drainfs" | grep NEEDED >&2 || true
  exit 1
fi

# The images' version and revision labels, from the binary itself (VERSION+COMMIT: build.rs).
built="$("$drainfs" --version | awk '{print $2}')"
if [[ "${built%%+*}" != "$version" || "$built" != *+* ]]; then
  echo "build.sh: $drainfs says '$built', Cargo.toml $version" >&2
  exit 1
fi
revision="${built#*+}"

for b in gcsfuse gcs-fuse-csi-driver-sidecar-mounter; do
  [[ -x "$lowers/$b" ]] || { echo "build.sh: $lowers/$b missing: run bash scripts/install-lowers.sh" >&2; exit 1; }
  if readelf -lW "$(readlink -f "$lowers/$b")" | grep -q INTERP; then
    echo "build.sh: $lowers/$b is dynamically linked" >&2
    exit 1
  fi
done
"$lowers/gcsfuse" --version | grep -q "gcsfuse version $GCSFUSE_VERSION " \
  || { echo "build.sh: $lowers/gcsfuse is not v$GCSFUSE_VERSION" >&2; exit 1; }

rm -rf "$out/dist" "$out/rootfs" "$out/oci"
mkdir -p "$out/dist" "$out/rootfs"
install -m 0755 "$drainfs" "$out/dist/drainfs"
strip "$out/dist/drainfs"
install -m 0755 "$(readlink -f "$lowers/gcsfuse")" "$out/dist/gcsfuse"
install -m 0755 "$(readlink -f "$lowers/gcs-fuse-csi-driver-sidecar-mounter")" "$out/dist/gcs-fuse-csi-driver-sidecar-mounter"
install -m 0644 /etc/ssl/certs/ca-certificates.crt "$out/dist/ca-certificates.crt"
install -m 0644 "$here/passwd" "$here/group" "$out/dist/"

umoci init --layout "$out/oci"
labels=(
  --config.label "org.opencontainers.image.licenses=Apache-2.0"
  --config.label "org.opencontainers.image.version=$version"
  --config.label "org.opencontainers.image.revision=$revision"
)
build() { # IMAGE, then umoci config flags
  local image=$1
  shift
  echo "==> image $image"
  bash "$here/stage-rootfs.sh" "$image" "$out/dist" "$out/rootfs/$image"
  umoci new --image "$out/oci:$image"
  umoci insert --image "$out/oci:$image" --history.created_by "docker/image/build.sh $image" \
    "$out/rootfs/$image" /
  umoci config --image "$out/oci:$image" --config.env "PATH=/usr/local/bin:/usr/bin:/bin:/" \
    "${labels[@]}" "$@"
}
build sidecar --config.entrypoint /usr/local/bin/drainfs --config.cmd --help \
  --config.user 0:0 --config.label "org.opencontainers.image.title=drainfs"
build relay --config.entrypoint /gcs-fuse-csi-driver-sidecar-mounter \
  --config.user 65534:65534 "${relay_env[@]}" \
  --config.label "org.opencontainers.image.title=gcs-fuse-csi-driver-sidecar-mounter with drainfs as /gcsfuse" \
  --config.label "dev.drainfs.sidecar-mounter.version=$SIDECAR_VERSION" \
  --config.label "dev.drainfs.gcsfuse.version=$GCSFUSE_VERSION"

echo "==> image gke-standin (a stand-in for GKE's sidecar image v1.24.4)"
bash "$here/stage-gke-standin.sh" "$out/dist" "$out/rootfs/gke-standin" >"$out/rootfs/gke-standin.env"
mapfile -t standin_env <"$out/rootfs/gke-standin.env"
env_flags=()
for e in "${standin_env[@]}"; do env_flags+=(--config.env "$e"); done
umoci new --image "$out/oci:gke-standin"
umoci insert --image "$out/oci:gke-standin" --history.created_by "stand-in: gcr.io/distroless/base-debian12" \
  "$out/rootfs/gke-standin/base" /
umoci insert --image "$out/oci:gke-standin" \
  --history.created_by "stand-in: gcs-fuse-csi-driver $SIDECAR_VERSION cmd/sidecar_mounter/Dockerfile output-image" \
  "$out/rootfs/gke-standin/sidecar" /
umoci config --image "$out/oci:gke-standin" --config.entrypoint /gcs-fuse-csi-driver-sidecar-mounter \
  "${env_flags[@]}" \
  --config.label "org.opencontainers.image.title=stand-in for gke.gcr.io/gcs-fuse-csi-driver-sidecar-mounter:$SIDECAR_VERSION-gke.0 (docker/image/build.sh)"

# The overlay, as the Dockerfile's gke-overlay stage: one layer on top of the base, holding the
# base's own /gcsfuse (taken from the image, mode kept) as /gcsfuse.real and drainfs as /gcsfuse.
echo "==> image gke-overlay (gke-standin + drainfs at /gcsfuse, the base's gcsfuse at /gcsfuse.real)"
umoci raw unpack --image "$out/oci:gke-standin" "$out/rootfs/gke-standin-unpacked" >/dev/null
install -d -m 0755 "$out/rootfs/gke-overlay"
cp -p "$out/rootfs/gke-standin-unpacked/gcsfuse" "$out/rootfs/gke-overlay/gcsfuse.real"
install -m 0755 "$out/dist/drainfs" "$out/rootfs/gke-overlay/gcsfuse"
rm -rf "$out/rootfs/gke-standin-unpacked"
umoci tag --image "$out/oci:gke-standin" gke-overlay
umoci insert --image "$out/oci:gke-overlay" --history.created_by "docker/Dockerfile gke-overlay: COPY /gcsfuse /gcsfuse.real; COPY drainfs /gcsfuse" \
  "$out/rootfs/gke-overlay" /
umoci gc --layout "$out/oci"

rm -f "$out/drainfs-sidecar.tar" "$out/gcsfuse-relay.tar"
skopeo copy --quiet "oci:$out/oci:sidecar" "oci-archive:$out/drainfs-sidecar.tar:drainfs:$version"
skopeo copy --quiet "oci:$out/oci:relay" \
  "oci-archive:$out/gcsfuse-relay.tar:gcs-fuse-csi-driver-sidecar-mounter:$SIDECAR_VERSION-gke.0-drainfs.$version"
for a in drainfs-sidecar gcsfuse-relay; do
  printf '  %s  %s\n' "$(du -h "$out/$a.tar" | cut -f1)" "$out/$a.tar"
done
