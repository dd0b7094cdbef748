#!/usr/bin/env python3
"""The relay image's name against GKE's node driver's own image-name checks.

GKE's Cloud Storage FUSE CSI driver decides from a sidecar image's *name* whether the image is
"GKE-managed", and from its tag's version which of its features the sidecar gets. This script
reads those checks from the vendored driver source (third_party/gcs-fuse-csi-driver,
pkg/csi_driver/utils.go and node.go), models them, and checks:

  * a table of names (the shapes a user might push the relay image under) against what the
    docs (docs/deploy-gke-managed.md) say each keeps and loses;
  * every relay image name in docker/k8s/*.yaml, docker/image/build.sh, docker/Dockerfile and
    the docs: each passes the loose check with a tag whose version is the vendored sidecar
    mounter's and keeps every version-gated feature.

The patterns are read from the Go source and matched with Python's `re.search` (Go's
`MatchString` is an unanchored search too; the patterns use only constructs both engines read
the same way: `.`, `*`, `?`, groups, `[^/]`, `\\d`, `^`). Versions are compared as
golang.org/x/mod/semver does (an invalid version is less than every valid one). The modelled
Go lines are checked to be still there, so a driver bump that changes them fails here.

Usage: python3 docker/check-image-names.py [--table]     Exit 0 when every check passed.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DRIVER = ROOT / "third_party" / "gcs-fuse-csi-driver"
UTILS = DRIVER / "pkg" / "csi_driver" / "utils.go"
NODE = DRIVER / "pkg" / "csi_driver" / "node.go"
CONTROLLER = DRIVER / "pkg" / "csi_driver" / "controller.go"

# Go lines the model below stands for: if one of them changes, the model must be re-read.
MODELLED = {
    UTILS: [
        "return managedSidecarRegexAR.MatchString(imageName) || managedSidecarRegexGCR.MatchString(imageName)",
        "return strictManagedSidecarRegexAR.MatchString(imageName) || managedSidecarRegexGCR.MatchString(imageName)",
        "if !isManagedSidecarImage(imageName) {",
        'imageVersion := strings.Split(strings.Split(imageName, ":")[1], "@")[0]',
        "if semver.Compare(imageVersion, sidecarMinSupportedVersion) >= 0 {",
    ],
    NODE: [
        "canUseMultiNIC := !isManagedSidecarImage(gcsFuseSidecarImage) || s.driver.isSidecarVersionSupportedForGivenFeature(gcsFuseSidecarImage, MultiNICMinVersion)",
    ],
    CONTROLLER: [
        "imageOverrideAllowed := s.features.SharedMountOptions.AllowCustomMounterImages || isStrictManagedSidecarImage(container.Image)",
    ],
}


def go_string(src: str, name: str) -> str:
    """The value of `name = `...`` (a raw string) in Go source."""
    m = re.search(rf"\b{name}\s*=\s*`([^`]*)`", src)
    if not m:
        raise SystemExit(f"check-image-names: {name} not found in {UTILS}")
    return m.group(1)


def min_versions(src: str) -> dict[str, str]:
    """Every `XxxMinVersion = "vX.Y.Z-gke.N"` constant."""
    return dict(re.findall(r'\b(\w+MinVersion)\s*=\s*"(v[^"]+)"', src))


# --- golang.org/x/mod/semver ------------------------------------------------------------------
_NUM = re.compile(r"0|[1-9][0-9]*")
_IDENT = re.compile(r"[0-9A-Za-z-]+")


def semver_parse(v: str):
    """(major, minor, patch, prerelease identifiers) or None, as x/mod/semver's parse."""
    m = re.fullmatch(r"v(\d+)(?:\.(\d+)(?:\.(\d+))?)?(?:-([^+]*))?(?:\+(.*))?", v)
    if not m:
        return None
    major, minor, patch, pre, build = m.groups()
    for part in (major, minor, patch):
        if part is not None and not _NUM.fullmatch(part):
            return None
    if (minor is None or patch is None) and (pre is not None or build is not None):
        return None  # shorthand versions take no prerelease or build
    ids: list[str] = []
    if pre is not None:
        ids = pre.split(".")
        for i in ids:
            if not _IDENT.fullmatch(i) or (i.isdigit() and not _NUM.fullmatch(i)):
                return None
    if build is not None and not all(_IDENT.fullmatch(i) for i in build.split(".")):
        return None
    return int(major), int(minor or 0), int(patch or 0), ids


def semver_compare(a: str, b: str) -> int:
    pa, pb = semver_parse(a), semver_parse(b)
    if pa is None or pb is None:
        return (pa is not None) - (pb is not None)
    if pa[:3] != pb[:3]:
        return -1 if pa[:3] < pb[:3] else 1
    ia, ib = pa[3], pb[3]
    if ia == ib:
        return 0
    if not ia or not ib:
        return 1 if not ia else -1  # a release is greater than its prereleases
    for x, y in zip(ia, ib):
        if x == y:
            continue
        if x.isdigit() and y.isdigit():
            return -1 if int(x) < int(y) else 1
        if x.isdigit() != y.isdigit():
            return -1 if x.isdigit() else 1  # numeric identifiers are lower
        return -1 if x < y else 1
    return -1 if len(ia) < len(ib) else 1


# --- the driver's checks ----------------------------------------------------------------------
class Driver:
    def __init__(self) -> None:
        src = UTILS.read_text()
        self.loose_ar = re.compile(go_string(src, "managedSidecarPatternAR"))
        self.gcr = re.compile(go_string(src, "managedSidecarPatternGCR"))
        self.strict_ar = re.compile(go_string(src, "strictManagedSidecarPatternAR"))
        self.mins = min_versions(src)
        if len(self.mins) < 8:
            raise SystemExit(f"check-image-names: only {sorted(self.mins)} found in {UTILS}")

    def loose(self, image: str) -> bool:
        """isManagedSidecarImage: what gates the version-dependent features."""
        return bool(self.loose_ar.search(image) or self.gcr.search(image))

    def strict(self, image: str) -> bool:
        """isStrictManagedSidecarImage: what an image override must pass (shared-mount mounter
        pods, unless the cluster allows custom mounter images)."""
        return bool(self.strict_ar.search(image) or self.gcr.search(image))

    def supported(self, image: str, feature: str) -> bool:
        """isSidecarVersionSupportedForGivenFeature (without AssumeGoodSidecarVersion and the
        driver's own test-registry names)."""
        if not image or not self.loose(image):
            return False
        version = image.split(":")[1].split("@")[0]
        return semver_compare(version, self.mins[feature]) >= 0

    def features(self, image: str) -> dict[str, bool]:
        out = {}
        for feature in sorted(self.mins):
            if feature == "MultiNICMinVersion":
                # node.go: a name that is not GKE-managed is assumed to support multi-NIC.
                out[feature] = not self.loose(image) or self.supported(image, feature)
            else:
                out[feature] = self.supported(image, feature)
        return out


SIDECAR_VERSION = "v1.24.4"  # docker/image/build.sh, docker/Dockerfile, third_party
MINE = f"us-docker.pkg.dev/PROJECT/gke-release/gcs-fuse-csi-driver-sidecar-mounter:{SIDECAR_VERSION}-gke.0-drainfs.0.1.0"

# name, loose, strict, version-gated features kept: "all", "none" or "multi-nic only"
CASES = [
    (MINE, True, False, "all"),
    # The repository in the user's project must be named gke-release.
    ("us-docker.pkg.dev/PROJECT/drainfs/gcs-fuse-csi-driver-sidecar-mounter:v1.24.4-gke.0-drainfs.0.1.0",
     False, False, "multi-nic only"),
    ("registry.example.com/gcsfuse-relay:0.1.0", False, False, "multi-nic only"),
    # The tag must start vX.Y.Z-gke.N.
    ("us-docker.pkg.dev/PROJECT/gke-release/gcs-fuse-csi-driver-sidecar-mounter:v1.24.4-drainfs.0.1.0",
     False, False, "multi-nic only"),
    # A tag that is not valid semver (a numeric identifier with a leading zero) is older than
    # every minimum: a managed name with no feature, multi-NIC included.
    ("us-docker.pkg.dev/PROJECT/gke-release/gcs-fuse-csi-driver-sidecar-mounter:v1.24.4-gke.0-drainfs.01",
     True, False, "none"),
    # Google's own images pass both checks (the project gke-release is Google's).
    ("us-central1-docker.pkg.dev/gke-release/gke-release/gcs-fuse-csi-driver-sidecar-mounter:v1.24.4-gke.0",
     True, True, "all"),
    ("gke.gcr.io/gcs-fuse-csi-driver-sidecar-mounter:v1.24.4-gke.0", True, True, "all"),
]


def kept(features: dict[str, bool]) -> str:
    if all(features.values()):
        return "all"
    if not any(features.values()):
        return "none"
    if [k for k, v in features.items() if v] == ["MultiNICMinVersion"]:
        return "multi-nic only"
    return "some: " + ", ".join(k for k, v in features.items() if v)


RELAY_NAME = re.compile(r"[\w.\-/]*gcs-fuse-csi-driver-sidecar-mounter:v[\w.\-]+")


def names_in_repo() -> list[tuple[str, str]]:
    """Relay image names written in the manifests, the image build and the docs (the literal
    placeholders REGION, PROJECT and TAG are filled in)."""
    files = sorted((ROOT / "docker" / "k8s").glob("*.yaml"))
    files += [ROOT / "docker" / "Dockerfile", ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    out = []
    for f in files:
        for m in RELAY_NAME.finditer(f.read_text()):
            name = m.group(0).replace("REGION", "us").replace("TAG", "0.1.0").rstrip(".")
            if "X.Y.Z" in name:
                continue  # the pattern's own description, not a name
            out.append((f.relative_to(ROOT).as_posix(), name))
    build = (ROOT / "docker" / "image" / "build.sh").read_text()
    m = re.search(r'"oci-archive:\$out/gcsfuse-relay\.tar:(gcs-fuse-csi-driver-sidecar-mounter:\$SIDECAR_VERSION[^"]*)"', build)
    if not m:
        raise SystemExit("check-image-names: the relay archive's name not found in docker/image/build.sh")
    tag = m.group(1).replace("$SIDECAR_VERSION", SIDECAR_VERSION).replace("$version", "0.1.0")
    out.append(("docker/image/build.sh", f"us-docker.pkg.dev/PROJECT/gke-release/{tag}"))
    return out


def main() -> int:
    problems = []
    for path, lines in MODELLED.items():
        src = path.read_text()
        for line in lines:
            if line not in src:
                problems.append(f"{path.relative_to(ROOT)} no longer has `{line}`: re-read the driver's checks")
    d = Driver()
    if f"SIDECAR_VERSION={SIDECAR_VERSION}" not in (ROOT / "docker" / "image" / "build.sh").read_text():
        problems.append(f"docker/image/build.sh does not build sidecar mounter {SIDECAR_VERSION}")
    rows = []
    for name, loose, strict, want in CASES:
        got = (d.loose(name), d.strict(name), kept(d.features(name)))
        rows.append((name, *got))
        if got != (loose, strict, want):
            problems.append(f"{name}: loose/strict/features {got}, expected {(loose, strict, want)}")
    seen = names_in_repo()
    if not any(p.startswith("docker/k8s/") for p, _ in seen):
        problems.append("no relay image name found in docker/k8s")
    examples = {c[0] for c in CASES}
    for where, name in seen:
        if name in examples:
            continue  # the docs' table of these very cases, bad names included
        tag_version = name.split(":")[1].split("-")[0]
        if tag_version != SIDECAR_VERSION:
            problems.append(f"{where}: {name}: the tag's version is not the image's sidecar mounter ({SIDECAR_VERSION})")
        elif "/gke-release/" in name and kept(d.features(name)) != "all":
            problems.append(f"{where}: {name}: keeps {kept(d.features(name))} of the version-gated features")
    if "--table" in sys.argv:
        print("| image name | loose (features) | strict (overrides) | version-gated features kept |")
        print("| --- | --- | --- | --- |")
        for name, loose, strict, k in rows:
            print(f"| `{name}` | {'yes' if loose else 'no'} | {'yes' if strict else 'no'} | {k} |")
    for p in problems:
        print(f"check-image-names: {p}", file=sys.stderr)
    if problems:
        return 1
    print(f"check-image-names: ok ({len(CASES)} names against the driver's checks, "
          f"{len(seen)} names in the repository, features {', '.join(sorted(d.mins))})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
