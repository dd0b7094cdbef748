#!/usr/bin/env python3
"""Start, mount, inspect and stop the "real lowers" of drainfs, on loopback.

Three pairs, each an object-store server plus a FUSE client of it:

  gcsfuse : fake-gcs-server (memory backend, XML reads on localhost) + gcsfuse v3.11.2, the real one
  gcs     : fake-gcs-server (GCS JSON API)  + rclone mount (":gcs" backend, --vfs-cache-mode off)
  s3      : moto_server (S3 API)            + s3fs

Binaries come from scripts/install-lowers.sh (default root /opt/drainfs-lowers, override
with DRAINFS_LOWERS_ROOT). This file uses only the Python standard library, so any python3
can run it, from a shell, from the demo, or from Rust tests through std::process::Command.

Everything lives in a work dir D that the caller owns; D/lowers-state.json records what was
started (pids, ports, mounts) so that `stop` can end exactly those processes and nothing else.

CLI (every command prints one JSON document on stdout; errors go to stderr, exit 1):

  lowers.py paths                                      binary paths
  lowers.py start-server gcsfuse|gcs|s3 --workdir D [--bucket B]
        -> {"kind","pid","port","bucket","endpoint","log"}
  lowers.py mount-cmd gcsfuse|gcs|s3 --workdir D --mountpoint M [--log FILE] [-- EXTRA...]
        -> ["/opt/.../rclone", "mount", ...]   argv of the FUSE client, to run in the
           foreground under a supervisor (`drainfs run ... -- <argv>`); needs no env vars.
  lowers.py mount gcs|s3 --workdir D --mountpoint M    start the FUSE client directly
        -> {"pid","mountpoint","log"}                  (no drainfs), wait until mounted
  lowers.py wait-mount --mountpoint M [--timeout S] [--fstype T]
  lowers.py objects gcs|s3 --workdir D [--prefix P] [--dirs]
        -> {"key": {"size": N, "sha256": "hex"}}       read from the SERVER, not a mount
  lowers.py status --workdir D
  lowers.py stop --workdir D [--kind gcs|s3]           unmount + stop clients, then servers
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import fcntl
import hashlib
import hmac
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import xml.etree.ElementTree as ET

LOWERS_ROOT = os.environ.get("DRAINFS_LOWERS_ROOT", "/opt/drainfs-lowers")
STATE_FILE = "lowers-state.json"
DEFAULT_BUCKET = "drainfs-test"
KINDS = ("gcsfuse", "gcs", "s3")
# gcsfuse against fake-gcs-server (../shared/REAL-PEERS.md §2.2): the endpoint's host must be
# literally "localhost" (else a gRPC GetStorageLayout call fails the mount), no credentials, no
# HNS/folder APIs, renames as copy+delete (the fake has no moveTo), no metadata-server lookups.
# No per-chunk upload timeout (gcsfuse's hidden `chunk-transfer-timeout-secs`, default 10 s):
# on a timeout the storage client resends the chunk without asking the server what it has;
# fake-gcs-server v1.54.0 deletes a resumable session before it stores the object and answers
# the resent final chunk 404, which gcsfuse returns from FLUSH as ENOENT. Cloud Storage answers
# a finished session with its object. A loaded suite saw one 256 MiB close() fail so (14 s).
GCSFUSE_FLAGS = ("--foreground", "--anonymous-access", "--enable-hns=false",
                 "--enable-atomic-rename-object=false", "--disable-autoconfig", "--implicit-dirs",
                 "--chunk-transfer-timeout-secs=0")
S3_ACCESS_KEY = "drainfs"
S3_SECRET_KEY = "drainfs-secret"


class LowersError(RuntimeError):
    pass


# ---------------------------------------------------------------- binaries


def binary(name: str) -> str:
    """Path of rclone | fake-gcs-server | moto_server | s3fs | fusermount3 | gcsfuse |
    gcs-fuse-csi-driver-sidecar-mounter."""
    cand = os.path.join(LOWERS_ROOT, "bin", name)
    if os.access(cand, os.X_OK):
        return cand
    found = shutil.which(name)
    if found:
        return found
    raise LowersError(
        f"{name} not found (looked in {LOWERS_ROOT}/bin and PATH); "
        f"run scripts/install-lowers.sh as root"
    )


def paths() -> dict:
    out = {}
    for name in ("rclone", "fake-gcs-server", "moto_server", "s3fs", "fusermount3", "gcsfuse",
                 "gcs-fuse-csi-driver-sidecar-mounter"):
        try:
            out[name] = binary(name)
        except LowersError:
            out[name] = None
    return out


# ---------------------------------------------------------------- state


def _state_path(workdir: str) -> str:
    return os.path.join(workdir, STATE_FILE)


def load_state(workdir: str) -> dict:
    try:
        with open(_state_path(workdir)) as f:
            return json.load(f)
    except FileNotFoundError:
        return {"servers": {}, "mounts": []}


@contextlib.contextmanager
def state_lock(workdir: str):
    """Serialize read-modify-write of the state file (concurrent CLI calls on one work dir)."""
    os.makedirs(workdir, exist_ok=True)
    fd = os.open(os.path.join(workdir, ".lowers-state.lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def save_state(workdir: str, state: dict) -> None:
    os.makedirs(workdir, exist_ok=True)
    tmp = _state_path(workdir) + ".tmp"
    with open(tmp, "w") as f:
        json.dump(state, f, indent=1)
    os.replace(tmp, _state_path(workdir))


# ---------------------------------------------------------------- processes


def _child_setup() -> None:
    # Default dispositions and an empty mask, whatever our parent left us with
    # (a bash `cmd &` starts cmd with SIGINT and SIGQUIT ignored, and Python keeps
    # an inherited SIG_IGN). Popen(restore_signals=True) covers SIGPIPE/SIGXFSZ.
    for sig in (signal.SIGINT, signal.SIGQUIT, signal.SIGTERM, signal.SIGHUP,
                signal.SIGPIPE, signal.SIGUSR1, signal.SIGUSR2, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])


def spawn(argv: list[str], log_path: str, env: dict | None = None) -> subprocess.Popen:
    """Start a daemon in its own session (a terminal's ^C does not reach it), stdin from
    /dev/null, stdout+stderr appended to log_path, default signal dispositions."""
    logf = open(log_path, "ab")
    try:
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=logf,
            stderr=subprocess.STDOUT,
            env=env,
            close_fds=True,
            restore_signals=True,
            start_new_session=True,
            preexec_fn=_child_setup,
        )
    finally:
        logf.close()


def pid_alive(pid: int) -> bool:
    """True if pid exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            st = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return st[st.rindex(")") + 2] not in "ZX"


def _same_process(pid: int, start_time: str | None) -> bool:
    """Guard against pid reuse: compare /proc/PID/stat starttime with the recorded one."""
    if not pid_alive(pid):
        return False
    if start_time is None:
        return True
    return _proc_start_time(pid) == start_time


def _proc_start_time(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            st = f.read()
    except OSError:
        return None
    return st[st.rindex(")") + 2:].split()[19]


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def stop_pid(pid: int, start_time: str | None, sig: int = signal.SIGTERM,
             timeout: float = 10.0) -> str:
    """Send sig, wait up to timeout, then SIGKILL. Returns what happened."""
    if not _same_process(pid, start_time):
        return "gone"
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return "gone"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _reap(pid)
        if not pid_alive(pid):
            return f"exited after {signal.Signals(sig).name}"
        time.sleep(0.05)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return f"exited after {signal.Signals(sig).name}"
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and pid_alive(pid):
        _reap(pid)
        time.sleep(0.05)
    return "killed"


PORTS_FILE = "/tmp/drainfs-test-ports"
PORTS = range(20000, 30000)


def free_port() -> int:
    """The next port of PORTS that binds on 127.0.0.1, after the last one handed out: the
    counter in PORTS_FILE, under flock, shared with the Rust tests (fuse-tests/src/wait.rs,
    free_port), so two tests never race for one port, and below the ephemeral range, so no
    connect() takes it as its local port."""
    fd = os.open(PORTS_FILE, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        raw = os.read(fd, 64).decode(errors="replace").strip()
        nxt = int(raw) if raw.isdigit() else 0
        for _ in range(len(PORTS)):
            port = PORTS.start + nxt % len(PORTS)
            nxt = (nxt + 1) % len(PORTS)
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(nxt).encode(), 0)
            return port
        raise SystemExit(f"lowers.py: no port of {PORTS.start}-{PORTS.stop - 1} binds on 127.0.0.1")
    finally:
        os.close(fd)


# ---------------------------------------------------------------- HTTP


def http_request(port: int, method: str, path: str, body: bytes | None = None,
                 headers: dict | None = None, timeout: float = 30.0):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        data = resp.read()
        return resp.status, data
    finally:
        conn.close()


def http_hash(port: int, path: str, headers: dict | None = None,
              timeout: float = 120.0) -> tuple[int, str]:
    """GET path, stream it through sha256. Returns (size, hexdigest)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path, headers=headers or {})
        resp = conn.getresponse()
        if resp.status != 200:
            raise LowersError(f"GET {path}: HTTP {resp.status}: {resp.read()[:300]!r}")
        h = hashlib.sha256()
        n = 0
        while True:
            chunk = resp.read(1 << 20)
            if not chunk:
                break
            h.update(chunk)
            n += len(chunk)
        return n, h.hexdigest()
    finally:
        conn.close()


def s3_sign(port: int, method: str, path: str, query: dict | None = None,
            payload: bytes = b"") -> tuple[str, dict]:
    """AWS SigV4 headers for a request to the S3 server on 127.0.0.1:port (moto answers
    403 to unsigned GETs of objects that s3fs wrote). path must already be URI-encoded."""
    now = datetime.datetime.now(datetime.timezone.utc)
    amzdate, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
    region, service = "us-east-1", "s3"
    q = sorted((urllib.parse.quote(k, safe="-_.~"), urllib.parse.quote(v, safe="-_.~"))
               for k, v in (query or {}).items())
    cq = "&".join(f"{k}={v}" for k, v in q)
    phash = hashlib.sha256(payload).hexdigest()
    host = f"127.0.0.1:{port}"
    headers = {"host": host, "x-amz-content-sha256": phash, "x-amz-date": amzdate}
    signed = ";".join(sorted(headers))
    creq = "\n".join([method, path, cq,
                      "".join(f"{k}:{headers[k]}\n" for k in sorted(headers)),
                      signed, phash])
    scope = f"{day}/{region}/{service}/aws4_request"
    sts = "\n".join(["AWS4-HMAC-SHA256", amzdate, scope,
                     hashlib.sha256(creq.encode()).hexdigest()])
    k = ("AWS4" + S3_SECRET_KEY).encode()
    for part in (day, region, service, "aws4_request"):
        k = hmac.new(k, part.encode(), hashlib.sha256).digest()
    sig = hmac.new(k, sts.encode(), hashlib.sha256).hexdigest()
    headers["Authorization"] = (f"AWS4-HMAC-SHA256 Credential={S3_ACCESS_KEY}/{scope}, "
                                f"SignedHeaders={signed}, Signature={sig}")
    del headers["host"]
    return path + ("?" + cq if cq else ""), headers


def wait_http(port: int, path: str, proc: subprocess.Popen, timeout: float,
              log_path: str) -> None:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise LowersError(f"server exited with status {proc.returncode} before it "
                              f"answered; log {log_path}:\n{_tail(log_path)}")
        try:
            status, _ = http_request(port, "GET", path, timeout=2)
            if status == 200:
                return
            last = f"HTTP {status}"
        except OSError as e:
            last = repr(e)
        time.sleep(0.1)
    raise LowersError(f"server on port {port} not ready after {timeout}s ({last}); "
                      f"log {log_path}:\n{_tail(log_path)}")


def _tail(path: str, n: int = 20) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return ""


# ---------------------------------------------------------------- servers


def start_server(kind: str, workdir: str, bucket: str = DEFAULT_BUCKET,
                 timeout: float = 60.0, tls: tuple[str, str] | None = None,
                 public_port: int | None = None) -> dict:
    """Starts the fake server of `kind` and records it in workdir's state. For kind gcsfuse,
    `tls` = (certificate, private key) PEM paths serves HTTPS too (`-scheme both`: HTTPS on
    `tls_port`, plain HTTP on `port` for this module's own requests), and `public_port` is the
    port of a proxy in front of it: the endpoint gcsfuse gets (`gcs_endpoint`) and the upload
    URLs the server hands out name localhost:`public_port`, so that every request of gcsfuse
    goes through the proxy. Raises LowersError when the server does not answer."""
    if kind not in KINDS:
        raise LowersError(f"unknown kind {kind!r}")
    if (tls or public_port) and kind != "gcsfuse":
        raise LowersError("tls and public_port are for the gcsfuse kind only")
    workdir = os.path.abspath(workdir)
    state = load_state(workdir)
    old = state["servers"].get(kind)
    if old and _same_process(old["pid"], old.get("start_time")):
        raise LowersError(f"{kind} server already running in {workdir} (pid {old['pid']})")
    kdir = os.path.join(workdir, kind)
    os.makedirs(kdir, exist_ok=True)
    log_path = os.path.join(kdir, "server.log")

    for attempt in range(3):
        port = free_port()
        if kind == "gcs":
            seed = os.path.join(kdir, "seed")
            os.makedirs(os.path.join(seed, bucket), exist_ok=True)
            root = os.path.join(kdir, "root")
            argv = [binary("fake-gcs-server"), "-scheme", "http", "-host", "127.0.0.1",
                    "-port", str(port), "-backend", "filesystem",
                    "-filesystem-root", root, "-data", seed]
            ready_path = f"/storage/v1/b/{urllib.parse.quote(bucket, safe='')}"
        elif kind == "gcsfuse":
            # -public-host: gcsfuse reads objects through the XML path on the endpoint's host,
            # which the fake serves only when the Host header matches (REAL-PEERS.md §2.4).
            scheme, public = "http", public_port or port
            argv = [binary("fake-gcs-server"), "-host", "127.0.0.1", "-backend", "memory"]
            if tls:
                scheme, tls_port = "https", free_port()
                argv += ["-scheme", "both", "-port", str(tls_port), "-port-http", str(port),
                         "-cert-location", tls[0], "-private-key-location", tls[1]]
            else:
                argv += ["-scheme", "http", "-port", str(port)]
            argv += ["-public-host", f"localhost:{public}",
                     "-external-url", f"{scheme}://localhost:{public}", "-log-level", "warn"]
            ready_path = "/storage/v1/b"
        else:
            argv = [binary("moto_server"), "-H", "127.0.0.1", "-p", str(port)]
            ready_path = "/"
        proc = spawn(argv, log_path)
        try:
            wait_http(port, ready_path, proc, timeout, log_path)
            break
        except LowersError:
            stop_pid(proc.pid, None, signal.SIGKILL, 1)
            if attempt == 2 or not _port_taken_in_log(log_path):
                raise
    if kind == "gcsfuse":
        status, body = http_request(port, "POST", "/storage/v1/b?project=test",
                                    json.dumps({"name": bucket}).encode(),
                                    {"Content-Type": "application/json"})
        if status != 200:
            stop_pid(proc.pid, None, signal.SIGTERM, 5)
            raise LowersError(f"creating bucket {bucket}: HTTP {status}: {body[:300]!r}")
    if kind == "s3":
        # unsigned PUT works too; signed, the bucket belongs to the s3fs key pair
        path, hdrs = s3_sign(port, "PUT", "/" + urllib.parse.quote(bucket, safe=""))
        status, body = http_request(port, "PUT", path, headers=hdrs)
        if status != 200:
            stop_pid(proc.pid, None, signal.SIGTERM, 5)
            raise LowersError(f"creating bucket {bucket}: HTTP {status}: {body[:300]!r}")
        passwd = os.path.join(kdir, "passwd")
        fd = os.open(passwd, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(f"{S3_ACCESS_KEY}:{S3_SECRET_KEY}\n")
        os.chmod(passwd, 0o600)  # s3fs refuses a passwd_file readable by others

    info = {
        "kind": kind,
        "pid": proc.pid,
        "start_time": _proc_start_time(proc.pid),
        "port": port,
        "bucket": bucket,
        "endpoint": f"http://127.0.0.1:{port}",
        "log": log_path,
    }
    if kind == "gcsfuse":
        info["gcs_endpoint"] = f"{scheme}://localhost:{public}/storage/v1/"
        if tls:
            info["tls_port"] = tls_port
    with state_lock(workdir):
        state = load_state(workdir)
        state["servers"][kind] = info
        save_state(workdir, state)
    return info


def start_toxiproxy(binary: str, log_path: str, listen_port: int, upstream_port: int,
                    rtt_ms: float, mibps: float = 0, timeout: float = 30.0) -> subprocess.Popen:
    """toxiproxy-server (`binary`, on an API port of its own) relaying 127.0.0.1:`listen_port`
    to 127.0.0.1:`upstream_port` with `rtt_ms` of round trip added (a latency toxic of half of
    it in each direction) and, with `mibps` > 0, each connection capped at that many MiB/s in
    each direction (a bandwidth toxic per direction, which toxiproxy runs per connection; its
    rate is in KB/s of 1,000 bytes). Returns the process, for the caller to stop; raises
    LowersError (and kills it) when its API does not answer or refuses a call."""
    api = free_port()
    proc = spawn([binary, "-host", "127.0.0.1", "-port", str(api)], log_path)
    try:
        wait_http(api, "/version", proc, timeout, log_path)

        def post(path: str, body: dict) -> None:
            status, data = http_request(api, "POST", path, json.dumps(body).encode(),
                                        {"Content-Type": "application/json"})
            if status not in (200, 201):
                raise LowersError(f"toxiproxy {path}: HTTP {status}: {data[:300]!r}")
        post("/proxies", {"name": "gcs", "listen": f"127.0.0.1:{listen_port}",
                          "upstream": f"127.0.0.1:{upstream_port}", "enabled": True})
        for stream in ("upstream", "downstream"):
            post("/proxies/gcs/toxics", {"name": f"latency-{stream}", "type": "latency", "stream": stream,
                                         "attributes": {"latency": int(rtt_ms / 2), "jitter": 0}})
            if mibps > 0:
                post("/proxies/gcs/toxics", {"name": f"bandwidth-{stream}", "type": "bandwidth",
                                             "stream": stream,
                                             "attributes": {"rate": int(mibps * 2**20 / 1000)}})
    except (LowersError, OSError):
        stop_pid(proc.pid, None, signal.SIGKILL, 5)
        raise
    return proc


def _port_taken_in_log(log_path: str) -> bool:
    t = _tail(log_path, 50)
    return "address already in use" in t.lower()


def _server(workdir: str, kind: str) -> dict:
    state = load_state(os.path.abspath(workdir))
    srv = state["servers"].get(kind)
    if not srv:
        raise LowersError(f"no {kind} server recorded in {workdir}; run start-server first")
    return srv


# ---------------------------------------------------------------- mounts


def mount_argv(kind: str, workdir: str, mountpoint: str, log: str | None = None,
               extra: list[str] | None = None) -> list[str]:
    """argv of the FUSE client, foreground, for a supervisor to run. No env needed.
    `extra` goes before the positional arguments (gcsfuse flags such as --file-cache...)."""
    workdir = os.path.abspath(workdir)
    if not mountpoint.startswith("/dev/fd/"):
        mountpoint = os.path.abspath(mountpoint)
    srv = _server(workdir, kind)
    extra = list(extra or [])
    if kind == "gcsfuse":
        endpoint = srv.get("gcs_endpoint") or f"http://localhost:{srv['port']}/storage/v1/"
        argv = [binary("gcsfuse"), *GCSFUSE_FLAGS, f"--custom-endpoint={endpoint}",
                "--log-format=text"]
        if log:
            argv += [f"--log-file={log}", "--log-severity=info"]
        else:
            argv += ["--log-severity=warning"]
        return argv + extra + [srv["bucket"], mountpoint]
    if kind == "gcs":
        cache = os.path.join(workdir, "gcs", "rclone-cache")
        os.makedirs(cache, exist_ok=True)
        remote = (f":gcs,anonymous=true,endpoint='http://127.0.0.1:{srv['port']}"
                  f"/storage/v1/':{srv['bucket']}")
        # --config /dev/null == RCLONE_CONFIG=/dev/null: no config file is read or written.
        argv = [binary("rclone"), "mount", "--config", "/dev/null", remote, mountpoint,
                "--vfs-cache-mode", "off", "--cache-dir", cache]
        if log:
            argv += ["--log-file", log, "--log-level", "INFO"]
        return argv
    passwd = os.path.join(workdir, "s3", "passwd")
    argv = [binary("s3fs"), srv["bucket"], mountpoint, "-f",
            "-o", f"url={srv['endpoint']},use_path_request_style,passwd_file={passwd}"]
    if log:
        argv += ["-o", f"logfile={log},dbglevel=info"]
    return argv


def mountinfo_entry(mountpoint: str) -> dict | None:
    mp = os.path.realpath(mountpoint)
    found = None
    with open("/proc/self/mountinfo") as f:
        for line in f:
            parts = line.split()
            sep = parts.index("-")
            path = parts[4].replace("\\040", " ").replace("\\011", "\t") \
                           .replace("\\012", "\n").replace("\\134", "\\")
            if path == mp:
                found = {"fstype": parts[sep + 1], "source": parts[sep + 2]}
    return found  # the last one is the top of the stack


def wait_mount(mountpoint: str, timeout: float = 30.0, fstype: str | None = None,
               proc: subprocess.Popen | None = None, log_path: str | None = None) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ent = mountinfo_entry(mountpoint)
        if ent and (fstype is None or ent["fstype"] == fstype):
            return ent
        if proc is not None and proc.poll() is not None:
            raise LowersError(f"FUSE client exited with status {proc.returncode} before "
                              f"mounting {mountpoint}; log {log_path}:\n{_tail(log_path)}")
        time.sleep(0.05)
    raise LowersError(f"{mountpoint} not mounted after {timeout}s"
                      + (f"; log {log_path}:\n{_tail(log_path)}" if log_path else ""))


FSTYPES = {"gcsfuse": "fuse.gcsfuse", "gcs": "fuse.rclone", "s3": "fuse.s3fs"}


def mount(kind: str, workdir: str, mountpoint: str, timeout: float = 30.0,
          extra: list[str] | None = None) -> dict:
    """Start the FUSE client directly (no drainfs), wait until mounted."""
    workdir = os.path.abspath(workdir)
    mountpoint = os.path.abspath(mountpoint)
    os.makedirs(mountpoint, exist_ok=True)
    if mountinfo_entry(mountpoint):
        raise LowersError(f"{mountpoint} is already a mount point")
    log_path = os.path.join(workdir, kind, "client-%s.log" % mountpoint.strip("/").replace("/", "_"))
    proc = spawn(mount_argv(kind, workdir, mountpoint, None, extra), log_path)
    info = {"kind": kind, "pid": proc.pid, "start_time": _proc_start_time(proc.pid),
            "mountpoint": mountpoint, "log": log_path}
    with state_lock(workdir):
        state = load_state(workdir)
        state["mounts"].append(info)
        save_state(workdir, state)
    try:
        wait_mount(mountpoint, timeout, FSTYPES[kind], proc, log_path)
    except LowersError:
        unmount(mountpoint)
        stop_pid(proc.pid, info["start_time"], signal.SIGTERM, 5)
        raise
    return info


def unmount(mountpoint: str, lazy_fallback: bool = True) -> str:
    """fusermount3 -u; if busy or dead, umount -l. Returns what was done."""
    if not mountinfo_entry(mountpoint):
        return "not mounted"
    r = subprocess.run([binary("fusermount3"), "-u", mountpoint],
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    if r.returncode == 0 and not mountinfo_entry(mountpoint):
        return "unmounted"
    if not lazy_fallback:
        return "busy: " + r.stderr.decode(errors="replace").strip()
    subprocess.run(["umount", "-l", mountpoint], stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    if mountinfo_entry(mountpoint):
        subprocess.run([binary("fusermount3"), "-uz", mountpoint],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return "lazily unmounted" if not mountinfo_entry(mountpoint) else "STILL MOUNTED"


# ---------------------------------------------------------------- objects


def objects(kind: str, workdir: str, prefix: str = "", dirs: bool = False) -> dict:
    """{key: {size, sha256}} of every object in the bucket, fetched from the server.
    Directory markers (keys ending in "/", which s3fs's mkdir creates) are left out
    unless dirs=True."""
    srv = _server(workdir, kind)
    port, bucket = srv["port"], srv["bucket"]
    qb = urllib.parse.quote(bucket, safe="")
    out = {}
    if kind in ("gcs", "gcsfuse"):
        token = None
        while True:
            q = {"maxResults": "1000"}
            if prefix:
                q["prefix"] = prefix
            if token:
                q["pageToken"] = token
            status, body = http_request(port, "GET", f"/storage/v1/b/{qb}/o?"
                                        + urllib.parse.urlencode(q))
            if status != 200:
                raise LowersError(f"listing {bucket}: HTTP {status}: {body[:300]!r}")
            doc = json.loads(body)
            for item in doc.get("items", []):
                key = item["name"]
                if key.endswith("/") and not dirs:
                    continue
                size, digest = http_hash(
                    port, f"/download/storage/v1/b/{qb}/o/"
                          f"{urllib.parse.quote(key, safe='')}?alt=media")
                out[key] = {"size": size, "sha256": digest}
            token = doc.get("nextPageToken")
            if not token:
                break
    else:
        ns = "{http://s3.amazonaws.com/doc/2006-03-01/}"
        token = None
        while True:
            q = {"list-type": "2"}
            if prefix:
                q["prefix"] = prefix
            if token:
                q["continuation-token"] = token
            path, hdrs = s3_sign(port, "GET", f"/{qb}", q)
            status, body = http_request(port, "GET", path, headers=hdrs)
            if status != 200:
                raise LowersError(f"listing {bucket}: HTTP {status}: {body[:300]!r}")
            root = ET.fromstring(body)
            for c in root.iter(ns + "Contents"):
                key = c.find(ns + "Key").text
                if key.endswith("/") and not dirs:
                    continue
                size, digest = http_hash(port, *s3_sign(
                    port, "GET", f"/{qb}/" + urllib.parse.quote(key, safe="/~")))
                out[key] = {"size": size, "sha256": digest}
            trunc = root.find(ns + "IsTruncated")
            token_el = root.find(ns + "NextContinuationToken")
            if trunc is None or trunc.text != "true" or token_el is None:
                break
            token = token_el.text
    return out


def delete_objects(kind: str, workdir: str, prefix: str) -> int:
    """Deletes every object under `prefix` (not empty) from the server's bucket; returns how
    many. Only for "gcs" and "gcsfuse" (the GCS JSON API). A long run deletes what it has
    checked: fake-gcs-server's memory backend keeps every object in its memory."""
    if kind not in ("gcs", "gcsfuse") or not prefix:
        raise LowersError(f"delete_objects: {kind} {prefix!r}: only gcs/gcsfuse, with a prefix")
    srv = _server(workdir, kind)
    port, qb = srv["port"], urllib.parse.quote(srv["bucket"], safe="")
    names = []
    token = None
    while True:
        q = {"maxResults": "1000", "prefix": prefix}
        if token:
            q["pageToken"] = token
        status, body = http_request(port, "GET", f"/storage/v1/b/{qb}/o?" + urllib.parse.urlencode(q))
        if status != 200:
            raise LowersError(f"listing {srv['bucket']}: HTTP {status}: {body[:300]!r}")
        doc = json.loads(body)
        names += [item["name"] for item in doc.get("items", [])]
        token = doc.get("nextPageToken")
        if not token:
            break
    for name in names:
        status, body = http_request(port, "DELETE", f"/storage/v1/b/{qb}/o/{urllib.parse.quote(name, safe='')}")
        if status not in (200, 204, 404):
            raise LowersError(f"deleting {name}: HTTP {status}: {body[:300]!r}")
    return len(names)


# ---------------------------------------------------------------- stop


def stop(workdir: str, kind: str | None = None, timeout: float = 15.0) -> dict:
    """Unmount and stop recorded FUSE clients (SIGINT, then SIGKILL), then the servers
    (SIGTERM, then SIGKILL). Only processes recorded in the state file are touched."""
    workdir = os.path.abspath(workdir)
    with state_lock(workdir):
        return _stop_locked(workdir, kind, timeout)


def _stop_locked(workdir: str, kind: str | None, timeout: float) -> dict:
    state = load_state(workdir)
    report = {"mounts": {}, "servers": {}}
    keep = []
    for m in state["mounts"]:
        if kind and m["kind"] != kind:
            keep.append(m)
            continue
        done = unmount(m["mountpoint"])
        how = stop_pid(m["pid"], m.get("start_time"), signal.SIGINT, timeout)
        # a client killed before unmounting leaves a dead mount behind
        done2 = unmount(m["mountpoint"])
        report["mounts"][m["mountpoint"]] = {"unmount": done, "process": how,
                                             "after": done2}
    state["mounts"] = keep
    for k in list(state["servers"]):
        if kind and k != kind:
            continue
        s = state["servers"].pop(k)
        report["servers"][k] = stop_pid(s["pid"], s.get("start_time"), signal.SIGTERM,
                                        timeout)
    save_state(workdir, state)
    return report


# ---------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="lowers.py", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("paths")
    sp = sub.add_parser("start-server")
    sp.add_argument("kind", choices=KINDS)
    sp.add_argument("--workdir", required=True)
    sp.add_argument("--bucket", default=DEFAULT_BUCKET)
    sp.add_argument("--timeout", type=float, default=60.0)
    for name in ("mount-cmd", "mount"):
        sp = sub.add_parser(name)
        sp.add_argument("kind", choices=KINDS)
        sp.add_argument("--workdir", required=True)
        sp.add_argument("--mountpoint", required=True)
        if name == "mount-cmd":
            sp.add_argument("--log", help="client log file (default: stderr)")
        else:
            sp.add_argument("--timeout", type=float, default=30.0)
    sp = sub.add_parser("wait-mount")
    sp.add_argument("--mountpoint", required=True)
    sp.add_argument("--timeout", type=float, default=30.0)
    sp.add_argument("--fstype")
    sp = sub.add_parser("objects")
    sp.add_argument("kind", choices=KINDS)
    sp.add_argument("--workdir", required=True)
    sp.add_argument("--prefix", default="")
    sp.add_argument("--dirs", action="store_true", help="include directory markers")
    sp = sub.add_parser("status")
    sp.add_argument("--workdir", required=True)
    sp = sub.add_parser("stop")
    sp.add_argument("--workdir", required=True)
    sp.add_argument("--kind", choices=KINDS)
    sp.add_argument("--timeout", type=float, default=15.0)
    argv = list(sys.argv[1:] if argv is None else argv)
    # Extra client flags follow "--" (argparse's subparsers mishandle "--" themselves).
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    a = p.parse_args(argv)
    a.extra = extra

    try:
        if a.cmd == "paths":
            out = paths()
        elif a.cmd == "start-server":
            out = start_server(a.kind, a.workdir, a.bucket, a.timeout)
        elif a.cmd == "mount-cmd":
            out = mount_argv(a.kind, a.workdir, a.mountpoint, a.log, a.extra)
        elif a.cmd == "mount":
            out = mount(a.kind, a.workdir, a.mountpoint, a.timeout, a.extra)
        elif a.cmd == "wait-mount":
            out = wait_mount(a.mountpoint, a.timeout, a.fstype)
        elif a.cmd == "objects":
            out = objects(a.kind, a.workdir, a.prefix, a.dirs)
        elif a.cmd == "status":
            st = load_state(os.path.abspath(a.workdir))
            for s in st["servers"].values():
                s["alive"] = _same_process(s["pid"], s.get("start_time"))
            for m in st["mounts"]:
                m["alive"] = _same_process(m["pid"], m.get("start_time"))
                m["mounted"] = mountinfo_entry(m["mountpoint"]) is not None
            out = st
        elif a.cmd == "stop":
            out = stop(a.workdir, a.kind, a.timeout)
        else:  # pragma: no cover
            raise AssertionError(a.cmd)
    except (LowersError, OSError, http.client.HTTPException) as e:
        print(f"lowers.py {a.cmd}: error: {e}", file=sys.stderr)
        return 1
    json.dump(out, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
