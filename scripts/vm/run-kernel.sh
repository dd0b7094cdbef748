#!/usr/bin/env bash
# Runs a command on another Linux kernel: a KVM guest booted from one of Debian's kernel
# packages, whose root is this host's / (read-only over 9p, with a tmpfs overlay for writes, so
# the guest sees the host's binaries, venvs and build outputs and changes nothing of them),
# cgroup v2 only (the unified hierarchy, as GKE's nodes), loopback networking, /dev/fuse.
# Prints the command's output and exits with its exit code (125: the guest did not report one,
# e.g. it did not boot or the command outran --timeout; the console log says why).
#
#   scripts/vm/run-kernel.sh [--kernel PKG] [--mem 6G] [--cpus 2] [--accel tcg|kvm] [--timeout SECS] -- CMD [ARGS...]
#
# PKG is a Debian kernel package (default linux-image-6.1.0-47-amd64-unsigned, Linux 6.1: the
# kernel of GKE's COS 113 nodes' series, GKE 1.28-1.30, without FUSE passthrough). It is
# downloaded and unpacked once under $DRAINFS_VM_CACHE (default /var/cache/drainfs-vm), with the
# initramfs built from it (busybox-static and the modules for 9p, virtio, fuse and overlay).
# CMD runs as root in the guest with the host's environment variables named in
# DRAINFS_VM_ENV (space-separated, default PATH HOME TMPDIR), in the host's current directory.
# Needs qemu-system-x86 (installed when missing). The guest runs under qemu's software
# emulation (TCG, one host thread per vCPU) by default: this machine's /dev/kvm is PVM
# (`kvm-pvm` in dmesg), which runs only guest kernels built for PVM, and a stock Debian kernel
# hangs there right after "Probing EDD". `--accel kvm` uses KVM where it runs stock kernels.
set -euo pipefail
kernel_pkg=linux-image-6.1.0-47-amd64-unsigned
mem=6G cpus=2 timeout=1800 accel=tcg
while (($#)); do
  case "$1" in
    --kernel) kernel_pkg=$2; shift 2 ;;
    --mem) mem=$2; shift 2 ;;
    --cpus) cpus=$2; shift 2 ;;
    --timeout) timeout=$2; shift 2 ;;
    --accel) accel=$2; shift 2 ;;
    --) shift; break ;;
    *) echo "run-kernel.sh: unknown option $1 (usage: see the script's header)" >&2; exit 2 ;;
  esac
done
(($#)) || { echo "run-kernel.sh: no command (after --)" >&2; exit 2; }
case "$accel" in
  tcg) accel_flags=(-accel "tcg,thread=multi" -cpu max) ;;
  kvm) accel_flags=(-enable-kvm -cpu host) ;;
  *) echo "run-kernel.sh: --accel tcg or kvm" >&2; exit 2 ;;
esac
need=()
command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
command -v cpio >/dev/null || need+=(cpio)
if ((${#need[@]})); then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

cache="${DRAINFS_VM_CACHE:-/var/cache/drainfs-vm}/$kernel_pkg"
if [[ ! -f "$cache/base.cpio.gz" ]]; then
  rm -rf "$cache.tmp" && mkdir -p "$cache.tmp/debs" "$cache.tmp/x" "$cache.tmp/init"
  (cd "$cache.tmp/debs" && apt-get download -qq "$kernel_pkg" busybox-static 2>/dev/null)
  for d in "$cache.tmp"/debs/*.deb; do dpkg -x "$d" "$cache.tmp/x"; done
  release=$(basename "$(ls -d "$cache.tmp"/x/lib/modules/*)")
  depmod -b "$cache.tmp/x" "$release"
  i="$cache.tmp/init"
  mkdir -p "$i/bin" "$i/mod" "$i/proc" "$i/sys" "$i/dev" "$i/host" "$i/rw" "$i/root"
  cp "$cache.tmp/x/bin/busybox" "$i/bin/busybox"
  # The modules in load order (each after what it depends on).
  n=0
  for m in virtio_pci 9pnet_virtio 9p fuse overlay; do
    modprobe -d "$cache.tmp/x" -S "$release" --show-depends "$m" | awk '$1 == "insmod" {print $2}'
  done | awk '!seen[$0]++' | while read -r ko; do
    n=$((n + 1)); cp "$ko" "$i/mod/$(printf %02d "$n")-$(basename "$ko")"
  done
  cat >"$i/init" <<'INIT'
#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
for m in /mod/*.ko; do insmod "$m" || echo "vm: insmod $m failed"; done
mount -t 9p -o ro,trans=virtio,version=9p2000.L,msize=524288,cache=loose hostroot /host
mount -t tmpfs -o size=80% rw /rw
mkdir -p /rw/upper /rw/work
mount -t overlay -o lowerdir=/host,upperdir=/rw/upper,workdir=/rw/work,redirect_dir=on overlay /root
for d in proc sys dev; do mount --move /$d /root/$d; done
mount -t cgroup2 cgroup2 /root/sys/fs/cgroup
mount -t tmpfs tmpfs /root/tmp; mount -t tmpfs tmpfs /root/run
mkdir -p /root/dev/pts /root/dev/shm; mount -t devpts devpts /root/dev/pts; mount -t tmpfs tmpfs /root/dev/shm
ip link set lo up
cp /cmd /root/run/vm-cmd
echo "vm: $(uname -r), running the command (cgroup v2 only at /sys/fs/cgroup)"
chroot /root /bin/bash /run/vm-cmd
echo "vm-exit-code=$?"
sync; poweroff -f
INIT
  chmod +x "$i/init"
  cp "$cache.tmp/x/boot/vmlinuz-$release" "$cache.tmp/vmlinuz"
  (cd "$i" && find . | cpio -o -H newc 2>/dev/null | gzip -1) >"$cache.tmp/base.cpio.gz"
  rm -rf "$cache" && mv "$cache.tmp" "$cache"
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/drainfs-vm-XXXXXX")
trap 'rm -rf "$work"' EXIT
# The command, in the host's directory and with the named variables, as /cmd of an extra
# initramfs segment (the kernel concatenates them).
{
  echo "set -u"
  for v in ${DRAINFS_VM_ENV:-PATH HOME TMPDIR}; do
    [[ -n "${!v+x}" ]] && printf 'export %s=%q\n' "$v" "${!v}"
  done
  printf 'cd %q\n' "$PWD"
  printf '%q ' "$@"; echo
} >"$work/cmd"
(cd "$work" && echo cmd | cpio -o -H newc 2>/dev/null | gzip -1) >"$work/cmd.cpio.gz"
cat "$cache/base.cpio.gz" "$work/cmd.cpio.gz" >"$work/initrd.cpio.gz"

log="$work/console.log"
set +e
timeout --kill-after=10 "$timeout" qemu-system-x86_64 "${accel_flags[@]}" -m "$mem" -smp "$cpus" \
  -nodefaults -no-reboot -display none -serial stdio \
  -kernel "$cache/vmlinuz" -initrd "$work/initrd.cpio.gz" \
  -append "console=ttyS0 panic=-1 rdinit=/init quiet" \
  -virtfs "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap" \
  </dev/null | tee "$log" | grep -v '^vm-exit-code='
set -e
rc=$(sed -n 's/^vm-exit-code=\([0-9]*\).*/\1/p' "$log" | tail -1)
if [[ -z "$rc" ]]; then
  echo "run-kernel.sh: the guest reported no exit code (console above)" >&2
  exit 125
fi
exit "$rc"
