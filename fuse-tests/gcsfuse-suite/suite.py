#!/usr/bin/env python3
"""gcsfuse v3.11.2's own integration tests as a parity test of drainfs's data paths. Python 3
stdlib only; run it through run.sh (which builds, makes the work directory and cleans up).

One fake-gcs-server (memory backend) on 127.0.0.1, a fresh bucket per mount. For every test
package and flag set (those of gcsfuse's tools/integration_tests/run_tests_mounted_directory.sh,
static mounts over HTTP), each data path gets its own mount, and the package's test binary
(built by build.sh) runs against it in mounted-directory mode (`--mountedDirectory`,
`--testbucket`, `--config-file test_config.yaml` with MOUNTED_DIR and BUCKET_NAME), with
STORAGE_EMULATOR_HOST pointing its own storage client at the server:

- `raw`:     gcsfuse on a directory (as root, as the upstream script mounts it);
- `auto`:    `drainfs run` (default `--passthrough auto`) over gcsfuse on its lower;
- `never`:   the same with `--passthrough never`;
- `relay`:   drainfs as the gcsfuse drop-in under GKE's real sidecar mounter (v1.24.4, uid
             65534, no capabilities), the mount made by `fake-node-driver` in CSI mode, the
             real gcsfuse behind it (DRAINFS_REAL_GCSFUSE);
- `sidecar`: the same with the stock gcsfuse as the sidecar's child (the relay's baseline;
             not in --smoke unless asked for with --paths).

Every test's result (top-level tests and subtests, from `go test -v` lines) goes into a table
per data path. Parity: a test that passes on raw gcsfuse but not on a drainfs path (auto,
never, relay) is a regression, unless it fails on the stock sidecar too (relay only, when that
path ran). Failures on raw gcsfuse (fake-gcs-server's or this host's) are listed, not hidden.
Exit 0 with parity, 1 with a regression or an infrastructure error (a mount that does not come
up, a mount left behind).

Every process started here is tracked by PID (WORK/pids) for run.sh's trap; nothing is killed
by name. Every wait is bounded. A mount that does not unmount gets its FUSE connection aborted
(only one this run made: the device number recorded when it came up, checked against the mount
at the same path before the abort), then a lazy unmount.
"""

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.parse

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "fuse-tests", "bench"))
sys.path.insert(0, os.path.join(REPO, "scripts"))

import benchlib  # noqa: E402  (Tracker, wait_for, private_bins, write_results)
import lowers  # noqa: E402  (fake-gcs-server, mountinfo, binaries)
from benchlib import SIDECAR_UID, BenchError, wait_for  # noqa: E402

log = benchlib.make_log("gcsfuse-suite")

# Static-mount flag sets of run_tests_mounted_directory.sh (v3.11.2), HTTP (the default
# protocol); the first of each package is the one --smoke uses.
FLAG_SETS = {
    "operations": [["--implicit-dirs=true"], ["--implicit-dirs=false"],
                   ["--kernel-list-cache-ttl-secs=-1", "--implicit-dirs"], ["--experimental-enable-json-read"]],
    "rename_dir_limit": [["--rename-dir-limit=3", "--implicit-dirs"], ["--rename-dir-limit=3"]],
    "implicit_dir": [["--implicit-dirs"]],
    "explicit_dir": [["--implicit-dirs=false"]],
    "local_file": [["--implicit-dirs=true", "--rename-dir-limit=3", "--enable-streaming-writes=false"],
                   ["--implicit-dirs=false", "--rename-dir-limit=3", "--enable-streaming-writes=false"]],
    "streaming_writes": [["--rename-dir-limit=3", "--write-block-size-mb=1", "--write-max-blocks-per-file=2",
                          "--write-global-max-blocks=-1"]],
    "readonly": [["--o=ro", "--implicit-dirs=true"], ["--file-mode=544", "--dir-mode=544", "--implicit-dirs=true"]],
    "concurrent_operations": [["--implicit-dirs=true", "--kernel-list-cache-ttl-secs=-1"]],
    "read_large_files": [["--implicit-dirs"]],
}
SMOKE_PACKAGES = ["rename_dir_limit", "operations", "implicit_dir", "explicit_dir", "local_file", "streaming_writes", "readonly"]
PATHS = ["raw", "auto", "never", "relay", "sidecar"]
SMOKE_PATHS = ["raw", "auto", "never", "relay"]
DRAINFS_PATHS = ["auto", "never", "relay"]
# What gcsfuse needs against fake-gcs-server (/work/shared/REAL-PEERS.md §2.2), without
# --implicit-dirs (each flag set says) and without --foreground (added for a directory mount;
# the sidecar mounter adds it itself).
EMULATOR_FLAGS = ["--anonymous-access", "--enable-hns=false", "--enable-atomic-rename-object=false",
                  "--disable-autoconfig"]
# The sidecar mounter drops these options with a warning (DisallowedFlags): a flag set with one
# does not mean the same through it.
SIDECAR_DISALLOWED = ("o", "log-file", "log-format", "cache-dir", "temp-dir", "config-file", "foreground")
RESULT_RE = re.compile(r"^\s*--- (PASS|FAIL|SKIP): (\S+) \(")
RUN_RE = re.compile(r"^=== (RUN|CONT|PAUSE)\s+(\S+)")
ABBREV = {"PASS": "pass", "FAIL": "FAIL", "SKIP": "skip"}


class Ctx:
    def __init__(self):
        # Differences listed in KNOWN that this run saw (printed, not counted).
        self.known = []


def fuse_dev(mountpoint):
    """The device number `0:N` of the mount at `mountpoint` (the top one), or None."""
    mp = os.path.realpath(mountpoint)
    found = None
    with open("/proc/self/mountinfo") as f:
        for line in f:
            parts = line.split()
            if parts[4].encode().decode("unicode_escape") == mp:
                found = parts[2]
    return found


def release(mountpoint, dev):
    """Unmounts `mountpoint`: a plain unmount, else (busy or dead) abort the FUSE connection
    `dev` if the mount there still has that device number (it is the one this run made), then
    a lazy unmount. Returns what was done."""
    if not lowers.mountinfo_entry(mountpoint):
        return "not mounted"
    r = subprocess.run(["fusermount3", "-u", mountpoint], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       timeout=30)
    if r.returncode == 0 and not lowers.mountinfo_entry(mountpoint):
        return "unmounted"
    done = []
    if dev and fuse_dev(mountpoint) == dev:
        abort = f"/sys/fs/fuse/connections/{dev.split(':')[1]}/abort"
        try:
            with open(abort, "w") as f:
                f.write("1")
            done.append(f"aborted connection {dev}")
        except OSError as e:
            done.append(f"abort {abort}: {e}")
    subprocess.run(["umount", "-l", mountpoint], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=30)
    done.append("lazily unmounted" if not lowers.mountinfo_entry(mountpoint) else "STILL MOUNTED")
    return ", ".join(done)


def drop_bucket(ctx, name):
    """Deletes the bucket's objects and the bucket (the server keeps them in memory)."""
    port, q = ctx.server["port"], urllib.parse.quote(name, safe="")
    for _ in range(100):
        status, body = lowers.http_request(port, "GET", f"/storage/v1/b/{q}/o?maxResults=1000")
        items = json.loads(body).get("items", []) if status == 200 else []
        for it in items:
            lowers.http_request(port, "DELETE", f"/storage/v1/b/{q}/o/{urllib.parse.quote(it['name'], safe='')}")
        if not items:
            break
    lowers.http_request(port, "DELETE", f"/storage/v1/b/{q}")


def create_bucket(ctx, name):
    status, body = lowers.http_request(ctx.server["port"], "POST", "/storage/v1/b?project=test",
                                       json.dumps({"name": name}).encode(), {"Content-Type": "application/json"})
    if status != 200:
        raise BenchError(f"creating bucket {name}: HTTP {status}: {body[:200]!r}")


class Target:
    """One data path over its own gcsfuse and bucket, mounted at self.mnt."""

    def __init__(self, ctx, path, tag, flags):
        self.ctx, self.path, self.flags = ctx, path, flags
        self.key = f"{tag}/{path}"
        self.bucket = re.sub(r"[^a-z0-9-]", "-", f"b-{tag}-{path}".lower())[:63]
        # Short paths: the sidecar's socket (<dir>/base/<vol>/socket) must fit in sun_path.
        ctx.n_targets = getattr(ctx, "n_targets", 0) + 1
        self.n = ctx.n_targets
        self.dir = os.path.join(ctx.work, "t", f"{self.n}")
        self.name = f"{tag}-{path}"
        self.mnt, self.lower, base = (os.path.join(self.dir, x) for x in ("mnt", "lower", "base"))
        self.log_path = os.path.join(ctx.logs, f"{tag}-{path}.log")
        self.summary = os.path.join(self.dir, "summary.json")
        self.proc, self.lines, self.devs = None, [], {}
        for d in (self.dir, self.mnt, self.lower, base):
            os.makedirs(d, exist_ok=True)
        self.sidecar = path in ("relay", "sidecar")
        if self.sidecar:
            os.chown(self.dir, SIDECAR_UID, SIDECAR_UID)
        self.base = base

    def applicable(self):
        """None, or why this flag set means something else through the sidecar mounter."""
        if self.sidecar:
            dropped = [f for f in self.flags if f.lstrip("-").split("=")[0] in SIDECAR_DISALLOWED]
            if dropped:
                return f"the sidecar mounter drops {' '.join(dropped)}"
        return None

    def gcsfuse_argv(self, mountpoint):
        log_file = os.path.join(self.dir, "gcsfuse.log")
        return [self.ctx.gcsfuse, "--foreground", *EMULATOR_FLAGS, f"--custom-endpoint={self.ctx.endpoint}",
                "--log-format=text", f"--log-file={log_file}", "--log-severity=info", *self.flags,
                self.bucket, mountpoint]

    def sidecar_argv(self):
        vol = f"drainfs-bench-s{os.getpid()}-{self.n}"
        with open(os.path.join(self.ctx.work, "global-dirs"), "a") as f:
            f.write(f"/gcsfuse-tmp/.volumes/{vol}\n/gcsfuse-buffer/.volumes/{vol}\n")
        opts = [f.lstrip("-") for f in EMULATOR_FLAGS + self.flags]
        opts += [f"custom-endpoint={self.ctx.endpoint}", "disable-metrics-for-gke:true", "logging:format:text",
                 "logging:severity:info"]
        cmd = [self.ctx.fake_node_driver, "--mountpoint", self.mnt, "--volume-base-path", self.base,
               "--volume-name", vol, "--bucket", self.bucket, "--stop", "native", "--grace-period", "30s",
               "--ready-timeout", "60s"]
        for o in opts:
            cmd += ["--mount-option", o]
        child = self.ctx.dropin if self.path == "relay" else self.ctx.gcsfuse
        return cmd + ["--", self.ctx.sidecar_mounter, f"--gcsfuse-path={child}"]

    def start(self):
        create_bucket(self.ctx, self.bucket)
        env = dict(os.environ)
        ready = os.path.join(self.dir, "ready")
        if self.path == "raw":
            cmd = self.gcsfuse_argv(self.mnt)
        elif self.path in ("auto", "never"):
            cmd = [self.ctx.drainfs, "run", "--lower", self.lower, "--mountpoint", self.mnt,
                   "--summary-file", self.summary, "--ready-file", ready]
            if self.path == "never":
                cmd += ["--passthrough", "never"]
            cmd += ["--", *self.gcsfuse_argv(self.lower)]
        else:
            cmd = self.sidecar_argv()
            env["DRAINFS_REAL_GCSFUSE"] = self.ctx.gcsfuse
            env["DRAINFS_DROPIN_MODE"] = "relay"  # the drop-in's default is the hand-off
            env["DRAINFS_SUMMARY_FILE"] = self.summary
        with open(self.log_path, "ab") as logf:
            logf.write(("$ " + " ".join(cmd) + "\n").encode())
            logf.flush()
            self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE if self.sidecar else subprocess.DEVNULL,
                                         stdout=subprocess.PIPE if self.sidecar else logf, stderr=logf, env=env,
                                         restore_signals=True, start_new_session=True)
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
            wait_for(ev.is_set, 90, f"{self.key}: fake-node-driver ready", self.proc, self.log_path)
        elif self.path == "raw":
            wait_for(lambda: (lowers.mountinfo_entry(self.mnt) or {}).get("fstype") == "fuse.gcsfuse", 60,
                     f"{self.key}: gcsfuse mounted", self.proc, self.log_path)
        else:
            wait_for(lambda: os.path.exists(ready), 60, f"{self.key}: drainfs ready", self.proc, self.log_path)
        for m in (self.mnt, self.lower):
            if lowers.mountinfo_entry(m):
                self.devs[m] = fuse_dev(m)
        return self

    def abort(self):
        """Ends this target's FUSE connections (a test stuck in the mount), top mount first."""
        for m in (self.mnt, self.lower):
            dev = self.devs.get(m)
            if dev and fuse_dev(m) == dev:
                try:
                    with open(f"/sys/fs/fuse/connections/{dev.split(':')[1]}/abort", "w") as f:
                        f.write("1")
                except OSError:
                    pass

    def stop(self, timeout=45.0):
        """Stops the target; returns a short description; raises BenchError on a mount left behind."""
        p = self.proc
        what = "not running"
        if p is not None and p.poll() is None:
            if self.path == "raw":
                r = subprocess.run(["fusermount3", "-u", self.mnt], stderr=subprocess.DEVNULL, timeout=30)
                if r.returncode != 0:
                    self.ctx.tracker.signal(p.pid, signal.SIGINT)
            elif self.sidecar:
                p.stdin.close()  # stdin EOF: fake-node-driver stops the sidecar the GKE way (SIGTERM)
            else:
                self.ctx.tracker.signal(p.pid, signal.SIGTERM)
            try:
                what = f"exit {p.wait(timeout)}"
            except subprocess.TimeoutExpired:
                self.abort()
                self.ctx.tracker.signal(p.pid, signal.SIGKILL)
                p.wait(30)
                what = f"did not exit within {timeout} s: killed"
        elif p is not None:
            what = f"had exited {p.returncode}"
        if p is not None:
            self.ctx.tracker.reaped(p.pid)
        glog = os.path.join(self.dir, "gcsfuse.log")
        if os.path.exists(glog):
            shutil.copyfile(glog, os.path.join(self.ctx.logs, f"{self.name}.gcsfuse.log"))
        if self.lines:
            with open(self.log_path, "a") as f:
                f.write("".join(f"fake-node-driver: {x}\n" for x in self.lines))
        left = [f"{m}: {release(m, self.devs.get(m))}" for m in (self.mnt, self.lower) if lowers.mountinfo_entry(m)]
        if left:
            raise BenchError(f"{self.key}: mount left behind ({'; '.join(left)}); {what}")
        return what


def run_binary(ctx, t, pkg, budget, skip, attempt):
    """One run of `pkg`'s test binary against the target, skipping the top-level tests in
    `skip`. Returns (results, tests still running at the end, exit code, timed out)."""
    src = os.path.join(ctx.suite_root, "src")
    env = dict(os.environ, STORAGE_EMULATOR_HOST=f"http://localhost:{ctx.server['port']}", MOUNTED_DIR=t.mnt,
               BUCKET_NAME=t.bucket, GODEBUG="asyncpreemptoff=1")
    # uid 0 (the mounts' files belong to uid 0) without the capabilities that bypass file
    # permissions: the permission checks apply as to the unprivileged user the upstream
    # scripts run the tests as (the readonly package's --file-mode=544 expects EACCES).
    cmd = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--",
           os.path.join(ctx.suite_root, "bin", f"{pkg}.test"), "-test.v", "-test.count=1",
           f"-test.timeout={max(budget - 15, 5):.0f}s", "--integrationTest", f"--mountedDirectory={t.mnt}",
           f"--testbucket={t.bucket}", f"--config-file={src}/tools/integration_tests/test_config.yaml"]
    if skip:
        cmd.append("-test.skip=^(" + "|".join(re.escape(x) for x in sorted(skip)) + ")$")
    out_path = os.path.join(ctx.logs, f"{t.name}.go-test.log")
    results, running = {}, set()
    with open(out_path, "ab") as out:
        out.write((f"$ [attempt {attempt}] " + " ".join(cmd) + "\n").encode())
        out.flush()
        p = subprocess.Popen(cmd, cwd=os.path.join(src, "tools", "integration_tests", pkg), env=env,
                             stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             restore_signals=True, start_new_session=True)
        ctx.tracker.add(p.pid)
        fired = threading.Event()

        def expire():
            fired.set()
            t.abort()
            ctx.tracker.signal(p.pid, signal.SIGKILL)

        timer = threading.Timer(budget, expire)
        timer.start()
        try:
            for raw in p.stdout:
                out.write(raw)
                line = raw.decode(errors="replace").rstrip("\n")
                m = RESULT_RE.match(line)
                if m:
                    results[m.group(2)] = ABBREV[m.group(1)]
                    running.discard(m.group(2))
                    continue
                m = RUN_RE.match(line)
                if m:
                    running.add(m.group(2))
                elif line.startswith("panic: test timed out after"):
                    fired.set()  # -test.timeout: the tests still running timed out
            p.wait(60)
        finally:
            timer.cancel()
            if p.poll() is None:
                expire()
                p.wait(30)
            ctx.tracker.reaped(p.pid)
    return results, running, p.returncode, fired.is_set()


def top_level_tests(ctx, pkg):
    """The package's top-level tests (`func TestX(t *testing.T)` in its _test.go files)."""
    d = os.path.join(ctx.suite_root, "src", "tools", "integration_tests", pkg)
    names = set()
    for root, _, files in os.walk(d):
        for fn in files:
            if fn.endswith("_test.go"):
                with open(os.path.join(root, fn), errors="replace") as f:
                    names |= set(re.findall(r"^func (Test\w+)\(\w+ \*testing\.T\)", f.read(), re.M))
    return names


def run_tests(ctx, t, pkg):
    """Runs `pkg`'s tests against the target; returns ({test: result}, status, notes). A binary
    that dies in a test (a panic after a failed assertion ends the whole binary) is run again
    on the same mount for the top-level tests it had not reached, so every test gets a result."""
    deadline = time.monotonic() + ctx.timeout
    every = top_level_tests(ctx, pkg)
    results, notes, status, attempt = {}, [], None, 0
    while True:
        attempt += 1
        done = {n for n in results if "/" not in n}
        res, running, rc, timed_out = run_binary(ctx, t, pkg, deadline - time.monotonic(), done, attempt)
        results.update(res)
        for name in running:
            results[name] = "timeout" if timed_out else "FAIL"
        left = every - {n for n in results if "/" not in n}
        if timed_out:
            status = f"timed out ({ctx.timeout} s budget)"
            break
        if rc == 0 or not left:
            break
        if not res:
            status = f"exit {rc} before any test"
            break
        died = sorted(n for n in set(res) | running if "/" not in n and results.get(n) != "pass")
        notes.append(f"the binary died (exit {rc}) after {', '.join(died[-1:]) or '?'}: run again for the rest")
        if deadline - time.monotonic() < 20:
            status = "no time left to run the rest after a crash"
            break
    return results, status, notes


def run_one(ctx, pkg, fi, flags, path):
    tag = f"{pkg}-{fi}"
    rec = {"package": pkg, "flags": " ".join(flags), "path": path, "tests": {}, "status": None}
    t = Target(ctx, path, tag, flags)
    why = t.applicable()
    if why:
        rec["status"] = f"n/a: {why}"
        return rec
    t0 = time.monotonic()
    try:
        t.start()
        rec["tests"], rec["status"], rec["notes"] = run_tests(ctx, t, pkg)
    except BenchError as e:
        rec["status"] = f"error: {e}"
    finally:
        try:
            rec["stop"] = t.stop()
        except BenchError as e:
            rec["stop"] = str(e)
            ctx.left_behind.append(str(e))
        try:
            drop_bucket(ctx, t.bucket)
        except (OSError, ValueError) as e:
            log(f"{t.key}: dropping bucket {t.bucket}: {e}")
    rec["seconds"] = round(time.monotonic() - t0, 1)
    n = {k: sum(1 for v in rec["tests"].values() if v == k) for k in ("pass", "FAIL", "skip")}
    log(f"{pkg} [{rec['flags']}] {path}: {n['pass']} pass, {n['FAIL']} fail, {n['skip']} skip"
        f"{', ' + rec['status'] if rec['status'] else ''} ({rec['seconds']} s; stop: {rec.get('stop')})")
    return rec


def render(rows):
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    out = [" | ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    out.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(out)


# Known differences: (package, test, data path) -> why. Each is printed with the verdict and
# does not count as a regression; one that passes again is a failure ("remove it from KNOWN"),
# so that this list never outlives its bug.
KNOWN = {}


def verdicts(ctx, recs):
    """(table rows for every test, list of regressions). A cell is pass/FAIL/skip/timeout, `-`
    (not run), or the run's status when the whole run did not happen."""
    by = {}
    for r in recs:
        by[(r["package"], r["flags"], r["path"])] = r
    rows, regressions = [], []
    for pkg, fi, flags in ctx.plan:
        fl = " ".join(flags)
        names = sorted({n for p in ctx.paths for n in by.get((pkg, fl, p), {}).get("tests", {})})
        names.append("(package)")
        for name in names:
            cells = {}
            for p in ctx.paths:
                r = by.get((pkg, fl, p))
                if r is None:
                    cells[p] = "-"
                elif r["status"] and r["status"].startswith("n/a"):
                    cells[p] = "n/a"
                elif name == "(package)":
                    cells[p] = "error" if r["status"] else "ok"
                else:
                    cells[p] = r["tests"].get(name, "error" if r["status"] else "-")
            good = ("pass", "ok")
            for p in DRAINFS_PATHS:
                if p not in cells or cells.get("raw") not in good or cells[p] in good + ("n/a", "skip"):
                    continue
                if cells[p] == "error" and name != "(package)":
                    continue  # the run failed: its (package) row says so once
                if cells[p] == "-" and ctx.interrupted:
                    continue  # never ran: the run was interrupted
                if p == "relay" and cells.get("sidecar") not in (None, "-", "n/a") and cells["sidecar"] not in good:
                    continue  # fails through the stock sidecar mounter too: not the relay's
                if (pkg, name, p) in KNOWN:
                    ctx.known.append(f"{pkg} [{fl}] {name}: raw {cells['raw']}, {p} {cells[p]}: "
                                     f"{KNOWN[(pkg, name, p)]}")
                    continue
                regressions.append(f"{pkg} [{fl}] {name}: raw {cells['raw']}, {p} {cells[p]}")
            for p in DRAINFS_PATHS:
                if (pkg, name, p) in KNOWN and cells.get("raw") in good and cells.get(p) in good:
                    regressions.append(f"{pkg} [{fl}] {name}: a known difference passes on {p} now: "
                                       "remove it from KNOWN in suite.py")
            rows.append((pkg, fl, name, cells))
    return rows, regressions


def tables(ctx, recs):
    rows, regressions = verdicts(ctx, recs)
    summary = [["package", "flags"] + [f"{p} pass/fail/skip" for p in ctx.paths]]
    for pkg, fi, flags in ctx.plan:
        fl = " ".join(flags)
        row = [pkg, fl]
        for p in ctx.paths:
            r = next((x for x in recs if (x["package"], x["flags"], x["path"]) == (pkg, fl, p)), None)
            if r is None:
                row.append("-")
            elif r["status"] and r["status"].startswith("n/a"):
                row.append(r["status"])
            else:
                v = list(r["tests"].values())
                cell = f"{v.count('pass')}/{v.count('FAIL') + v.count('timeout')}/{v.count('skip')}"
                crashes = len(r.get("notes") or [])
                notes = [x for x in (r["status"], f"stop: {r.get('stop')}" if r.get("stop") != "exit 0" else None,
                                     f"binary died {crashes}x, rest rerun" if crashes else None) if x]
                row.append(cell + (f" ({'; '.join(notes)})" if notes else ""))
        summary.append(row)
    head = ["package", "flags", "test"] + ctx.paths
    full = [head] + [[pkg, fl, name] + [cells[p] for p in ctx.paths] for pkg, fl, name, cells in rows]
    diff = [head] + [[pkg, fl, name] + [cells[p] for p in ctx.paths] for pkg, fl, name, cells in rows
                     if any(cells[p] not in ("pass", "ok", "n/a") for p in ctx.paths)]
    return render(summary), render(full), (render(diff) if len(diff) > 1 else "(none)"), regressions


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", required=True, help="empty scratch directory (run.sh makes it and cleans it up)")
    ap.add_argument("--bin-dir", required=True, help="directory holding drainfs and fake-node-driver")
    ap.add_argument("--suite-root", required=True, help="build.sh's root (src/, bin/<package>.test)")
    ap.add_argument("--results", help="results directory (default fuse-tests/gcsfuse-suite/results/<time>[-smoke])")
    ap.add_argument("--smoke", action="store_true", help=f"{', '.join(SMOKE_PACKAGES)}, first flag set, paths "
                    f"{', '.join(SMOKE_PATHS)}")
    ap.add_argument("--packages", help="comma-separated packages (default: all, smoke: " + ",".join(SMOKE_PACKAGES) + ")")
    ap.add_argument("--paths", help="comma-separated data paths (default " + ",".join(PATHS) + ", smoke "
                    + ",".join(SMOKE_PATHS) + ")")
    ap.add_argument("--all-flag-sets", action="store_true", help="every flag set (default: all in the full run, "
                    "the first in --smoke)")
    ap.add_argument("--first-flag-set", action="store_true", help="only each package's first flag set")
    ap.add_argument("--timeout", type=int, help="seconds per test binary run (default 900, smoke 240)")
    ap.add_argument("--full-table", action="store_true", help="print every test's row, not only those that fail somewhere")
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("gcsfuse-suite: must run as root")
    for s in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, lambda *_: sys.exit(143))

    ctx = Ctx()
    ctx.work = os.path.abspath(a.workdir)
    ctx.logs = os.path.join(ctx.work, "logs")
    os.makedirs(ctx.logs, exist_ok=True)
    ctx.suite_root = os.path.abspath(a.suite_root)
    ctx.timeout = a.timeout or (240 if a.smoke else 900)
    pkgs = a.packages.split(",") if a.packages else (SMOKE_PACKAGES if a.smoke else list(FLAG_SETS))
    ctx.paths = a.paths.split(",") if a.paths else (SMOKE_PATHS if a.smoke else PATHS)
    for p in pkgs:
        if p not in FLAG_SETS:
            sys.exit(f"gcsfuse-suite: unknown package {p} (known: {', '.join(FLAG_SETS)})")
    for p in ctx.paths:
        if p not in PATHS:
            sys.exit(f"gcsfuse-suite: unknown data path {p} (known: {', '.join(PATHS)})")
    first = a.first_flag_set or (a.smoke and not a.all_flag_sets)
    ctx.plan = [(p, i, fl) for p in pkgs for i, fl in enumerate(FLAG_SETS[p][:1] if first else FLAG_SETS[p])]
    bindir = os.path.join(ctx.work, "bin")
    for name, path in benchlib.private_bins(a.bin_dir, bindir, ("drainfs", "fake-node-driver"), "gcsfuse-suite").items():
        setattr(ctx, name.replace("-", "_"), path)
    # The drop-in: drainfs under the name gcsfuse (the sidecar mounter runs it as uid 65534).
    ctx.dropin = os.path.join(ctx.work, "dropin", "gcsfuse")
    os.makedirs(os.path.dirname(ctx.dropin))
    shutil.copy2(ctx.drainfs, ctx.dropin)
    try:
        ctx.gcsfuse = lowers.binary("gcsfuse")
        if {"relay", "sidecar"} & set(ctx.paths):
            ctx.sidecar_mounter = lowers.binary("gcs-fuse-csi-driver-sidecar-mounter")
    except lowers.LowersError as e:
        sys.exit(f"gcsfuse-suite: {e}")
    results = a.results or os.path.join(HERE, "results", time.strftime("%Y%m%d-%H%M%S") + ("-smoke" if a.smoke else ""))
    os.makedirs(results, exist_ok=True)
    ctx.tracker = benchlib.Tracker(ctx.work)
    ctx.left_behind, ctx.interrupted = [], False
    recs, ok = [], True
    t0 = time.monotonic()
    try:
        ctx.server = lowers.start_server("gcsfuse", os.path.join(ctx.work, "lowers"), bucket="drainfs-suite")
        ctx.tracker.add(ctx.server["pid"])
        ctx.endpoint = f"http://localhost:{ctx.server['port']}/storage/v1/"
        log(f"fake-gcs-server on port {ctx.server['port']}; {len(ctx.plan)} runs x {len(ctx.paths)} paths; "
            f"work dir {ctx.work}")
        for pkg, fi, flags in ctx.plan:
            for path in ctx.paths:
                recs.append(run_one(ctx, pkg, fi, flags, path))
    except (BenchError, lowers.LowersError) as e:
        log(f"FAILED: {e}")
        ok = False
    except (KeyboardInterrupt, SystemExit):
        log("interrupted")
        ctx.interrupted, ok = True, False
    finally:
        try:
            lowers.stop(os.path.join(ctx.work, "lowers"))
        except Exception as e:  # noqa: BLE001
            log(f"stopping fake-gcs-server: {e}")
    elapsed = time.monotonic() - t0
    summary, full, diff, regressions = tables(ctx, recs)
    git = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], stdout=subprocess.PIPE, text=True).stdout.strip()
    errors = [f"{r['package']} [{r['flags']}] {r['path']}: {r['status']}" for r in recs
              if r["status"] and r["status"].startswith("error")]
    verdict = "INTERRUPTED; so far: " if ctx.interrupted else ""
    verdict += "PARITY" if not regressions else (f"NO PARITY: {len(regressions)} result(s) (test, path) pass on raw gcsfuse "
                                                    "but not on a drainfs path")
    out = [f"gcsfuse v3.11.2 integration tests (mounted-directory mode) over fake-gcs-server, "
           f"{'smoke' if a.smoke else 'full'}: {elapsed:.0f} s; {os.cpu_count()} CPUs; loadavg {benchlib.loadavg()}; "
           f"git {git}", "", "Per package and flag set (tests passed/failed/skipped):", summary, "",
           "Every test that did not pass on some path (pass, FAIL, skip, timeout; - not run; error: the run failed; "
           "n/a: not applicable):", diff, "", f"Verdict: {verdict}"]
    out += [f"  regression: {x}" for x in regressions]
    out += [f"  known (not counted): {x}" for x in ctx.known]
    out += [f"  run error: {x}" for x in errors]
    out += [f"  left behind: {x}" for x in ctx.left_behind]
    if a.full_table:
        out += ["", "Every test:", full]
    with open(os.path.join(results, "table-full.txt"), "w") as f:
        f.write(full + "\n")
    benchlib.write_results(results, "\n".join(out), {"runs": recs, "regressions": regressions, "elapsed_s": elapsed},
                           logs=ctx.logs)
    log(f"results in {results}")
    return 0 if ok and not regressions and not errors and not ctx.left_behind else 1


if __name__ == "__main__":
    sys.exit(main())
