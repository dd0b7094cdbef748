#!/usr/bin/env python3
"""The seed's pod under the real kubelet (up.sh): a Job-shaped static pod (restartPolicy: Never)
whose workload writes files through a bucket volume and exits, with the gcsfuse sidecar as a
native sidecar, over a fake-gcs-server on loopback, in three arrangements:

  stock         GKE's sidecar as the webhook injects it (sidecar_spec.go,
                GetNativeSidecarContainerSpec: uid/gid 65534, every capability dropped, no
                privilege escalation, read-only root, seccomp RuntimeDefault, NATIVE_SIDECAR=TRUE,
                args --v=5, the emptyDirs gke-gcsfuse-buffer and -cache), image: the real sidecar
                mounter v1.24.4 and the real gcsfuse v3.11.2 (drainfs-images.sh's stock image);
  relay         the same, with the project's relay image (drainfs as /gcsfuse);
  self-managed  docker/k8s/job-native-sidecar.yaml's pod template as written, in static-pod form:
                only the image names, gcsfuse's bucket and fake-server flags, hostNetwork (no CNI
                here) and the workload container's program are replaced, and its
                serviceAccountName (Workload Identity; a static pod has no API server) dropped.

For stock and relay this script is the CSI node driver, as docker/image/run-test.py is in runc:
before the pod exists it opens /dev/fuse, mounts the volume's target with fd=N (the workload
container gets the target as a hostPath), listens on <tmp>/.volumes/<vol>/socket in the
directory the sidecar gets as /gcsfuse-tmp (a hostPath here, an emptyDir the driver finds by
the pod's UID on GKE), and hands the fd and the mount options to the sidecar mounter, as
csi_mounter.go does. The mount options are job-gke-managed-relay.yaml's volume's
(implicit-dirs, uid=1000, gid=1000) plus the fake server's endpoint.

The workload (testbin write, uid 1000 as in the manifests) writes FILES files of KIB KiB under
/data/<pod>/, each closed before the next, and stamps its exit (UNIX ns, the host's clock) into
a hostPath directory off the bucket. Measured from the kubelet's side: workload exit -> the
kubelet's /pods shows phase Succeeded (polled every 50 ms: what a Job controller or Airflow's
KubernetesPodOperator waits for), and workload exit -> the sidecar's finishedAt. Checked per
pod: phase Succeeded, the workload's exit 0, the sidecar's exit code and termination message
as the kubelet records them (drainfs: a JSON summary with outcome clean), and every object read
back from the server byte for byte.

Usage: drainfs-pods.py [--arrangements stock,relay,self-managed] [--pods N] [--files N] [--kib K]
Results: a table per pod, then p50/p95 per arrangement and a side-by-side table;
$K8S_NODE_WORK/results/drainfs-pods.json.
Exit codes: 0 every pod passed every check; 1 a check failed (printed); 2 usage, or the node is
not up (up.sh, then drainfs-images.sh).
"""
import argparse
import contextlib
import importlib.util
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# The runc image test's fake server, bucket reads and unmounts; job-pods.py's kubelet and
# crictl queries.
rt = load("run_test", os.path.join(REPO, "docker", "image", "run-test.py"))
jp = load("job_pods", os.path.join(HERE, "job-pods.py"))

WORK = jp.WORK
NODE = jp.NODE
VERSION = next(line.split('"')[1] for line in open(os.path.join(REPO, "Cargo.toml"))
               if line.startswith("version = "))
IMAGES = {
    "stock": "local.drainfs/gcs-fuse-csi-driver-sidecar-mounter:v1.24.4-stock",
    "relay": f"docker.io/library/gcs-fuse-csi-driver-sidecar-mounter:v1.24.4-gke.0-drainfs.{VERSION}",
    "self-managed": f"docker.io/library/drainfs:{VERSION}",
}
TESTBIN = "local.drainfs/testbin:1"
SIDECAR_NAME = {"stock": "gke-gcsfuse-sidecar", "relay": "gke-gcsfuse-sidecar", "self-managed": "drainfs"}
POD_TIMEOUT = 180
BUCKET = rt.BUCKET


def content(i, kib):
    """testbin's Content(i, kib): 64-byte records "part-I offset-O", '.'-padded, newline-ended."""
    return b"".join(f"part-{i} offset-{off}".ljust(63, ".").encode() + b"\n"
                    for off in range(0, kib * 1024, 64))


def workload(name, stamps, files, kib):
    return {
        "name": "app", "image": TESTBIN, "imagePullPolicy": "Never",
        "args": ["write", "/stamps", f"/data/{name}", str(files), str(kib)],
        "securityContext": {"runAsUser": 1000, "runAsGroup": 1000, "runAsNonRoot": True,
                            "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "capabilities": {"drop": ["ALL"]}},
        "volumeMounts": [{"name": "stamps", "mountPath": "/stamps"}],
    }, {"name": "stamps", "hostPath": {"path": stamps, "type": "Directory"}}


class NodeDriver:
    """The CSI node driver's part for one volume: /dev/fuse mounted at `target` with fd=N, the
    fd and options handed to the sidecar mounter over <tmp>/.volumes/<vol>/socket."""

    VOL = "gcs"

    def __init__(self, stack, base, port):
        self.target = os.path.join(base, "target")
        self.tmp = os.path.join(base, "gcsfuse-tmp")
        vdir = os.path.join(self.tmp, ".volumes", self.VOL)
        os.makedirs(vdir)
        os.makedirs(self.target)
        for d in (self.tmp, os.path.dirname(vdir), vdir):
            os.chown(d, 65534, 65534)
        fd = os.open("/dev/fuse", os.O_RDWR)
        self.fd_open = True

        def close_fd():
            if self.fd_open:
                self.fd_open = False
                os.close(fd)
        stack.callback(close_fd)
        opts = f"nodev,nosuid,allow_other,default_permissions,rootmode=40000,user_id=0,group_id=0,fd={fd}"
        subprocess.run(["mount", "-i", "-t", "fuse", "-o", opts, BUCKET, self.target], pass_fds=(fd,), check=True)
        stack.callback(rt.umount, self.target)
        sock = os.path.join(vdir, "socket")
        srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        srv.bind(sock)
        os.chmod(sock, 0o777)
        srv.listen(1)
        stack.callback(srv.close)
        msg = json.dumps({"bucketName": BUCKET, "volumeName": self.VOL, "options": [
            "implicit-dirs", "uid=1000", "gid=1000",
            f"custom-endpoint=http://localhost:{port}/storage/v1/", "anonymous-access",
            "enable-hns=false", "enable-atomic-rename-object=false", "disable-autoconfig",
            "disable-metrics-for-gke:true"]}).encode()
        self.handed = threading.Event()

        def hand_over():
            srv.settimeout(POD_TIMEOUT)
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            socket.send_fds(conn, [msg], [fd])
            conn.close()
            close_fd()  # the sidecar holds the only copy now, as with the real driver
            self.handed.set()
        threading.Thread(target=hand_over, daemon=True).start()


def gke_pod(arr, name, port, stack, base, stamps, files, kib):
    drv = NodeDriver(stack, base, port)
    app, stamps_vol = workload(name, stamps, files, kib)
    app["volumeMounts"].append({"name": "gcs", "mountPath": "/data"})
    sidecar = {
        "name": "gke-gcsfuse-sidecar", "image": IMAGES[arr], "imagePullPolicy": "Never",
        "restartPolicy": "Always", "args": ["--v=5"],
        "env": [{"name": "NATIVE_SIDECAR", "value": "TRUE"}],
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "capabilities": {"drop": ["ALL"]},
                            "seccompProfile": {"type": "RuntimeDefault"},
                            "runAsNonRoot": True, "runAsUser": 65534, "runAsGroup": 65534},
        "volumeMounts": [{"name": "gke-gcsfuse-tmp", "mountPath": "/gcsfuse-tmp"},
                         {"name": "gke-gcsfuse-buffer", "mountPath": "/gcsfuse-buffer"},
                         {"name": "gke-gcsfuse-cache", "mountPath": "/gcsfuse-cache"}],
    }
    spec = {
        "hostNetwork": True, "restartPolicy": "Never", "terminationGracePeriodSeconds": 30,
        "initContainers": [sidecar], "containers": [app],
        "volumes": [{"name": "gke-gcsfuse-tmp", "hostPath": {"path": drv.tmp, "type": "Directory"}},
                    {"name": "gke-gcsfuse-buffer", "emptyDir": {}},
                    {"name": "gke-gcsfuse-cache", "emptyDir": {}},
                    # No type: the kubelet's type check stats the path, which waits for the
                    # FUSE daemon, and the sidecar that brings it up starts only after every
                    # volume is set up (a CSI volume is not stat'ed either).
                    {"name": "gcs", "hostPath": {"path": drv.target}},
                    stamps_vol],
    }
    return spec, drv


def self_managed_pod(name, port, stamps, files, kib):
    import yaml
    with open(os.path.join(REPO, "docker", "k8s", "job-native-sidecar.yaml")) as f:
        job = next(d for d in yaml.safe_load_all(f) if d and d.get("kind") == "Job")
    spec = job["spec"]["template"]["spec"]
    spec.pop("serviceAccountName", None)
    spec["hostNetwork"] = True
    for c in spec["initContainers"]:
        c["image"], c["imagePullPolicy"] = IMAGES["self-managed"], "Never"
    drainfs = next(c for c in spec["initContainers"] if c["name"] == "drainfs")
    args = drainfs["args"]
    fg = args.index("--foreground")
    args[fg + 1:fg + 1] = [f"--custom-endpoint=http://localhost:{port}/storage/v1/", "--anonymous-access",
                           "--enable-hns=false", "--enable-atomic-rename-object=false", "--disable-autoconfig"]
    args[args.index("example-bucket")] = BUCKET
    app, stamps_vol = workload(name, stamps, files, kib)
    manifest_app = spec["containers"][0]
    app["volumeMounts"] += manifest_app["volumeMounts"]
    app["securityContext"] = manifest_app["securityContext"]
    spec["containers"] = [app]
    spec["volumes"].append(stamps_vol)
    return spec


def pod_status(full):
    p = jp.kubelet_pod(full)
    return p, (p or {}).get("status", {})


def container_status(status, name):
    for c in status.get("initContainerStatuses", []) + status.get("containerStatuses", []):
        if c["name"] == name:
            return c
    return {}


def rfc3339_ns(ts):
    """An RFC 3339 time with up to 9 fractional digits (crictl's finishedAt) -> UNIX ns."""
    import datetime
    base, _, frac = ts.rstrip("Z").partition(".")
    whole = datetime.datetime.fromisoformat(base).replace(tzinfo=datetime.timezone.utc)
    return int(whole.timestamp()) * 1_000_000_000 + int((frac + "000000000")[:9])


def finished_ns(full, container):
    """The container's finishedAt as containerd recorded it (ns resolution; the pod status the
    kubelet reports has seconds), or None."""
    sb = jp.sandbox(full)
    if not sb:
        return None
    for c in json.loads(jp.crictl("ps", "-a", "-o", "json", "--pod", sb["id"]))["containers"]:
        if c["metadata"]["name"] == container:
            ts = json.loads(jp.crictl("inspect", c["id"]))["status"].get("finishedAt")
            if ts and not ts.startswith("0001"):
                return rfc3339_ns(ts)
    return None


def run_pod(arr, i, port, files, kib):
    name = f"{arr}-{os.getpid()}-{i}"
    full = f"{name}-{NODE}"
    base = os.path.join(WORK, "drainfs-pods", name)
    stamps = os.path.join(base, "stamps")
    os.makedirs(stamps)
    os.chmod(stamps, 0o777)
    r = {"arrangement": arr, "pod": full, "errors": []}
    manifest = os.path.join(WORK, "manifests", f"{name}.yaml")
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, base, True)
        drv = None
        if arr == "self-managed":
            spec = self_managed_pod(name, port, stamps, files, kib)
        else:
            spec, drv = gke_pod(arr, name, port, stack, base, stamps, files, kib)
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": name, "namespace": "default"}, "spec": spec}
        tmp = os.path.join(WORK, "manifests", f".{name}.yaml")
        with open(tmp, "w") as f:
            json.dump(pod, f, indent=1)  # JSON is YAML

        def remove_pod():
            with contextlib.suppress(FileNotFoundError):
                os.unlink(manifest)
            deadline = time.time() + 60
            while time.time() < deadline and jp.kubelet_pod(full):
                time.sleep(0.2)
        stack.callback(remove_pod)
        os.rename(tmp, manifest)
        t_succeeded, phases, status = None, [], {}
        deadline = time.time() + POD_TIMEOUT
        while time.time() < deadline:
            now = time.time_ns()
            p, status = pod_status(full)
            phase = status.get("phase")
            if phase and (not phases or phases[-1] != phase):
                phases.append(phase)
            if phase == "Succeeded":
                t_succeeded = now
                break
            if phase == "Failed":
                break
            time.sleep(jp.POLL)
        # The sidecar's final status can follow the phase by a sync.
        side = {}
        for _ in range(100):
            _, status = pod_status(full)
            side = container_status(status, SIDECAR_NAME[arr])
            if "terminated" in side.get("state", {}):
                break
            time.sleep(0.1)
        r["phases"] = phases
        app = container_status(status, "app").get("state", {}).get("terminated", {})
        term = side.get("state", {}).get("terminated", {})
        r["app_exit"], r["sidecar_exit"] = app.get("exitCode"), term.get("exitCode")
        r["sidecar_reason"] = term.get("reason")
        msg = term.get("message", "")
        r["termination_message"] = msg[:400]
        s = jp.stamps(stamps)
        if t_succeeded is None:
            r["errors"].append(f"no phase Succeeded within {POD_TIMEOUT}s (phases {phases})")
        if r["app_exit"] != 0:
            r["errors"].append(f"the workload's exit code {r['app_exit']}")
        if drv is not None and not drv.handed.is_set():
            r["errors"].append("the sidecar mounter never took the FUSE fd")
        if "job.exit" not in s:
            r["errors"].append("no job.exit stamp")
        if arr in ("relay", "self-managed"):
            try:
                summary = json.loads(msg)
            except ValueError:
                summary = {}
            r["outcome"] = summary.get("outcome")
            if summary.get("outcome") != "clean" or summary.get("exit_code") != 0:
                r["errors"].append(f"termination message is not a clean drainfs summary: {msg[:200]!r}")
        if arr == "self-managed" and r["sidecar_exit"] != 0:
            r["errors"].append(f"drainfs's exit code {r['sidecar_exit']}")
        if t_succeeded is not None and "job.exit" in s:
            ex = s["job.exit"]
            r["ms"] = {"exit->Succeeded": (t_succeeded - ex) / 1e6}
            fin = finished_ns(full, SIDECAR_NAME[arr])
            if fin is not None:
                r["ms"]["exit->sidecar exited"] = (fin - ex) / 1e6
        got = {k: v for k, v in rt.objects(port).items() if k.startswith(name + "/")}
        want = {f"{name}/part-{j}.bin": content(j, kib) for j in range(files)}
        got.pop(name + "/", None)  # the directory's own object, if gcsfuse made one
        if got != want:
            r["errors"].append(f"bucket: {len(got)} of {len(want)} objects, wrong or missing:"
                               f" {sorted(k for k in want if got.get(k) != want[k])[:5]}")
        r["objects"] = len(got)
    return r


def pct(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, max(0, round(q / 100 * len(v) + 0.5) - 1))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arrangements", default="stock,relay,self-managed")
    ap.add_argument("--pods", type=int, default=10)
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--kib", type=int, default=1024)
    a = ap.parse_args()
    arrs = a.arrangements.split(",")
    if any(x not in IMAGES for x in arrs) or a.pods < 1 or a.files < 1 or a.kib < 1:
        ap.error("arrangements: stock, relay, self-managed; counts positive")
    import signal
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda n, _f: sys.exit(128 + n))
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{jp.PORT}/pods", timeout=5).read()
    except OSError as e:
        print(f"drainfs-pods.py: the kubelet's read-only port does not answer ({e}): run up.sh", file=sys.stderr)
        return 2
    results = []
    with contextlib.ExitStack() as stack:
        fake = os.path.join(WORK, "drainfs-pods", f"fake-gcs-{os.getpid()}")
        os.makedirs(fake)
        stack.callback(shutil.rmtree, fake, True)
        port = rt.fake_gcs(stack, fake)
        # Interleaved: one pod of each arrangement in turn.
        for i in range(a.pods):
            for arr in arrs:
                r = run_pod(arr, i, port, a.files, a.kib)
                results.append(r)
                ms = r.get("ms", {})
                print(f"{r['pod']}: phases {r['phases']}, app exit {r['app_exit']}, sidecar exit "
                      f"{r['sidecar_exit']} ({r['sidecar_reason']}), outcome {r.get('outcome')}, "
                      f"{r['objects']} objects, "
                      + ", ".join(f"{k} {v:.0f} ms" for k, v in ms.items())
                      + (f"; ERRORS {r['errors']}" if r["errors"] else ""), flush=True)
    os.makedirs(os.path.join(WORK, "results"), exist_ok=True)
    with open(os.path.join(WORK, "results", "drainfs-pods.json"), "w") as f:
        json.dump(results, f, indent=1)
    print()
    print("| arrangement | pods passed | workload exit -> Succeeded p50 / p95 (ms) | workload exit -> sidecar exited p50 / p95 (ms) | sidecar exit codes | objects intact |")
    print("| --- | --- | --- | --- | --- | --- |")
    bad = 0
    for arr in arrs:
        rs = [r for r in results if r["arrangement"] == arr]
        ok = [r for r in rs if not r["errors"]]
        bad += len(rs) - len(ok)
        col = []
        for key in ("exit->Succeeded", "exit->sidecar exited"):
            v = [r["ms"][key] for r in ok if key in r.get("ms", {})]
            col.append(f"{pct(v, 50):.0f} / {pct(v, 95):.0f}" if v else "-")
        codes = sorted({str(r["sidecar_exit"]) for r in rs})
        print(f"| {arr} | {len(ok)} of {len(rs)} | {col[0]} | {col[1]} | {', '.join(codes)} | "
              f"{sum(1 for r in rs if not any(e.startswith('bucket') for e in r['errors']))} of {len(rs)} |")
    for r in results:
        if r["errors"]:
            print(f"FAILED {r['pod']}: {r['errors']}; termination message {r['termination_message']!r}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
