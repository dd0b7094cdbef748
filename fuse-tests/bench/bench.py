#!/usr/bin/env python3
"""drainfs benchmark: raw tmpfs lower vs drainfs (kernel passthrough) vs drainfs
(--passthrough never), interleaved, medians of repetitions. Python 3 stdlib only.

Run it through run.sh (which builds, makes the work directory and cleans up behind it); see
fuse-tests/bench/README.md. Phases:

1. mount a tmpfs at WORK/lower and lay out the fio files through it;
2. start two drainfs over it (auto = passthrough, and never), read their idle VmRSS;
3. fio: every job (fio/*.ini) x numjobs 1 and 4, each rep running raw / pt / never back to
   back in an order rotated per rep; then VmRSS of both daemons;
4. metadata: mdbench 1 and 4 threads, same interleaving;
5. stop both daemons; then trigger-to-exit: start drainfs, wait until it serves, write and
   close one 4 KiB file through it and at once (no idle wait: a Job's last close comes right
   before its stop) SIGTERM, waitpid (we are its parent), with the default quiet period and
   with --native-sidecar, for both data-path modes; p50 and p95;
6. print one table and write it, with all raw figures, to the results directory.

Every process started here is tracked by PID (and a pidfd) and written to WORK/pids so that
run.sh's trap can stop it too; nothing is killed by name.
"""

import argparse
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time

from benchlib import (
    FIO_JOBS, HERE, MD_PHASES, REPO, BenchError, Tracker, child_pids, fio_env, fio_value,
    fmt_num, is_mounted, loadavg, log, private_bins, read_json, read_jsonl, rotated, run_fio,
    run_mdbench, sha256, write_results,
)

NUMJOBS = [1, 4]
MD_THREADS = [1, 4]
TARGETS = ["raw", "pt", "never"]
DRAINFS_MODES = {"pt": "auto", "never": "never"}

# Fixed figures from the issue: libfuse passthrough_hp, single-threaded, us per operation.
PASSTHROUGH_HP_US = {"create": 170.0, "open_close": 90.0, "unlink": 90.0}

PROFILES = {
    "full": dict(reps=3, runtime="10s", ramp="1s", size="1G", tmpfs="6g", md_files=10000, trigger_runs=20, forced_runs=10),
    "smoke": dict(reps=2, runtime="400ms", ramp="0", size="32M", tmpfs="1g", md_files=400, trigger_runs=5, forced_runs=2),
}


# ---------------------------------------------------------------------------------------------
# forced paths and the drainfs processes


# Forced-path rows: (label, key, limit in ms). The second-signal exit includes the lower's own
# stop (bucketfs exits on SIGINT once its session ends), which drainfs bounds at 2 s.
FORCED_ROWS = (
    ("forced exit: lower SIGKILLed, 3 files open (ms)", "lower_dead", 2000),
    ("forced exit: 2nd SIGTERM, hung upload (ms)", "second_signal", 2500),
    ("2nd SIGTERM -> lower's SIGINT (ms)", "second_signal_to_lower_sigint", 500),
)


def forced_paths(ctx, out, run):
    """One run of each forced path: drainfs supervising bucketfs, then (a) bucketfs SIGKILLed
    while three files are held open on drainfs: time from the kill to drainfs reaped; (b) a
    second SIGTERM while an upload hangs: time from it to drainfs reaped, and to bucketfs's
    SIGINT (from its events log)."""
    for case in ("lower_dead", "second_signal"):
        d = os.path.join(ctx.work, "forced", f"{case}-{run}")
        bucket, lower, mnt = (os.path.join(d, x) for x in ("bucket", "lower", "mnt"))
        for x in (bucket, lower, mnt):
            os.makedirs(x)
        events, ready = os.path.join(d, "events.jsonl"), os.path.join(d, "ready")
        lower_cmd = [ctx.bucketfs, "--bucket", bucket, "--mountpoint", lower, "--events", events]
        if case == "second_signal":
            lower_cmd += ["--hang-upload", "stuck"]
        cmd = [ctx.drainfs, "run", "--lower", lower, "--mountpoint", mnt, "--grace-period", "60s",
               "--passthrough", "never", "--ready-file", ready, "--"] + lower_cmd
        logf = open(os.path.join(ctx.logs, f"forced-{case}-{run}.log"), "wb")
        p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=logf, restore_signals=True)
        ctx.tracker.add(p.pid)
        helpers = []
        try:
            deadline = time.monotonic() + 30
            while not os.path.exists(ready):
                if p.poll() is not None or time.monotonic() > deadline:
                    raise BenchError(f"forced {case}: drainfs did not become ready")
                time.sleep(0.005)
            if case == "lower_dead":
                held = [open(os.path.join(mnt, f"held{i}"), "wb") for i in range(3)]
                for f in held:
                    f.write(b"data")
                    f.flush()
                (lower_pid,) = child_pids(p.pid)
                t0 = time.perf_counter()
                os.kill(lower_pid, signal.SIGKILL)
                p.wait(timeout=30)
                out.setdefault("lower_dead", []).append((time.perf_counter() - t0) * 1000)
                for f in held:
                    try:
                        f.close()
                    except OSError:
                        pass
                want = 69
            else:
                w = subprocess.Popen(["sh", "-c", f"echo x > {mnt}/stuck.bin"], stderr=subprocess.DEVNULL)
                ctx.tracker.add(w.pid)
                helpers.append(w)
                deadline = time.monotonic() + 30
                while not any(e.get("event") == "upload_start" for e in read_jsonl(events)):
                    if time.monotonic() > deadline:
                        raise BenchError("forced second_signal: the upload never started")
                    time.sleep(0.005)
                os.kill(p.pid, signal.SIGTERM)
                time.sleep(0.2)
                wall = time.time()
                t0 = time.perf_counter()
                os.kill(p.pid, signal.SIGTERM)
                p.wait(timeout=30)
                out.setdefault("second_signal", []).append((time.perf_counter() - t0) * 1000)
                sigint = [e["t_ms"] for e in read_jsonl(events) if e.get("event") == "signal"]
                if sigint:
                    out.setdefault("second_signal_to_lower_sigint", []).append(max(0.0, sigint[0] - wall * 1000))
                want = 75
            ctx.tracker.reaped(p.pid)
            if p.returncode != want:
                raise BenchError(f"forced {case}: drainfs exited {p.returncode}, expected {want}")
            if is_mounted(mnt) or is_mounted(lower):
                raise BenchError(f"forced {case}: a mount was left behind")
        finally:
            for h in helpers:
                try:
                    h.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    ctx.tracker.signal(h.pid, signal.SIGKILL)
                    h.wait()
                ctx.tracker.reaped(h.pid)
            if p.poll() is None:
                ctx.tracker.signal(p.pid, signal.SIGKILL)
                p.wait()
                ctx.tracker.reaped(p.pid)
            logf.close()


class Drainfs:
    """One `drainfs run` child with its stderr copied to a log file."""

    def __init__(self, ctx, name, mnt, extra, log_name=None):
        self.ctx = ctx
        self.name = name
        self.mnt = mnt
        self.extra = extra
        self.log_path = os.path.join(ctx.logs, f"{log_name or name}.log")
        self.summary_path = os.path.join(ctx.logs, f"{log_name or name}.summary.json")
        self.ready_path = os.path.join(ctx.logs, f"{log_name or name}.ready")
        self.proc = None
        self.data_path_line = ""
        self.exit_code = None

    def start(self, timeout=30.0):
        os.makedirs(self.mnt, exist_ok=True)
        for stale in (self.summary_path, self.ready_path):
            if os.path.exists(stale):
                os.unlink(stale)
        cmd = [self.ctx.drainfs, "run", "--lower", self.ctx.lower, "--mountpoint", self.mnt,
               "--summary-file", self.summary_path, "--ready-file", self.ready_path] + self.extra
        env = dict(os.environ)
        env.setdefault("RUST_LOG", "info")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, env=env, restore_signals=True)
        self.ctx.tracker.add(self.proc.pid)
        logf = open(self.log_path, "ab")
        logf.write(("$ " + " ".join(cmd) + "\n").encode())

        def reader(stream=self.proc.stderr):
            for raw in iter(stream.readline, b""):
                logf.write(raw)
                line = raw.decode(errors="replace")
                if "data path" in line and not self.data_path_line:
                    self.data_path_line = line.strip()
            logf.close()

        threading.Thread(target=reader, daemon=True).start()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if os.path.exists(self.ready_path) and is_mounted(self.mnt):
                os.stat(self.mnt)  # one round trip answered
                return self
            if self.proc.poll() is not None:
                self.ctx.tracker.reaped(self.proc.pid)
                raise BenchError(f"drainfs {self.name} exited ({self.proc.returncode}) before serving; see {self.log_path}")
            time.sleep(0.002)
        raise BenchError(f"drainfs {self.name} did not serve within {timeout}s; see {self.log_path}")

    @property
    def pid(self):
        return self.proc.pid

    def passthrough_active(self):
        return "passthrough=true" in self.data_path_line.replace("\x1b[0m", "").replace("\x1b[2m", "")

    def status(self):
        out = {}
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in ("VmRSS", "VmHWM", "Threads"):
                    out[k] = int(v.split()[0])
        return out

    def cpu_secs(self):
        """utime + stime of the daemon so far."""
        with open(f"/proc/{self.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self, timeout=30.0):
        """SIGTERM, then waitpid as the parent. Returns seconds from kill() to reaped."""
        pid = self.pid
        timer = threading.Timer(timeout, lambda: self.ctx.tracker.signal(pid, signal.SIGKILL))
        timer.start()
        try:
            t0 = time.perf_counter()
            os.kill(pid, signal.SIGTERM)
            _, status = os.waitpid(pid, 0)
            elapsed = time.perf_counter() - t0
        finally:
            timer.cancel()
        self.ctx.tracker.reaped(pid)
        self.exit_code = os.waitstatus_to_exitcode(status)
        self.proc.returncode = self.exit_code
        if self.exit_code != 0:
            raise BenchError(f"drainfs {self.name} exited {self.exit_code} after SIGTERM; see {self.log_path}")
        if is_mounted(self.mnt):
            raise BenchError(f"drainfs {self.name} exited but left {self.mnt} mounted")
        return elapsed

    def summary(self):
        return read_json(self.summary_path)


# ---------------------------------------------------------------------------------------------
# table


def build_rows(ctx, med):
    """Rows of (metric, raw, pt, pt_ratio, never, never_ratio, target, met)."""
    rows = []

    def ratio(a, b):
        return None if a is None or b in (None, 0) else a / b

    def yn(ok):
        return "-" if ok is None else ("yes" if ok else "NO")

    for key, _, _, unit in FIO_JOBS:
        for nj in NUMJOBS:
            raw, pt, nv = (med["fio"].get(f"{key}/nj{nj}/{t}") for t in TARGETS)
            rp, rn = ratio(pt, raw), ratio(nv, raw)
            tgt = "pt>=0.90x"
            met = [f"pt {yn(None if rp is None else rp >= 0.90)}"]
            if key.startswith("seq"):
                tgt += ", never>=0.50x"
                met.append(f"never {yn(None if rn is None else rn >= 0.50)}")
            rows.append((f"fio {key} {'1M' if key.startswith('seq') else '4K'} nj{nj} ({unit})",
                         fmt_num(raw), fmt_num(pt), fmt_num(rp), fmt_num(nv), fmt_num(rn), tgt, "; ".join(met)))

    for th in MD_THREADS:
        for ph in MD_PHASES:
            cells = {}
            for t in TARGETS:
                v = med["md"].get(f"{ph}/t{th}/{t}")
                cells[t] = v
            def cell(v):
                return "-" if v is None else f"{fmt_num(v['ops_per_sec'])}/s {fmt_num(v['us_per_op'])}us"
            ops = {t: (cells[t] or {}).get("ops_per_sec") for t in TARGETS}
            us = {t: (cells[t] or {}).get("us_per_op") for t in TARGETS}
            rp, rn = ratio(ops["pt"], ops["raw"]), ratio(ops["never"], ops["raw"])
            tgt, met = "", "-"
            if th == 1 and ph in PASSTHROUGH_HP_US:
                lim = PASSTHROUGH_HP_US[ph]
                tgt = f"<={lim:.0f}us (passthrough_hp)"
                met = "; ".join(f"{n} {yn(None if us[t] is None else us[t] <= lim)}" for t, n in (("pt", "pt"), ("never", "never")))
            elif ph == "stat_hot":
                tgt = "cached stat >=0.50x"
                met = f"pt {yn(None if rp is None else rp >= 0.5)}; never {yn(None if rn is None else rn >= 0.5)}"
            name = {"stat": "stat (after create)", "stat_hot": "stat (cached)", "open_close": "open+close"}.get(ph, ph)
            rows.append((f"md {name} {th}T (ops/s, us/op)", cell(cells["raw"]), cell(cells["pt"]), fmt_num(rp),
                         cell(cells["never"]), fmt_num(rn), tgt, met))

    for label, key, lim in (("default quiet period", "default", 600.0), ("--native-sidecar", "native", 50.0)):
        v = {t: med["trigger"].get(f"{key}/{t}") for t in ("pt", "never")}
        p95 = {t: med["trigger_p95"].get(f"{key}/{t}") for t in ("pt", "never")}
        ok = {t: None if p95[t] is None else p95[t] < lim for t in v}
        rows.append((f"trigger->exit after a write, {label}, p50 / p95 (ms)", "-",
                     f"{fmt_num(v['pt'])} / {fmt_num(p95['pt'])}", "",
                     f"{fmt_num(v['never'])} / {fmt_num(p95['never'])}", "",
                     f"p95 <{lim:.0f}ms", f"pt {yn(ok['pt'])}; never {yn(ok['never'])}"))

    for label, key, lim in FORCED_ROWS:
        v = med["forced"].get(key)
        rows.append((label, "-", fmt_num(v), "", "", "", f"<{lim:.0f}ms", yn(None if v is None else v < lim)))

    for label, key, lim in (("idle", "idle", 16), ("after fio", "after_fio", 64), ("after metadata", "after_md", None),
                            ("peak (VmHWM)", "peak", None)):
        v = {t: med["rss"].get(f"{key}/{t}") for t in ("pt", "never")}
        tgt = f"<{lim} MiB" if lim else ""
        met = "-" if not lim else "; ".join(f"{t} {yn(None if v[t] is None else v[t] < lim)}" for t in ("pt", "never"))
        rows.append((f"drainfs RSS {label} (MiB)", "-", fmt_num(v["pt"]), "", fmt_num(v["never"]), "", tgt, met))
    for key, _, _, _ in FIO_JOBS:
        for nj in NUMJOBS:
            v = {t: med["cpu"].get(f"{key}/nj{nj}/{t}") for t in ("pt", "never")}
            if any(x is not None for x in v.values()):
                rows.append((f"drainfs CPU s during fio {key} nj{nj}", "-", fmt_num(v["pt"]), "", fmt_num(v["never"]), "", "", "-"))
    return rows


def render(rows, header):
    cols = ["metric", "raw lower", "drainfs (passthrough)", "ratio", "drainfs (never)", "ratio", "target", "met"]
    widths = [max(len(str(r[i])) for r in rows + [cols]) for i in range(len(cols))]
    def line(r):
        return " | ".join(str(c).ljust(w) if i in (0, 6, 7) else str(c).rjust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()
    out = [header, line(cols), "-+-".join("-" * w for w in widths)]
    out += [line(r) for r in rows]
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------
# main


class Ctx:
    pass


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="short run for CI (tiny fio runtime/size, few files, 5 trigger runs)")
    ap.add_argument("--workdir", required=True, help="empty scratch directory (run.sh makes it and cleans it up)")
    ap.add_argument("--bin-dir", required=True, help="directory holding the drainfs and mdbench binaries")
    ap.add_argument("--results", help="results directory (default: fuse-tests/bench/results/<time>[-smoke])")
    ap.add_argument("--reps", type=int, help="repetitions (default 3, smoke 2)")
    ap.add_argument("--runtime", help="fio runtime per job (default 10s, smoke 500ms)")
    ap.add_argument("--ramp", help="fio ramp time before measuring (default 1s, smoke 0)")
    ap.add_argument("--size", help="fio file size per job (default 1G, smoke 32M)")
    ap.add_argument("--md-files", type=int, help="mdbench files (default 10000, smoke 400)")
    ap.add_argument("--trigger-runs", type=int, help="trigger-to-exit runs per case (default 20, smoke 5)")
    ap.add_argument("--threads", type=int, help="pass --threads N to drainfs (default: drainfs's own default)")
    ap.add_argument("--ttl", help="pass --ttl to drainfs (default: drainfs's own default)")
    a = ap.parse_args()

    if os.geteuid() != 0:
        sys.exit("bench: must run as root (mounts a tmpfs, uses FUSE passthrough)")
    # Children must start with default signal dispositions: undo inherited SIG_IGN (exec keeps
    # ignored signals ignored), and turn SIGTERM/SIGHUP into a clean exit through `finally`.
    for s in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, lambda *_: sys.exit(143))
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)

    ctx = Ctx()
    ctx.profile = "smoke" if a.smoke else "full"
    ctx.p = dict(PROFILES[ctx.profile])
    for k, v in (("reps", a.reps), ("runtime", a.runtime), ("ramp", a.ramp), ("size", a.size), ("md_files", a.md_files),
                 ("trigger_runs", a.trigger_runs)):
        if v is not None:
            ctx.p[k] = v
    ctx.work = os.path.abspath(a.workdir)
    ctx.lower = os.path.join(ctx.work, "lower")
    ctx.logs = os.path.join(ctx.work, "logs")
    # Private copies: a concurrent `cargo build` must not swap the binary under test mid-run.
    for name, path in private_bins(a.bin_dir, os.path.join(ctx.work, "bin"), ("drainfs", "mdbench", "bucketfs"), "bench").items():
        setattr(ctx, name, path)
    if shutil.which("fio") is None:
        sys.exit("bench: fio not installed (run.sh installs it)")
    ctx.results = a.results or os.path.join(HERE, "results", time.strftime("%Y%m%d-%H%M%S") + ("-smoke" if a.smoke else ""))
    os.makedirs(ctx.results, exist_ok=True)
    os.makedirs(ctx.logs, exist_ok=True)
    ctx.tracker = Tracker(ctx.work)
    common = []
    if a.threads:
        common += ["--threads", str(a.threads)]
    if a.ttl:
        common += ["--ttl", a.ttl]

    raw = {"fio": {}, "fio_load": {}, "fio_daemon_cpu": {}, "md": {}, "trigger": {}, "forced": {}, "rss": {}, "cpu": {}, "drainfs_log": {}, "trigger_summaries": []}
    daemons = []
    t_start = time.monotonic()
    load_start = loadavg()
    ok = False
    try:
        os.makedirs(ctx.lower)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={ctx.p['tmpfs']},mode=0755", "drainfs-bench", ctx.lower], check=True)
        log(f"profile {ctx.profile}: {ctx.p}; work dir {ctx.work}")

        # 1. fio files, laid out once through the raw lower and shared by every job.
        fio_dir = {"raw": os.path.join(ctx.lower, "fio")}
        os.makedirs(fio_dir["raw"])
        r = subprocess.run(["fio", "--create_only=1", "--output=/dev/null", os.path.join(HERE, "fio", "seq-read.ini")],
                           env=fio_env(ctx.p, fio_dir["raw"], max(NUMJOBS)), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        if r.returncode != 0:
            raise BenchError("fio layout failed: " + r.stdout.decode(errors="replace"))

        # 2. the two daemons under test.
        mnts = {}
        for t, mode in DRAINFS_MODES.items():
            mnts[t] = os.path.join(ctx.work, f"mnt-{t}")
            d = Drainfs(ctx, t, mnts[t], ["--passthrough", mode] + common).start()
            daemons.append(d)
            raw["drainfs_log"][t] = d.data_path_line
            fio_dir[t] = os.path.join(mnts[t], "fio")
        dm = dict(zip(DRAINFS_MODES, daemons))
        if not dm["pt"].passthrough_active():
            log("WARNING: drainfs (auto) did not get kernel passthrough: " + dm["pt"].data_path_line)
        time.sleep(1.0)
        for t, d in dm.items():
            st = d.status()
            raw["rss"][f"idle/{t}"] = [st["VmRSS"] / 1024]
        log("idle RSS: " + ", ".join(f"{t} {raw['rss'][f'idle/{t}'][0]:.1f} MiB" for t in dm))

        # 3. fio
        n_fio = ctx.p["reps"] * len(FIO_JOBS) * len(NUMJOBS) * len(TARGETS)
        i = 0
        for rep in range(ctx.p["reps"]):
            for key, ini, direction, unit in FIO_JOBS:
                for nj in NUMJOBS:
                    for t in rotated(TARGETS, rep):
                        i += 1
                        out = os.path.join(ctx.results, f"fio-{key}-nj{nj}-{t}-rep{rep}.json")
                        cpu0 = dm[t].cpu_secs() if t in dm else 0.0
                        doc = run_fio(ctx.p, ini, fio_dir[t], nj, out)
                        if t in dm:
                            raw["fio_daemon_cpu"].setdefault(f"{key}/nj{nj}/{t}", []).append(dm[t].cpu_secs() - cpu0)
                        v = fio_value(doc, direction, unit)
                        raw["fio"].setdefault(f"{key}/nj{nj}/{t}", []).append(v)
                        raw["fio_load"].setdefault(f"{key}/nj{nj}/{t}", []).append(loadavg())
                        log(f"fio {i}/{n_fio} rep{rep} {key} nj{nj} {t}: {v:,.1f} {unit} (load {loadavg()})")
        for t, d in dm.items():
            st = d.status()
            raw["rss"][f"after_fio/{t}"] = [st["VmRSS"] / 1024]
        for k, v in raw["fio_daemon_cpu"].items():
            raw["cpu"][k] = [statistics.median(v)]
        log("RSS after fio: " + ", ".join(f"{t} {raw['rss'][f'after_fio/{t}'][0]:.1f} MiB" for t in dm))

        # 4. metadata
        md_root = {"raw": ctx.lower, **mnts}
        for rep in range(ctx.p["reps"]):
            for th in MD_THREADS:
                for t in rotated(TARGETS, rep):
                    doc = run_mdbench(ctx.mdbench, md_root[t], ctx.p["md_files"], th, f"{t}-t{th}-rep{rep}")
                    for ph in MD_PHASES:
                        raw["md"].setdefault(f"{ph}/t{th}/{t}", []).append(doc["phases"][ph])
                    log(f"mdbench rep{rep} {th}T {t}: " + ", ".join(f"{ph} {doc['phases'][ph]['us_per_op']:.1f}us" for ph in MD_PHASES))
        for t, d in dm.items():
            st = d.status()
            raw["rss"][f"after_md/{t}"] = [st["VmRSS"] / 1024]
            raw["rss"][f"peak/{t}"] = [st["VmHWM"] / 1024]

        # 5. stop the daemons (their exit must be clean), then trigger-to-exit right after a write.
        for d in daemons:
            d.stop()
        daemons = []
        tmnt = os.path.join(ctx.work, "mnt-trigger")
        n = 0
        for run in range(ctx.p["trigger_runs"]):
            for key, extra in (("default", []), ("native", ["--native-sidecar"])):
                for t, mode in DRAINFS_MODES.items():
                    n += 1
                    d = Drainfs(ctx, f"trigger-{key}-{t}-{run}", tmnt, ["--passthrough", mode] + extra + common,
                                log_name=f"trigger-{key}-{t}")
                    daemons.append(d.start())
                    # The workload's last write, then the stop at once.
                    fd = os.open(os.path.join(tmnt, f"last-{run}.bin"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                    os.write(fd, b"x" * 4096)
                    os.close(fd)
                    secs = d.stop()
                    daemons.remove(d)
                    raw["trigger"].setdefault(f"{key}/{t}", []).append(secs * 1000)
                    s = d.summary()
                    raw["trigger_summaries"].append({"run": d.name, "ms": secs * 1000,
                                                     "timings": (s or {}).get("timings")})
            log(f"trigger-to-exit run {run + 1}/{ctx.p['trigger_runs']}: " + ", ".join(
                f"{k} {v[-1]:.1f}ms" for k, v in raw["trigger"].items()))
        # 6. forced paths over the gcsfuse-like bucketfs.
        for run in range(ctx.p["forced_runs"]):
            forced_paths(ctx, raw["forced"], run)
            log(f"forced paths run {run + 1}/{ctx.p['forced_runs']}: " + ", ".join(
                f"{k} {v[-1]:.1f}ms" for k, v in raw["forced"].items()))
        ok = True
    except BenchError as e:
        log(f"FAILED: {e}")
    except Exception:  # noqa: BLE001 -- report, clean up, still write what we have
        import traceback
        log("FAILED:\n" + traceback.format_exc())
    except (KeyboardInterrupt, SystemExit):
        log("interrupted")
    finally:
        for d in daemons:
            try:
                if d.proc and d.proc.returncode is None:
                    d.stop(timeout=15)
            except Exception as e:  # noqa: BLE001 -- best effort, then force
                log(f"stopping {d.name}: {e}")
            if is_mounted(d.mnt):
                subprocess.run(["fusermount3", "-u", "-z", d.mnt], stderr=subprocess.DEVNULL)
        if is_mounted(ctx.lower):
            if subprocess.run(["umount", ctx.lower], stderr=subprocess.DEVNULL).returncode != 0:
                subprocess.run(["umount", "-l", ctx.lower])

    elapsed = time.monotonic() - t_start
    load_end = loadavg()
    med = {k: {} for k in ("fio", "md", "trigger", "trigger_p95", "forced", "rss", "cpu")}
    for k, v in raw["cpu"].items():
        med["cpu"][k] = v[0]
    for k, v in raw["fio"].items():
        med["fio"][k] = statistics.median(v)
    for k, v in raw["md"].items():
        secs = statistics.median(x["secs"] for x in v)
        ops, th = v[0]["ops"], int(k.split("/t")[1].split("/")[0])
        med["md"][k] = {"secs": secs, "ops_per_sec": ops / secs, "us_per_op": secs * 1e6 * th / ops}
    for k, v in raw["trigger"].items():
        med["trigger"][k] = statistics.median(v)
        s95 = sorted(v)
        med["trigger_p95"][k] = s95[min(len(s95) - 1, round(0.95 * (len(s95) - 1)))]
    for k, v in raw["forced"].items():
        med["forced"][k] = statistics.median(v)
    for k, v in raw["rss"].items():
        med["rss"][k] = statistics.median(v)

    pt_note = "kernel passthrough active" if raw["drainfs_log"].get("pt") and "passthrough=true" in raw["drainfs_log"]["pt"].replace("\x1b[0m", "").replace("\x1b[2m", "") else "PASSTHROUGH NOT ACTIVE"
    header = (f"drainfs benchmark ({ctx.profile}; {ctx.p['reps']} reps interleaved, medians; tmpfs lower; "
              f"fio runtime {ctx.p['runtime']} size {ctx.p['size']}/job; mdbench {ctx.p['md_files']} files; "
              f"trigger-to-exit n={ctx.p['trigger_runs']} right after a write; kernel {platform.release()}, {os.cpu_count()} CPUs; "
              f"pt: {pt_note}; {elapsed:.0f}s; loadavg start {load_start}, end {load_end})")
    table = render(build_rows(ctx, med), header)
    meta = {"profile": ctx.profile, "params": ctx.p, "ok": ok, "elapsed_s": elapsed, "kernel": platform.release(),
            "cpus": os.cpu_count(), "loadavg_start": load_start, "loadavg_end": load_end, "drainfs_extra_args": common, "passthrough_hp_us": PASSTHROUGH_HP_US,
            "git_head": subprocess.run(["git", "-C", REPO, "rev-parse", "HEAD"], stdout=subprocess.PIPE, text=True).stdout.strip(),
            "drainfs_sha256": sha256(ctx.drainfs),
            "fio_version": subprocess.run(["fio", "--version"], stdout=subprocess.PIPE, text=True).stdout.strip()}
    # The daemons' logs are kept next to the results.
    write_results(ctx.results, table, {"meta": meta, "raw": raw, "medians": med}, logs=ctx.logs)
    log(f"results in {ctx.results}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
