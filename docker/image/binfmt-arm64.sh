#!/usr/bin/env bash
# Lets this amd64 host exec arm64 programs, for the arm64 image checks: binfmt_misc mounted, and
# Debian's qemu-user-static entry for aarch64 ELF files registered (/usr/lib/binfmt.d/
# qemu-aarch64.conf, flags OPF: F opens the emulator at registration, so an exec in a chroot or a
# container finds it). Installs qemu-user-static when missing. Idempotent; the registration is
# machine-wide and is left in place (it only changes what an exec of an aarch64 ELF file does,
# which fails without it). Prints the emulator's path. Exits 1 when it cannot be set up.
# Usage (root): docker/image/binfmt-arm64.sh
set -euo pipefail
conf=/usr/lib/binfmt.d/qemu-aarch64.conf
bm=/proc/sys/fs/binfmt_misc
if [[ $(uname -m) == aarch64 ]]; then
  echo native
  exit 0
fi
if [[ ! -f $conf ]]; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq qemu-user-static >/dev/null
fi
[[ -e $bm/register ]] || mount -t binfmt_misc binfmt_misc "$bm"
if [[ ! -e $bm/qemu-aarch64 ]]; then
  # A concurrent registration of the same name fails with EEXIST: check the result, not the write.
  cat "$conf" >"$bm/register" 2>/dev/null || true
fi
[[ -e $bm/qemu-aarch64 ]] || { echo "binfmt-arm64.sh: could not register $conf" >&2; exit 1; }
grep -qx enabled "$bm/qemu-aarch64" && grep -q '^flags:.*F' "$bm/qemu-aarch64" || {
  echo "binfmt-arm64.sh: qemu-aarch64 is registered disabled or without the F flag:" >&2
  cat "$bm/qemu-aarch64" >&2
  exit 1
}
readlink -f "$(sed -n 's/^interpreter //p' "$bm/qemu-aarch64")"
