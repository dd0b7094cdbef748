#!/usr/bin/env bash
# Stages one image's root file system from the file list (files.txt next to this script).
# Usage: stage-rootfs.sh IMAGE DIST OUT
#   IMAGE  sidecar | relay
#   DIST   directory holding the SOURCE files the list names
#   OUT    directory to fill (created; must not exist)
# Besides the listed files it creates the directories every image has: /tmp (mode 1777; a
# read-only root gets an emptyDir there), /dev, /proc, /sys (mount points for the runtime), and
# for the sidecar /data, /gcs-lower and /run/drainfs. Exits 2 on a usage error, 1 when a source
# file is missing.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
(($# == 3)) || { echo "usage: $0 IMAGE DIST OUT" >&2; exit 2; }
image=$1 dist=$2 out=$3
case "$image" in sidecar|relay) ;; *) echo "$0: unknown image $image" >&2; exit 2 ;; esac
[[ ! -e "$out" ]] || { echo "$0: $out exists" >&2; exit 2; }
mkdir -p "$out"
n=0
while read -r img dest mode src; do
  [[ -z "$img" || "$img" == \#* || "$img" != "$image" ]] && continue
  [[ -f "$dist/$src" ]] || { echo "$0: $dist/$src is missing" >&2; exit 1; }
  install -D -m "$mode" "$dist/$src" "$out$dest"
  n=$((n + 1))
done <"$here/files.txt"
((n > 0)) || { echo "$0: no files for $image in files.txt" >&2; exit 1; }
install -d -m 1777 "$out/tmp"
install -d -m 0755 "$out/dev" "$out/proc" "$out/sys"
if [[ "$image" == sidecar ]]; then
  install -d -m 0755 "$out/data" "$out/gcs-lower" "$out/run/drainfs"
fi
