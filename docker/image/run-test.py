#!/usr/bin/env python3
"""Runs the images docker/image/build.sh built in runc, in the pod's shape, against the real
peers and a fake-gcs-server on loopback, and checks the outcome where Kubernetes shows it.

Usage (root): docker/image/run-test.py [relay] [relay-held] [sidecar] [gke-overlay] [gke-overlay-numa]
                                        [gke-overlay-arm64]                  (default: all)

relay   (target/images/oci:relay, GKE's layout): as GKE's webhook injects it, uid/gid 65534,
        no capabilities, no_new_privs, read-only root, no /dev/fuse; the emptyDirs
        /gcsfuse-tmp and /gcsfuse-buffer and the termination-log file as bind mounts;
        NATIVE_SIDECAR=TRUE. The node-driver stand-in (this script) opens /dev/fuse, mounts the
        volume's target with fd=N and hands the fd and the mount config to the sidecar mounter
        over <tmp>/.volumes/<vol>/socket, as csi_mounter.go does. The container's entrypoint is
        the real sidecar mounter v1.24.4, which execs /gcsfuse (drainfs) with /gcsfuse.real
        (gcsfuse v3.11.2) behind it.
sidecar (target/images/oci:sidecar): the drainfs container of docker/k8s/job-native-sidecar.yaml
        with the manifest's own command and environment (only gcsfuse's bucket and endpoint
        flags are the fake server's): uid 0, privileged (every capability, /dev/fuse), read-only
        root, /data bind-mounted rshared (Bidirectional) from a shared mount on the host,
        /gcs-lower, /run/drainfs, /tmp and /dev/termination-log bind-mounted.

gke-overlay (target/images/oci:gke-overlay): the managed path's image, GKE's sidecar image plus
        drainfs (here on the stand-in for GKE's image, built as docker/Dockerfile's gke-overlay
        stage builds it), run as the relay image is: the entrypoint is the base's sidecar
        mounter, which execs /gcsfuse (drainfs), which runs /gcsfuse.real (the base's gcsfuse).
        Checks only what does not depend on the drop-in's mode: the process tree, exit 0 before
        the sidecar mounter's SIGKILL, an empty error file, drainfs's summary (exit 0) and every
        object, the workload's files all closed before the SIGTERM.
gke-overlay-numa: the same with the node driver's `gcs-fuse-numa-node=0` option and the
        webhook's NUMA-pinning security context (CAP_SYS_NICE added, seccomp unconfined): the
        sidecar mounter runs `numactl --cpunodebind=0 --membind=0 /gcsfuse ...` with the image's
        numactl; drainfs and gcsfuse must run bound to node 0 (every mapping's policy `bind:0` in
        /proc/PID/numa_maps, node 0's CPUs), the sidecar mounter itself unbound (the plain
        gke-overlay run checks that nothing is bound without the option).

gke-overlay-arm64: the gke-overlay run on the arm64 image (target/images/oci:gke-overlay-arm64:
        the arm64 stand-in, the arm64 drainfs, gcsfuse and sidecar mounter) under qemu's user-mode
        emulation (Debian's qemu-user-static 7.2, registered with binfmt_misc for aarch64 ELF
        files, with the F flag, so that runc's exec inside the container finds it: this script
        mounts binfmt_misc and registers Debian's /usr/lib/binfmt.d/qemu-aarch64.conf when they are
        missing, and leaves them registered). The node driver (this script) and the kernel's
        FUSE are the host's; the sidecar mounter, drainfs and gcsfuse run as arm64 code, checked
        by their /proc/PID/exe (the emulator). Same checks as gke-overlay, the stop bounded as
        there (before the sidecar mounter's SIGKILL at 5 s) by drainfs's own summary (exit_ms),
        the SIGTERM sent 2.5 s after the last write (under the emulator drainfs widens its idle
        window to 2 s: no sock_diag). The container's own exit is printed, not checked: beside a
        loaded machine the emulated drainfs, ending itself by SIGTERM, sometimes lingered until
        the sidecar mounter's SIGKILL at 5 s (in the one such run whose summary was looked at,
        the summary was written early in the stop; no record of those runs was kept).

relay-held: the relay image again, with a file that stays open for writing past the stop: the
        container still exits 0 (the sidecar mounter's status), drainfs forces its stop before
        the sidecar mounter's SIGKILL, and the termination message says exit 75, incomplete,
        forced at the deadline, and names the file.

Each run: a workload on the host writes files through the volume (one of them still open and
being written when the container gets its SIGTERM), `runc kill ... TERM` as the kubelet sends
it, then the checks: the container's exit code, the time from SIGTERM to exit (the relay must
beat the sidecar mounter's SIGKILL at 5 s), the JSON summary in the termination-log file
(exit_code 0, outcome clean), a new open after the SIGTERM refused, and every object in the
bucket read back from the server, byte for byte. The network namespace is the host's: the
fake server on 127.0.0.1 stands in for storage.googleapis.com (in a pod it would be reached
through the pod's own network namespace). Containers, mounts, the fake server and the
temporary directories are removed on every exit path. Exit 0 when every check passed.
DRAINFS_IMAGE_DRAINFS=PATH runs another drainfs binary in the images' place;
DRAINFS_IMAGE_TEST_KEEP=1 keeps the work directory (logs) for a look afterwards.
"""

import contextlib
import errno
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
IMAGES = os.path.join(REPO, "target", "images")
LOWERS = os.path.join(os.environ.get("DRAINFS_LOWERS_ROOT", "/opt/drainfs-lowers"), "bin")
BUCKET = "drainfs-image-test"
ALL_CAPS = [
    "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH", "CAP_FOWNER", "CAP_FSETID",
    "CAP_KILL", "CAP_SETGID", "CAP_SETUID", "CAP_SETPCAP", "CAP_LINUX_IMMUTABLE",
    "CAP_NET_BIND_SERVICE", "CAP_NET_BROADCAST", "CAP_NET_ADMIN", "CAP_NET_RAW",
    "CAP_IPC_LOCK", "CAP_IPC_OWNER", "CAP_SYS_MODULE", "CAP_SYS_RAWIO", "CAP_SYS_CHROOT",
    "CAP_SYS_PTRACE", "CAP_SYS_PACCT", "CAP_SYS_ADMIN", "CAP_SYS_BOOT", "CAP_SYS_NICE",
    "CAP_SYS_RESOURCE", "CAP_SYS_TIME", "CAP_SYS_TTY_CONFIG", "CAP_MKNOD", "CAP_LEASE",
    "CAP_AUDIT_WRITE", "CAP_AUDIT_CONTROL", "CAP_SETFCAP", "CAP_MAC_OVERRIDE",
    "CAP_MAC_ADMIN", "CAP_SYSLOG", "CAP_WAKE_ALARM", "CAP_BLOCK_SUSPEND", "CAP_AUDIT_READ",
    "CAP_PERFMON", "CAP_BPF", "CAP_CHECKPOINT_RESTORE",
]

failures = []


def privileged_caps():
    """What `privileged: true` gives: every capability the runtime itself holds (its bounding
    set; ALL_CAPS is in bit order)."""
    with open("/proc/self/status") as f:
        bnd = int(next(l for l in f if l.startswith("CapBnd:")).split()[1], 16)
    return [c for i, c in enumerate(ALL_CAPS) if bnd >> i & 1]


def check(ok, what):
    print(f"  [{'ok' if ok else 'FAIL'}] {what}", flush=True)
    if not ok:
        failures.append(what)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# port -> the fake-gcs-server process fake_gcs started (scripts/k8s-node/drainfs-pods.py stops
# and resumes one).
FAKE_SERVERS = {}


def fake_gcs(stack, workdir, public_port=None):
    """fake-gcs-server on a free loopback port, with the test bucket; returns the port. With
    `public_port` (a proxy in front of it), the URLs it hands out (an upload's Location) name
    that port instead of its own."""
    port = free_port()
    public = public_port or port
    log = open(os.path.join(workdir, "fake-gcs.log"), "wb")
    p = subprocess.Popen(
        [os.path.join(LOWERS, "fake-gcs-server"), "-scheme", "http", "-backend", "memory",
         "-host", "127.0.0.1", "-port", str(port), "-public-host", f"localhost:{public}",
         "-external-url", f"http://localhost:{public}", "-log-level", "warn"],
        stdout=log, stderr=subprocess.STDOUT)
    FAKE_SERVERS[port] = p

    def stop():
        p.kill()
        p.wait()
    stack.callback(stop)
    base = f"http://127.0.0.1:{port}/storage/v1"
    wait_http(f"{base}/b?project=test")
    post_json(f"{base}/b?project=test", {"name": BUCKET})
    return port


def wait_http(url, tries=200):
    """Polls `url` every 50 ms until it answers (at most `tries` times)."""
    for _ in range(tries):
        try:
            urllib.request.urlopen(url, timeout=1).read()
            return
        except OSError:
            time.sleep(0.05)


def post_json(url, body):
    """POSTs `body` as JSON to `url`; returns the answer's bytes."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    return urllib.request.urlopen(req, timeout=5).read()


def objects(port):
    """Every object of the bucket: name -> bytes, read back from the server."""
    out, token = {}, None
    while True:
        url = f"http://127.0.0.1:{port}/storage/v1/b/{BUCKET}/o?maxResults=1000"
        if token:
            url += f"&pageToken={token}"
        listing = json.load(urllib.request.urlopen(url, timeout=10))
        for item in listing.get("items", []):
            name = item["name"]
            q = urllib.parse.quote(name, safe="")
            out[name] = urllib.request.urlopen(
                f"http://127.0.0.1:{port}/download/storage/v1/b/{BUCKET}/o/{q}?alt=media",
                timeout=30).read()
        token = listing.get("nextPageToken")
        if not token:
            return out


def unpack(stack, tag, workdir):
    bundle = os.path.join(workdir, f"bundle-{tag}")
    subprocess.run(["umoci", "unpack", "--image", f"{IMAGES}/oci:{tag}", bundle], check=True,
                   stdout=subprocess.DEVNULL)
    stack.callback(shutil.rmtree, bundle, True)
    # DRAINFS_IMAGE_DRAINFS: another drainfs binary in the image's place (to run these checks
    # against an older build).
    other = os.environ.get("DRAINFS_IMAGE_DRAINFS")
    if other:
        dest = {"relay": "gcsfuse", "gke-overlay": "gcsfuse", "sidecar": "usr/local/bin/drainfs"}.get(tag)
        if dest is None:
            raise SystemExit(f"run-test.py: DRAINFS_IMAGE_DRAINFS does not apply to {tag}")
        shutil.copy(other, os.path.join(bundle, "rootfs", dest))
    with open(os.path.join(bundle, "config.json")) as f:
        return bundle, json.load(f)


def kubelet_files(workdir):
    """The files the kubelet bind-mounts into every container: /etc/hosts (localhost, which
    the static Go gcsfuse resolves itself: without it `localhost` goes to DNS) and
    /etc/resolv.conf."""
    hosts = os.path.join(workdir, "etc-hosts")
    with open(hosts, "w") as f:
        f.write("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n")
    resolv = os.path.join(workdir, "etc-resolv.conf")
    with open(resolv, "w") as f:
        f.write("nameserver 127.0.0.1\noptions ndots:5\n")
    return [bind("/etc/hosts", hosts, "ro"), bind("/etc/resolv.conf", resolv, "ro")]


def bind(dest, src, *opts):
    return {"destination": dest, "type": "bind", "source": src, "options": ["rbind", *opts]}


def pod_spec(spec, *, user, caps, no_new_privs, fuse_device, mounts, env, args):
    p = spec["process"]
    p["terminal"] = False
    p["user"] = {"uid": user, "gid": user, "additionalGids": []}
    p["capabilities"] = {k: list(caps) for k in ("bounding", "effective", "permitted")}
    p["noNewPrivileges"] = no_new_privs
    # The image's environment (a container runtime merges it under the container's: the relay
    # image's DRAINFS_ADMIN_ADDR reaches drainfs this way, the webhook discards the pod's env;
    # GKE's image sets PATH, SSL_CERT_FILE and LIB_DIR*), without the TERM and HOME umoci adds,
    # then the container's, which wins.
    given = {e.split("=", 1)[0] for e in env}
    p["env"] = [e for e in p.get("env", [])
                if e.split("=", 1)[0] not in given | {"TERM", "HOME"}] + env
    p["args"] = args
    p["cwd"] = "/"
    spec["root"]["readonly"] = True
    linux = spec.setdefault("linux", {})
    # The host's network namespace: the fake server listens on its loopback.
    linux["namespaces"] = [n for n in linux.get("namespaces", []) if n["type"] != "network"]
    linux.pop("uidMappings", None)
    linux.pop("gidMappings", None)
    devices = linux.setdefault("resources", {}).setdefault("devices", [])
    devices[:] = [{"allow": False, "access": "rwm"}]
    if fuse_device:
        linux.setdefault("devices", []).append(
            {"path": "/dev/fuse", "type": "c", "major": 10, "minor": 229, "fileMode": 0o666,
             "uid": 0, "gid": 0})
        devices.append({"allow": True, "type": "c", "major": 10, "minor": 229, "access": "rwm"})
    for std in ((1, 3), (1, 5), (1, 7), (1, 8), (1, 9), (5, 0), (5, 2), (136, None)):
        devices.append({"allow": True, "type": "c", "major": std[0],
                        **({"minor": std[1]} if std[1] is not None else {}), "access": "rwm"})
    spec["mounts"] = [m for m in spec["mounts"] if m["destination"] not in {x["destination"] for x in mounts}]
    spec["mounts"] += mounts
    return spec


class Container:
    """`runc run` of a bundle in the foreground of a child process; killed and deleted on exit."""

    def __init__(self, stack, bundle, spec, name, workdir):
        with open(os.path.join(bundle, "config.json"), "w") as f:
            json.dump(spec, f, indent=1)
        self.name, self.root = name, os.path.join(workdir, "runc-state")
        self.log = os.path.join(workdir, f"{name}.log")
        self.proc = subprocess.Popen(
            ["runc", "--root", self.root, "run", "--bundle", bundle, name],
            stdin=subprocess.DEVNULL, stdout=open(self.log, "wb"), stderr=subprocess.STDOUT)
        stack.callback(self.destroy)

    def kill(self, sig="TERM"):
        subprocess.run(["runc", "--root", self.root, "kill", self.name, sig], check=False,
                       stderr=subprocess.DEVNULL)

    def wait(self, timeout):
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def destroy(self):
        if self.proc.poll() is None:
            self.kill("KILL")
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=10)
        subprocess.run(["runc", "--root", self.root, "delete", "--force", self.name],
                       check=False, stderr=subprocess.DEVNULL)

    def tail(self, n=40):
        with open(self.log, "rb") as f:
            return "\n".join(f.read().decode(errors="replace").splitlines()[-n:])


def wait_statfs(path, timeout):
    """Whether statfs(path) answers within timeout, in a child (it blocks until INIT)."""
    try:
        r = subprocess.run(["stat", "-f", "-c", "%T", path], timeout=timeout, capture_output=True)
        return r.returncode == 0
    except subprocess.TimeoutExpired:
        return False


def is_mount(path):
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == path for line in f)


def umount(path):
    for _ in range(8):
        if not is_mount(path):
            return
        subprocess.run(["umount", "-l", path], check=False, stderr=subprocess.DEVNULL)


def workload(vol, open_during_term, term):
    """Writes files through the mounted volume `vol`; returns name -> bytes. One file is open
    and half written when `term()` is called, and is finished and closed after it; then a new
    open must be refused."""
    # gcsfuse stores a directory made with mkdir as an empty object named `results/`.
    files = {"results/": b""}
    os.makedirs(os.path.join(vol, "results"), exist_ok=True)
    for i in range(5):
        data = os.urandom(256 * 1024 * (i + 1))
        with open(os.path.join(vol, "results", f"part-{i}.bin"), "wb") as f:
            f.write(data)
        files[f"results/part-{i}.bin"] = data
    late = os.urandom(8 * 1024 * 1024)
    f = open(os.path.join(vol, open_during_term), "wb")
    f.write(late[: len(late) // 2])
    term()
    time.sleep(0.2)
    f.write(late[len(late) // 2:])
    f.close()  # the upload happens here; it must succeed after the SIGTERM
    files[open_during_term] = late
    try:
        open(os.path.join(vol, "after-sigterm.txt"), "wb").close()
        refused = False
    except OSError as e:
        refused = e.errno in (errno.ESHUTDOWN, errno.ENOTCONN, errno.EIO, errno.ENOENT, errno.EACCES)
    return files, refused


def schema_errors(doc):
    """Where `doc` breaks the published summary schema of its data path (the hand-off's own,
    docker/monitoring/handoff-summary.schema.json, for `data_path` "handoff"; jsonschema: in
    the manifest linters' virtualenv, which docker/check.sh installs)."""
    import jsonschema
    name = "handoff-summary.schema.json" if doc.get("data_path") == "handoff" else "summary.schema.json"
    with open(os.path.join(REPO, "docker", "monitoring", name)) as f:
        schema = json.load(f)
    v = jsonschema.Draft202012Validator(schema)
    return [f"{'/'.join(map(str, e.path))}: {e.message}" for e in v.iter_errors(doc)]


def check_outcome(name, c, t_term, code, term_log, port, files, refused, within):
    elapsed = time.monotonic() - t_term
    check(code is not None, f"{name}: the container exited ({c.name})")
    if code is None:
        print(c.tail())
        return
    print(f"  {name}: container exit {code} {elapsed:.2f} s after SIGTERM")
    check(code == 0, f"{name}: container exit code 0 (got {code})")
    check(elapsed < within, f"{name}: exited within {within} s of the SIGTERM ({elapsed:.2f} s)")
    check(refused, f"{name}: a new open after the SIGTERM was refused")
    with open(term_log) as f:
        text = f.read()
    try:
        summary = json.loads(text)
    except ValueError:
        summary = {}
    check(summary.get("exit_code") == 0 and summary.get("outcome") == "clean",
          f"{name}: termination message is a clean drainfs summary ({text[:200]!r})")
    check(schema_errors(summary) == [], f"{name}: the summary matches docker/monitoring/summary.schema.json {schema_errors(summary)}")
    got = objects(port)
    check(sorted(got) == sorted(files), f"{name}: the bucket holds exactly the files written ({sorted(got)})")
    for k, v in files.items():
        check(got.get(k) == v, f"{name}: object {k} ({len(v)} bytes) intact")
    if failures:
        print(c.tail())


def start_managed(stack, workdir, name, tag, *, caps=(), options=()):
    """The managed sidecar as GKE runs it: the image `tag` as the webhook injects it (uid/gid
    65534, `caps` only, no_new_privs, read-only root, no /dev/fuse, the emptyDirs and the
    termination log bind-mounted, NATIVE_SIDECAR=TRUE), with this script as the node driver
    (/dev/fuse opened and mounted at the target with fd=N, the fd and the volume's options handed
    over the volume's socket). Returns (fake server port, container, spec, target, termination
    log, error file), or None when the volume never answered."""
    port = fake_gcs(stack, workdir)
    vol = "vol-1"
    tmp_vol = os.path.join(workdir, "gcsfuse-tmp")
    buf_vol = os.path.join(workdir, "gcsfuse-buffer")
    target = os.path.join(workdir, "target")
    term_log = os.path.join(workdir, "termination-log")
    for d in (os.path.join(tmp_vol, ".volumes", vol), buf_vol, target):
        os.makedirs(d)
    for d in (tmp_vol, os.path.join(tmp_vol, ".volumes"), os.path.join(tmp_vol, ".volumes", vol), buf_vol):
        os.chown(d, 65534, 65534)
    open(term_log, "w").close()
    os.chmod(term_log, 0o666)
    # The node driver: /dev/fuse opened and mounted at the target with fd=N.
    fd = os.open("/dev/fuse", os.O_RDWR)
    fd_open = [True]

    def close_fd():
        if fd_open[0]:
            fd_open[0] = False
            os.close(fd)
    stack.callback(close_fd)
    opts = f"nodev,nosuid,allow_other,default_permissions,rootmode=40000,user_id=0,group_id=0,fd={fd}"
    subprocess.run(["mount", "-i", "-t", "fuse", "-o", opts, BUCKET, target], pass_fds=(fd,), check=True)
    stack.callback(umount, target)
    sock_path = os.path.join(tmp_vol, ".volumes", vol, "socket")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(sock_path)
    os.chmod(sock_path, 0o777)
    srv.listen(1)
    stack.callback(srv.close)
    msg = json.dumps({"bucketName": BUCKET, "volumeName": vol, "options": [
        f"custom-endpoint=http://localhost:{port}/storage/v1/", "anonymous-access",
        "enable-hns=false", "enable-atomic-rename-object=false", "disable-autoconfig",
        "implicit-dirs", "disable-metrics-for-gke:true", *options]}).encode()
    sent = threading.Event()

    def hand_over():
        srv.settimeout(60)
        try:
            conn, _ = srv.accept()
        except OSError:
            return
        socket.send_fds(conn, [msg], [fd])
        conn.close()
        # As the node driver does: the sidecar now holds the only copy, so the connection
        # ends when the sidecar's processes are gone.
        close_fd()
        sent.set()
    threading.Thread(target=hand_over, daemon=True).start()

    bundle, spec = unpack(stack, tag, workdir)
    spec = pod_spec(
        spec, user=65534, caps=list(caps), no_new_privs=True, fuse_device=False,
        env=["NATIVE_SIDECAR=TRUE"],
        # The webhook's arguments (sidecar_spec.go): klog verbosity only.
        args=["/gcs-fuse-csi-driver-sidecar-mounter", "--v=5"],
        mounts=[
            bind("/gcsfuse-tmp", tmp_vol, "rw"),
            bind("/gcsfuse-buffer", buf_vol, "rw"),
            bind("/dev/termination-log", term_log, "rw"),
            {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "nodev", "mode=1777"]},
            *kubelet_files(workdir),
        ])
    c = Container(stack, bundle, spec, f"drainfs-{tag}-{os.getpid()}", workdir)
    check(sent.wait(60), f"{name}: the sidecar mounter took the FUSE fd from the node driver's socket")
    ready = wait_statfs(target, 60)
    check(ready, f"{name}: the volume answers through drainfs and gcsfuse")
    if not ready:
        print(c.tail())
        return None
    return port, c, spec, target, term_log, os.path.join(tmp_vol, ".volumes", vol, "error")


def test_relay(stack, workdir, held=False):
    if held:
        print("==> relay image, a file still open for writing when the sidecar mounter's SIGKILL comes")
    else:
        print("==> relay image (GKE layout) under the real sidecar mounter, uid 65534, no capabilities")
    started = start_managed(stack, workdir, "relay", "relay")
    if started is None:
        return
    port, c, spec, target, term_log, error_file = started
    t = {}

    def term():
        t["t"] = time.monotonic()
        c.kill("TERM")
    admin_outcome(spec)
    if held:
        held_outcome(c, target, term, term_log, port)
        return
    files, refused = workload(target, "results/late.bin", term)
    code = c.wait(30)
    check_outcome("relay", c, t["t"], code, term_log, port, files, refused, within=5.0)
    print(f"  relay: the sidecar mounter's error file: {read_error_file(error_file)[-300:]!r}")


def read_error_file(path):
    """The volume's error file the sidecar mounter writes (gcsfuse's stderr and its exit), as the
    node driver reads it: '' when absent."""
    with contextlib.suppress(FileNotFoundError), open(path, "rb") as f:
        return f.read().decode(errors="replace").strip()
    return ""


def descendants(pid):
    """Every descendant of pid (from /proc/PID/task/TID/children)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        with contextlib.suppress(OSError):
            for tid in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{tid}/children") as f:
                    kids = [int(x) for x in f.read().split()]
                out += kids
                todo += kids
    return out


def same_file(pid, path):
    """Whether process pid runs the file at path: /proc/PID/exe leads to the same inode, or, for a
    program run by an emulator through binfmt_misc (whose /proc/PID/exe is the emulator), the
    program's file is mapped in the process (/proc/PID/maps: device major:minor and inode)."""
    try:
        a, b = os.stat(f"/proc/{pid}/exe"), os.stat(path)
    except OSError:
        return False
    if (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino):
        return True
    want = (f"{os.major(b.st_dev):02x}:{os.minor(b.st_dev):02x}", str(b.st_ino))
    try:
        with open(f"/proc/{pid}/maps") as f:
            return any(tuple(l.split()[3:5]) == want for l in f if len(l.split()) >= 6)
    except OSError:
        return False


def ensure_binfmt_aarch64():
    """binfmt_misc set up to run aarch64 programs with qemu (docker/image/binfmt-arm64.sh).
    Returns the emulator's path, or None (with the reason printed) when it cannot be set up."""
    r = subprocess.run(["bash", os.path.join(REPO, "docker", "image", "binfmt-arm64.sh")],
                       capture_output=True, text=True)
    if r.returncode != 0:
        print(f"  binfmt-arm64.sh: {r.stderr.strip()}")
        return None
    return r.stdout.strip()


def numa_state(pid):
    """(memory policies of pid's mappings, its allowed CPUs) from /proc/PID/numa_maps and status."""
    with open(f"/proc/{pid}/numa_maps") as f:
        policies = {line.split()[1] for line in f if len(line.split()) > 1}
    with open(f"/proc/{pid}/status") as f:
        cpus = next(line.split()[1] for line in f if line.startswith("Cpus_allowed_list:"))
    return policies, cpus


def cpulist(spec):
    """The CPUs of a cpulist string such as 0-1,4."""
    cpus = set()
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def overlay_processes(name, c, bundle):
    """The sidecar mounter (the container's init), drainfs (/gcsfuse) below it, and gcsfuse
    (/gcsfuse.real) below drainfs: their PIDs, or None."""
    st = json.loads(subprocess.run(["runc", "--root", c.root, "state", c.name], check=True,
                                   capture_output=True, text=True).stdout)
    init = st["pid"]
    rootfs = os.path.join(bundle, "rootfs")
    drainfs = [p for p in descendants(init) if same_file(p, os.path.join(rootfs, "gcsfuse"))]
    gcsfuse = [p for d in drainfs for p in descendants(d) if same_file(p, os.path.join(rootfs, "gcsfuse.real"))]
    check(same_file(init, os.path.join(rootfs, "gcs-fuse-csi-driver-sidecar-mounter")),
          f"{name}: the container's init is the image's sidecar mounter")
    check(len(drainfs) == 1 and len(gcsfuse) == 1,
          f"{name}: drainfs (/gcsfuse) runs under the sidecar mounter and gcsfuse (/gcsfuse.real) under drainfs"
          f" (drainfs {drainfs}, gcsfuse {gcsfuse})")
    if len(drainfs) == 1 and len(gcsfuse) == 1:
        return init, drainfs[0], gcsfuse[0]
    return None


def test_overlay(stack, workdir, numa_node=None, arch=None):
    """GKE's sidecar image plus drainfs (target/images/oci:gke-overlay: the stand-in for GKE's
    image with the Dockerfile's overlay layer) as GKE runs it, the workload's files all closed
    before the SIGTERM (as the kubelet sends it to a native sidecar once the workload exited).
    Keyed on what any drop-in mode gives: the processes, the container's exit and time, the
    error file, drainfs's summary and the bucket. With numa_node, the node driver's
    gcs-fuse-numa-node option and the webhook's NUMA-pinning security context (CAP_SYS_NICE
    added, seccomp unconfined, still uid 65534): the sidecar mounter's `numactl
    --cpunodebind=N --membind=N /gcsfuse ...` must start drainfs and gcsfuse bound to the node."""
    name = "gke-overlay" if numa_node is None else "gke-overlay-numa"
    tag = "gke-overlay"
    emulator = None
    if arch is not None:
        name = tag = f"gke-overlay-{arch}"
        emulator = ensure_binfmt_aarch64()
        check(emulator is not None, f"{name}: binfmt_misc runs aarch64 programs with qemu (docker/image/binfmt-arm64.sh)")
        if emulator is None:
            return
    print(f"==> {name}: GKE's sidecar image (stand-in) + drainfs under its sidecar mounter, uid 65534"
          + ("" if numa_node is None else f", gcs-fuse-numa-node={numa_node}")
          + ("" if emulator is None else f", arm64 code under {emulator}"))
    options = () if numa_node is None else (f"gcs-fuse-numa-node={numa_node}",)
    caps = () if numa_node is None else ("CAP_SYS_NICE",)
    started = start_managed(stack, workdir, name, tag, caps=caps, options=options)
    if started is None:
        return
    port, c, spec, target, term_log, error_file = started
    bundle = os.path.join(workdir, f"bundle-{tag}")
    procs = overlay_processes(name, c, bundle)
    if procs and emulator is not None:
        exes = {p: os.path.realpath(f"/proc/{p}/exe") for p in procs}
        check(all(os.path.basename(e).startswith("qemu-aarch64") for e in exes.values()),
              f"{name}: the sidecar mounter, drainfs and gcsfuse run as arm64 code under the emulator ({exes})")
    if procs and emulator is None:
        init, drainfs, gcsfuse = procs
        pol_init, _ = numa_state(init)
        pol_d, cpus_d = numa_state(drainfs)
        pol_g, cpus_g = numa_state(gcsfuse)
        print(f"  {name}: memory policies: sidecar mounter {sorted(pol_init)}, drainfs {sorted(pol_d)},"
              f" gcsfuse {sorted(pol_g)}; CPUs drainfs {cpus_d}, gcsfuse {cpus_g}")
        check(not any(p.startswith("bind") for p in pol_init),
              f"{name}: the sidecar mounter itself is not bound ({sorted(pol_init)})")
        if numa_node is None:
            check(not any(p.startswith("bind") for p in pol_d | pol_g),
                  f"{name}: without the option drainfs and gcsfuse run unbound")
        else:
            with open(f"/sys/devices/system/node/node{numa_node}/cpulist") as f:
                node_cpus = cpulist(f.read().strip())
            want = f"bind:{numa_node}"
            check(pol_d == {want} and pol_g == {want},
                  f"{name}: drainfs and gcsfuse run with numactl's --membind={numa_node} ({want} on every mapping)")
            check(cpulist(cpus_d) == node_cpus and cpulist(cpus_g) == node_cpus,
                  f"{name}: drainfs and gcsfuse run on node {numa_node}'s CPUs ({sorted(node_cpus)})")
    files = {"results/": b""}
    os.makedirs(os.path.join(target, "results"), exist_ok=True)
    for i in range(4):
        data = os.urandom(512 * 1024 * (i + 1))
        with open(os.path.join(target, "results", f"part-{i}.bin"), "wb") as f:
            f.write(data)
        files[f"results/part-{i}.bin"] = data
    if emulator is not None:
        # Under the emulator drainfs cannot see gcsfuse's connections and widens its idle
        # window to 2 s; as a kubelet's SIGTERM comes after the workload's exit, let that
        # window pass first, so that the stop measured is drainfs's, not the window.
        time.sleep(2.5)
    t0 = time.monotonic()
    c.kill("TERM")
    code = c.wait(30)
    elapsed = time.monotonic() - t0
    check(code is not None, f"{name}: the container exited")
    if code is None:
        print(c.tail())
        return
    print(f"  {name}: container exit {code} {elapsed:.2f} s after SIGTERM")
    check(code == 0, f"{name}: container exit code 0 (got {code})")
    # Stock gcsfuse on /dev/fd/N serves on after SIGTERM and is SIGKILLed by the sidecar
    # mounter at 5 s: an earlier exit is drainfs's stop.
    if emulator is None:
        check(elapsed < 4.5, f"{name}: exited before the sidecar mounter's SIGKILL at 5 s ({elapsed:.2f} s)")
    else:
        # Under qemu-user the emulated drainfs, ending itself by SIGTERM as the drop-in does
        # after an idle stop, sometimes lingers until the sidecar mounter's SIGKILL (seen in some
        # runs beside a loaded machine; in the one whose summary was looked at, exit_ms was well
        # under the bound; no record kept); the emulator,
        # not drainfs: the amd64 runs above end at once. The bound is drainfs's own (its
        # summary's exit_ms), checked with the summary below; the container's time is printed.
        print(f"  {name}: (under the emulator; the SIGTERM came 2.5 s after the last write)")
    err = read_error_file(error_file)
    check(err == "", f"{name}: the volume's error file is empty ({err[-300:]!r})")
    with open(term_log) as f:
        text = f.read()
    try:
        summary = json.loads(text)
    except ValueError:
        summary = {}
    check(summary.get("exit_code") == 0, f"{name}: the termination message is drainfs's summary, exit 0 ({text[:200]!r})")
    if name.startswith("gke-overlay"):
        # GKE's image sets no DRAINFS_DROPIN_MODE and the volume asks for no mode: the hand-off.
        check(summary.get("data_path") == "handoff" and summary.get("outcome") == "idle",
              f"{name}: the drop-in's default, the hand-off, stopped with gcsfuse idle ({text[:200]!r})")
    if emulator is not None:
        exit_ms = (summary.get("timings") or {}).get("exit_ms")
        check(isinstance(exit_ms, int) and exit_ms < 4500,
              f"{name}: drainfs ended its stop before the sidecar mounter's SIGKILL at 5 s (exit_ms {exit_ms})")
    check(schema_errors(summary) == [], f"{name}: the summary matches the schema {schema_errors(summary)}")
    got = objects(port)
    check(sorted(got) == sorted(files), f"{name}: the bucket holds exactly the files written ({sorted(got)})")
    for k, v in files.items():
        check(got.get(k) == v, f"{name}: object {k} ({len(v)} bytes) intact")
    if failures:
        print(c.tail())


def admin_outcome(spec):
    """The relay image's DRAINFS_ADMIN_ADDR reached drainfs through the sidecar mounter: its
    admin server answers (host network here, so on the host's loopback)."""
    addr = next((e.split("=", 1)[1] for e in spec["process"]["env"] if e.startswith("DRAINFS_ADMIN_ADDR=")), "")
    check(addr.endswith(":29090"), f"relay: the image sets DRAINFS_ADMIN_ADDR ({addr!r})")
    if not addr:
        return
    url = f"http://127.0.0.1:{addr.rsplit(':', 1)[1]}"
    try:
        ready = urllib.request.urlopen(f"{url}/readyz", timeout=5).status
        metrics = urllib.request.urlopen(f"{url}/metrics", timeout=5).read().decode()
    except OSError as e:
        ready, metrics = f"error {e}", ""
    check(ready == 200 and "drainfs_phase" in metrics,
          f"relay: the image's admin address answers /readyz ({ready}) and /metrics")


def held_outcome(c, target, term, term_log, port):
    """A writer that never closes: drainfs forces its stop before the sidecar mounter's SIGKILL
    (5 s), and the outcome (exit 75, the file named) must be in the termination message, since
    the container's exit code is the sidecar mounter's 0."""
    with open(os.path.join(target, "done.bin"), "wb") as f:
        f.write(b"uploaded before the stop\n")
    held = open(os.path.join(target, "held.bin"), "wb")
    held.write(os.urandom(1024 * 1024))
    held.flush()
    t0 = time.monotonic()
    term()
    code = c.wait(30)
    elapsed = time.monotonic() - t0
    with contextlib.suppress(OSError):
        held.close()  # the connection is gone: this close fails
    check(code == 0, f"relay-held: container exit code is the sidecar mounter's 0 (got {code})")
    with open(term_log) as f:
        text = f.read()
    try:
        summary = json.loads(text)
    except ValueError:
        summary = {}
    # A SIGKILLed drainfs writes no summary; its own clock says when it finished.
    exit_ms = (summary.get("timings") or {}).get("exit_ms")
    print(f"  relay-held: container exit {elapsed:.2f} s after SIGTERM, drainfs done at {exit_ms} ms")
    check(isinstance(exit_ms, int) and exit_ms < 5000,
          f"relay-held: drainfs finished before the sidecar mounter's SIGKILL at 5 s ({exit_ms} ms)")
    check(summary.get("exit_code") == 75 and summary.get("outcome") == "incomplete"
          and summary.get("forced") == "deadline",
          f"relay-held: termination message says incomplete, forced at the deadline ({text[:160]!r})")
    check(any(p.endswith("held.bin") for p in summary.get("open_paths", [])),
          f"relay-held: the summary names the file still open ({summary.get('open_paths')})")
    check(schema_errors(summary) == [], f"relay-held: the summary matches the schema {schema_errors(summary)}")
    got = objects(port)
    check(got.get("done.bin") == b"uploaded before the stop\n", "relay-held: the closed file is in the bucket")
    if failures:
        print(c.tail())


def manifest_sidecar():
    out = subprocess.run([sys.executable, os.path.join(REPO, "docker", "extract-drainfs-invocations.py"),
                          os.path.join(REPO, "docker", "k8s", "job-native-sidecar.yaml")],
                         check=True, capture_output=True, text=True).stdout
    runs = [e for e in json.loads(out) if e["subcommand"] == "run"]
    assert len(runs) == 1, runs
    return runs[0]


def test_sidecar(stack, workdir):
    print("==> self-managed sidecar image as in job-native-sidecar.yaml: uid 0, privileged, read-only root")
    port = fake_gcs(stack, workdir)
    inv = manifest_sidecar()
    argv = inv["argv"]
    dd = argv.index("--")
    lower_cmd = argv[dd + 1:]
    # The manifest's gcsfuse line, with the fake server's bucket and flags.
    gcsfuse = [lower_cmd[0], "--foreground", f"--custom-endpoint=http://localhost:{port}/storage/v1/",
               "--anonymous-access", "--enable-hns=false", "--enable-atomic-rename-object=false",
               "--disable-autoconfig", "--implicit-dirs", BUCKET, lower_cmd[-1]]
    args = ["/usr/local/bin/drainfs", *argv[1:dd], "--", *gcsfuse]
    env = [f"{k}={v}" for k, v in inv["env"].items() if k != "DRAINFS_ADMIN_ADDR"]
    data = os.path.join(workdir, "data")
    term_log = os.path.join(workdir, "termination-log")
    vols = {d: os.path.join(workdir, d.strip("/").replace("/", "-")) for d in ("/gcs-lower", "/run/drainfs", "/tmp")}
    for d in [data, *vols.values()]:
        os.makedirs(d)
    open(term_log, "w").close()
    # Bidirectional: a shared mount on the node, bind-mounted rshared into the container.
    subprocess.run(["mount", "--bind", data, data], check=True)
    stack.callback(umount, data)
    subprocess.run(["mount", "--make-shared", data], check=True)
    bundle, spec = unpack(stack, "sidecar", workdir)
    spec = pod_spec(
        spec, user=0, caps=privileged_caps(), no_new_privs=False, fuse_device=True, env=env, args=args,
        mounts=[bind("/data", data, "rw", "rshared"),
                *[bind(d, src, "rw") for d, src in vols.items()],
                bind("/dev/termination-log", term_log, "rw"),
                *kubelet_files(workdir)])
    spec["linux"]["rootfsPropagation"] = "rshared"
    c = Container(stack, bundle, spec, f"drainfs-sidecar-{os.getpid()}", workdir)
    deadline = time.monotonic() + 60
    served = False
    while time.monotonic() < deadline and c.proc.poll() is None:
        with open("/proc/self/mountinfo") as f:
            if any(line.split()[4] == data and " - fuse" in line and "drainfs" in line for line in f):
                served = wait_statfs(data, 30)
                break
        time.sleep(0.1)
    check(served, "sidecar: drainfs's mount reached the node through /data (Bidirectional)")
    if not served:
        print(c.tail())
        return
    t = {}

    def term():
        t["t"] = time.monotonic()
        c.kill("TERM")
    files, refused = workload(data, "results/late.bin", term)
    grace = int(inv["termination_grace_period_seconds"])
    code = c.wait(grace + 10)
    check_outcome("sidecar", c, t["t"], code, term_log, port, files, refused, within=float(grace))
    # The image has no fusermount, so gcsfuse cannot unmount itself on SIGINT: drainfs, drained
    # and privileged, unmounts it first, and gcsfuse exits 0 by itself (no aborted connection).
    try:
        with open(term_log) as f:
            summary = json.load(f)
    except ValueError:
        summary = {}
    check(summary.get("lower_unmount") == "drainfs" and summary.get("lower_exit") == "exit 0",
          f"sidecar: drainfs unmounted gcsfuse and gcsfuse exited 0 (lower_unmount {summary.get('lower_unmount')!r},"
          f" lower_exit {summary.get('lower_exit')!r})")
    check(not any(line.split()[4] == data and " - fuse" in line for line in open("/proc/self/mountinfo")),
          "sidecar: no FUSE mount left at /data on the node")


def main():
    # A SIGTERM or SIGINT (CI's timeout, Ctrl-C) unwinds the cleanup stack too.
    import signal
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda n, _f: sys.exit(128 + n))
    if os.geteuid() != 0:
        print("run-test.py: needs root (runc, mount)", file=sys.stderr)
        return 2
    tests = {"relay": test_relay, "sidecar": test_sidecar,
             "relay-held": lambda st, wd: test_relay(st, wd, held=True),
             "gke-overlay": test_overlay,
             "gke-overlay-numa": lambda st, wd: test_overlay(st, wd, numa_node=0),
             "gke-overlay-arm64": lambda st, wd: test_overlay(st, wd, arch="arm64")}
    which = sys.argv[1:] or list(tests)
    for w in which:
        if w not in tests:
            print(f"run-test.py: unknown image {w}", file=sys.stderr)
            return 2
        with contextlib.ExitStack() as stack:
            workdir = tempfile.mkdtemp(prefix=f"drainfs-image-{w}-", dir="/tmp")
            if not os.environ.get("DRAINFS_IMAGE_TEST_KEEP"):
                stack.callback(shutil.rmtree, workdir, True)
            os.chmod(workdir, 0o755)
            tests[w](stack, workdir)
    if failures:
        print(f"run-test.py: {len(failures)} check(s) FAILED", file=sys.stderr)
        return 1
    print("run-test.py: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
