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
# The Debian files come from Debian 12 packages (libc6, numactl, libnuma1, coreutils,
# libpcre2-8-0), as the driver's Dockerfile takes them from its Debian 12 stage: for this host's
# architecture, the installed packages (apt-get installs the missing ones); for another one
# (arm64 on an amd64 host), the packages of that architecture downloaded with apt-get into a
# cache of their own ($DRAINFS_DEBS_CACHE, default /var/cache/drainfs-debs-ARCH: its own package
# lists, nothing of the host's apt or dpkg state changed) and unpacked there with dpkg-deb.
# gcsfuse and the sidecar mounter are the ones scripts/install-lowers.sh built for ARCH
# (gcsfuse v3.11.2 from its Go module, the sidecar mounter v1.24.4 from third_party/).
# What distroless has and this stand-in leaves out (nothing in the image uses them): libssl,
# openssl, tzdata, /etc/nsswitch.conf, /etc/os-release, /home/nonroot.
#
# Usage: stage-gke-standin.sh [--arch amd64|arm64] DIST OUT
#   --arch  the image's architecture (default: this host's, from dpkg)
#   DIST    directory holding gcsfuse, gcs-fuse-csi-driver-sidecar-mounter, ca-certificates.crt,
#           passwd and group (as build.sh fills it), built for ARCH
#   OUT     directory to fill (created; must not exist): OUT/base and OUT/sidecar, one layer each
# Prints the environment the image's config must carry, one VAR=VALUE a line, on stdout.
# Exits 2 on a usage error, 1 when a file or package is missing.
set -euo pipefail
host_arch=$(dpkg --print-architecture)
arch=$host_arch
if [[ ${1:-} == --arch ]]; then arch=${2:-}; shift 2 || true; fi
(($# == 2)) || { echo "usage: $0 [--arch amd64|arm64] DIST OUT" >&2; exit 2; }
dist=$1 out=$2
[[ ! -e "$out" ]] || { echo "$0: $out exists" >&2; exit 2; }

case "$arch" in
  amd64) prefix=x86_64 ld_file=/lib64/ld-linux-x86-64.so.2 lib_dir=/lib64/ ;;
  arm64) prefix=aarch64 ld_file=/lib/ld-linux-aarch64.so.1 lib_dir=/lib/ ;;
  *) echo "$0: no GKE sidecar image for architecture '$arch' (amd64, arm64)" >&2; exit 2 ;;
esac
triple="$prefix-linux-gnu"
pkgs=(libc6 numactl libnuma1 libpcre2-8-0 coreutils)

if [[ "$arch" == "$host_arch" ]]; then
  # This host's own files (usr-merged: /lib is /usr/lib).
  sysroot=""
  if ! command -v numactl >/dev/null || ! dpkg -s libnuma1 libpcre2-8-0 >/dev/null 2>&1; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq numactl libnuma1 libpcre2-8-0 >/dev/null
  fi
  libc_files() { dpkg -L "libc6:$arch"; }
else
  # ARCH's packages, from apt's sources with lists of their own (the host's apt and dpkg state
  # are not touched), unpacked into a sysroot that is not usr-merged.
  cache="${DRAINFS_DEBS_CACHE:-/var/cache/drainfs-debs-$arch}"
  sysroot="$cache/root"
  if [[ ! -f "$cache/root.done" ]]; then
    rm -rf "$cache"
    mkdir -p "$cache/lists/partial" "$cache/archives/partial" "$cache/debs" "$sysroot"
    apt_o=(-o "Dir::State::Lists=$cache/lists" -o "Dir::Cache::archives=$cache/archives"
      -o "APT::Architecture=$arch" -o "APT::Architectures::=$arch" -o Dir::State::status=/dev/null
      -o APT::Sandbox::User=root)
    apt-get -qq "${apt_o[@]}" update >/dev/null
    (cd "$cache/debs" && apt-get -qq "${apt_o[@]}" download "${pkgs[@]/%/:$arch}" >/dev/null)
    for p in "${pkgs[@]}"; do
      deb=$(compgen -G "$cache/debs/${p}_*_$arch.deb" | head -1) \
        || { echo "$0: apt-get download gave no $p for $arch" >&2; exit 1; }
      dpkg-deb -x "$deb" "$sysroot"
    done
    touch "$cache/root.done"
  fi
  libc_files() { dpkg-deb --fsys-tarfile "$(compgen -G "$cache/debs/libc6_*_$arch.deb" | head -1)" | tar -t | sed 's|^\./|/|'; }
fi
# sysroot_path PATH: PATH in the sysroot, as a usr-merged Debian stage would find it (/lib/X may
# be /usr/lib/X in a package, /usr/bin/true is /bin/true).
sysroot_path() {
  local c
  for c in "$1" "/usr$1" "${1#/usr}"; do
    if [[ -e "$sysroot$c" || -L "$sysroot$c" ]]; then printf '%s\n' "$sysroot$c"; return; fi
  done
  echo "$0: $1 not found for $arch${sysroot:+ in $sysroot}" >&2
  exit 1
}

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
  cp -a "$sysroot$f" "$dest"
done < <(libc_files)
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
  install -D -m "$3" "$(readlink -f "$(sysroot_path "$1")")" "$sidecar$2"
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
