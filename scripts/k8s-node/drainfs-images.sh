#!/usr/bin/env bash
# Puts the images of the four arrangements drainfs-pods.py runs into the node's containerd
# (k8s.io namespace), for the kubelet up.sh started:
#   the project's two images, as docker/image/build.sh builds them (built first when missing,
#   or with --build), this host's architecture (the layout's `sidecar` and `relay` tags: the
#   images build.sh's two archives index for amd64 and arm64), written by skopeo into
#   $K8S_NODE_ROOT/images/{drainfs-sidecar,gcsfuse-relay}.tar under the archives' names:
#     drainfs-sidecar.tar  -> drainfs:VERSION (tagged docker.io/library/drainfs:VERSION)
#     gcsfuse-relay.tar    -> gcs-fuse-csi-driver-sidecar-mounter:v1.24.4-gke.0-drainfs.VERSION
#                             (tagged docker.io/library/... likewise)
#   the managed path's default image, the gke-overlay tag build.sh makes in target/images/oci
#   (docker/Dockerfile's gke-overlay target on the stand-in for GKE's sidecar image), written
#   by skopeo into $K8S_NODE_ROOT/images/gke-overlay.tar
#     -> local.drainfs/gcs-fuse-csi-driver-sidecar-mounter:v1.24.4-gke-overlay
#   and the stock sidecar, laid out as GKE's gcs-fuse-csi-driver-sidecar-mounter image: the relay
#   image's files with the real gcsfuse v3.11.2 as /gcsfuse and no drainfs, written by umoci and
#   skopeo into $K8S_NODE_ROOT/images/gke-sidecar-stock.tar
#     -> local.drainfs/gcs-fuse-csi-driver-sidecar-mounter:v1.24.4-stock
# Prints the names containerd holds afterwards.
#
# Usage: bash scripts/k8s-node/drainfs-images.sh [--build]     (as root; the node is up)
# Exit codes: 0 imported; 1 a build or an import failed; 2 usage, or containerd is not up.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
# shellcheck source=env.sh
source "$here/env.sh"
build=0
case "${1:-}" in
  "") ;;
  --build) build=1 ;;
  *) echo "drainfs-images.sh: unknown argument $1" >&2; exit 2 ;;
esac
ctr_ version >/dev/null 2>&1 || { echo "drainfs-images.sh: containerd is not up (scripts/k8s-node/up.sh)" >&2; exit 2; }
images="$repo/target/images"
if ((build)) || [[ ! -f "$images/drainfs-sidecar.tar" || ! -f "$images/gcsfuse-relay.tar" || ! -d "$images/rootfs/relay" ]] \
    || ! grep -Eq '"org.opencontainers.image.ref.name": *"gke-overlay"' "$images/oci/index.json" 2>/dev/null; then
  bash "$repo/docker/image/build.sh"
fi

out="$root/images"
mkdir -p "$out"
stock_rootfs="$out/rootfs-stock"
rm -rf "$stock_rootfs" "$out/oci-stock"
cp -a "$images/rootfs/relay" "$stock_rootfs"
# GKE's image holds the real gcsfuse as /gcsfuse; the relay image keeps it as /gcsfuse.real.
mv -f "$stock_rootfs/gcsfuse.real" "$stock_rootfs/gcsfuse"
umoci init --layout "$out/oci-stock"
umoci new --image "$out/oci-stock:stock"
umoci insert --image "$out/oci-stock:stock" --history.created_by "scripts/k8s-node/drainfs-images.sh" \
  "$stock_rootfs" /
umoci config --image "$out/oci-stock:stock" --config.env "PATH=/usr/local/bin:/usr/bin:/bin:/" \
  --config.entrypoint /gcs-fuse-csi-driver-sidecar-mounter --config.user 65534:65534
rm -f "$out/gke-sidecar-stock.tar"
skopeo copy --quiet "oci:$out/oci-stock:stock" \
  "oci-archive:$out/gke-sidecar-stock.tar:local.drainfs/gcs-fuse-csi-driver-sidecar-mounter:v1.24.4-stock"
rm -rf "$stock_rootfs" "$out/oci-stock"
rm -f "$out/gke-overlay.tar"
skopeo copy --quiet "oci:$images/oci:gke-overlay" \
  "oci-archive:$out/gke-overlay.tar:local.drainfs/gcs-fuse-csi-driver-sidecar-mounter:v1.24.4-gke-overlay"
version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$repo/Cargo.toml" | head -1)
rm -f "$out/drainfs-sidecar.tar" "$out/gcsfuse-relay.tar"
skopeo copy --quiet "oci:$images/oci:sidecar" "oci-archive:$out/drainfs-sidecar.tar:drainfs:$version"
skopeo copy --quiet "oci:$images/oci:relay" \
  "oci-archive:$out/gcsfuse-relay.tar:gcs-fuse-csi-driver-sidecar-mounter:v1.24.4-gke.0-drainfs.$version"

for a in "$out/drainfs-sidecar.tar" "$out/gcsfuse-relay.tar" "$out/gke-sidecar-stock.tar" "$out/gke-overlay.tar"; do
  ctr_ images import "$a" >/dev/null 2>&1 || { echo "drainfs-images.sh: import of $a failed" >&2; exit 1; }
done
# The archives name the two project images without a registry (drainfs:VERSION); the CRI looks a
# pod's `image: drainfs:VERSION` up under its normalized name, docker.io/library/drainfs:VERSION.
for n in "drainfs:$version" "gcs-fuse-csi-driver-sidecar-mounter:v1.24.4-gke.0-drainfs.$version"; do
  ctr_ images tag --force "$n" "docker.io/library/$n" >/dev/null 2>&1 \
    || { echo "drainfs-images.sh: $n was not imported" >&2; exit 1; }
done
ctr_ images ls -q | grep -E 'drainfs|sidecar-mounter'
