#!/usr/bin/env bash
# Builds docker/Dockerfile's gke-overlay target, the image users build from GKE's sidecar image,
# with buildah (Debian's package; vfs storage of its own under target/images/buildah, no daemon,
# no registry), on the stand-in for GKE's image that docker/image/build.sh wrote
# (target/images/oci:gke-standin), and checks that it holds exactly what build.sh's gke-overlay
# holds: the same files with the same modes, owners, sizes, link targets and contents, and the
# same entrypoint, command, user, working directory and environment.
#
# What cannot be built here, and how this script stands in for it: there is no registry but the
# package registries, so neither GKE's image (GKE_SIDECAR_IMAGE) nor the Rust image the drainfs
# stage starts from can be pulled. The stand-in is loaded into buildah's storage and passed as
# GKE_SIDECAR_IMAGE; the static drainfs build.sh built is passed as `--build-context
# drainfs=DIR` (DIR/dist/drainfs), which replaces the drainfs stage (buildah then skips it, and
# the go and stage stages, which gke-overlay does not use). Every instruction of the gke-overlay
# stage itself runs as written.
#
# For each architecture build.sh built (tags gke-standin-ARCH: amd64, arm64), the same with
# `--platform linux/ARCH` on that architecture's stand-in and drainfs: the stage is COPY only, so
# no emulator runs. Writes target/images/oci:gke-overlay-buildah-ARCH. Run after
# docker/image/build.sh, as root.
# Usage: bash docker/image/buildah-overlay.sh        Exit 0 when built and identical.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
out="$repo/target/images"
[[ -f "$out/dist/drainfs" ]] && [[ -d "$out/oci" ]] \
  || { echo "buildah-overlay.sh: run docker/image/build.sh first" >&2; exit 2; }
command -v buildah >/dev/null || {
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq buildah >/dev/null
}

store="$out/buildah"
work="$out/buildah-work"
# The storage is buildah's alone and thrown away each run (vfs keeps full copies of each layer).
rm -rf "$store" "$work"
mkdir -p "$store" "$work/context" "$work/dist/dist"
export TMPDIR="$work"
b=(buildah --root "$store/root" --runroot "$store/run" --storage-driver vfs)
cleanup() {
  "${b[@]}" rm --all >/dev/null 2>&1 || true
  rm -rf "$store" "$work"
}
trap cleanup EXIT

arches=()
for a in amd64 arm64; do
  grep -Eq "\"org.opencontainers.image.ref.name\": *\"gke-standin-$a\"" "$out/oci/index.json" && arches+=("$a")
done
((${#arches[@]})) || { echo "buildah-overlay.sh: no gke-standin-ARCH in $out/oci: run docker/image/build.sh" >&2; exit 2; }

for a in "${arches[@]}"; do
echo "==> buildah $(buildah --version | awk '{print $3}'): the $a stand-in base into its storage"
# Copied by skopeo under the name the build argument gives: `buildah pull oci:DIR` names the
# image after DIR, which fails (`repository name must be lowercase`) for a clone whose path has
# a capital letter, such as /root/proof-S.
skopeo copy --quiet "oci:$out/oci:gke-standin-$a" \
  "containers-storage:[vfs@$store/root+$store/run]localhost/gke-sidecar-standin:v1.24.4-gke.0-$a"
install -D -m 0755 "$out/dist-$a/drainfs" "$work/dist-$a/dist/drainfs"

echo "==> buildah bud -f docker/Dockerfile --target gke-overlay --platform linux/$a"
# The context is empty: the gke-overlay stage copies only from other stages.
"${b[@]}" bud --quiet --pull=never --layers=false --platform "linux/$a" \
  -f "$repo/docker/Dockerfile" --target gke-overlay \
  --build-arg GKE_SIDECAR_IMAGE="localhost/gke-sidecar-standin:v1.24.4-gke.0-$a" \
  --build-context drainfs="$work/dist-$a" \
  -t "localhost/gke-overlay:buildah-$a" "$work/context" >/dev/null
"${b[@]}" push --quiet "localhost/gke-overlay:buildah-$a" "oci:$out/oci:gke-overlay-buildah-$a"

echo "==> compare with build.sh's gke-overlay-$a"
python3 - "$out" "$a" <<'PY'
import hashlib, json, os, subprocess, sys, tempfile

out, arch = sys.argv[1], sys.argv[2]

def tree(tag, d):
    subprocess.run(["umoci", "raw", "unpack", "--image", f"{out}/oci:{tag}", d], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    files = {}
    for root, dirs, names in os.walk(d):
        for n in dirs + names:
            p = os.path.join(root, n)
            st = os.lstat(p)
            rel = "/" + os.path.relpath(p, d)
            kind = "l" if os.path.islink(p) else "d" if os.path.isdir(p) else "f"
            entry = [kind, oct(st.st_mode & 0o7777), st.st_uid, st.st_gid]
            if kind == "l":
                entry.append(os.readlink(p))
            elif kind == "f":
                with open(p, "rb") as f:
                    entry += [st.st_size, hashlib.sha256(f.read()).hexdigest()]
            files[rel] = entry
    return files

def config(tag):
    index = json.load(open(f"{out}/oci/index.json"))
    desc = next(m for m in index["manifests"]
                if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == tag)
    blob = lambda d: json.load(open(f"{out}/oci/blobs/{d['digest'].replace(':', '/')}"))
    doc = blob(blob(desc)["config"])
    c = doc.get("config", {})
    return {"architecture": doc.get("architecture"), "os": doc.get("os"),
            **{k: c.get(k) or None for k in ("Entrypoint", "Cmd", "User", "WorkingDir", "Env")}}

with tempfile.TemporaryDirectory(dir=out) as t:
    a, b = tree(f"gke-overlay-{arch}", f"{t}/a"), tree(f"gke-overlay-buildah-{arch}", f"{t}/b")
    base = tree(f"gke-standin-{arch}", f"{t}/base")
diff = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
problems = [f"{k}: build.sh {a.get(k)} buildah {b.get(k)}" for k in diff]
# The two changes, and nothing else, against the base: /gcsfuse.real is the base's /gcsfuse,
# /gcsfuse is the drainfs binary, every other entry is the base's.
with open(f"{out}/dist-{arch}/drainfs", "rb") as f:
    drainfs_sha = hashlib.sha256(f.read()).hexdigest()
if b.get("/gcsfuse.real") != base.get("/gcsfuse"):
    problems.append(f"/gcsfuse.real {b.get('/gcsfuse.real')} is not the base's /gcsfuse {base.get('/gcsfuse')}")
if (b.get("/gcsfuse") or [None])[-1] != drainfs_sha:
    problems.append(f"/gcsfuse {b.get('/gcsfuse')} is not drainfs ({drainfs_sha})")
other = sorted(k for k in set(base) | set(b) if k not in ("/gcsfuse", "/gcsfuse.real") and base.get(k) != b.get(k))
problems += [f"{k}: base {base.get(k)} overlay {b.get(k)}" for k in other]
ca, cb, cbase = config(f"gke-overlay-{arch}"), config(f"gke-overlay-buildah-{arch}"), config(f"gke-standin-{arch}")
problems += [f"config {k}: build.sh {ca[k]} buildah {cb[k]}" for k in ca if ca[k] != cb[k]]
problems += [f"config {k}: base {cbase[k]} overlay {cb[k]}" for k in cbase if cbase[k] != cb[k]]
if (cb["architecture"], cb["os"]) != (arch, "linux"):
    problems.append(f"config: linux/{arch} built, the image says {cb['os']}/{cb['architecture']}")
for k in ("/gcsfuse", "/gcsfuse.real"):
    print(f"  {k}: {b.get(k)}")
print(f"  config: {cb}")
if problems:
    print("buildah-overlay.sh: the Dockerfile's gke-overlay differs from build.sh's:", file=sys.stderr)
    print("\n".join("  " + p for p in problems), file=sys.stderr)
    sys.exit(1)
print(f"buildah-overlay.sh: {arch}: the Dockerfile's gke-overlay and build.sh's are the same ({len(b)} entries,"
      " same config), and differ from the base only by /gcsfuse (drainfs) and /gcsfuse.real (the base's gcsfuse)")
PY
done
