#!/usr/bin/env python3
"""drainfs relay benchmark: the same FUSE daemon (bucketfs, which stages data in a
local directory) served directly on its /dev/fd/N connection vs through `drainfs relay`, in one
run, interleaved, medians of repetitions. Python 3 stdlib only; run it through relay.sh.

Every mount is made the way GKE's CSI driver makes it, by `fake-node-driver` (mount with fd=N,
the sidecar gets the fd as /dev/fd/3, runs as uid 65534 with no capabilities; on SIGTERM it
SIGTERMs the sidecar and SIGKILLs it 5 s later). Targets:

- `direct`:   the sidecar is bucketfs on the kernel fd (GKE today);
- `relay`:    the sidecar is `drainfs relay` (default message cap, 128 KiB) over bucketfs;
- `relay-max`: the same with `--max-message 1048576`, i.e. the largest cap the socket buffers
  allow (408 KiB with SO_SNDBUF 212992);
- `relay-nospin`: the default cap with `--spin 0s` (the pump sleeps in poll(2) as soon as
  nothing is ready: what `--spin auto` does under a CPU limit below 2 CPUs).

Socket buffers are forced to 212992 (the kernel's default wmem_max) in every relay target.

Phases:
1. start the three sidecars, lay out the fio files through each mount;
2. fio (fio/*.ini: seq 1 MiB read/write, 4 KiB random read/write), numjobs 1, each rep running
   the targets back to back in an order rotated per rep;
3. mdbench (1 thread), same interleaving;
4. CPU seconds and RSS (VmRSS, VmHWM) of each relay and of each daemon;
5. the stop of the loaded mounts (SIGTERM to fake-node-driver), then trigger-to-exit on idle
   mounts: `--trigger-runs` fresh relay mounts (SIGTERM -> drainfs exit as fake-node-driver
   sees it, and the daemon's exit as drainfs's summary records it), and `--direct-runs` fresh
   direct mounts (SIGTERM -> the daemon does not exit -> SIGKILL 5 s later);
6. one table on stdout; the raw figures as JSON in the results directory.

Every process started here is a fake-node-driver tracked by PID (written to WORK/pids so that
relay.sh's trap can stop it too); nothing is killed by name.
"""

import argparse
import os
import signal
import subprocess
import sys
import threading
import time

from benchlib import (
    FIO_JOBS, MD_PHASES, SIDECAR_UID, SOCKET_BUFFER, BenchError, child_pids, fio_value, make_log, med,
    mounted_paths, proc_cpu_secs, proc_mem_kib, read_json, rotated, run_fio, run_mdbench,
    write_results,
)

log = make_log("relay-bench")

TARGETS = ["direct", "relay", "relay-max", "relay-nospin"]
RELAY_EXTRA = {"relay": [], "relay-max": ["--max-message", "1048576"], "relay-nospin": ["--spin", "0s"]}

PROFILES = {
    "full": dict(reps=3, runtime="8s", ramp="1s", size="512M", md_files=5000, trigger_runs=15, direct_runs=2),
    "smoke": dict(reps=1, runtime="300ms", ramp="0", size="16M", md_files=200, trigger_runs=3, direct_runs=1),
}


class Sidecar:
    """One mount made by fake-node-driver, with its sidecar (bucketfs, or drainfs over it)."""

    def __init__(self, ctx, name, target, kill_after="5s"):
        self.ctx, self.name, self.target = ctx, name, target
        base = os.path.join(ctx.work, name)
        self.mnt, self.bucket, self.staging, self.var = (os.path.join(base, d) for d in ("mnt", "bucket", "staging", "var"))
        for d in (self.mnt, self.bucket, self.staging, self.var):
            os.makedirs(d, exist_ok=True)
        for d in (base, self.bucket, self.staging, self.var):
            os.chown(d, SIDECAR_UID, SIDECAR_UID)
        self.summary_path = os.path.join(self.var, "summary.json")
        daemon = [ctx.bin("bucketfs"), "--bucket", self.bucket, "--staging", self.staging,
                  "--mountpoint", "/dev/fd/3"]
        if target == "direct":
            sidecar = daemon
        else:
            sidecar = [ctx.bin("drainfs"), "relay", "--socket-buffer", str(SOCKET_BUFFER),
                       "--summary-file", self.summary_path, *RELAY_EXTRA[target], "--", *daemon]
        cmd = [ctx.bin("fake-node-driver"), "--mountpoint", self.mnt, "--kill-after", kill_after, "--", *sidecar]
        self.err = open(os.path.join(ctx.results, f"{name}.log"), "wb")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.err)
        ctx.track(self.proc.pid)
        self.lines = []
        self.ready = threading.Event()
        self.done = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for raw in self.proc.stdout:
            line = raw.decode(errors="replace").strip()
            self.lines.append(line)
            if line == "ready":
                self.ready.set()
        self.done.set()

    def wait_ready(self, timeout=20.0):
        if not self.ready.wait(timeout):
            raise BenchError(f"{self.name}: no `ready` from fake-node-driver (see {self.err.name})")
        return self

    def sidecar_pid(self):
        c = child_pids(self.proc.pid)
        return c[0] if c else None

    def daemon_pid(self):
        s = self.sidecar_pid()
        if s is None or self.target == "direct":
            return s
        c = child_pids(s)
        return c[0] if c else None

    def stop(self, timeout=30.0):
        """SIGTERM to fake-node-driver (the CSI sidecar's stop); returns (status, ms) from its
        `sidecar exit: <status> after <ms> ms` line."""
        t0 = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise BenchError(f"{self.name}: fake-node-driver did not exit within {timeout} s")
        self.done.wait(5)
        wall = (time.monotonic() - t0) * 1000
        self.err.close()
        for line in self.lines:
            if line.startswith("sidecar exit: "):
                rest = line[len("sidecar exit: "):]
                status, _, ms = rest.rpartition(" after ")
                return status, float(ms.split()[0]), wall, "sigkill sent" in self.lines
        raise BenchError(f"{self.name}: no `sidecar exit` line: {self.lines}")

    def summary(self):
        return read_json(self.summary_path)


def round_trip_us(mnt, n):
    """Mean time of `n` stat calls on a missing name: one LOOKUP round trip each."""
    p = os.path.join(mnt, "no-such-file")
    t0 = time.perf_counter()
    for _ in range(n):
        try:
            os.stat(p)
        except FileNotFoundError:
            pass
    return (time.perf_counter() - t0) * 1e6 / n


class Ctx:
    def __init__(self, args):
        self.work = args.work
        self.results = args.results
        self.bin_dir = args.bin_dir
        self.p = dict(PROFILES["smoke" if args.smoke else "full"])
        for k in ("reps", "runtime", "ramp", "size", "md_files", "trigger_runs", "direct_runs"):
            v = getattr(args, k)
            if v is not None:
                self.p[k] = v
        self.pids_file = os.path.join(self.work, "pids")

    def bin(self, name):
        return os.path.join(self.bin_dir, name)

    def track(self, pid):
        with open(self.pids_file, "a") as f:
            f.write(f"{pid}\n")


def fmt(v, nd=1):
    if v is None:
        return "-"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:.{nd}f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", required=True)
    ap.add_argument("--results", required=True)
    ap.add_argument("--bin-dir", required=True)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--reps", type=int)
    ap.add_argument("--runtime")
    ap.add_argument("--ramp")
    ap.add_argument("--size")
    ap.add_argument("--md-files", type=int)
    ap.add_argument("--trigger-runs", type=int)
    ap.add_argument("--direct-runs", type=int)
    args = ap.parse_args()
    ctx = Ctx(args)
    os.makedirs(ctx.results, exist_ok=True)
    raw = {"params": ctx.p, "fio": {}, "md": {}, "cpu": {}, "stop": {}, "trigger": {}}

    # 1. Mounts, fio layout.
    side = {t: Sidecar(ctx, t, t) for t in TARGETS}
    for s in side.values():
        s.wait_ready()
    for t, s in side.items():
        log(f"{t}: laying out the fio files")
        run_fio(ctx.p, "seq-write.ini", s.mnt, 1, os.path.join(ctx.results, f"layout-{t}.json"), timeout=900)
    cpu0 = {t: proc_cpu_secs(side[t].sidecar_pid()) for t in TARGETS if t != "direct"}

    # 2. fio, interleaved.
    for key, ini, direction, unit in FIO_JOBS:
        raw["fio"][key] = {t: [] for t in TARGETS}
    for rep in range(ctx.p["reps"]):
        for key, ini, direction, unit in FIO_JOBS:
            for t in rotated(TARGETS, rep):
                out = os.path.join(ctx.results, f"fio-{key}-{t}-{rep}.json")
                v = fio_value(run_fio(ctx.p, ini, side[t].mnt, 1, out, timeout=900), direction, unit)
                raw["fio"][key][t].append(v)
                log(f"rep {rep} {key} {t}: {v:.1f} {unit}")

    # 3. mdbench, interleaved.
    md = {t: {ph: [] for ph in MD_PHASES} for t in TARGETS}
    for rep in range(ctx.p["reps"]):
        for t in rotated(TARGETS, rep):
            doc = run_mdbench(ctx.bin("mdbench"), side[t].mnt, ctx.p["md_files"], 1, f"{rep}", timeout=900)
            for ph in MD_PHASES:
                md[t][ph].append(doc["phases"][ph]["us_per_op"] if "phases" in doc else doc[ph]["us_per_op"])
            log(f"rep {rep} mdbench {t}: " + ", ".join(f"{ph} {md[t][ph][-1]:.1f}" for ph in MD_PHASES))
    raw["md"] = md

    # 3b. One round trip: a LOOKUP of a missing name (negative entries are not cached).
    rt = {t: [] for t in TARGETS}
    for rep in range(ctx.p["reps"]):
        for t in rotated(TARGETS, rep):
            rt[t].append(round_trip_us(side[t].mnt, ctx.p["md_files"] * 2))
            log(f"rep {rep} round trip {t}: {rt[t][-1]:.1f} us")
    raw["round_trip_us"] = rt

    # 4. CPU and memory.
    for t in TARGETS:
        s = side[t]
        entry = {"daemon_cpu_s": proc_cpu_secs(s.daemon_pid()), "daemon_mem_kib": proc_mem_kib(s.daemon_pid())}
        if t != "direct":
            entry["relay_cpu_s"] = proc_cpu_secs(s.sidecar_pid())
            entry["relay_cpu_s_measured"] = entry["relay_cpu_s"] - cpu0[t]
            entry["relay_mem_kib"] = proc_mem_kib(s.sidecar_pid())
        raw["cpu"][t] = entry

    # 5. Stops: the loaded mounts, then idle mounts.
    for t in TARGETS:
        status, ms, wall, sigkill = side[t].stop()
        sm = side[t].summary()
        raw["stop"][t] = {"status": status, "ms": ms, "sigkill": sigkill,
                          "summary": sm and {k: sm.get(k) for k in ("exit_code", "outcome", "timings", "lower_exit")},
                          "relay": sm and sm.get("relay")}
        log(f"stop {t} (loaded): sidecar exit {status} after {ms} ms")
    trig = {"relay_exit_ms": [], "daemon_exit_ms": [], "status": []}
    for i in range(ctx.p["trigger_runs"]):
        s = Sidecar(ctx, f"trigger-relay-{i}", "relay").wait_ready()
        os.statvfs(s.mnt)
        time.sleep(0.3)
        status, ms, wall, sigkill = s.stop()
        sm = s.summary() or {}
        d = (sm.get("timings") or {}).get("lower_exited_ms")
        trig["relay_exit_ms"].append(ms)
        trig["daemon_exit_ms"].append(d)
        trig["status"].append(status)
        log(f"trigger relay {i}: sidecar exit {status} after {ms} ms (daemon exited at {d} ms)")
    raw["trigger"]["relay"] = trig
    dtrig = {"exit_ms": [], "status": [], "sigkill": []}
    for i in range(ctx.p["direct_runs"]):
        s = Sidecar(ctx, f"trigger-direct-{i}", "direct").wait_ready()
        os.statvfs(s.mnt)
        time.sleep(0.3)
        status, ms, wall, sigkill = s.stop()
        dtrig["exit_ms"].append(ms)
        dtrig["status"].append(status)
        dtrig["sigkill"].append(sigkill)
        log(f"trigger direct {i}: sidecar exit {status} after {ms} ms")
    raw["trigger"]["direct"] = dtrig

    left = [m for m in mounted_paths() if m.startswith(ctx.work + "/")]
    if left:
        raise BenchError(f"mounts left behind: {left}")

    # 6. Table.
    rows = [("metric", "direct", "relay (128K)", "relay/direct", "relay-max", "max/direct",
             "relay --spin 0s", "nospin/direct", "target (relay)")]
    targets = {"seq-read": 0.8, "seq-write": 0.8, "rand-read": 0.7, "rand-write": 0.7}
    others = ("relay-max", "relay-nospin")
    for key, ini, direction, unit in FIO_JOBS:
        m = {t: med(raw["fio"][key][t]) for t in TARGETS}
        row = [f"fio {key} ({unit})", fmt(m["direct"])]
        for t in ("relay",) + others:
            row += [fmt(m[t]), f"{m[t] / m['direct']:.2f}x"]
        row.append(f">= {targets[key]}x: {'met' if m['relay'] / m['direct'] >= targets[key] else 'NOT met'}")
        rows.append(tuple(row))
    for ph in MD_PHASES:
        m = {t: med(md[t][ph]) for t in TARGETS}
        added = m["relay"] - m["direct"]
        row = [f"mdbench {ph} (us/op)", fmt(m["direct"])]
        for t in ("relay",) + others:
            row += [fmt(m[t]), f"+{m[t] - m['direct']:.1f} us"]
        row.append(f"<= +20 us: {'met' if added <= 20 else 'NOT met'}")
        rows.append(tuple(row))
    m = {t: med(raw["round_trip_us"][t]) for t in TARGETS}
    row = ["one round trip: LOOKUP (us)", fmt(m["direct"])]
    for t in ("relay",) + others:
        row += [fmt(m[t]), f"+{m[t] - m['direct']:.1f} us"]
    rows.append(tuple(row + ["per request added"]))

    def relay_cell(t, what):
        c = raw["cpu"][t]
        if what == "cpu":
            return f"{c['relay_cpu_s_measured']:.2f}"
        m = c["relay_mem_kib"]
        return f"{m.get('VmRSS', 0) / 1024:.1f} / {m.get('VmHWM', 0) / 1024:.1f}"

    for label, what in (("relay CPU s (fio + mdbench phases)", "cpu"), ("relay RSS / peak RSS (MiB)", "mem")):
        row = [label, ""]
        for t in ("relay",) + others:
            row += [relay_cell(t, what), ""]
        rows.append(tuple(row + ["reported"]))
    row = ["daemon CPU s (whole run)", f"{raw['cpu']['direct']['daemon_cpu_s']:.2f}"]
    for t in ("relay",) + others:
        row += [f"{raw['cpu'][t]['daemon_cpu_s']:.2f}", ""]
    rows.append(tuple(row + [""]))
    rm = med(trig["relay_exit_ms"])
    dm = med([d for d in trig["daemon_exit_ms"] if d is not None])
    rows.append((f"idle SIGTERM -> exit, ms (median of {len(trig['relay_exit_ms'])})",
                 f"{med(dtrig['exit_ms']):.0f} ({dtrig['status'][0] if dtrig['status'] else '-'})",
                 f"{rm:.0f} (drainfs) / {dm} (daemon)", "", "", "", "", "",
                 f"< 20 ms: {'met' if rm < 20 else 'NOT met'}"))
    row = ["loaded SIGTERM -> exit, ms", f"{raw['stop']['direct']['ms']:.0f} ({raw['stop']['direct']['status']})"]
    for t in ("relay",) + others:
        row += [f"{raw['stop'][t]['ms']:.0f} ({raw['stop'][t]['status']})", ""]
    rows.append(tuple(row + [""]))
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    lines = [" | ".join(str(c).ljust(w) for c, w in zip(r, widths)) for r in rows]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    caps = (raw["stop"]["relay"].get("relay") or {}), (raw["stop"]["relay-max"].get("relay") or {})
    header = (f"drainfs relay benchmark: bucketfs on /dev/fd/N direct vs through drainfs relay; "
              f"SO_SNDBUF {SOCKET_BUFFER}; relay cap {caps[0].get('cap')} B, relay-max cap {caps[1].get('cap')} B; "
              f"{ctx.p['reps']} reps, fio {ctx.p['runtime']} x size {ctx.p['size']}, numjobs 1; "
              f"mdbench {ctx.p['md_files']} files, 1 thread")
    write_results(ctx.results, header + "\n" + "\n".join(lines), raw, json_name="raw.json", sort_keys=False)


if __name__ == "__main__":
    try:
        main()
    except BenchError as e:
        print(f"relay-bench: error: {e}", file=sys.stderr)
        sys.exit(1)
