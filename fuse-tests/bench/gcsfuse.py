#!/usr/bin/env python3
"""drainfs against the real gcsfuse (v3.11.2) on fake-gcs-server: throughput and the
end-of-Job tail. Python 3 stdlib only; run it through gcsfuse.sh (which builds, makes the work
directory and cleans up behind it). It reuses benchlib.py's fio and mdbench runners and process
tracker, and scripts/lowers.py's fake-gcs-server and gcsfuse command lines.

Part 1, throughput. One fake-gcs-server (memory backend), one bucket, and eight targets, each
its own gcsfuse process, with gcsfuse's file cache off and on (`--file-cache-max-size-mb=-1
--cache-dir=DIR`, a cache directory per gcsfuse; through the sidecar mounter, the mount option
`file-cache:max-size-mb:-1`, which puts the cache in its /gcsfuse-cache/.volumes/VOL);
sixteen mounts at once:

- `raw`:      gcsfuse on a directory, the application on it;
- `auto`:     `drainfs run` (default flags: `--passthrough auto`) over gcsfuse on its lower;
- `never`:    the same with `--passthrough never`;
- `relay`:    `drainfs relay --socket-buffer 212992` (default flags: `--pump poll --spin auto`)
              over gcsfuse on `/dev/fd/3`, the mount made by `fake-node-driver` as GKE's CSI
              driver makes it (fd=N, the sidecar as uid 65534 without capabilities);
- `relay-threads`: the same with `--pump threads` (two threads, each blocked in its own fd);
- `stock`:    gcsfuse as GKE runs it today: `fake-node-driver` in its CSI mode (the node
              driver's mount with fd=N, the mount config and the fd over the sidecar's socket)
              and GKE's real sidecar mounter (uid 65534), which runs gcsfuse on /dev/fd/3 with
              its own flags and config file: raw gcsfuse through the fd hand-off;
- `stock-b`:  the same again (its own mount and gcsfuse): raw gcsfuse against itself, the
              spread the hand-off's goals are judged against (left out of the smoke);
- `handoff`:  the same with `--gcsfuse-path` = drainfs's drop-in (a copy named `gcsfuse`, the
              real gcsfuse in DRAINFS_REAL_GCSFUSE) in its default mode: drainfs starts gcsfuse
              on the kernel's /dev/fd/3 untouched and is not in the data path;
- only with `--targets`: `relay-0s`, the same as `relay` with `--spin 0s`; `relay-capped`, the
              same with `--split-large-requests false`, the kernel capped at the relay's 128 KiB
              instead of the relay splitting larger READs and WRITEs (what the relay did before
              it split); `handoff-quiet`, the same as `handoff` with `DRAINFS_IDLE_SAMPLE=10s`
              (drainfs reads gcsfuse's counters every 10 s instead of 50 ms: the control for
              what the sampling costs gcsfuse).

fio (fio/*.ini: 1 MiB sequential and 4 KiB random, read and write, numjobs 1 and 4) and mdbench
(1 and 4 threads); each repetition runs every case on every target back to back, in an order
rotated per repetition; medians. Reads use the files fio-r/bench.0..3, laid out once through
the raw gcsfuse (every target sees the same objects), and run with O_DIRECT (fio --direct=1),
so that every read reaches gcsfuse on every target: fio's `invalidate=1` drops only the page
cache of the file it opens, and behind drainfs that is not gcsfuse's, which stayed warm (raw
gcsfuse re-read every pass from the bucket while drainfs's passthrough read gcsfuse's page cache
at 10x). drainfs `never` does not pass O_DIRECT on to the lower, so its repeated passes are
still served from gcsfuse's page cache. With the cache on, every target reads the files once
before the measurements, so cache-on reads are gcsfuse file-cache hits. Writes (buffered) go to
a directory per target. Before every job the lower's copies of its files get
POSIX_FADV_DONTNEED for `auto` and `never` (see drop_lower_cache). The ratios are to raw
gcsfuse with the same cache setting (`raw`; for `stock-b` and `handoff`, `stock`). The
hand-off's own tables judge its goals (>= 0.98x of stock on every fio job, CPU per GiB of
gcsfuse + drainfs equal to stock's gcsfuse) on the medians of at least 5 interleaved reps
against stock-b's distance from stock in the same runs.

Part 2, the end-of-Job tail through GKE's real sidecar mounter (v1.24.4). Per run: a fresh
mount made by `fake-node-driver` in its CSI mode (the node driver's part: mount with fd=N, the
mount config and the fd over the sidecar's socket), the sidecar mounter as uid 65534, an
application that writes files into the mount (each close() returns once gcsfuse has uploaded)
and exits, then the stop right after its exit. Arrangements:

- `stock`: `--gcsfuse-path` = gcsfuse (GKE today);
- `relay`: `--gcsfuse-path` = drainfs as the drop-in (a copy named `gcsfuse`, the real gcsfuse
  in DRAINFS_REAL_GCSFUSE) with the volume's mount option `drainfs-mode=relay` (without it the
  drop-in runs the hand-off);
- `handoff`: the same drop-in without the option: the hand-off, its default;
- `mount`: no sidecar mounter: `drainfs run --native-sidecar` (`--exit-file` for the regular
  container) over gcsfuse on a directory, as in drainfs's own sidecar container.

The stop (right after the application's exit, or `--tail-stop-delay` seconds later) is SIGTERM
with NATIVE_SIDECAR=TRUE (`--tail-runs` each), and, for `--exit-file-runs` runs each, the
regular container's exit file (`<base>/exit`, which the sidecar mounter polls every 5 s).
Measured: the tail = sidecar exit - application exit (ms, p50/p95); stop -> exit, from the
stop to the sidecar's exit; for the drop-in, also from its first trigger (the sidecar
mounter's SIGTERM, the wall-clock `trigger` of its summary) to the sidecar's exit, which leaves
out the sidecar mounter's poll of the exit file (the hand-off's goal, p50 <= 15 ms and p95 <=
50 ms, is judged on stop -> exit for the native stop and on this for the exit file); bytes lost =
bytes whose close() returned 0 but are not in the bucket, read back from the server; what the
sidecar said about gcsfuse's exit; the lines of its error file.

Every process started here is tracked by PID (WORK/pids) for gcsfuse.sh's trap; nothing is
killed by name.
"""

import argparse
import datetime
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(REPO, "scripts"))

import benchlib  # noqa: E402  (fio/mdbench runners, Tracker, formatting)
import lowers  # noqa: E402  (fake-gcs-server, gcsfuse argv, objects read back from the server)
from benchlib import (  # noqa: E402
    MD_PHASES, SIDECAR_UID, SOCKET_BUFFER, BenchError, child_pids, pct_nearest, private_bins, proc_cpu_secs,
    wait_for,
)

log = benchlib.log

TARGETS = ["raw", "auto", "never", "relay", "relay-threads", "stock", "stock-b", "handoff"]
KNOWN_TARGETS = TARGETS + ["relay-0s", "relay-capped", "handoff-quiet"]
# The targets mounted through the real sidecar mounter (fake-node-driver's CSI mode: the node
# driver's mount with fd=N, the fd over the sidecar's socket, the sidecar as uid 65534), with
# the gcsfuse the sidecar mounter runs: stock gcsfuse (twice: raw gcsfuse's spread against
# itself), or drainfs's drop-in in its default hand-off mode.
CSI_TARGETS = {"stock": "gcsfuse", "stock-b": "gcsfuse", "handoff": "dropin", "handoff-quiet": "dropin"}
# The hand-off's sampling interval per target: `handoff-quiet` samples every 10 s (the control
# for what drainfs's sampling costs gcsfuse: no sample falls inside a 5 s fio job's run but one).
IDLE_SAMPLE = {"handoff-quiet": "10s"}
# What each target's ratio is taken against: the hand-off against gcsfuse through the same fd
# hand-off, everything else against gcsfuse on a directory.
BASE = {"handoff": "stock", "handoff-quiet": "stock", "stock-b": "stock"}
# The relay's flags per relay target.
RELAY_FLAGS = {"relay": [], "relay-threads": ["--pump", "threads"], "relay-0s": ["--spin", "0s"],
               "relay-capped": ["--split-large-requests", "false"]}
CACHES = ["off", "on"]
# The targets, as a fraction of raw gcsfuse on every fio job.
GOAL = {"auto": 0.95, "never": 0.95, "relay": 0.9, "relay-threads": 0.9, "relay-0s": 0.9, "relay-capped": 0.9,
        "handoff": 0.98}
# The hand-off's goals are judged on the median of at least this many interleaved repetitions.
HANDOFF_MIN_REPS = 5
# CPU per GiB "equal to gcsfuse's": within this fraction of stock's, or within stock-b's own
# distance from stock (whichever is larger).
HANDOFF_CPU_TOLERANCE = 0.02
ARRANGEMENTS = ["stock", "relay", "handoff", "mount"]
# The drop-in's mount option per arrangement of part 2 (the drop-in runs the hand-off unless
# the volume's mountOptions say drainfs-mode=relay, or its environment does: dropin_env).
DROPIN_MODE = {"relay": ["drainfs-mode=relay"], "handoff": []}
# Part 2's goals for the hand-off (ms): stop -> sidecar exit, p50 and p95.
TAIL_GOAL_MS = {"p50": 15, "p95": 50}


def dropin_env(env, arr):
    """The drop-in's mode in its environment (`DRAINFS_DROPIN_MODE`, what a relay image sets):
    `relay` for the relay (whose volume also asks for it with the mount option), and none for
    the hand-off, whose mode must be the drop-in's default, whatever this process inherited."""
    env.pop("DRAINFS_DROPIN_MODE", None)
    if arr == "relay":
        env["DRAINFS_DROPIN_MODE"] = "relay"

PROFILES = {
    "full": dict(reps=5, runtime="5s", ramp="1s", size="64M", md_files=500, numjobs=[1, 4], md_threads=[1, 4],
                 tail_runs=20, exit_file_runs=5, tail_files=4, tail_file_size=8 << 20, tail_stop_delay=0.0),
    "smoke": dict(reps=1, runtime="300ms", ramp="0", size="4M", md_files=16, numjobs=[1], md_threads=[1],
                  tail_runs=1, exit_file_runs=0, tail_files=2, tail_file_size=1 << 20, tail_stop_delay=0.0),
}


def statfs_within(path, timeout):
    """statvfs(path) in a thread (a FUSE mount whose daemon has not answered INIT blocks it)."""
    done = threading.Event()
    err = []

    def go():
        try:
            os.statvfs(path)
        except OSError as e:
            err.append(e)
        done.set()

    threading.Thread(target=go, daemon=True).start()
    return done.wait(timeout) and not err


class CpuLimit:
    """A CPU limit of `cpus` CPUs (0.25, 1, ...) for each target: every target's processes
    (gcsfuse, drainfs, fake-node-driver) run in a cgroup of their own, as a sidecar container's
    processes share its limit. cgroup v2's `cpu.max` where the unified hierarchy has the cpu
    controller, else cgroup v1's `cpu.cfs_quota_us` (hybrid hosts); period 100 ms. Each cgroup
    is listed in WORK/cgroups for gcsfuse.sh's EXIT trap and removed by close()."""

    PERIOD_US = 100_000

    def __init__(self, cpus, work):
        if not 0.01 <= cpus <= (os.cpu_count() or 1):
            raise BenchError(f"--cpu-limit {cpus}: must be between 0.01 and the {os.cpu_count()} CPUs here")
        self.cpus, self.work = cpus, work
        self.quota = int(cpus * self.PERIOD_US)
        v2 = "/sys/fs/cgroup/cgroup.controllers"
        if os.path.exists(v2) and "cpu" in open(v2).read().split():
            self.v2, base = True, "/sys/fs/cgroup"
        elif os.path.exists("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"):
            self.v2, base = False, "/sys/fs/cgroup/cpu"
        else:
            raise BenchError("--cpu-limit: no cgroup cpu controller (neither v2 cpu.max nor v1 cpu.cfs_quota_us)")
        self.parent = os.path.join(base, f"drainfs-bench-{os.getpid()}")
        self.made = []
        self._mkdir(self.parent)
        if self.v2:
            with open(os.path.join(self.parent, "cgroup.subtree_control"), "w") as f:
                f.write("+cpu")

    def _mkdir(self, d):
        with open(os.path.join(self.work, "cgroups"), "a") as f:
            f.write(d + "\n")
        os.mkdir(d)
        self.made.append(d)

    def cgroup(self, name):
        """A new cgroup with the limit; returns its directory."""
        d = os.path.join(self.parent, name)
        self._mkdir(d)
        if self.v2:
            with open(os.path.join(d, "cpu.max"), "w") as f:
                f.write(f"{self.quota} {self.PERIOD_US}")
        else:
            with open(os.path.join(d, "cpu.cfs_period_us"), "w") as f:
                f.write(str(self.PERIOD_US))
            with open(os.path.join(d, "cpu.cfs_quota_us"), "w") as f:
                f.write(str(self.quota))
        return d

    @staticmethod
    def wrap(cgroup_dir, cmd):
        """`cmd` started inside `cgroup_dir` (its children follow it there)."""
        return ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', cgroup_dir, *cmd]

    def throttled(self, cgroup_dir):
        """Microseconds the cgroup was throttled so far (its cpu.stat)."""
        with open(os.path.join(cgroup_dir, "cpu.stat")) as f:
            st = dict(line.split() for line in f if line.strip())
        return int(st.get("throttled_usec", int(st.get("throttled_time", 0)) // 1000))

    def close(self):
        """Removes the cgroups (they are empty once the targets stopped)."""
        for d in reversed(self.made):
            try:
                os.rmdir(d)
            except OSError as e:
                log(f"cpu limit: could not remove {d}: {e}")
        self.made = []


class Wan:
    """The bucket as a cloud VM reaches Cloud Storage (--wan RTT_MS,MIBPS): fake-gcs-server
    serving HTTPS (a certificate made here for localhost, trusted by gcsfuse through
    SSL_CERT_FILE, which Go's crypto/x509 reads on Linux; the sidecar mounter passes its
    environment on to gcsfuse), behind toxiproxy (scripts/k8s-node/install.sh's `toxiproxy`
    step, v2.5.0 from its Go module) adding `rtt_ms` of round trip (a latency toxic of half of it
    in each direction) and capping each connection at `mibps` MiB/s in each direction (a
    bandwidth toxic per direction; toxiproxy runs every toxic per connection). The server's
    upload URLs name the proxy's port, so every request goes through it. toxiproxy and
    fake-gcs-server run outside the targets' CPU limits; their CPU-seconds are reported."""

    def __init__(self, spec, toxiproxy):
        try:
            rtt, mibps = (float(x) for x in spec.split(","))
        except ValueError:
            raise BenchError(f"--wan takes RTT_MS,MIBPS (e.g. 10,100), not {spec!r}") from None
        if rtt < 0 or mibps <= 0:
            raise BenchError(f"--wan: the round trip must be >= 0 ms and the bandwidth > 0 MiB/s, not {spec!r}")
        if not os.access(toxiproxy, os.X_OK):
            raise BenchError(f"no toxiproxy-server at {toxiproxy} (bash scripts/k8s-node/install.sh toxiproxy)")
        self.rtt_ms, self.mibps, self.toxiproxy = rtt, mibps, toxiproxy
        self.proc = None

    def describe(self):
        return (f"HTTPS through toxiproxy: {self.rtt_ms:g} ms of round trip added, {self.mibps:g} MiB/s per "
                f"connection each way")

    def certificate(self, work):
        """A self-signed certificate for localhost and 127.0.0.1 (cert, key), readable by uid
        65534 (the sidecar's gcsfuse reads SSL_CERT_FILE)."""
        d = os.path.join(work, "tls")
        os.makedirs(d, mode=0o755)
        cert, key = os.path.join(d, "cert.pem"), os.path.join(d, "key.pem")
        r = subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                            "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
                            "-keyout", key, "-out", cert], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        if r.returncode != 0:
            raise BenchError("openssl: " + r.stdout.decode(errors="replace"))
        os.chmod(cert, 0o644)
        return cert, key

    def start(self, ctx):
        """Starts fake-gcs-server (HTTPS) and toxiproxy in front of it; returns the server's
        lowers record (gcs_endpoint = the proxy)."""
        # A private copy under the work dir: gcsfuse.sh's trap ends only processes whose
        # command line names it.
        toxiproxy = os.path.join(ctx.work, "bin", "toxiproxy-server")
        shutil.copy2(self.toxiproxy, toxiproxy)
        cert, key = self.certificate(ctx.work)
        os.environ["SSL_CERT_FILE"] = cert
        proxy = lowers.free_port()
        server = lowers.start_server("gcsfuse", ctx.lowers_dir, tls=(cert, key), public_port=proxy)
        ctx.tracker.add(server["pid"])
        try:
            self.proc = lowers.start_toxiproxy(toxiproxy, os.path.join(ctx.logs, "toxiproxy.log"), proxy,
                                               server["tls_port"], self.rtt_ms, self.mibps)
        except lowers.LowersError as e:
            raise BenchError(str(e)) from None
        ctx.tracker.add(self.proc.pid)
        return server

    def stop(self, ctx):
        if self.proc is not None and self.proc.poll() is None:
            ctx.tracker.signal(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            ctx.tracker.reaped(self.proc.pid)


class Ctx:
    cpu = None
    wan = None
    server = None


# ---------------------------------------------------------------------------------------------
# targets


class Target:
    """One gcsfuse and whatever is in front of it, mounted at self.mnt."""

    def __init__(self, ctx, name, cache):
        self.ctx, self.name, self.cache = ctx, name, cache
        self.key = f"{cache}/{name}"
        self.dir = os.path.join(ctx.work, "t", f"{cache}-{name}")
        self.mnt = os.path.join(self.dir, "mnt")
        self.lower = os.path.join(self.dir, "lower")
        self.summary_path = os.path.join(self.dir, "summary.json")
        self.log_path = os.path.join(ctx.logs, f"{cache}-{name}.log")
        self.gcsfuse_log = os.path.join(self.dir, "gcsfuse.log")
        self.proc = None
        self.cgroup = None
        self.cache_vol = None
        self.lines = []
        for d in (self.dir, self.mnt, self.lower):
            os.makedirs(d, exist_ok=True)
        self.csi = name in CSI_TARGETS
        self.sidecar = name.startswith("relay") or self.csi
        if self.sidecar:
            os.chown(self.dir, SIDECAR_UID, SIDECAR_UID)
            open(self.gcsfuse_log, "a").close()
            os.chown(self.gcsfuse_log, SIDECAR_UID, SIDECAR_UID)

    def gcsfuse_argv(self, mountpoint):
        extra = []
        if self.cache == "on":
            cache_dir = os.path.join(self.dir, "cache")
            os.makedirs(cache_dir, exist_ok=True)
            if self.sidecar:
                os.chown(cache_dir, SIDECAR_UID, SIDECAR_UID)
            extra = ["--file-cache-max-size-mb=-1", f"--cache-dir={cache_dir}"]
        argv = lowers.mount_argv("gcsfuse", self.ctx.lowers_dir, mountpoint, self.gcsfuse_log, extra)
        return [self.ctx.gcsfuse, *argv[1:]]

    def csi_cmd(self):
        """fake-node-driver in its CSI mode with the real sidecar mounter, which runs stock
        gcsfuse or the drop-in (drainfs named gcsfuse: the hand-off, its default) on the
        kernel's /dev/fd/3. With the cache on, the volume's mountOptions enable gcsfuse's file
        cache, which the sidecar mounter puts in its hard-coded /gcsfuse-cache/.volumes/VOL
        (made here for uid 65534, removed by stop() and by gcsfuse.sh's trap)."""
        ctx = self.ctx
        self.vol = f"drainfs-bench-{os.getpid()}-{self.cache}-{self.name}"
        with open(os.path.join(ctx.work, "global-dirs"), "a") as f:
            f.write(f"/gcsfuse-tmp/.volumes/{self.vol}\n/gcsfuse-buffer/.volumes/{self.vol}\n"
                    f"/gcsfuse-cache/.volumes/{self.vol}\n")
        opts = sidecar_mount_options(ctx)
        if self.cache == "on":
            self.cache_vol = f"/gcsfuse-cache/.volumes/{self.vol}"
            os.makedirs(self.cache_vol, exist_ok=True)
            for d in ("/gcsfuse-cache", "/gcsfuse-cache/.volumes", self.cache_vol):
                os.chown(d, SIDECAR_UID, SIDECAR_UID)
            opts.append("file-cache:max-size-mb:-1")
        base = os.path.join(self.dir, "base")
        os.makedirs(base, exist_ok=True)
        gcsfuse_path = ctx.gcsfuse if CSI_TARGETS[self.name] == "gcsfuse" else ctx.dropin
        cmd = [ctx.fake_node_driver, "--mountpoint", self.mnt, "--volume-base-path", base, "--volume-name", self.vol,
               "--bucket", ctx.server["bucket"], "--stop", "native", "--grace-period", "60s", "--ready-timeout", "60s"]
        for o in opts:
            cmd += ["--mount-option", o]
        return cmd + ["--", ctx.sidecar_mounter, f"--gcsfuse-path={gcsfuse_path}"]

    def start(self):
        logf = open(self.log_path, "ab")
        ready = os.path.join(self.dir, "ready")
        env = None
        self.cache_vol = None
        if self.csi:
            cmd = self.csi_cmd()
            env = dict(os.environ, DRAINFS_REAL_GCSFUSE=self.ctx.gcsfuse, DRAINFS_SUMMARY_FILE=self.summary_path)
            dropin_env(env, self.name)
            if self.name in IDLE_SAMPLE:
                env["DRAINFS_IDLE_SAMPLE"] = IDLE_SAMPLE[self.name]
        elif self.name == "raw":
            cmd = self.gcsfuse_argv(self.mnt)
        elif self.name in ("auto", "never"):
            cmd = [self.ctx.drainfs, "run", "--lower", self.lower, "--mountpoint", self.mnt,
                   "--summary-file", self.summary_path, "--ready-file", ready]
            if self.name == "never":
                cmd += ["--passthrough", "never"]
            cmd += ["--", *self.gcsfuse_argv(self.lower)]
        else:
            flags = RELAY_FLAGS[self.name]
            cmd = [self.ctx.fake_node_driver, "--mountpoint", self.mnt, "--ready-timeout", "60s", "--",
                   self.ctx.drainfs, "relay", "--socket-buffer", str(SOCKET_BUFFER),
                   "--summary-file", self.summary_path, *flags, "--", *self.gcsfuse_argv("/dev/fd/3")]
        if self.ctx.cpu:
            self.cgroup = self.ctx.cpu.cgroup(f"{self.cache}-{self.name}")
            cmd = CpuLimit.wrap(self.cgroup, cmd)
        logf.write(("$ " + " ".join(cmd) + "\n").encode())
        logf.flush()
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE if self.sidecar else subprocess.DEVNULL,
                                     stdout=subprocess.PIPE if self.sidecar else logf, stderr=logf, env=env,
                                     restore_signals=True, start_new_session=True)
        logf.close()
        self.ctx.tracker.add(self.proc.pid)
        if self.sidecar:
            ev = threading.Event()

            def reader():
                for raw in self.proc.stdout:
                    line = raw.decode(errors="replace").strip()
                    self.lines.append(line)
                    if line == "ready":
                        ev.set()

            threading.Thread(target=reader, daemon=True).start()
            wait_for(ev.is_set, 60, f"{self.key}: fake-node-driver ready", self.proc, self.log_path)
        elif self.name == "raw":
            wait_for(lambda: (lowers.mountinfo_entry(self.mnt) or {}).get("fstype") == "fuse.gcsfuse", 60,
                     f"{self.key}: gcsfuse mounted", self.proc, self.log_path)
        else:
            wait_for(lambda: os.path.exists(ready), 60, f"{self.key}: drainfs ready", self.proc, self.log_path)
        os.statvfs(self.mnt)
        return self

    def drainfs_pid(self):
        """The drainfs process (run, relay or the hand-off) of this target, or None for raw
        gcsfuse (raw, stock, stock-b)."""
        if self.name in ("raw", "stock", "stock-b"):
            return None
        if self.name in ("auto", "never"):
            return self.proc.pid
        parent = self.proc.pid
        if self.csi:
            # fake-node-driver -> the sidecar mounter -> the drop-in -> gcsfuse
            c = child_pids(parent)
            parent = c[0] if c else None
        c = child_pids(parent) if parent else []
        return c[0] if c else None

    def gcsfuse_pid(self):
        """This target's gcsfuse process, or None when it cannot be found."""
        if self.name == "raw":
            return self.proc.pid
        if self.name in ("stock", "stock-b"):
            c = child_pids(self.proc.pid)  # the sidecar mounter
            parent = c[0] if c else None
        else:
            parent = self.proc.pid if self.name in ("auto", "never") else self.drainfs_pid()
        c = child_pids(parent) if parent else []
        return c[0] if c else None

    def data_path(self):
        """drainfs's data-path decision from its log (`data path ...` line), for the table."""
        try:
            with open(self.log_path, errors="replace") as f:
                for line in f:
                    if "data path" in line:
                        return line.strip()
        except OSError:
            pass
        return ""

    def stop(self, timeout=40.0):
        """Stops the target and checks that it ended cleanly; returns a short description."""
        p = self.proc
        if p is None or p.poll() is not None:
            return "not running"
        if self.name == "raw":
            # Unmounting ends gcsfuse's connection: it exits 0 by end-of-stream.
            r = subprocess.run(["fusermount3", "-u", self.mnt], stderr=subprocess.PIPE)
            if r.returncode != 0:
                self.ctx.tracker.signal(p.pid, signal.SIGINT)
        elif self.sidecar:
            if not p.stdin.closed:
                p.stdin.close()  # stdin EOF: fake-node-driver stops the sidecar as on SIGTERM
        else:
            self.ctx.tracker.signal(p.pid, signal.SIGTERM)
        try:
            rc = p.wait(timeout)
        except subprocess.TimeoutExpired:
            self.ctx.tracker.signal(p.pid, signal.SIGKILL)
            rc = p.wait()
            raise BenchError(f"{self.key}: did not exit within {timeout} s of its stop")
        finally:
            self.ctx.tracker.reaped(p.pid)
            if self.cache_vol:
                shutil.rmtree(self.cache_vol, ignore_errors=True)
            if lowers.mountinfo_entry(self.mnt) or lowers.mountinfo_entry(self.lower):
                lowers.unmount(self.mnt)
                lowers.unmount(self.lower)
                raise BenchError(f"{self.key}: a mount was left behind")
        if rc != 0:
            raise BenchError(f"{self.key}: exited {rc} (lines {self.lines}); see {self.log_path}")
        return next((x for x in self.lines if x.startswith("sidecar exit:")), f"exit {rc}")


# ---------------------------------------------------------------------------------------------
# part 1: fio and mdbench


def fio_dirs(t, root=None):
    root = root or t.mnt
    return os.path.join(root, "fio-r"), os.path.join(root, f"fio-w-{t.cache}-{t.name}")


def drop_lower_cache(t, which, nj):
    """fio's `invalidate=1` drops the page cache of the files it opens, which behind drainfs
    are drainfs's; the page cache of gcsfuse's files underneath (where kernel passthrough reads
    and writes, and drainfs's own reads go) would stay warm from the previous job, while raw
    gcsfuse's is dropped. So for `auto` and `never` the same files on the lower get
    POSIX_FADV_DONTNEED too: every job on every target starts with gcsfuse's files uncached."""
    if t.name not in ("auto", "never"):
        return
    d = fio_dirs(t, t.lower)[which]
    for i in range(nj):
        try:
            fd = os.open(os.path.join(d, f"bench.{i}"), os.O_RDONLY)
        except FileNotFoundError:
            continue
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def part_throughput(ctx, raw):
    targets = {}
    try:
        for cache in CACHES:
            for name in TARGETS:
                t = Target(ctx, name, cache)
                targets[t.key] = t
                t.start()
                log(f"{t.key}: serving at {t.mnt}")
                if t.key == f"off/{TARGETS[0]}":
                    # The read files, laid out once through the first target (raw gcsfuse, or
                    # stock) before the others mount.
                    rdir, _ = fio_dirs(t)
                    os.makedirs(rdir)
                    r = subprocess.run(["fio", "--create_only=1", "--output=/dev/null",
                                        os.path.join(HERE, "fio", "seq-read.ini")],
                                       env=benchlib.fio_env(ctx.p, rdir, max(ctx.p["numjobs"])),
                                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
                    if r.returncode != 0:
                        raise BenchError("fio layout failed: " + r.stdout.decode(errors="replace"))
        for t in targets.values():
            os.makedirs(fio_dirs(t)[1], exist_ok=True)
            raw["data_path"][t.key] = t.data_path()
            if t.cache == "on":
                # Every read file once: the measurements are cached reads.
                rdir = fio_dirs(t)[0]
                for i in range(max(ctx.p["numjobs"])):
                    with open(os.path.join(rdir, f"bench.{i}"), "rb") as f:
                        while f.read(1 << 20):
                            pass
        cpu0 = {k: proc_cpu_secs(t.drainfs_pid()) for k, t in targets.items() if t.drainfs_pid()}

        n_total = ctx.p["reps"] * len(CACHES) * len(benchlib.FIO_JOBS) * len(ctx.p["numjobs"]) * len(TARGETS)
        i = 0
        for rep in range(ctx.p["reps"]):
            order = TARGETS[rep % len(TARGETS):] + TARGETS[:rep % len(TARGETS)]
            for cache in CACHES:
                for key, ini, direction, unit in benchlib.FIO_JOBS:
                    for nj in ctx.p["numjobs"]:
                        for name in order:
                            t = targets[f"{cache}/{name}"]
                            i += 1
                            which = 0 if direction == "read" else 1
                            d = fio_dirs(t)[which]
                            drop_lower_cache(t, which, nj)
                            out = os.path.join(ctx.results, f"fio-{key}-nj{nj}-{cache}-{name}-rep{rep}.json")
                            extra = ["--direct=1"] if direction == "read" else []
                            pids = (t.gcsfuse_pid(), t.drainfs_pid())
                            job0 = [proc_cpu_secs(p) if p else 0.0 for p in pids]
                            doc = benchlib.run_fio(ctx.p, ini, d, nj, out, extra)
                            job1 = [proc_cpu_secs(p) if p else 0.0 for p in pids]
                            v = benchlib.fio_value(doc, direction, unit)
                            raw["fio"].setdefault(f"{cache}/{key}/nj{nj}/{name}", []).append(v)
                            # CPU-seconds of gcsfuse and of drainfs per GiB fio moved in this job.
                            gib = doc["jobs"][0][direction]["io_bytes"] / 2**30
                            if gib > 0:
                                raw["cpu_per_gib"].setdefault(f"{cache}/{key}/nj{nj}/{name}", []).append(
                                    [(b - a) / gib for a, b in zip(job0, job1)])
                            log(f"fio {i}/{n_total} rep{rep} cache {cache} {key} nj{nj} {name}: {v:,.1f} {unit} "
                                f"(load {benchlib.loadavg()})")
            for cache in CACHES:
                for th in ctx.p["md_threads"]:
                    for name in order:
                        t = targets[f"{cache}/{name}"]
                        doc = benchlib.run_mdbench(ctx.mdbench, t.mnt, ctx.p["md_files"], th, f"{cache}-{name}-t{th}-rep{rep}")
                        for ph in MD_PHASES:
                            raw["md"].setdefault(f"{cache}/{ph}/t{th}/{name}", []).append(doc["phases"][ph]["us_per_op"])
                        log(f"mdbench rep{rep} cache {cache} {th}T {name}: "
                            + ", ".join(f"{ph} {doc['phases'][ph]['us_per_op']:.0f}us" for ph in MD_PHASES))
        for k, t in targets.items():
            pid = t.drainfs_pid()
            if pid:
                raw["drainfs_cpu_s"][k] = proc_cpu_secs(pid) - cpu0.get(k, 0.0)
    finally:
        errors = []
        # The sidecar mounter's stop of stock gcsfuse takes its 5 s (SIGKILL): begin every
        # sidecar's stop at once (stdin EOF), then wait for each.
        for t in targets.values():
            if t.csi and t.proc is not None and not t.proc.stdin.closed:
                t.proc.stdin.close()
        for t in reversed(list(targets.values())):
            try:
                raw["stops"][t.key] = t.stop()
            except BenchError as e:
                errors.append(str(e))
            if t.cgroup:
                try:
                    raw["throttled_s"][t.key] = ctx.cpu.throttled(t.cgroup) / 1e6
                except (OSError, ValueError):
                    pass
            if t.sidecar and not t.csi:
                try:
                    with open(t.summary_path) as f:
                        raw["relay_profile"][t.key] = (json.load(f).get("relay") or {}).get("profile")
                except (OSError, ValueError):
                    pass
        if errors:
            raise BenchError("; ".join(errors))


# ---------------------------------------------------------------------------------------------
# part 2: the end-of-Job tail

# The application: writes N files of SIZE bytes into DIR, one after the other, and prints one
# JSON line per file (name, size, sha256, whether write+close succeeded, the errno if not).
APP = r"""
import hashlib, json, os, sys
d, n, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
os.makedirs(d, exist_ok=True)
for i in range(n):
    data = os.urandom(size)
    name = f"f{i}.bin"
    rec = {"name": name, "size": size, "sha256": hashlib.sha256(data).hexdigest(), "closed": False}
    try:
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)
        rec["closed"] = True
    except OSError as e:
        rec["errno"] = e.errno
    print(json.dumps(rec), flush=True)
"""

# What the sidecar mounter's node-driver part and the GKE volume pass: the gcsfuse flags
# fake-gcs-server needs (lowers.GCSFUSE_FLAGS without --foreground, which the sidecar adds) and
# metrics off (disable-metrics-for-gke:true also drops the sidecar's --prometheus-port).
def sidecar_mount_options(ctx):
    opts = [f.lstrip("-") for f in lowers.GCSFUSE_FLAGS if f != "--foreground"]
    return opts + [f"custom-endpoint={ctx.server['gcs_endpoint']}", "disable-metrics-for-gke:true"]


def tail_run(ctx, arr, stop, n):
    """One Job end. Returns a dict with the tail (ms), bytes written/lost, statuses, error lines."""
    tag = f"{arr}-{stop}-{n}"
    d = os.path.join(ctx.work, "tail", tag)
    mnt, base, lower = (os.path.join(d, x) for x in ("mnt", "base", "lower"))
    for x in (d, mnt, base, lower):
        os.makedirs(x, exist_ok=True)
    os.chown(d, SIDECAR_UID, SIDECAR_UID)
    logp = os.path.join(ctx.logs, f"tail-{tag}.log")
    logf = open(logp, "ab")
    summary = os.path.join(d, "summary.json")
    prefix = f"tail/{tag}"
    env = dict(os.environ)
    if arr == "mount":
        ready = os.path.join(d, "ready")
        exit_file = os.path.join(d, "exit")
        trig = ["--native-sidecar"] if stop == "native" else ["--exit-file", exit_file]
        cmd = [ctx.drainfs, "run", "--lower", lower, "--mountpoint", mnt, "--summary-file", summary,
               "--ready-file", ready, *trig, "--",
               *lowers.mount_argv("gcsfuse", ctx.lowers_dir, lower, os.path.join(d, "gcsfuse.log"))]
    else:
        # Short: the socket's path (BASE/VOL/socket) must fit in sun_path.
        vol = f"drainfs-bench-{os.getpid()}-t{arr[0]}{stop[0]}{n}"
        with open(os.path.join(ctx.work, "global-dirs"), "a") as f:
            f.write(f"/gcsfuse-tmp/.volumes/{vol}\n/gcsfuse-buffer/.volumes/{vol}\n")
        gcsfuse_path = ctx.gcsfuse if arr == "stock" else ctx.dropin
        env["DRAINFS_REAL_GCSFUSE"] = ctx.gcsfuse
        dropin_env(env, arr)
        env["DRAINFS_SUMMARY_FILE"] = summary
        cmd = [ctx.fake_node_driver, "--mountpoint", mnt, "--volume-base-path", base, "--volume-name", vol,
               "--bucket", ctx.server["bucket"], "--stop", "native" if stop == "native" else "exit-file",
               "--grace-period", "30s", "--ready-timeout", "60s"]
        for o in sidecar_mount_options(ctx) + DROPIN_MODE.get(arr, []):
            cmd += ["--mount-option", o]
        cmd += ["--", ctx.sidecar_mounter, f"--gcsfuse-path={gcsfuse_path}"]
    logf.write(("$ " + " ".join(cmd) + "\n").encode())
    logf.flush()
    p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE if arr != "mount" else logf,
                         stderr=logf, env=env, restore_signals=True, start_new_session=True)
    logf.close()
    ctx.tracker.add(p.pid)
    lines = []
    ev = threading.Event()
    reader_thread = None
    if arr != "mount":
        def reader():
            for rawl in p.stdout:
                line = rawl.decode(errors="replace").strip()
                lines.append(line)
                if line == "ready":
                    ev.set()
        reader_thread = threading.Thread(target=reader, daemon=True)
        reader_thread.start()
    res = {"arrangement": arr, "stop": stop, "run": n}
    try:
        if arr == "mount":
            wait_for(lambda: os.path.exists(ready), 60, f"tail {tag}: drainfs ready", p, logp)
        else:
            wait_for(ev.is_set, 60, f"tail {tag}: ready", p, logp)
        if not statfs_within(mnt, 30):
            raise BenchError(f"tail {tag}: the mount does not answer")
        app = subprocess.run([sys.executable, "-c", APP, os.path.join(mnt, prefix), str(ctx.p["tail_files"]),
                              str(ctx.p["tail_file_size"])], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             timeout=300)
        t_app = time.monotonic()
        # The stop, right after the application's exit (or --tail-stop-delay later).
        if ctx.p["tail_stop_delay"]:
            time.sleep(ctx.p["tail_stop_delay"])
        if arr == "mount":
            if stop == "native":
                os.kill(p.pid, signal.SIGTERM)
            else:
                with open(exit_file + ".tmp", "w"):
                    pass
                os.rename(exit_file + ".tmp", exit_file)
        else:
            p.stdin.close()
        t_stop = time.monotonic()
        t_stop_wall = time.time()
        rc = p.wait(60)
        t_exit = time.monotonic()
        ctx.tracker.reaped(p.pid)
        if reader_thread is not None:
            # The driver's last lines (`sidecar exit: ...`) may still be in the pipe.
            reader_thread.join(10)
        recs = [json.loads(x) for x in app.stdout.decode().splitlines() if x.strip()]
        if app.returncode != 0 or len(recs) != ctx.p["tail_files"]:
            raise BenchError(f"tail {tag}: the application failed ({app.returncode}): {app.stderr.decode()[-500:]}")
        if arr == "mount":
            res["tail_ms"] = (t_exit - t_app) * 1000
            res["stop_ms"] = (t_exit - t_stop) * 1000
            res["sidecar_exit"] = str(rc)
        else:
            ex = next((x for x in lines if x.startswith("sidecar exit: ")), None)
            if ex is None:
                raise BenchError(f"tail {tag}: no `sidecar exit` line: {lines}")
            status, _, ms = ex[len("sidecar exit: "):].rpartition(" after ")
            # fake-node-driver counts from its stop (the SIGTERM or the exit file) to the
            # sidecar's exit; add the time from the application's exit to that stop.
            res["tail_ms"] = (t_stop - t_app) * 1000 + float(ms.split()[0])
            res["stop_ms"] = float(ms.split()[0])
            res["sidecar_exit_wall"] = t_stop_wall + float(ms.split()[0]) / 1000
            res["sidecar_exit"] = status
            # What the sidecar mounter said of its child (gcsfuse, or the drop-in).
            res["sidecar_child"] = next((x[len("gcsfuse exit: "):] for x in lines if x.startswith("gcsfuse exit: ")), "?")
            res["gcsfuse_exit"] = res["sidecar_child"]
            res["error_lines"] = [x[len("error file: "):] for x in lines if x.startswith("error file: ")]
            res["fnd_exit"] = rc
        try:
            with open(summary) as f:
                s = json.load(f)
            res["drainfs_exit"] = s.get("exit_code")
            res["drainfs_outcome"] = s.get("outcome")
            le = s.get("gcsfuse_exit") if arr == "handoff" else s.get("lower_exit")
            if arr in ("mount", "relay", "handoff"):  # the real gcsfuse behind drainfs, as drainfs saw it
                res["gcsfuse_exit"] = json.dumps(le) if not isinstance(le, str) else le
            # The drop-in's first trigger (the sidecar mounter's SIGTERM to it), wall clock in ms:
            # the time from it to the sidecar's exit, without the sidecar mounter's own wait
            # before it (its 5 s poll of the exit file).
            trig = s.get("trigger") or (s.get("timings") or {}).get("trigger")
            if trig and "sidecar_exit_wall" in res:
                t_trig = datetime.datetime.fromisoformat(trig.replace("Z", "+00:00")).timestamp()
                res["from_sigterm_ms"] = (res["sidecar_exit_wall"] - t_trig) * 1000
        except (OSError, ValueError):
            pass
        objs = lowers.objects("gcsfuse", ctx.lowers_dir, prefix=prefix + "/")
        written = lost = 0
        for r in recs:
            if not r["closed"]:
                continue
            written += r["size"]
            o = objs.get(f"{prefix}/{r['name']}")
            if o is None or o["sha256"] != r["sha256"] or o["size"] != r["size"]:
                lost += r["size"]
        res["bytes_closed"], res["bytes_lost"] = written, lost
        res["close_failed"] = sum(1 for r in recs if not r["closed"])
        return res
    finally:
        if p.poll() is None:
            ctx.tracker.signal(p.pid, signal.SIGTERM)
            try:
                p.wait(40)
            except subprocess.TimeoutExpired:
                ctx.tracker.signal(p.pid, signal.SIGKILL)
                p.wait()
            ctx.tracker.reaped(p.pid)
        for m in (mnt, lower):
            if lowers.mountinfo_entry(m):
                lowers.unmount(m)
                res["left_mounted"] = True


def part_tail(ctx, raw):
    plan = [("native", ctx.p["tail_runs"]), ("exit-file", ctx.p["exit_file_runs"])]
    for stop, runs in plan:
        for n in range(runs):
            for k in range(len(ARRANGEMENTS)):
                arr = ARRANGEMENTS[(n + k) % len(ARRANGEMENTS)]
                r = tail_run(ctx, arr, stop, n)
                raw["tail"].append(r)
                log(f"tail {stop} {n + 1}/{runs} {arr}: {r['tail_ms']:.0f} ms, lost {r['bytes_lost']} B, "
                    f"sidecar exit {r.get('sidecar_exit')}, gcsfuse {r.get('gcsfuse_exit')}, "
                    f"{len(r.get('error_lines', []))} error-file lines")
                if r.get("left_mounted"):
                    raise BenchError(f"tail {arr} {stop} {n}: a mount was left behind")


# ---------------------------------------------------------------------------------------------
# table


def render(rows):
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    out = [" | ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()
           for r in rows]
    out.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(out)


def base_of(t):
    """The target `t`'s ratio is taken against (None for a baseline)."""
    if t in ("raw", "stock"):
        return None
    return BASE.get(t, "raw")


def med(xs):
    return statistics.median(xs) if xs else None


def throughput_table(ctx, raw):
    f = benchlib.fmt_num
    compared = [t for t in TARGETS if base_of(t)]
    goals = [t for t in compared if t in GOAL and t != "handoff"]
    rows = [["metric"] + [("raw gcsfuse" if t == "raw" else t) for t in TARGETS]
            + ["ratios " + " / ".join(f"{t}/{base_of(t)}" for t in compared),
               "goal met (0.95x mount, 0.9x relay; handoff: see its table)"]]
    for cache in CACHES:
        for key, _, _, unit in benchlib.FIO_JOBS:
            for nj in ctx.p["numjobs"]:
                m = {t: med(raw["fio"].get(f"{cache}/{key}/nj{nj}/{t}")) for t in TARGETS}
                ratios = {t: (m[t] / m[base_of(t)]) if m[t] is not None and m[base_of(t)] else None for t in compared}
                miss = [t for t in goals if ratios[t] is not None and ratios[t] < GOAL[t]]
                rows.append([f"cache {cache}: fio {key} nj{nj} ({unit})"] + [f(m[t]) for t in TARGETS]
                            + [" / ".join(f(ratios[t]) for t in compared),
                               ("yes" if not miss else "NO: " + ", ".join(miss)) if goals else ""])
        for th in ctx.p["md_threads"]:
            for ph in MD_PHASES:
                m = {t: med(raw["md"].get(f"{cache}/{ph}/t{th}/{t}")) for t in TARGETS}
                # us/op: the ratio is the base's time over the target's (higher is better, as for fio).
                ratios = {t: (m[base_of(t)] / m[t]) if m[t] and m[base_of(t)] else None for t in compared}
                rows.append([f"cache {cache}: mdbench {ph} {th}T (us/op)"] + [f(m[t]) for t in TARGETS]
                            + [" / ".join(f(ratios[t]) for t in compared), ""])
    rows.append(["drainfs CPU s over part 1"] + [(f(raw["drainfs_cpu_s"].get(f"off/{t}")) + " / "
                                                  + f(raw["drainfs_cpu_s"].get(f"on/{t}")))
                                                 if f"off/{t}" in raw["drainfs_cpu_s"] else "" for t in TARGETS]
                + ["cache off / on", ""])
    return render(rows)


def cpu_table(ctx, raw):
    """CPU-seconds per GiB moved, gcsfuse / drainfs, per fio job and target (medians)."""
    f = benchlib.fmt_num
    rows = [["CPU s per GiB (gcsfuse / drainfs)"] + TARGETS]
    for cache in CACHES:
        for key, _, _, _ in benchlib.FIO_JOBS:
            for nj in ctx.p["numjobs"]:
                row = [f"cache {cache}: fio {key} nj{nj}"]
                for t in TARGETS:
                    v = raw["cpu_per_gib"].get(f"{cache}/{key}/nj{nj}/{t}")
                    if not v:
                        row.append("")
                        continue
                    g = statistics.median(x[0] for x in v)
                    d = statistics.median(x[1] for x in v)
                    row.append(f"{f(g)} / {f(d)}" if t not in ("raw", "stock", "stock-b") else f(g))
                rows.append(row)
    return render(rows)


def per_rep_ratios(xs, base):
    """xs[i] / base[i] for each repetition i (the runs of one repetition are interleaved)."""
    return [x / b for x, b in zip(xs or [], base or []) if b]


def spread_text(rs):
    f = benchlib.fmt_num
    return f"{f(min(rs))}-{f(max(rs))}" if rs else ""


def handoff_verdicts(ctx, raw):
    """The hand-off's goals, per fio job: throughput >= 0.98x of stock (gcsfuse through the
    same fd hand-off) and CPU per GiB (gcsfuse + drainfs) equal to stock's, each the median of
    the interleaved repetitions, judged against stock-b's distance from stock in the same runs
    (raw gcsfuse against itself). Returns (rows of the throughput table, rows of the CPU table,
    summary lines)."""
    f = benchlib.fmt_num
    reps = ctx.p["reps"]
    judged = reps >= HANDOFF_MIN_REPS
    have_b = "stock-b" in TARGETS
    goal = GOAL["handoff"]
    trows = [["fio job (cache, job, numjobs)", "stock", "stock-b", "handoff", "stock-b/stock (runs)",
              "handoff/stock (runs)", f"goal >= {goal}x"]]
    crows = [["CPU s per GiB (cache, job, numjobs)", "stock gcsfuse", "stock-b gcsfuse", "handoff gcsfuse + drainfs",
              "stock-b/stock", "handoff/stock", f"goal: equal (+{HANDOFF_CPU_TOLERANCE:.0%} or stock's spread)"]]
    t_met = t_total = c_met = c_total = 0
    t_miss, c_miss = [], []
    # The control: on how many jobs raw gcsfuse against itself (stock-b / stock) falls below
    # the same bar by the same medians.
    self_below = 0
    for cache in CACHES:
        for key, _, _, unit in benchlib.FIO_JOBS:
            for nj in ctx.p["numjobs"]:
                name = f"cache {cache}: {key} nj{nj}"
                k = f"{cache}/{key}/nj{nj}"
                v = {t: raw["fio"].get(f"{k}/{t}") for t in ("stock", "stock-b", "handoff")}
                m = {t: med(x) for t, x in v.items()}
                if m["stock"] and m["handoff"] is not None:
                    ratio = m["handoff"] / m["stock"]
                    self_r = m["stock-b"] / m["stock"] if m["stock-b"] is not None else None
                    noise = abs(self_r - 1) if self_r is not None else 0.0
                    t_total += 1
                    if self_r is not None and self_r < goal:
                        self_below += 1
                    if not judged:
                        verdict = f"not judged ({reps} reps < {HANDOFF_MIN_REPS})"
                    elif ratio >= goal:
                        verdict, t_met = "met", t_met + 1
                    elif have_b and ratio >= 1 - noise:
                        verdict, t_met = f"met within stock's own spread (+-{noise:.1%})", t_met + 1
                    else:
                        verdict = (f"NOT MET: {ratio:.3f}x, below the goal's {goal}"
                                   + (f" and below stock-b's distance from stock (1 - {noise:.1%})"
                                      if have_b else ", no stock-b to judge"))
                        t_miss.append(name)
                    trows.append([f"{name} ({unit})", f(m["stock"]), f(m["stock-b"]), f(m["handoff"]),
                                  f"{f(self_r)} ({spread_text(per_rep_ratios(v['stock-b'], v['stock']))})" if have_b else "",
                                  f"{f(ratio)} ({spread_text(per_rep_ratios(v['handoff'], v['stock']))})", verdict])
                c = {t: raw["cpu_per_gib"].get(f"{k}/{t}") for t in ("stock", "stock-b", "handoff")}
                cm = {t: med([sum(x) for x in c[t]]) if c[t] else None for t in c}
                if cm["stock"] and cm["handoff"] is not None:
                    ratio = cm["handoff"] / cm["stock"]
                    self_r = cm["stock-b"] / cm["stock"] if cm["stock-b"] is not None else None
                    allow = max(HANDOFF_CPU_TOLERANCE, abs(self_r - 1) if self_r is not None else 0.0)
                    d = med([x[1] for x in c["handoff"]])
                    c_total += 1
                    if not judged:
                        verdict = f"not judged ({reps} reps < {HANDOFF_MIN_REPS})"
                    elif ratio <= 1 + allow:
                        verdict, c_met = "met", c_met + 1
                    else:
                        verdict = f"NOT MET: +{ratio - 1:.1%} (allowed +{allow:.1%})"
                        c_miss.append(name)
                    crows.append([name, f(cm["stock"]), f(cm["stock-b"]), f"{f(cm['handoff'])} (drainfs {f(d)})",
                                  f(self_r), f(ratio), verdict])
    if judged:
        lines = [f"handoff throughput >= {goal}x of stock: met on {t_met} of {t_total} fio jobs"
                 + (f"; NOT MET on: {', '.join(t_miss)}" if t_miss else ""),
                 f"handoff CPU per GiB equal to stock's: met on {c_met} of {c_total} fio jobs"
                 + (f"; NOT MET on: {', '.join(c_miss)}" if c_miss else "")]
        if have_b:
            lines.append(f"control: stock-b / stock (raw gcsfuse against itself) below {goal}x by the same medians "
                         f"on {self_below} of {t_total} fio jobs")
    else:
        lines = [f"handoff goals NOT JUDGED: {reps} interleaved reps, the goals need at least {HANDOFF_MIN_REPS} (--reps)"]
    if not have_b:
        lines.append("no stock-b target: the spread of stock against itself is unknown (add stock-b to --targets)")
    else:
        lines += handoff_pooled(raw)
    return trows, crows, lines


def handoff_pooled(raw, resamples=4000):
    """Every fio job and repetition at once: the geometric means of the per-repetition ratios
    handoff/stock and stock-b/stock (each repetition ran the three targets back to back, in an
    order rotated per repetition, so a pair shares the machine's state), their quotient (the hand-off against stock's own noise)
    with a 95% bootstrap interval over the pairs (seeded: the same data give the same
    interval), and the same for CPU per GiB (gcsfuse + drainfs). Lines of text; none without
    stock-b."""
    import math
    fio, cpu = raw.get("fio", {}), raw.get("cpu_per_gib", {})
    jobs = sorted({k.rsplit("/", 1)[0] for k in fio if k.endswith("/stock")})
    lh, lb, ch, cb = [], [], [], []
    for j in jobs:
        s, b, h = fio.get(f"{j}/stock"), fio.get(f"{j}/stock-b"), fio.get(f"{j}/handoff")
        if s and b and h:
            for x, y, z in zip(s, b, h):
                if x > 0 and y > 0 and z > 0:
                    lh.append(math.log(z / x))
                    lb.append(math.log(y / x))
        s, b, h = cpu.get(f"{j}/stock"), cpu.get(f"{j}/stock-b"), cpu.get(f"{j}/handoff")
        if s and b and h:
            for x, y, z in zip(s, b, h):
                if x[0] > 0 and y[0] > 0 and sum(z) > 0:
                    ch.append(math.log(sum(z) / x[0]))
                    cb.append(math.log(y[0] / x[0]))
    if not lh:
        return []

    def gm(xs):
        return math.exp(statistics.fmean(xs))

    _, lo, hi = benchlib.geo_interval([a - b for a, b in zip(lh, lb)], resamples)
    out = [f"pooled over {len(jobs)} fio jobs x their reps ({len(lh)} pairs): throughput handoff/stock {gm(lh):.3f},"
           f" stock-b/stock {gm(lb):.3f} (geometric means of the per-rep ratios); handoff against stock-b's"
           f" distance {gm(lh) / gm(lb):.3f}, 95% bootstrap interval {lo:.3f}-{hi:.3f}"]
    if ch:
        _, lo, hi = benchlib.geo_interval([a - b for a, b in zip(ch, cb)], resamples)
        out.append(f"pooled CPU per GiB ({len(ch)} pairs): handoff (gcsfuse + drainfs)/stock {gm(ch):.3f},"
                   f" stock-b/stock {gm(cb):.3f}; handoff against stock-b's distance {gm(ch) / gm(cb):.3f},"
                   f" 95% bootstrap interval {lo:.3f}-{hi:.3f}")
    return out


def profile_lines(raw):
    """The relay's instrument, per relay target: time in its two hops, READ/WRITE sizes."""
    out = []
    for k, p in sorted(raw["relay_profile"].items()):
        if not p:
            continue
        out.append(f"{k}: to_daemon {p['to_daemon']['count']} msgs mean {p['to_daemon']['mean_us']:.1f} us; "
                   f"to_kernel {p['to_kernel']['count']} msgs mean {p['to_kernel']['mean_us']:.1f} us; "
                   f"READ sizes {p['read_sizes']}; WRITE sizes {p['write_sizes']}")
    return out


def tail_verdict(ms):
    """The hand-off's tail goals (p50 <= 15 ms, p95 <= 50 ms) on `ms`."""
    if not ms:
        return "no measurement"
    p50, p95 = pct_nearest(ms, 0.5), pct_nearest(ms, 0.95)
    miss = [f"{k} {v:.0f} > {TAIL_GOAL_MS[k]}" for k, v in (("p50", p50), ("p95", p95)) if v > TAIL_GOAL_MS[k]]
    return "met" if not miss else "NOT MET: " + ", ".join(miss)


def tail_table(ctx, raw):
    """One row per stop and arrangement. `from SIGTERM`: from the drop-in's first trigger (the
    sidecar mounter's SIGTERM to it, in drainfs's summary) to the sidecar's exit, which for the
    exit file leaves out the sidecar mounter's own poll; the hand-off's goal is judged on the
    tail for the native stop and on `from SIGTERM` for the exit file."""
    rows = [["stop", "arrangement", "runs", "tail p50 (ms)", "tail p95 (ms)", "max (ms)",
             "stop -> exit p50 / p95 (ms)", "from SIGTERM p50 / p95 (ms)", f"handoff goal (p50 <= {TAIL_GOAL_MS['p50']}, p95 <= {TAIL_GOAL_MS['p95']})",
             "bytes closed", "bytes lost", "sidecar exit", "the sidecar on its child", "gcsfuse exit", "drainfs outcome",
             "error-file lines"]]
    verdicts = []
    for stop in ("native", "exit-file"):
        for arr in ARRANGEMENTS:
            rs = [r for r in raw["tail"] if r["arrangement"] == arr and r["stop"] == stop]
            if not rs:
                continue
            ms = [r["tail_ms"] for r in rs]
            ss = [r["stop_ms"] for r in rs if r.get("stop_ms") is not None]
            fs = [r["from_sigterm_ms"] for r in rs if r.get("from_sigterm_ms") is not None]

            def counts(k):
                c = {}
                for r in rs:
                    c[str(r.get(k))] = c.get(str(r.get(k)), 0) + 1
                return ", ".join(f"{v}x {k2}" for k2, v in sorted(c.items(), key=lambda kv: -kv[1]))
            err = {}
            for r in rs:
                for line in r.get("error_lines", []):
                    err[line[:80]] = err.get(line[:80], 0) + 1
            goal = "-"
            if arr == "handoff":
                goal = tail_verdict(ss if stop == "native" else fs)
                verdicts.append(f"handoff tail, {stop} ({'the SIGTERM to the sidecar mounter' if stop == 'native' else 'the drop-in SIGTERM'}"
                                f" -> sidecar exit, {len(rs)} runs): {goal}")
                if stop == "native" and goal != "met" and not ctx.p["tail_stop_delay"]:
                    verdicts.append("(the hand-off ends gcsfuse once its I/O counters stood still for the idle window, "
                                    "500 ms by default, counting stillness before the stop, and 2 s after an exchange the "
                                    "kernel's timestamps cannot order: a stop right after the last close() waits out "
                                    "the rest; --tail-stop-delay 2.5 measures a stop with gcsfuse idle; see "
                                    "docs/deploy-gke-managed.md)")
            rows.append([stop, arr if arr != "mount" else "mount (drainfs run)", len(rs), f"{pct_nearest(ms, 0.5):.0f}",
                         f"{pct_nearest(ms, 0.95):.0f}", f"{max(ms):.0f}",
                         f"{pct_nearest(ss, 0.5):.0f} / {pct_nearest(ss, 0.95):.0f}" if ss else "-",
                         f"{pct_nearest(fs, 0.5):.0f} / {pct_nearest(fs, 0.95):.0f}" if fs else "-", goal,
                         sum(r["bytes_closed"] for r in rs),
                         sum(r["bytes_lost"] for r in rs), counts("sidecar_exit"),
                         counts("sidecar_child") if arr != "mount" else "-", counts("gcsfuse_exit"),
                         counts("drainfs_outcome") if arr != "stock" else "-",
                         "; ".join(f"{v}x {k}" for k, v in err.items()) if arr != "mount" else "(no sidecar)"])
    return render(rows) + ("\n" + "\n".join(verdicts) if verdicts else "")


# ---------------------------------------------------------------------------------------------
# main


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", required=True, help="empty scratch directory (gcsfuse.sh makes it and cleans it up)")
    ap.add_argument("--bin-dir", required=True, help="directory holding drainfs, mdbench and fake-node-driver")
    ap.add_argument("--results", help="results directory (default fuse-tests/bench/results/gcsfuse-<time>[-smoke])")
    ap.add_argument("--smoke", action="store_true", help="every part once with tiny sizes (CI)")
    ap.add_argument("--reps", type=int, help="repetitions of part 1 (default 5, smoke 1; the hand-off's goals "
                    "are judged with at least 5)")
    ap.add_argument("--runtime", help="fio runtime per job (default 5s, smoke 300ms)")
    ap.add_argument("--ramp", help="fio ramp time (default 1s, smoke 0)")
    ap.add_argument("--size", help="fio file size per job (default 64M, smoke 4M)")
    ap.add_argument("--md-files", type=int, help="mdbench files (default 500, smoke 16)")
    ap.add_argument("--numjobs", help="fio numjobs, comma-separated (default 1,4, smoke 1)")
    ap.add_argument("--md-threads", help="mdbench threads, comma-separated (default 1,4, smoke 1)")
    ap.add_argument("--tail-runs", type=int, help="tail runs per arrangement, native SIGTERM (default 20, smoke 1)")
    ap.add_argument("--exit-file-runs", type=int, help="tail runs per arrangement, exit file (default 5, smoke 0)")
    ap.add_argument("--tail-stop-delay", type=float, help="part 2: seconds between the application's exit and "
                    "the stop (default 0: right after it)")
    ap.add_argument("--parts", default="throughput,tail", help="which parts to run (default throughput,tail)")
    ap.add_argument("--targets", help="part 1's targets, comma-separated, raw first (default "
                    + ",".join(TARGETS) + "; also: relay-0s, relay-capped)")
    ap.add_argument("--cpu-limit", type=float, help="part 1: run every target's processes (gcsfuse, drainfs, "
                    "fake-node-driver) in a cgroup of its own limited to this many CPUs, as a sidecar's cpu limit "
                    "(0.25, 1); fio is not limited")
    ap.add_argument("--gcsfuse", help="the gcsfuse binary to run (default: scripts/install-lowers.sh's v3.11.2)")
    ap.add_argument("--fio-jobs", help="part 1's fio jobs, comma-separated (default all: "
                    + ",".join(j[0] for j in benchlib.FIO_JOBS) + ")")
    ap.add_argument("--caches", default="off,on", help="gcsfuse's file cache in part 1: off, on or both (default off,on)")
    ap.add_argument("--wan", metavar="RTT_MS,MIBPS", help="the bucket as a cloud VM reaches Cloud Storage: HTTPS "
                    "through toxiproxy adding RTT_MS of round trip and capping each connection at MIBPS MiB/s each way "
                    "(e.g. 10,100; needs scripts/k8s-node/install.sh toxiproxy, which gcsfuse.sh runs)")
    ap.add_argument("--toxiproxy", default=os.path.join(os.environ.get("K8S_NODE_ROOT", "/opt/drainfs-k8s"), "bin",
                                                         "toxiproxy-server"),
                    help="toxiproxy-server for --wan (default $K8S_NODE_ROOT/bin/toxiproxy-server)")
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("gcsfuse bench: must run as root")
    for s in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, lambda *_: sys.exit(143))

    ctx = Ctx()
    ctx.profile = "smoke" if a.smoke else "full"
    ctx.p = dict(PROFILES[ctx.profile])
    for k in ("reps", "runtime", "ramp", "size", "md_files", "tail_runs", "exit_file_runs", "tail_stop_delay"):
        if getattr(a, k) is not None:
            ctx.p[k] = getattr(a, k)
    for k in ("numjobs", "md_threads"):
        if getattr(a, k):
            ctx.p[k] = [int(x) for x in getattr(a, k).split(",")]
    caches = a.caches.split(",")
    if not caches or len(set(caches)) != len(caches) or not set(caches) <= {"off", "on"}:
        sys.exit(f"gcsfuse bench: --caches takes off, on or off,on, not {a.caches!r}")
    CACHES[:] = caches
    if a.fio_jobs:
        known = [j[0] for j in benchlib.FIO_JOBS]
        jobs = a.fio_jobs.split(",")
        if len(set(jobs)) != len(jobs) or not set(jobs) <= set(known):
            sys.exit(f"gcsfuse bench: --fio-jobs names some of {','.join(known)}, not {a.fio_jobs!r}")
        benchlib.FIO_JOBS[:] = [j for j in benchlib.FIO_JOBS if j[0] in jobs]
    parts = set(a.parts.split(","))
    if not parts or not parts <= {"throughput", "tail"}:
        sys.exit(f"gcsfuse bench: --parts takes throughput, tail or both, not {a.parts!r}")
    if a.targets:
        chosen = a.targets.split(",")
        if (len(chosen) < 2 or len(set(chosen)) != len(chosen) or any(t not in KNOWN_TARGETS for t in chosen)
                or any(base_of(t) and base_of(t) not in chosen[:i] for i, t in enumerate(chosen))):
            sys.exit(f"gcsfuse bench: --targets names some of {KNOWN_TARGETS}, each after the target it is compared "
                     f"with (raw for drainfs run and the relay, stock for stock-b and handoff): e.g. "
                     f"raw,relay or stock,stock-b,handoff")
        TARGETS[:] = chosen
    elif a.smoke:
        # The smoke proves the harness: stock-b runs stock's code again; it stays out to keep
        # the smoke short.
        TARGETS.remove("stock-b")
    ctx.work = os.path.abspath(a.workdir)
    ctx.logs = os.path.join(ctx.work, "logs")
    ctx.lowers_dir = os.path.join(ctx.work, "lowers")
    os.makedirs(ctx.logs, exist_ok=True)
    # Private copies (a concurrent cargo build must not swap them mid-run), readable by uid 65534.
    bindir = os.path.join(ctx.work, "bin")
    os.makedirs(bindir)
    for name, path in private_bins(a.bin_dir, bindir, ("drainfs", "mdbench", "fake-node-driver"), "gcsfuse bench").items():
        setattr(ctx, name.replace("-", "_"), path)
    # The drop-in: drainfs under the name gcsfuse (the sidecar mounter runs it as uid 65534).
    ctx.dropin = os.path.join(ctx.work, "dropin", "gcsfuse")
    os.makedirs(os.path.dirname(ctx.dropin))
    shutil.copy2(ctx.drainfs, ctx.dropin)
    try:
        ctx.gcsfuse = lowers.binary("gcsfuse")
        if a.gcsfuse:
            # A private copy, executable by the sidecar's uid 65534 (part 2's stock arrangement too).
            ctx.gcsfuse = os.path.join(bindir, "gcsfuse")
            shutil.copy(a.gcsfuse, ctx.gcsfuse)
            os.chmod(ctx.gcsfuse, 0o755)
        ctx.sidecar_mounter = lowers.binary("gcs-fuse-csi-driver-sidecar-mounter")
        lowers.binary("fake-gcs-server")
    except lowers.LowersError as e:
        sys.exit(f"gcsfuse bench: {e}")
    ctx.results = a.results or os.path.join(HERE, "results", "gcsfuse-" + time.strftime("%Y%m%d-%H%M%S")
                                            + ("-smoke" if a.smoke else ""))
    os.makedirs(ctx.results, exist_ok=True)
    ctx.tracker = benchlib.Tracker(ctx.work)
    if a.cpu_limit is not None:
        try:
            ctx.cpu = CpuLimit(a.cpu_limit, ctx.work)
        except (BenchError, OSError) as e:
            sys.exit(f"gcsfuse bench: {e}")
    if a.wan:
        try:
            ctx.wan = Wan(a.wan, a.toxiproxy)
        except BenchError as e:
            sys.exit(f"gcsfuse bench: {e}")
    versions = {
        "gcsfuse": subprocess.run([ctx.gcsfuse, "--version"], stdout=subprocess.PIPE, text=True).stdout.strip(),
        "sidecar_mounter": "gcs-fuse-csi-driver v1.24.4 (scripts/install-lowers.sh)",
        "fio": subprocess.run(["fio", "--version"], stdout=subprocess.PIPE, text=True).stdout.strip(),
        "git_head": subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], stdout=subprocess.PIPE,
                                   text=True).stdout.strip(),
    }
    raw = {"fio": {}, "md": {}, "drainfs_cpu_s": {}, "cpu_per_gib": {}, "relay_profile": {}, "throttled_s": {}, "stops": {},
           "data_path": {}, "tail": []}
    t0 = time.monotonic()
    load_start = benchlib.loadavg()
    ok = False
    cpu_server0 = None
    try:
        if ctx.wan:
            ctx.server = ctx.wan.start(ctx)
        else:
            ctx.server = lowers.start_server("gcsfuse", ctx.lowers_dir)
            ctx.tracker.add(ctx.server["pid"])
        log(f"profile {ctx.profile}: {ctx.p}; fake-gcs-server on port {ctx.server['port']}, gcsfuse's endpoint "
            f"{ctx.server['gcs_endpoint']}; work dir {ctx.work}")
        cpu_server0 = proc_cpu_secs(ctx.server["pid"])
        cpu_proxy0 = proc_cpu_secs(ctx.wan.proc.pid) if ctx.wan else 0.0
        if "throughput" in parts:
            part_throughput(ctx, raw)
        if "tail" in parts:
            part_tail(ctx, raw)
        ok = True
    except BenchError as e:
        log(f"FAILED: {e}")
    except Exception:  # noqa: BLE001 -- report, clean up, still write what we have
        import traceback
        log("FAILED:\n" + traceback.format_exc())
    except (KeyboardInterrupt, SystemExit):
        log("interrupted")
    finally:
        if cpu_server0 is not None:
            raw["server_cpu_s"] = proc_cpu_secs(ctx.server["pid"]) - cpu_server0
            if ctx.wan:
                raw["proxy_cpu_s"] = proc_cpu_secs(ctx.wan.proc.pid) - cpu_proxy0
        if ctx.wan:
            ctx.wan.stop(ctx)
        try:
            lowers.stop(ctx.lowers_dir)
        except Exception as e:  # noqa: BLE001
            log(f"stopping fake-gcs-server: {e}")
        if ctx.cpu:
            ctx.cpu.close()

    elapsed = time.monotonic() - t0
    limit = f"; every target limited to {ctx.cpu.cpus:g} CPU ({'cpu.max' if ctx.cpu.v2 else 'cfs quota'})" if ctx.cpu else ""
    backend = "fake-gcs-server (memory backend" + (f"; {ctx.wan.describe()}" if ctx.wan else "") + ")"
    cpu_note = ""
    if "server_cpu_s" in raw:
        cpu_note = f"; fake-gcs-server {raw['server_cpu_s']:.0f} CPU s" + (
            f", toxiproxy {raw['proxy_cpu_s']:.0f} CPU s" if "proxy_cpu_s" in raw else "")
    header = (f"drainfs over real gcsfuse ({versions['gcsfuse']}) on {backend}{limit}{cpu_note}, "
              f"{ctx.profile}: {ctx.p['reps']} reps interleaved, medians; fio {ctx.p['runtime']} (ramp {ctx.p['ramp']}) "
              f"x {ctx.p['size']}/job; mdbench {ctx.p['md_files']} files; kernel {platform.release()}, {os.cpu_count()} CPUs; "
              f"{elapsed:.0f} s; loadavg start {load_start}, end {benchlib.loadavg()}; git {versions['git_head']}")
    out = [header]
    if raw["fio"]:
        out += ["", "Part 1: throughput (ratios to the baseline with the same cache setting: raw gcsfuse on a "
                "directory, or for stock-b and handoff stock, gcsfuse through the sidecar mounter's fd hand-off)", throughput_table(ctx, raw)]
        out += ["", "CPU-seconds per GiB moved (fio's bytes), medians", cpu_table(ctx, raw)]
        if "handoff" in TARGETS:
            trows, crows, lines = handoff_verdicts(ctx, raw)
            raw["handoff_goals"] = lines
            out += ["", f"The hand-off against stock gcsfuse through the same fd hand-off (the real sidecar mounter), "
                    f"medians of {ctx.p['reps']} interleaved reps; stock-b is stock again (its own gcsfuse), the spread "
                    f"of raw gcsfuse against itself; (runs) = lowest-highest of the per-rep ratios",
                    render(trows), "", render(crows)] + lines
        prof = profile_lines(raw)
        if prof:
            out += ["", "The relay's instrument (whole part 1, from its summary)"] + prof
        if raw["throttled_s"]:
            out.append("CPU-limit throttling over part 1 (s): " + ", ".join(
                f"{k} {v:.1f}" for k, v in sorted(raw["throttled_s"].items())))
        dp = raw["data_path"].get("off/auto")
        if dp:
            out.append("drainfs auto on fuse.gcsfuse: " + dp[-220:])
    if raw["tail"]:
        out += ["", f"Part 2: end-of-Job tail through the real sidecar mounter ({ctx.p['tail_files']} files x "
                f"{ctx.p['tail_file_size'] >> 20} MiB, stop "
                + (f"{ctx.p['tail_stop_delay']:g} s after" if ctx.p["tail_stop_delay"] else "right after")
                + " the application's exit)", tail_table(ctx, raw)]
    meta = {"profile": ctx.profile, "params": ctx.p, "ok": ok, "elapsed_s": elapsed, "versions": versions,
            "loadavg_start": load_start, "caches": CACHES, "fio_jobs": [j[0] for j in benchlib.FIO_JOBS],
            "wan": {"rtt_ms": ctx.wan.rtt_ms, "mibps_per_connection": ctx.wan.mibps, "tls": True} if ctx.wan else None}
    benchlib.write_results(ctx.results, "\n".join(out), {"meta": meta, "raw": raw}, logs=ctx.logs)
    log(f"results in {ctx.results}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
