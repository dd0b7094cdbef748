#!/usr/bin/env bash
# Stages the root file systems of a stand-in for GKE's sidecar image
# (gke.gcr.io/gcs-fuse-csi-driver-sidecar-mounter:v1.24.4-gke.0), which cannot be pulled here, with
# the layout of the driver's cmd/sidecar_mounter/Dockerfile at v1.24.4:
#
#   FROM gcr.io/distroless/base-debian12                    -> OUT/base (glibc, passwd, CA bundle, /tmp)
#   COPY --from=debian /usr/bin/numactl /usr/bin/numactl    -> OUT/sidecar, the Debian files below
#   COPY --from=debian /usr/bin/true /usr/bin/true
#   COPY --from=debian /lib/$TRIPLE/libnuma.so.1 /lib/$TRIPLE/
#   COPY --from=debian /lib/$TRIPLE/libpcre2-8.so.0 /lib/$TRIPLE/
#   COPY --from=debian $LD_LINUX_FILE $LIB_DIR
#   COPY ./bin/$TARGETPLATFORM/gcsfuse /gcsfuse             -> gcsfuse (mode 0555, as the Makefile sets it)
#   COPY ... /gcs-fuse-csi-driver-sidecar-mounter            -> the sidecar mounter
#   ENTRYPOINT ["/gcs-fuse-csi-driver-sidecar-mounter"]      (set by build.sh; no USER: the webhook
#                                                             runs the container as 65534)
#
# The Debian files come from this Debian 12 host's packages (libc6, numactl, libnuma1, coreutils,
# libpcre2-8-0; installed with apt-get when missing), as the driver's Dockerfile takes them from
# its Debian 12 stage; gcsfuse and the sidecar mounter are the ones scripts/install-lowers.sh
# built (gcsfuse v3.11.2 from its Go module, the sidecar mounter v1.24.4 from third_party/).
# What distroless has and this stand-in leaves out (nothing in the image uses them): libssl,
# openssl, tzdata, /etc/nsswitch.conf, /etc/os-release, /home/nonroot.
#
# Usage: stage-gke-standin.sh DIST OUT
#   DIST  directory holding gcsfuse, gcs-fuse-csi-driver-sidecar-mounter, ca-certificates.crt,
#         passwd and group (as build.sh fills it)
#   OUT   directory to fill (created; must not exist): OUT/base and OUT/sidecar, one layer each
# Prints the environment the image's config must carry, one VAR=VALUE a line, on stdout.
set -euo pipefail
(($# == 2)) || { echo "usage: $0 DIST OUT" >&2; exit 2; }
dist=$1 out=$2
[[ ! -e "$out" ]] || { echo "$0: $out exists" >&2; exit 2; }

case "$(uname -m)" in
  x86_64) prefix=x86_64 ld_file=/lib64/ld-linux-x86-64.so.2 lib_dir=/lib64/ ;;
  aarch64) prefix=aarch64 ld_file=/lib/ld-linux-aarch64.so.1 lib_dir=/lib/ ;;
  *) echo "$0: no GKE sidecar image for $(uname -m)" >&2; exit 1 ;;
esac
triple="$prefix-linux-gnu"

if ! command -v numactl >/dev/null || ! dpkg -s libnuma1 libpcre2-8-0 >/dev/null 2>&1; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq numactl libnuma1 libpcre2-8-0 >/dev/null
fi

base="$out/base" sidecar="$out/sidecar"
mkdir -p "$base" "$sidecar"

# distroless/base-debian12: glibc (libc6's shared objects and the dynamic loader), the users and
# groups (root, nobody 65534, nonroot 65532), the CA bundle, /tmp.
while read -r f; do
  case "$f" in
    /lib/"$triple"/*.so* | /usr/lib/"$triple"/*.so* | "$ld_file") ;;
    *) continue ;;
  esac
  [[ "$f" == */gconv/* || "$f" == */audit/* ]] && continue
  dest="$base${f#/usr}"
  mkdir -p "$(dirname "$dest")"
  cp -a "$f" "$dest"
done < <(dpkg -L "libc6:$(dpkg --print-architecture)")
{ [[ -e "$base/lib/$triple/libc.so.6" ]] && [[ -L "$base$ld_file" || -e "$base$ld_file" ]]; } \
  || { echo "$0: libc6 gave no libc.so.6 or $ld_file" >&2; exit 1; }
install -D -m 0644 "$dist/ca-certificates.crt" "$base/etc/ssl/certs/ca-certificates.crt"
install -D -m 0644 "$dist/passwd" "$base/etc/passwd"
install -D -m 0644 "$dist/group" "$base/etc/group"
install -d -m 1777 "$base/tmp"
install -d -m 0755 "$base/dev" "$base/proc" "$base/sys"

# The driver's output-image stage. Docker's COPY follows a source symlink, so each of these is
# a regular file in the image (the loader replaces the base's symlink).
deb() { # SOURCE DEST MODE
  install -D -m "$3" "$(readlink -f "$1")" "$sidecar$2"
}
deb /usr/bin/numactl /usr/bin/numactl 0755
deb /usr/bin/true /usr/bin/true 0755
deb "/lib/$triple/libnuma.so.1" "/lib/$triple/libnuma.so.1" 0644
deb "/lib/$triple/libpcre2-8.so.0" "/lib/$triple/libpcre2-8.so.0" 0644
deb "$ld_file" "$lib_dir$(basename "$ld_file")" 0755
install -m 0555 "$dist/gcsfuse" "$sidecar/gcsfuse"
install -m 0755 "$dist/gcs-fuse-csi-driver-sidecar-mounter" "$sidecar/gcs-fuse-csi-driver-sidecar-mounter"

# The image's environment: distroless's, then the driver's Dockerfile's distroless-$ARCH stage.
cat <<EOF
PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
LIB_DIR_PREFIX=$prefix
LD_LINUX_FILE=$ld_file
LIB_DIR=$lib_dir
EOF
