#!/usr/bin/env bash
# Builds the images without a Docker engine, for amd64 and arm64, from the binaries this project
# builds and tests, and writes them as OCI archives that `skopeo copy --all` pushes:
#   target/images/drainfs-sidecar.tar   the self-managed sidecar (entrypoint drainfs)
#   target/images/gcsfuse-relay.tar     laid out as GKE's sidecar-mounter image: entrypoint
#                                       /gcs-fuse-csi-driver-sidecar-mounter, /gcsfuse = drainfs,
#                                       /gcsfuse.real = gcsfuse
# each an OCI image index over both architectures (a pull resolves it to the node's). The OCI
# layout they came from, target/images/oci, holds every image per architecture (tags IMAGE-amd64,
# IMAGE-arm64), the index of each (IMAGE-index), and this host's under the plain tag IMAGE (what
# the suite's runc and kubelet runs use). In the same layout, the managed path's image as
# docker/Dockerfile's gke-overlay target makes it, on a stand-in for GKE's sidecar image (which
# cannot be pulled here):
#   gke-standin   the layout of the driver's cmd/sidecar_mounter/Dockerfile at v1.24.4
#                 (stage-gke-standin.sh): a distroless-like glibc layer, then numactl, true,
#                 libnuma, the loader, gcsfuse v3.11.2 at /gcsfuse and the sidecar mounter
#                 v1.24.4; entrypoint the sidecar mounter, no USER
#   gke-overlay   gke-standin plus one layer: the base's own /gcsfuse as /gcsfuse.real and
#                 drainfs as /gcsfuse (the Dockerfile's two COPYs); config unchanged
# docker/image/buildah-overlay.sh then builds the Dockerfile's gke-overlay target on gke-standin
# with buildah, for each architecture, and checks it holds the same files as gke-overlay.
#
# Inputs: drainfs built here with `-C target-feature=+crt-static` (a static-pie binary, no
# shared libraries, checked) for x86_64-unknown-linux-gnu and aarch64-unknown-linux-gnu (Debian's
# cross gcc links it; rustup's target), gcsfuse v3.11.2 and the sidecar mounter v1.24.4 as
# scripts/install-lowers.sh builds them from their Go modules (CGO_ENABLED=0, static; found in
# $DRAINFS_LOWERS_ROOT/bin, default /opt/drainfs-lowers/bin, and with --arm64 in bin/arm64), and
# Debian's CA bundle. The arm64 binaries are asked their version under qemu-aarch64-static.
# Files and modes come from files.txt, staged by stage-rootfs.sh (the Dockerfile runs the
# same script). Tools: umoci (writes the layers and the config into an OCI layout, as an
# unprivileged file operation: no daemon, no storage driver, no mounts) and skopeo (layout to
# archive, and what a user pushes with). Installs them, the cross toolchain and qemu-user-static
# with apt-get when missing. DRAINFS_IMAGE_ARCHES="amd64" builds this host's architecture only;
# from a host that is not amd64, only its own architecture is built.
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

host_arch=$(dpkg --print-architecture)
# Both from an amd64 host (the cross toolchain and the emulator are amd64's); elsewhere the
# host's own architecture only.
default_arches="amd64 arm64"
[[ $host_arch == amd64 ]] || default_arches=$host_arch
read -r -a arches <<<"${DRAINFS_IMAGE_ARCHES:-$default_arches}"
for a in "${arches[@]}"; do
  case "$a" in amd64 | arm64) ;; *) echo "build.sh: DRAINFS_IMAGE_ARCHES: no '$a' (amd64, arm64)" >&2; exit 2 ;; esac
done
[[ " ${arches[*]} " == *" $host_arch "* ]] \
  || { echo "build.sh: DRAINFS_IMAGE_ARCHES must include this host's $host_arch (the images the suite runs)" >&2; exit 2; }
if [[ $host_arch != amd64 && "${arches[*]}" != "$host_arch" ]]; then
  echo "build.sh: from a $host_arch host only $host_arch is built (DRAINFS_IMAGE_ARCHES=$host_arch)" >&2
  exit 2
fi
if [[ " ${arches[*]} " == *" arm64 "* && $host_arch != arm64 ]]; then
  # The cross toolchain (linker, strip, static glibc) and the emulator the checks run arm64 under.
  cross=()
  command -v aarch64-linux-gnu-gcc >/dev/null || cross+=(gcc-aarch64-linux-gnu)
  [[ -f /usr/aarch64-linux-gnu/lib/libc.a ]] || cross+=(libc6-dev-arm64-cross)
  command -v qemu-aarch64-static >/dev/null || cross+=(qemu-user-static)
  if ((${#cross[@]})); then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${cross[@]}" >/dev/null
  fi
  rustup target list --installed 2>/dev/null | grep -qx aarch64-unknown-linux-gnu \
    || rustup target add aarch64-unknown-linux-gnu >/dev/null
  export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
  bash "$repo/scripts/install-lowers.sh" --arm64 >/dev/null
fi

# run_as ARCH CMD...: CMD, under qemu's user-mode emulation when ARCH is not this host's.
run_as() {
  local a=$1
  shift
  if [[ $a == "$host_arch" ]]; then "$@"; else "qemu-aarch64-static" "$@"; fi
}

rm -rf "$out/dist" "$out/rootfs" "$out/oci" "$out"/dist-* "$out"/rootfs-*
umoci init --layout "$out/oci"

# stage_dist ARCH DIST: the static drainfs for ARCH, the Go peers for ARCH, the CA bundle and the
# users, into DIST. Sets $revision (the images' label) from the host's binary.
stage_dist() {
  local a=$1 dist=$2 triple strip=strip lowers_a=$lowers
  case "$a" in
    amd64) triple=x86_64-unknown-linux-gnu ;;
    arm64) triple=aarch64-unknown-linux-gnu ;;
  esac
  if [[ $a != "$host_arch" ]]; then
    strip=aarch64-linux-gnu-strip
    lowers_a="$lowers/$a"
  fi
  echo "==> static drainfs ($triple, +crt-static)"
  # --target keeps the flag off build scripts and proc macros (which must stay dynamic) and
  # gives the static build a directory of its own (target/$triple), next to the normal one.
  RUSTFLAGS="-C target-feature=+crt-static" cargo build --release --locked -p drainfs --target "$triple"
  local drainfs="$repo/target/$triple/release/drainfs"
  if readelf -lW "$drainfs" | grep -q INTERP || readelf -dW "$drainfs" | grep -q NEEDED; then
    echo "build.sh: $drainfs is not static:" >&2
    readelf -dW "$drainfs" | grep NEEDED >&2 || true
    exit 1
  fi
  # The images' version and revision labels, from the binary itself (VERSION+COMMIT: build.rs);
  # the arm64 binary is asked under emulation and must say the same.
  local built
  built="$(run_as "$a" "$drainfs" --version | awk '{print $2}')"
  if [[ "${built%%+*}" != "$version" || "$built" != *+* ]]; then
    echo "build.sh: $drainfs ($a) says '$built', Cargo.toml $version" >&2
    exit 1
  fi
  if [[ -n ${revision:-} && ${built#*+} != "$revision" ]]; then
    echo "build.sh: $drainfs ($a) says '$built', the $host_arch binary +$revision" >&2
    exit 1
  fi
  revision="${built#*+}"

  for b in gcsfuse gcs-fuse-csi-driver-sidecar-mounter; do
    [[ -x "$lowers_a/$b" ]] || { echo "build.sh: $lowers_a/$b missing: run bash scripts/install-lowers.sh${lowers_a#"$lowers"}" >&2; exit 1; }
    if readelf -lW "$(readlink -f "$lowers_a/$b")" | grep -q INTERP; then
      echo "build.sh: $lowers_a/$b is dynamically linked" >&2
      exit 1
    fi
  done
  run_as "$a" "$lowers_a/gcsfuse" --version | grep -q "gcsfuse version $GCSFUSE_VERSION " \
    || { echo "build.sh: $lowers_a/gcsfuse is not v$GCSFUSE_VERSION" >&2; exit 1; }

  mkdir -p "$dist"
  install -m 0755 "$drainfs" "$dist/drainfs"
  "$strip" "$dist/drainfs"
  install -m 0755 "$(readlink -f "$lowers_a/gcsfuse")" "$dist/gcsfuse"
  install -m 0755 "$(readlink -f "$lowers_a/gcs-fuse-csi-driver-sidecar-mounter")" "$dist/gcs-fuse-csi-driver-sidecar-mounter"
  install -m 0644 /etc/ssl/certs/ca-certificates.crt "$dist/ca-certificates.crt"
  install -m 0644 "$here/passwd" "$here/group" "$dist/"
}

labels=(
  --config.label "org.opencontainers.image.licenses=Apache-2.0"
  --config.label "org.opencontainers.image.version=$version"
)

# images_for ARCH: the four images for ARCH, tagged IMAGE-ARCH in the layout (the host's also
# plain IMAGE: the tags the suite's runc and kubelet runs use).
images_for() {
  local a=$1 dist="$out/dist-$1" rootfs="$out/rootfs-$1"
  stage_dist "$a" "$dist"
  local plat=(--architecture "$a" --os linux)
  build() { # IMAGE, then umoci config flags
    local image=$1
    shift
    echo "==> image $image ($a)"
    bash "$here/stage-rootfs.sh" "$image" "$dist" "$rootfs/$image"
    umoci new --image "$out/oci:$image-$a"
    umoci insert --image "$out/oci:$image-$a" --history.created_by "docker/image/build.sh $image" \
      "$rootfs/$image" /
    umoci config --image "$out/oci:$image-$a" "${plat[@]}" --config.env "PATH=/usr/local/bin:/usr/bin:/bin:/" \
      "${labels[@]}" --config.label "org.opencontainers.image.revision=$revision" "$@"
  }
  build sidecar --config.entrypoint /usr/local/bin/drainfs --config.cmd --help \
    --config.user 0:0 --config.label "org.opencontainers.image.title=drainfs"
  build relay --config.entrypoint /gcs-fuse-csi-driver-sidecar-mounter \
    --config.user 65534:65534 "${relay_env[@]}" \
    --config.label "org.opencontainers.image.title=gcs-fuse-csi-driver-sidecar-mounter with drainfs as /gcsfuse" \
    --config.label "dev.drainfs.sidecar-mounter.version=$SIDECAR_VERSION" \
    --config.label "dev.drainfs.gcsfuse.version=$GCSFUSE_VERSION"

  echo "==> image gke-standin ($a; a stand-in for GKE's sidecar image v1.24.4)"
  bash "$here/stage-gke-standin.sh" --arch "$a" "$dist" "$rootfs/gke-standin" >"$rootfs/gke-standin.env"
  local standin_env env_flags=() e
  mapfile -t standin_env <"$rootfs/gke-standin.env"
  for e in "${standin_env[@]}"; do env_flags+=(--config.env "$e"); done
  umoci new --image "$out/oci:gke-standin-$a"
  umoci insert --image "$out/oci:gke-standin-$a" --history.created_by "stand-in: gcr.io/distroless/base-debian12" \
    "$rootfs/gke-standin/base" /
  umoci insert --image "$out/oci:gke-standin-$a" \
    --history.created_by "stand-in: gcs-fuse-csi-driver $SIDECAR_VERSION cmd/sidecar_mounter/Dockerfile output-image" \
    "$rootfs/gke-standin/sidecar" /
  umoci config --image "$out/oci:gke-standin-$a" "${plat[@]}" --config.entrypoint /gcs-fuse-csi-driver-sidecar-mounter \
    "${env_flags[@]}" \
    --config.label "org.opencontainers.image.title=stand-in for gke.gcr.io/gcs-fuse-csi-driver-sidecar-mounter:$SIDECAR_VERSION-gke.0 (docker/image/build.sh)"

  # The overlay, as the Dockerfile's gke-overlay stage: one layer on top of the base, holding the
  # base's own /gcsfuse (taken from the image, mode kept) as /gcsfuse.real and drainfs as /gcsfuse.
  echo "==> image gke-overlay ($a; gke-standin + drainfs at /gcsfuse, the base's gcsfuse at /gcsfuse.real)"
  umoci raw unpack --image "$out/oci:gke-standin-$a" "$rootfs/gke-standin-unpacked" >/dev/null
  install -d -m 0755 "$rootfs/gke-overlay"
  cp -p "$rootfs/gke-standin-unpacked/gcsfuse" "$rootfs/gke-overlay/gcsfuse.real"
  install -m 0755 "$dist/drainfs" "$rootfs/gke-overlay/gcsfuse"
  rm -rf "$rootfs/gke-standin-unpacked"
  umoci tag --image "$out/oci:gke-standin-$a" "gke-overlay-$a"
  umoci insert --image "$out/oci:gke-overlay-$a" --history.created_by "docker/Dockerfile gke-overlay: COPY /gcsfuse /gcsfuse.real; COPY drainfs /gcsfuse" \
    "$rootfs/gke-overlay" /
}

# The host's first: its revision is the one every other architecture's binary must print.
images_for "$host_arch"
for a in "${arches[@]}"; do [[ $a == "$host_arch" ]] || images_for "$a"; done
# The host's images under their plain tags and directories, as the suite's checks use them.
for image in sidecar relay gke-standin gke-overlay; do
  umoci tag --image "$out/oci:$image-$host_arch" "$image"
done
ln -sfn "dist-$host_arch" "$out/dist"
ln -sfn "rootfs-$host_arch" "$out/rootfs"
umoci gc --layout "$out/oci"

# One OCI image index per image, over every architecture built (tag IMAGE-index): what
# `docker pull` or the kubelet resolves to the node's architecture.
python3 - "$out/oci" "${arches[@]}" <<'PY'
import hashlib, json, os, sys

layout, arches = sys.argv[1], sys.argv[2:]
path = os.path.join(layout, "index.json")
top = json.load(open(path))
by_tag = {m.get("annotations", {}).get("org.opencontainers.image.ref.name"): m for m in top["manifests"]}
for image in ("sidecar", "relay", "gke-standin", "gke-overlay"):
    manifests = []
    for a in arches:
        d = dict(by_tag[f"{image}-{a}"])
        d.pop("annotations", None)
        d["platform"] = {"architecture": a, "os": "linux"}
        manifests.append(d)
    blob = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
                       "manifests": manifests}, separators=(",", ":")).encode()
    digest = hashlib.sha256(blob).hexdigest()
    with open(os.path.join(layout, "blobs", "sha256", digest), "wb") as f:
        f.write(blob)
    tag = f"{image}-index"
    top["manifests"] = [m for m in top["manifests"]
                        if m.get("annotations", {}).get("org.opencontainers.image.ref.name") != tag]
    top["manifests"].append({"mediaType": "application/vnd.oci.image.index.v1+json",
                             "digest": f"sha256:{digest}", "size": len(blob),
                             "annotations": {"org.opencontainers.image.ref.name": tag}})
with open(path + ".tmp", "w") as f:
    json.dump(top, f)
os.replace(path + ".tmp", path)
PY

rm -f "$out/drainfs-sidecar.tar" "$out/gcsfuse-relay.tar"
skopeo copy --quiet --all "oci:$out/oci:sidecar-index" "oci-archive:$out/drainfs-sidecar.tar:drainfs:$version"
skopeo copy --quiet --all "oci:$out/oci:relay-index" \
  "oci-archive:$out/gcsfuse-relay.tar:gcs-fuse-csi-driver-sidecar-mounter:$SIDECAR_VERSION-gke.0-drainfs.$version"
# Each archive, as a registry or a runtime reads it: an index with one image per architecture,
# each resolving to an image of that architecture.
for a in drainfs-sidecar gcsfuse-relay; do
  got=$(skopeo inspect --raw "oci-archive:$out/$a.tar" | python3 -c \
    'import json, sys; d = json.load(sys.stdin); print(" ".join(m["platform"]["architecture"] for m in d.get("manifests", [])))')
  [[ "$got" == "${arches[*]}" ]] || { echo "build.sh: $a.tar indexes '$got', not '${arches[*]}'" >&2; exit 1; }
  for arch in "${arches[@]}"; do
    resolved=$(skopeo inspect --override-arch "$arch" --format '{{.Architecture}}' "oci-archive:$out/$a.tar")
    [[ "$resolved" == "$arch" ]] || { echo "build.sh: $a.tar resolves $arch to '$resolved'" >&2; exit 1; }
  done
  printf '  %s  %s (%s)\n' "$(du -h "$out/$a.tar" | cut -f1)" "$out/$a.tar" "$got"
done
