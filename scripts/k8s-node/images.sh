#!/usr/bin/env bash
# Builds the k8s-node test images without a Docker engine, as docker/image/build.sh does: one
# static Go program (scripts/k8s-node/testbin, CGO_ENABLED=0) packed by umoci into an OCI layout
# and written by skopeo as OCI archives that `ctr -n k8s.io images import` takes:
#   $K8S_NODE_ROOT/images/pause.tar    local.drainfs/pause:1     entrypoint: /testbin pause
#   $K8S_NODE_ROOT/images/testbin.tar  local.drainfs/testbin:1   entrypoint: /testbin
# Both also hold Debian's busybox-static as /bin/busybox with a /bin link per applet (/bin/sh,
# mv, sleep, kill, ...), so that the manifests' /bin/sh wrappers run as written.
# Rebuilds only when testbin's source or this script changed (a hash of them is kept beside
# the archives).
#
# Usage: bash scripts/k8s-node/images.sh     (as root)
# Exit codes: 0 built or up to date; 1 a build step failed.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="${K8S_NODE_ROOT:-/opt/drainfs-k8s}"
out="$root/images"
export PATH="/usr/local/go/bin:$PATH" GOTOOLCHAIN=local CGO_ENABLED=0
need=()
command -v umoci >/dev/null || need+=(umoci)
command -v skopeo >/dev/null || need+=(skopeo)
if ((${#need[@]})); then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
sum=$(cat "$here/testbin/go.mod" "$here/testbin/main.go" "$0" | sha256sum | cut -c1-16)
if [[ -f "$out/pause.tar" && -f "$out/testbin.tar" && "$(cat "$out/source.sum" 2>/dev/null)" == "$sum" ]]; then
  echo "images: up to date ($out)"; exit 0
fi
rm -rf "$out"; mkdir -p "$out/rootfs/bin" "$out/deb"
(cd "$here/testbin" && go build -trimpath -ldflags "-s -w" -o "$out/rootfs/testbin" .)
(cd "$out/deb" && apt-get download -qq busybox-static >/dev/null 2>&1) || {
  apt-get update -qq && (cd "$out/deb" && apt-get download -qq busybox-static)
}
dpkg-deb -x "$out"/deb/busybox-static_*.deb "$out/deb/x"
cp "$out/deb/x/bin/busybox" "$out/rootfs/bin/busybox"
for b in "$out/rootfs/testbin" "$out/rootfs/bin/busybox"; do
  if readelf -lW "$b" | grep -q INTERP; then
    echo "images.sh: $b is dynamically linked" >&2; exit 1
  fi
done
for applet in $("$out/rootfs/bin/busybox" --list); do
  [[ -e "$out/rootfs/bin/$applet" ]] || ln -s busybox "$out/rootfs/bin/$applet"
done
umoci init --layout "$out/oci"
mk() { # TAG, then umoci config flags
  local tag=$1; shift
  umoci new --image "$out/oci:$tag"
  umoci insert --image "$out/oci:$tag" --history.created_by "scripts/k8s-node/images.sh" \
    "$out/rootfs" /
  umoci config --image "$out/oci:$tag" --config.user 0:0 "$@"
}
mk pause --config.entrypoint /testbin --config.cmd pause
mk testbin --config.entrypoint /testbin
umoci gc --layout "$out/oci"
skopeo copy --quiet "oci:$out/oci:pause" "oci-archive:$out/pause.tar:local.drainfs/pause:1"
skopeo copy --quiet "oci:$out/oci:testbin" "oci-archive:$out/testbin.tar:local.drainfs/testbin:1"
echo "$sum" > "$out/source.sum"
ls -l "$out"/*.tar
