#!/usr/bin/env python3
"""The seed's pod under the real kubelet (up.sh): a Job-shaped static pod (restartPolicy: Never)
whose workload writes files through a bucket volume and exits, with the gcsfuse sidecar as a
native sidecar, over a fake-gcs-server on loopback, in these arrangements:

  stock         GKE's sidecar as the webhook injects it (sidecar_spec.go,
                GetNativeSidecarContainerSpec: uid/gid 65534, every capability dropped, no
                privilege escalation, read-only root, seccomp RuntimeDefault, NATIVE_SIDECAR=TRUE,
                args --v=5, the emptyDirs gke-gcsfuse-buffer and -cache), image: the real sidecar
                mounter v1.24.4 and the real gcsfuse v3.11.2 (drainfs-images.sh's stock image);
  relay         the same, with the project's relay image (drainfs as /gcsfuse, DRAINFS_DROPIN_MODE=relay
                in the image's environment);
  handoff       the same, with the managed path's default image: docker/Dockerfile's gke-overlay target
                as docker/image/build.sh makes it on its stand-in for GKE's sidecar image (GKE's
                own /gcsfuse kept as /gcsfuse.real, drainfs as /gcsfuse, the hand-off: drainfs
                gives gcsfuse the FUSE fd and owns only the stop);
  self-managed  docker/k8s/job-native-sidecar.yaml's pod template as written, in static-pod form:
                only the image names, gcsfuse's bucket and fake-server flags, hostNetwork (no CNI
                here) and the workload (testbin) are replaced, and its serviceAccountName
                (Workload Identity; a static pod has no API server) dropped;
  airflow       (scenario legacy only) docker/k8s/airflow-pod-template.yaml's pod, the same way:
                the `base` container's /bin/sh wrapper runs as written, testbin is its workload.
  floor         (scenario job only) the same Job with no gcsfuse sidecar and no bucket: the workload
                writes its files to an emptyDir. What the kubelet itself takes from the workload's
                exit to phase Succeeded; each arrangement's excess over it is in the table.

For stock and relay this script is the CSI node driver, as docker/image/run-test.py is in runc:
before the pod exists it opens /dev/fuse, mounts the volume's target with fd=N (the workload
container gets the target as a hostPath), listens on <tmp>/.volumes/<vol>/socket in the
directory the sidecar gets as /gcsfuse-tmp (a hostPath here, an emptyDir the driver finds by
the pod's UID on GKE), and hands the fd and the mount options to the sidecar mounter, as
csi_mounter.go does. The mount options are the manifests' volume's (implicit-dirs, uid=1000,
gid=1000; the relay adds drainfs-mode=relay, as job-gke-managed-relay.yaml does) plus the fake
server's endpoint.

The workload (testbin write, uid 1000 as in the manifests) writes FILES files of KIB KiB under
/data/<pod>/, each closed before the next, and stamps its start, any SIGTERM, its exit (UNIX ns,
the host's clock) and the number of files it closed into a hostPath directory off the bucket.

Scenarios (--scenarios, each run for every arrangement, interleaved):

  job       the pod runs to completion. Measured from the kubelet's side: workload exit -> the
            kubelet's /pods shows phase Succeeded (polled every 50 ms: what a Job controller or
            Airflow's KubernetesPodOperator waits for), and workload exit -> the sidecar's
            exit (containerd's task exit event).
  legacy    the same with the sidecar as a regular container and the exit-file flow: for stock
            and relay GKE's non-native spec (the sidecar first in `containers`, NATIVE_SIDECAR
            unset) and this script as the node driver writing the exit file once every other
            container has terminated (putExitFile); for self-managed pod-legacy-sidecar.yaml's
            pod, whose /bin/sh wrapper (as written, in busybox's sh) waits for drainfs's ready
            file, runs the workload and creates the exit file; and the airflow arrangement.
  delete    the Deployment case: the pod's manifest is removed while the workload writes its
            second file (each file is open --pace-ms ms); the kubelet stops the pod with its
            grace period, the workload finishes the file it is writing on SIGTERM and exits 0.
            Measured from the deletion: the workload's and the sidecar's exits, the sandbox's
            stop. Every file the workload closed must be in the bucket, and nothing else.
  stalled   the same, but the bucket's server (the pod's own fake-gcs-server) is stopped
            (SIGSTOP) just before the deletion, with terminationGracePeriodSeconds (and, in
            self-managed, DRAINFS_GRACE_PERIOD) GRACE_STALLED; resumed grace + 60 s after the
            deletion if the pod is still stopping. Recorded: who exited when, with which code
            and termination message. Checked: the files closed before the stall are in the
            bucket, and the self-managed drainfs exits 75 with outcome `incomplete` before the
            grace period ends (the relay cannot promise that: a native sidecar gets its SIGTERM
            only once the workload has exited or been killed, and 2 s after it the kubelet's
            SIGKILL); the relay's termination message is its provisional summary (outcome
            `stopping`), or its final one, and names the file open at the stall either way.

  grace     the pod's grace period runs out while the workload is inside close() of a large
            file (GKE arrangements: stock, relay, handoff): the workload writes one file of
            --kib KiB to a bucket behind toxiproxy with --bandwidth-mibps (so that the close,
            which waits for gcsfuse's upload, lasts), and the pod's manifest is removed the
            moment it begins close() (its `closing` stamp), with terminationGracePeriodSeconds
            --grace-s. The kubelet SIGTERMs the workload, which is inside close() and stays
            there; at the grace period's end it SIGKILLs it, and the close()'s FLUSH, a forced
            request, still waits for gcsfuse. Recorded from the deletion: the workload's and
            the sidecar's exits (containerd's task exit events), the sidecar's termination
            message, and whether the file is in the bucket whole, absent, or anything else.
            Checked: the hand-off never calls a stop idle while the upload it cut was still in
            flight (outcome idle with the file not whole), nothing the workload closed with 0 is
            missing, and no object is half there. The arrangements are compared with stock:
            whether each upload completed, and when the sidecar exited.

With --latency-ms N the pods' bucket is the fake-gcs-server behind toxiproxy (install.sh's
`toxiproxy` step), N ms of round trip added (N/2 each way), the URLs the server hands out naming
the proxy: a round trip of the order of a cloud VM's to Cloud Storage, which loopback lacks (an
answer within the 4 ms step of its request is common on loopback, and the hand-off holds such a
tie 2 s). The stalled scenario keeps its own server, without it.

Checked per pod (job, legacy, delete): the workload's exit 0, the sidecar's exit code and
termination message as the kubelet records them (drainfs: a JSON summary with outcome clean, or
for the hand-off, outcome idle and data_path handoff; after a deletion, the kubelet's termination-message file, held open), and every object read back
from the server byte for byte. In every scenario: a drainfs summary that says `clean` with a
closed file missing, or an exit code that disagrees with the summary, fails the pod.

Usage: drainfs-pods.py [--arrangements stock,relay,handoff,self-managed,airflow,floor] [--scenarios job,legacy,delete,stalled,grace]
                       [--pods N] [--files N] [--kib K] [--pace-ms MS] [--latency-ms MS]
                       [--bandwidth-mibps M] [--grace-s S] [--exit-spread-ms MS]
                       [--handoff-option drainfs-idle-window=1s ...]
Results: a line per pod, then a side-by-side table (p50/p95) per scenario, with the job scenario's
exit->Succeeded p50 also as the excess over the floor's when the floor ran;
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
import signal
import socket
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
# toxiproxy in front of the fake server (--latency-ms, --bandwidth-mibps).
lw = load("lowers", os.path.join(REPO, "scripts", "lowers.py"))

WORK = jp.WORK
NODE = jp.NODE
VERSION = next(line.split('"')[1] for line in open(os.path.join(REPO, "Cargo.toml"))
               if line.startswith("version = "))
IMAGES = {
    "stock": "local.drainfs/gcs-fuse-csi-driver-sidecar-mounter:v1.24.4-stock",
    "relay": f"docker.io/library/gcs-fuse-csi-driver-sidecar-mounter:v1.24.4-gke.0-drainfs.{VERSION}",
    "handoff": "local.drainfs/gcs-fuse-csi-driver-sidecar-mounter:v1.24.4-gke-overlay",
    "self-managed": f"docker.io/library/drainfs:{VERSION}",
    "airflow": f"docker.io/library/drainfs:{VERSION}",
    "floor": None,
}
GKE_ARRANGEMENTS = ("stock", "relay", "handoff")
TESTBIN = "local.drainfs/testbin:1"
SIDECAR_NAME = {"stock": "gke-gcsfuse-sidecar", "relay": "gke-gcsfuse-sidecar", "handoff": "gke-gcsfuse-sidecar",
                "self-managed": "drainfs", "floor": None,
                "airflow": "drainfs"}
# The workload container's name: Airflow's KubernetesPodOperator calls it `base`.
APP_NAME = {"airflow": "base"}
POD_TIMEOUT = 180
SCENARIOS = ("job", "legacy", "delete", "stalled", "grace")
# The stalled scenario's terminationGracePeriodSeconds (and DRAINFS_GRACE_PERIOD).
GRACE_STALLED = 20
# The grace scenario's terminationGracePeriodSeconds (--grace-s).
GRACE_CLOSE = [2]
BUCKET = rt.BUCKET


# A proxy's port -> the fake-gcs-server port behind it (--latency-ms): the pods talk to the
# first, the objects are read back from the second.
BEHIND = {}


def latency_backend(stack, workdir, latency_ms, mibps=0):
    """fake-gcs-server behind toxiproxy (install.sh's `toxiproxy` step) adding `latency_ms` of
    round trip (a latency toxic of half of it in each direction), as a cloud VM sees Cloud
    Storage, and with `mibps` > 0 capping each connection at that many MiB/s each way (a
    bandwidth toxic per direction, in toxiproxy's KB/s of 1,000 bytes); returns the proxy's
    port."""
    proxy = rt.free_port()
    server = rt.fake_gcs(stack, workdir, public_port=proxy)
    p = lw.start_toxiproxy(os.path.join(jp.ROOT, "bin", "toxiproxy-server"), os.path.join(workdir, "toxiproxy.log"),
                           proxy, server, latency_ms, mibps)

    def stop():
        p.kill()
        p.wait()
    stack.callback(stop)
    BEHIND[proxy] = server
    return proxy


def content(i, kib):
    """testbin's Content(i, kib): 64-byte records "part-I offset-O", '.'-padded, newline-ended."""
    return b"".join(f"part-{i} offset-{off}".ljust(63, ".").encode() + b"\n"
                    for off in range(0, kib * 1024, 64))


def workload(name, stamps, files, kib, flags=()):
    return {
        "name": "app", "image": TESTBIN, "imagePullPolicy": "Never",
        "args": ["write", *flags, "/stamps", f"/data/{name}", str(files), str(kib)],
        "securityContext": {"runAsUser": 1000, "runAsGroup": 1000, "runAsNonRoot": True,
                            "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "capabilities": {"drop": ["ALL"]}},
        "volumeMounts": [{"name": "stamps", "mountPath": "/stamps"}],
    }, {"name": "stamps", "hostPath": {"path": stamps, "type": "Directory"}}


class NodeDriver:
    """The CSI node driver's part for one volume: /dev/fuse mounted at `target` with fd=N, the
    fd and options handed to the sidecar mounter over <tmp>/.volumes/<vol>/socket."""

    VOL = "gcs"

    def __init__(self, stack, base, port, extra=()):
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
            "disable-metrics-for-gke:true", *extra]}).encode()
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
        self.exit_file_ns = None

    def put_exit_file(self, full, stop):
        """The node driver's putExitFile (utils.go) for a regular sidecar: once every container
        but the sidecar has terminated (polled at the kubelet's /pods every 200 ms; the real
        driver checks when the kubelet republishes the volume), create <tmp>/.volumes/exit,
        owned by 65534, which the sidecar mounter polls for every 5 s."""
        def watch():
            while not stop.is_set():
                _, status = pod_status(full)
                cs = [c for c in status.get("containerStatuses", []) if c["name"] != "gke-gcsfuse-sidecar"]
                if cs and all("terminated" in c.get("state", {}) for c in cs):
                    path = os.path.join(self.tmp, ".volumes", "exit")
                    with open(path, "w"):
                        pass
                    os.chown(path, 65534, 65534)
                    self.exit_file_ns = time.time_ns()
                    return
                stop.wait(0.2)
        threading.Thread(target=watch, daemon=True).start()


def gke_pod(arr, name, port, stack, base, stamps, files, kib, scenario, flags, handoff_options=()):
    """GKE's webhook spec: GetNativeSidecarContainerSpec, or for `legacy` GetSidecarContainerSpec
    (a regular container, first in the list, NATIVE_SIDECAR unset). `handoff_options`: mount
    options added to the hand-off's volume (as a user writes them in mountOptions)."""
    extra = {"handoff": tuple(handoff_options), "relay": ("drainfs-mode=relay",)}.get(arr, ())
    drv = NodeDriver(stack, base, port, extra)
    app, stamps_vol = workload(name, stamps, files, kib, flags)
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
    if scenario == "legacy":
        del sidecar["restartPolicy"], sidecar["env"]
    spec = {
        "hostNetwork": True, "restartPolicy": "Never",
        "terminationGracePeriodSeconds": (GRACE_STALLED if scenario == "stalled" else
                                          GRACE_CLOSE[0] if scenario == "grace" else 30),
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
    if scenario == "legacy":
        spec["initContainers"], spec["containers"] = [], [sidecar, app]
    return spec, drv


def floor_pod(name, stamps, files, kib, flags=()):
    """The floor: the Job's workload alone (no sidecar, no bucket), writing to an emptyDir at
    /data."""
    app, stamps_vol = workload(name, stamps, files, kib, flags)
    app["volumeMounts"].append({"name": "data", "mountPath": "/data"})
    return {"hostNetwork": True, "restartPolicy": "Never", "terminationGracePeriodSeconds": 30,
            "containers": [app], "volumes": [{"name": "data", "emptyDir": {}}, stamps_vol]}


def self_managed_pod(arr, name, port, stamps, files, kib, scenario, flags):
    """A shipped manifest's pod as written but for what the module docstring lists:
    job-native-sidecar.yaml's pod template; for `legacy`, pod-legacy-sidecar.yaml's pod; for the
    `airflow` arrangement, airflow-pod-template.yaml's pod. The Job's workload container is
    replaced by testbin; the other two keep their /bin/sh wrapper (waits for drainfs's ready
    file, runs the workload, creates the exit file by rename) as `command`, with testbin as the
    workload (`args`), in the testbin image (busybox's sh). In `stalled` the grace period and
    DRAINFS_GRACE_PERIOD are both GRACE_STALLED."""
    import yaml
    file, kind = (("airflow-pod-template.yaml", "Pod") if arr == "airflow" else
                  ("pod-legacy-sidecar.yaml", "Pod") if scenario == "legacy" else ("job-native-sidecar.yaml", "Job"))
    with open(os.path.join(REPO, "docker", "k8s", file)) as f:
        doc = next(d for d in yaml.safe_load_all(f) if d and d.get("kind") == kind)
    spec = doc["spec"] if kind == "Pod" else doc["spec"]["template"]["spec"]
    spec.pop("serviceAccountName", None)
    spec["hostNetwork"] = True
    app_name = APP_NAME.get(arr, "app")
    for c in spec.get("initContainers", []) + spec["containers"]:
        if c["name"] != app_name:
            c["image"], c["imagePullPolicy"] = IMAGES[arr], "Never"
    drainfs = next(c for c in spec.get("initContainers", []) + spec["containers"] if c["name"] == "drainfs")
    if scenario == "stalled":
        spec["terminationGracePeriodSeconds"] = GRACE_STALLED
        next(e for e in drainfs["env"] if e["name"] == "DRAINFS_GRACE_PERIOD")["value"] = str(GRACE_STALLED)
    args = drainfs["args"]
    fg = args.index("--foreground")
    args[fg + 1:fg + 1] = [f"--custom-endpoint=http://localhost:{port}/storage/v1/", "--anonymous-access",
                           "--enable-hns=false", "--enable-atomic-rename-object=false", "--disable-autoconfig"]
    args[args.index("example-bucket")] = BUCKET
    app, stamps_vol = workload(name, stamps, files, kib, flags)
    at = next(i for i, c in enumerate(spec["containers"]) if c["name"] == app_name)
    manifest_app = spec["containers"][at]
    if kind == "Pod":
        manifest_app["image"], manifest_app["imagePullPolicy"] = TESTBIN, "Never"
        manifest_app["args"] = ["/testbin", *app["args"]]
        manifest_app["volumeMounts"] += app["volumeMounts"]
    else:
        app["volumeMounts"] += manifest_app["volumeMounts"]
        app["securityContext"] = manifest_app["securityContext"]
        spec["containers"][at] = app
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


class TaskExits:
    """containerd's task exit events (`ctr events`, topic /tasks/exit, the container's own
    task, not a hook's exec): container ID -> (exit status, exited_at in UNIX ns). The kubelet
    removes a deleted pod's containers within moments of their exit, often before crictl can
    be asked about them; the event stream misses none."""

    def __init__(self, stack):
        self.exits = {}
        self.proc = subprocess.Popen(
            [os.path.join(jp.ROOT, "bin", "ctr"), "--address", jp.SOCK.removeprefix("unix://"),
             "-n", "k8s.io", "events"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)

        def stop():
            self.proc.kill()
            self.proc.wait()
        stack.callback(stop)

        def read():
            for line in self.proc.stdout:
                _, sep, rest = line.partition(" /tasks/exit ")
                e = json.loads(rest) if sep else {}
                # A hook's exec process exits with its own `id`; the container's task has its ID.
                if "container_id" in e and e.get("id") == e["container_id"]:
                    at = e.get("exited_at", {})
                    self.exits[e["container_id"]] = (e.get("exit_status", 0),
                                                     at.get("seconds", 0) * 1_000_000_000 + at.get("nanos", 0))
        threading.Thread(target=read, daemon=True).start()


def exited(sb_id, seen, ids, events):
    """Records the sandbox's containers (name -> ID, into `ids`, while they exist) and adds to
    `seen` (name -> (exit code, reason, finishedAt in UNIX ns)) each one that has exited, from
    the task exit events."""
    for c in json.loads(jp.crictl("ps", "-a", "-o", "json", "--pod", sb_id))["containers"]:
        ids.setdefault(c["metadata"]["name"], c["id"])
    for name, cid in ids.items():
        if name not in seen and cid in events.exits:
            code, at = events.exits[cid]
            seen[name] = (code, "Completed" if code == 0 else "Error", at)
    return seen


class TermLog:
    """Holds open every termination-message file the kubelet makes for `container`
    (<root-dir>/pods/<uid>/containers/<name>/<id>, bind-mounted at its terminationMessagePath),
    so that what the container wrote there can be read after a deleted pod's directory is gone
    (the kubelet's /pods drops a static pod as soon as its manifest is removed)."""

    def __init__(self, stack, full, container):
        self.fds = {}
        stop = threading.Event()

        def watch():
            d = None
            while not stop.wait(0.05):
                with contextlib.suppress(OSError):
                    if d is None:
                        p = jp.kubelet_pod(full)
                        if p:
                            d = os.path.join(WORK, "kubelet", "pods", p["metadata"]["uid"], "containers", container)
                        continue
                    for f in os.listdir(d):
                        if f not in self.fds:
                            self.fds[f] = os.open(os.path.join(d, f), os.O_RDONLY)
        t = threading.Thread(target=watch, daemon=True)
        t.start()

        def close():
            stop.set()
            t.join()
            for fd in self.fds.values():
                os.close(fd)
        stack.callback(close)

    def text(self):
        """The last non-empty message (one per container instance), or ""."""
        out = ""
        for fd in list(self.fds.values()):
            t = os.pread(fd, 65536, 0).decode(errors="replace")
            out = t or out
        return out


def read_stamps(d):
    """testbin's stamps in d (job.start, job.term, job.exit, job.closing: UNIX ns), `closed`: the number
    of files the workload closed (written as it exits), and `opening`: the number of the last
    file it began (written before each). testbin writes each by rename."""
    s = {}
    for f in os.listdir(d):
        for key in ("job.start", "job.term", "job.exit", "job.closed", "job.opening", "job.closing"):
            if f.endswith("-" + key):
                name = key.removeprefix("job.") if key in ("job.closed", "job.opening") else key
                s[name] = int(open(os.path.join(d, f)).read())
    return s


def observe_completion(r, full, arr):
    """Waits for the pod's phase (POD_TIMEOUT) and records it with the kubelet's record of the
    containers; returns the time the phase Succeeded was seen (UNIX ns) or None."""
    t_succeeded, phases, status = None, [], {}
    deadline = time.time() + POD_TIMEOUT
    while time.time() < deadline:
        now = time.time_ns()
        _, status = pod_status(full)
        phase = status.get("phase")
        if phase and (not phases or phases[-1] != phase):
            phases.append(phase)
        if phase in ("Succeeded", "Failed"):
            t_succeeded = now if phase == "Succeeded" else None
            break
        time.sleep(jp.POLL)
    # The sidecar's final status can follow the phase by a sync.
    side = {}
    for _ in range(100 if SIDECAR_NAME[arr] else 0):
        _, status = pod_status(full)
        side = container_status(status, SIDECAR_NAME[arr])
        if "terminated" in side.get("state", {}):
            break
        time.sleep(0.1)
    r["phases"] = phases
    app = container_status(status, APP_NAME.get(arr, "app")).get("state", {}).get("terminated", {})
    t = side.get("state", {}).get("terminated", {})
    r["app_exit"], r["sidecar_exit"], r["sidecar_reason"] = app.get("exitCode"), t.get("exitCode"), t.get("reason")
    r["termination_message"] = t.get("message") or ""
    if t_succeeded is None:
        r["errors"].append(f"no phase Succeeded within {POD_TIMEOUT}s (phases {phases})")
    return t_succeeded


def observe_deletion(r, full, arr, stamps, manifest, server, pace_ms, grace, term, events):
    """Removes the pod's manifest (the kubelet stops the pod with its grace period, as on a
    deletion) while the workload writes its second file, after stopping the bucket's server
    (SIGSTOP) when `server` is given; waits for the sandbox to stop, resuming the server grace +
    60 s after the deletion if it is still waiting. Records the containers' exit codes from
    containerd's task exit events and the sidecar's termination message (TermLog); returns the
    deletion's time."""
    deadline = time.time() + POD_TIMEOUT
    # The grace scenario deletes the pod the moment the workload begins its close(); the others
    # while it writes its second file.
    wait_for = "job.closing" if r["scenario"] == "grace" else "job.start"
    while wait_for not in read_stamps(stamps):
        if time.time() > deadline:
            r["errors"].append(f"the workload did not reach {wait_for} within {POD_TIMEOUT}s")
            return None
        time.sleep(0.01 if r["scenario"] == "grace" else jp.POLL)
    if r["scenario"] != "grace":
        time.sleep(pace_ms * 1.5 / 1000)
    if server is not None:
        os.kill(server.pid, signal.SIGSTOP)
    t_del = time.time_ns()
    os.unlink(manifest)
    resume, end = time.time() + grace + 60, time.time() + grace + 150
    r["phases"] = ["deleted"]
    sb_id, seen, ids = jp.sandbox(full)["id"], {}, {}
    while time.time() < end:
        exited(sb_id, seen, ids, events)
        if server is not None and time.time() > resume and "server resumed" not in r["phases"]:
            os.kill(server.pid, signal.SIGCONT)
            r["phases"].append("server resumed")
            r["ms"]["deleted->server resumed"] = (time.time_ns() - t_del) / 1e6
        sb = jp.sandbox(full)
        if sb is None or sb["state"] == "SANDBOX_NOTREADY":
            r["ms"]["deleted->pod stopped"] = (time.time_ns() - t_del) / 1e6
            r["phases"].append("stopped")
            break
        time.sleep(jp.POLL)
    else:
        r["errors"].append(f"the pod did not stop within {grace + 150}s of its deletion")
    if server is not None:
        os.kill(server.pid, signal.SIGCONT)
    for _ in range(50):  # the last exit events can trail the sandbox's state by moments
        if len(exited(sb_id, seen, ids, events)) == len(ids):
            break
        time.sleep(0.1)
    r["app_exit"], _, app_fin = seen.get(APP_NAME.get(arr, "app"), (None, None, None))
    r["sidecar_exit"], r["sidecar_reason"], side_fin = seen.get(SIDECAR_NAME[arr], (None, None, None))
    for what, fin in (("app", app_fin), ("sidecar", side_fin)):
        if fin is not None:
            r["ms"][f"deleted->{what} exited"] = (fin - t_del) / 1e6
    r["termination_message"] = term.text()
    return t_del


def check(r, arr, scenario, s, drv, port, name, files, kib):
    """The checks every scenario shares (see the module docstring); appends to r["errors"]."""
    if drv is not None and not drv.handed.is_set():
        r["errors"].append("the sidecar mounter never took the FUSE fd")
    msg = r["termination_message"]
    summary = {}
    if arr == "floor":
        # No bucket: the workload's exit and its stamps are all there is to check.
        if r["app_exit"] != 0 or "job.exit" not in s:
            r["errors"].append(f"the workload's exit code {r['app_exit']}, job.exit stamp {'job.exit' in s}")
        r["objects"] = None
        return
    if arr != "stock":
        with contextlib.suppress(ValueError):
            summary = json.loads(msg)
        r["outcome"] = summary.get("outcome")
        # drainfs's own time from its trigger (the SIGTERM it got) to its exit, from its summary.
        took = (summary.get("timings") or {}).get("exit_ms")
        if isinstance(took, (int, float)) and not isinstance(took, bool):
            r["ms"]["drainfs: trigger->exit"] = took
    closed = s.get("closed", files if "job.exit" in s else None)
    if closed is None and scenario == "stalled":
        # SIGKILLed in a close() (stock, relay): every file before the last it began was closed.
        closed = s.get("opening")
    r["closed"] = closed
    got = {k: v for k, v in rt.objects(BEHIND.get(port, port)).items() if k.startswith(name + "/")}
    got.pop(name + "/", None)  # the directory's own object, if gcsfuse made one
    want = {f"{name}/part-{j}.bin": content(j, kib) for j in range(closed or 0)}
    r["objects"] = len(got)
    intact = closed is not None and all(got.get(k) == v for k, v in want.items())
    if scenario == "grace":
        # SIGKILLed inside its close(): the file is whole in the bucket (the upload ended before
        # gcsfuse did) or absent; never half there, and never absent once close() returned 0.
        key = f"{name}/part-0.bin"
        r["upload"] = ("complete" if got.get(key) == content(0, kib) else "absent" if key not in got
                       else f"WRONG ({len(got[key])} bytes)")
        if r["upload"].startswith("WRONG"):
            r["errors"].append(f"bucket: {key} is neither whole nor absent: {r['upload']}")
        if (closed or 0) >= 1 and r["upload"] != "complete":
            r["errors"].append(f"bucket: the workload's close() returned 0 and {key} is {r['upload']}")
        if arr == "handoff" and r["upload"] != "complete" and (
                summary.get("data_path") != "handoff" or r["outcome"] in ("idle", None)):
            r["errors"].append(f"the hand-off ended with the upload cut and outcome {r['outcome']!r} "
                               f"(idle would say nothing was cut): {msg[:300]!r}")
    elif scenario != "stalled":
        if r["app_exit"] != 0:
            r["errors"].append(f"the workload's exit code {r['app_exit']}")
        if "job.exit" not in s:
            r["errors"].append("no job.exit stamp")
        if arr == "handoff" and (summary.get("data_path") != "handoff" or r["outcome"] != "idle"
                                 or summary.get("exit_code") != 0):
            r["errors"].append(f"termination message is not the hand-off's idle summary: {msg[:200]!r}")
        elif arr not in ("stock", "handoff") and (r["outcome"] != "clean" or summary.get("exit_code") != 0):
            r["errors"].append(f"termination message is not a clean drainfs summary: {msg[:200]!r}")
        if arr in ("self-managed", "airflow") and r["sidecar_exit"] != 0:
            r["errors"].append(f"drainfs's exit code {r['sidecar_exit']}")
        if not intact or set(got) - set(want):
            r["errors"].append(f"bucket: {len(got)} objects, {closed} closed by the workload; wrong or"
                               f" missing: {sorted(k for k in want if got.get(k) != want[k])[:5]}")
    if scenario == "grace" and "job.term" not in s:
        r["errors"].append("the deletion did not reach the workload (no job.term stamp)")
    if scenario == "delete" and ("job.term" not in s or not 0 < (closed or 0) < files):
        r["errors"].append(f"the deletion did not land while the workload wrote ({closed} of {files} closed)")
    if scenario == "stalled":
        # What the workload had closed before the stall was uploaded by its close(); the file
        # open at the stall cannot be, so drainfs must say so, before the grace period ends.
        if closed is not None and not intact:
            r["errors"].append(f"bucket: a file closed before the stall is missing or wrong ({closed} closed)")
        if arr == "self-managed" and closed is not None and not any(
                p.endswith(f"{name}/part-{closed}.bin") for p in summary.get("open_paths", [])):
            r["errors"].append(f"drainfs's summary does not name the file open at the stall (part-{closed}.bin)")
        # The file open at the stall: the one after those closed.
        stuck = closed
        if arr == "relay" and (stuck is None or summary.get("outcome") not in ("stopping", "incomplete")
                               or not any(p.endswith(f"{name}/part-{stuck}.bin")
                                          for p in summary.get("open_paths", []))):
            r["errors"].append(f"the relay's termination message does not say its stop was unfinished"
                               f" and name the file open at the stall (part-{stuck}.bin): {msg[:300]!r}")
        # The hand-off cannot name files (it sees no request); what it must not do is call a stop
        # with an upload stuck in gcsfuse idle, the outcome that says nothing was cut.
        if arr == "handoff" and (summary.get("data_path") != "handoff" or r["outcome"] == "idle"):
            r["errors"].append(f"the hand-off called the stop idle with part-{stuck}.bin stuck in gcsfuse: {msg[:300]!r}")
        took = r["ms"].get("deleted->sidecar exited")
        if arr == "self-managed" and (r["sidecar_exit"] != 75 or r.get("outcome") != "incomplete"
                                      or took is None or took >= GRACE_STALLED * 1000):
            r["errors"].append(f"drainfs did not exit 75 with outcome incomplete within the grace period"
                               f" (exit {r['sidecar_exit']}, outcome {r.get('outcome')}, after {took} ms)")
    # Every scenario: a drainfs that reports `clean` lost nothing the workload closed, and its
    # exit code says the same as its summary.
    # (In grace the workload is SIGKILLed inside its close(): what it closed is the upload.)
    if r.get("outcome") == "clean" and not (r.get("upload") == "complete" if scenario == "grace" else intact):
        r["errors"].append("drainfs reported clean, but a file the workload closed is missing or wrong")
    if summary and arr in ("self-managed", "airflow") and (r["sidecar_exit"] == 0) != (r["outcome"] == "clean"):
        r["errors"].append(f"drainfs exited {r['sidecar_exit']} with outcome {r['outcome']}")


def run_pod(arr, i, port, a, scenario):
    name = f"{arr}-{scenario}-{os.getpid()}-{i}"
    full = f"{name}-{NODE}"
    base = os.path.join(WORK, "drainfs-pods", name)
    stamps = os.path.join(base, "stamps")
    os.makedirs(stamps)
    os.chmod(stamps, 0o777)
    # Every field a line of the report reads, also for a pod that never started.
    r = {"arrangement": arr, "scenario": scenario, "pod": full, "errors": [], "ms": {}, "phases": [],
         "app_exit": None, "sidecar_exit": None, "sidecar_reason": None, "termination_message": "",
         "closed": None, "objects": None}
    manifest = os.path.join(WORK, "manifests", f"{name}.yaml")
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, base, True)
        server = None
        if scenario == "stalled":
            # Its own server, stopped and resumed by observe_deletion.
            os.makedirs(os.path.join(base, "fake-gcs"))
            port = rt.fake_gcs(stack, os.path.join(base, "fake-gcs"))
            server = rt.FAKE_SERVERS[port]
        flags = ["-pace-ms", str(a.pace_ms)] if scenario in ("delete", "stalled") else []
        if scenario == "job" and a.exit_spread_ms:
            # Pod i of N exits i/N of the spread after its last close: the kubelet notices an
            # exit at its next relist (every 1 s), so a workload whose exit keeps one phase
            # against that tick (the same files, the same time) would give every pod of an
            # arrangement the same wait, and arrangements different ones.
            flags += ["-linger-ms", str(i * a.exit_spread_ms // a.pods)]
        drv = None
        if arr == "floor":
            spec = floor_pod(name, stamps, a.files, a.kib, flags)
        elif arr in ("self-managed", "airflow"):
            spec = self_managed_pod(arr, name, port, stamps, a.files, a.kib, scenario, flags)
        else:
            spec, drv = gke_pod(arr, name, port, stack, base, stamps, a.files, a.kib, scenario, flags,
                                a.handoff_option)
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
        stop = threading.Event()
        stack.callback(stop.set)
        events = TaskExits(stack)
        term = TermLog(stack, full, SIDECAR_NAME[arr]) if scenario in ("delete", "stalled", "grace") else None
        os.rename(tmp, manifest)
        if drv is not None and scenario == "legacy":
            drv.put_exit_file(full, stop)
        if scenario in ("job", "legacy"):
            t_end = observe_completion(r, full, arr)
        else:
            t_end = observe_deletion(r, full, arr, stamps, manifest, server, a.pace_ms,
                                     spec["terminationGracePeriodSeconds"], term, events)
        s = read_stamps(stamps)
        if scenario in ("job", "legacy") and t_end is not None and "job.exit" in s:
            ex = s["job.exit"]
            r["ms"]["exit->Succeeded"] = (t_end - ex) / 1e6
            sb = jp.sandbox(full)
            fin = exited(sb["id"], {}, {}, events).get(SIDECAR_NAME[arr], (None,) * 3)[2] if sb and SIDECAR_NAME[arr] else None
            if fin is not None:
                r["ms"]["exit->sidecar exited"] = (fin - ex) / 1e6
            if drv is not None and drv.exit_file_ns:
                r["ms"]["exit->exit file"] = (drv.exit_file_ns - ex) / 1e6
        r["closed"] = s.get("closed")
        if scenario == "grace" and t_end is not None and "job.closing" in s:
            r["ms"]["closing->deleted"] = (t_end - s["job.closing"]) / 1e6
        check(r, arr, scenario, s, drv, port, name, a.files, a.kib)
    return r


def pct(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, max(0, round(q / 100 * len(v) + 0.5) - 1))]


def table(results, arrs, scenario):
    """The side-by-side table of one scenario; returns how many pods failed."""
    rs_all = [r for r in results if r["scenario"] == scenario]
    arrs = [x for x in arrs if any(r["arrangement"] == x for r in rs_all)]
    keys = list(dict.fromkeys(k for r in rs_all for k in r["ms"]))
    print(f"\n{scenario}:\n")
    # The floor's exit->Succeeded p50: what the kubelet itself takes, without a sidecar.
    floor = [r["ms"]["exit->Succeeded"] for r in rs_all
             if r["arrangement"] == "floor" and "exit->Succeeded" in r["ms"]]
    over = f" | exit->Succeeded p50 over the floor's {pct(floor, 50):.0f} (ms)" if floor else ""
    print("| arrangement | pods passed | " + " | ".join(f"{k} p50 / p95 (ms)" for k in keys)
          + over + " | sidecar exit codes | outcomes | objects intact |")
    print("| --- " * (len(keys) + 5 + bool(floor)) + "|")
    bad = 0
    for arr in arrs:
        rs = [r for r in rs_all if r["arrangement"] == arr]
        ok = [r for r in rs if not r["errors"]]
        bad += len(rs) - len(ok)
        col = []
        for key in keys:
            v = [r["ms"][key] for r in rs if key in r["ms"]]
            col.append(f"{pct(v, 50):.0f} / {pct(v, 95):.0f}" if v else "-")
        if floor:
            v = [r["ms"]["exit->Succeeded"] for r in rs if "exit->Succeeded" in r["ms"]]
            col.append(f"{pct(v, 50) - pct(floor, 50):+.0f}" if v else "-")
        codes = ", ".join(sorted({str(r["sidecar_exit"]) for r in rs}))
        outcomes = ", ".join(sorted({str(r.get("outcome", "-")) for r in rs}))
        intact = ("no bucket" if arr == "floor" else
                  f"{sum(1 for r in rs if not any(e.startswith('bucket') for e in r['errors']))} of {len(rs)}")
        if scenario == "grace":
            ups = {}
            for r in rs:
                ups[r.get("upload")] = ups.get(r.get("upload"), 0) + 1
            intact += " (uploads: " + ", ".join(f"{v} {k}" for k, v in sorted(ups.items(), key=str)) + ")"
        print(f"| {arr} | {len(ok)} of {len(rs)} | " + " | ".join(col)
              + f" | {codes} | {outcomes} | {intact} |")
    return bad


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arrangements", default="stock,relay,handoff,self-managed,floor")
    ap.add_argument("--scenarios", default="job")
    ap.add_argument("--pods", type=int, default=10)
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--kib", type=int, default=1024)
    ap.add_argument("--pace-ms", type=int, default=2000)
    ap.add_argument("--latency-ms", type=int, default=0,
                    help="the bucket's round trip added by toxiproxy (job, legacy, delete; default 0: none)")
    ap.add_argument("--bandwidth-mibps", type=float, default=0,
                    help="each connection to the bucket capped at this many MiB/s each way by toxiproxy "
                         "(default 0: no cap; the grace scenario needs one)")
    ap.add_argument("--grace-s", type=int, default=GRACE_CLOSE[0],
                    help=f"the grace scenario's terminationGracePeriodSeconds (default {GRACE_CLOSE[0]})")
    ap.add_argument("--exit-spread-ms", type=int, default=0,
                    help="job: pod i of N lingers i*MS/N ms between its last close and its exit, so that the "
                         "exits fall at every phase of the kubelet's 1 s relist (default 0: none)")
    ap.add_argument("--handoff-option", action="append", default=[],
                    help="a mount option for the hand-off's volume, e.g. drainfs-idle-window=1s (repeatable)")
    a = ap.parse_args()
    arrs, scens = a.arrangements.split(","), a.scenarios.split(",")
    if (any(x not in IMAGES for x in arrs) or any(x not in SCENARIOS for x in scens)
            or a.pods < 1 or a.files < 1 or a.kib < 1 or a.pace_ms < 0 or a.exit_spread_ms < 0):
        ap.error(f"arrangements: {', '.join(IMAGES)}; scenarios: {', '.join(SCENARIOS)}; counts positive")
    if any(x in ("delete", "stalled") for x in scens) and (a.files < 3 or a.pace_ms < 400):
        ap.error("delete and stalled need --files 3 or more and --pace-ms 400 or more (the deletion lands in the second file)")
    if "grace" in scens and (a.bandwidth_mibps <= 0 or a.grace_s < 1
                             or any(x not in GKE_ARRANGEMENTS for x in arrs)):
        ap.error("grace runs the GKE arrangements (stock, relay, handoff) and needs --bandwidth-mibps "
                 "(a cap that keeps the close() going past the grace period) and --grace-s of 1 or more")
    GRACE_CLOSE[0] = a.grace_s
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
        port = (latency_backend(stack, fake, a.latency_ms, a.bandwidth_mibps) if a.latency_ms or a.bandwidth_mibps
                else rt.fake_gcs(stack, fake))
        # Interleaved: one pod of each arrangement in turn.
        for scenario in scens:
            for i in range(a.pods):
                # The Airflow template is a regular-sidecar pod: it runs in `legacy` only.
                # The floor is the Job without a sidecar: it runs in `job` only.
                for arr in (x for x in arrs if (x != "airflow" or scenario == "legacy")
                            and (x != "floor" or scenario == "job")):
                    r = run_pod(arr, i, port, a, scenario)
                    results.append(r)
                    print(f"{r['pod']}: phases {r['phases']}, app exit {r['app_exit']}, sidecar exit "
                          f"{r['sidecar_exit']} ({r['sidecar_reason']}), outcome {r.get('outcome')}, "
                          f"{r['closed']} closed, {r['objects']} objects, "
                          + ", ".join(f"{k} {v:.0f} ms" for k, v in r["ms"].items())
                          + (f"; ERRORS {r['errors']}" if r["errors"] else ""), flush=True)
    os.makedirs(os.path.join(WORK, "results"), exist_ok=True)
    with open(os.path.join(WORK, "results", "drainfs-pods.json"), "w") as f:
        json.dump(results, f, indent=1)
    bad = sum(table(results, arrs, scenario) for scenario in scens)
    for r in results:
        if r["errors"]:
            print(f"FAILED {r['pod']}: {r['errors']}; termination message {r['termination_message'][:600]!r}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
