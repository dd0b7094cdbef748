#!/usr/bin/env python3
"""Exit tail: trigger-to-exit of drainfs right after the workload's last write (a Job's last
close comes right before its stop), p50/p95 over N runs per trigger. Python 3 stdlib only; as
root (drainfs mounts).

Each run starts `drainfs run` over a fresh directory lower (in /dev/shm when it exists),
waits until the ready file is there and a stat through the mount answered, writes one 4 KiB
file through the mount (open, write, close), and at once (no idle wait) fires the trigger:
SIGTERM with --native-sidecar, the exit file, or a plain SIGTERM (which waits for the quiet
period on purpose). The time runs from the trigger to the moment drainfs is reaped (this
script is its parent). It also reports how long the mount was held between the door closing
and the drain (`drained_ms - door_closed_ms` from drainfs's summary).

    fuse-tests/bench/exit_tail.py [--runs 20] [--drainfs target/release/drainfs] [--cases native,exit_file,plain]

Only processes this script started are signalled, by PID; every mount it made is gone when
drainfs exits (checked), or detached at the end if a run failed.
"""

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from benchlib import REPO, is_mounted, pct_interp


def one_run(drainfs, base, case, run):
    work = tempfile.mkdtemp(prefix=f"exit-tail-{case}-{run}-", dir=base)
    lower, mnt = os.path.join(work, "lower"), os.path.join(work, "mnt")
    os.mkdir(lower)
    os.mkdir(mnt)
    ready, summary, exit_file = (os.path.join(work, n) for n in ("ready", "summary.json", "exit"))
    cmd = [drainfs, "run", "--lower", lower, "--mountpoint", mnt, "--ready-file", ready,
           "--summary-file", summary, "--exit-file", exit_file, "--grace-period", "30s"]
    if case == "native":
        cmd.append("--native-sidecar")
    log = open(os.path.join(work, "drainfs.log"), "wb")
    p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 30
        while not (os.path.exists(ready) and is_mounted(mnt)):
            if p.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"drainfs did not serve ({p.returncode}); see {log.name}")
            time.sleep(0.002)
        os.stat(mnt)
        fd = os.open(os.path.join(mnt, "last.bin"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.write(fd, b"x" * 4096)
        os.close(fd)
        t0 = time.perf_counter()
        if case == "exit_file":
            with open(exit_file, "w"):
                pass
        else:
            os.kill(p.pid, signal.SIGTERM)
        _, status = os.waitpid(p.pid, 0)
        ms = (time.perf_counter() - t0) * 1000
        p.returncode = os.waitstatus_to_exitcode(status)
        if p.returncode != 0:
            raise RuntimeError(f"drainfs exited {p.returncode}; see {log.name}")
        if is_mounted(mnt):
            raise RuntimeError(f"drainfs left {mnt} mounted")
        with open(summary) as f:
            t = json.load(f)["timings"]
        held = (t.get("drained_ms") or 0) - (t.get("door_closed_ms") or 0)
        return ms, held
    finally:
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
            p.wait()
        if is_mounted(mnt):
            subprocess.run(["fusermount3", "-u", "-z", mnt], stderr=subprocess.DEVNULL)
        log.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=20, help="runs per trigger (default 20)")
    ap.add_argument("--drainfs", default=os.path.join(REPO, "target", "release", "drainfs"),
                    help="the drainfs binary (default target/release/drainfs)")
    ap.add_argument("--cases", default="native,exit_file,plain",
                    help="comma-separated: native (SIGTERM with --native-sidecar), exit_file, plain (SIGTERM)")
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("exit_tail: must run as root (drainfs mounts)")
    if not os.access(a.drainfs, os.X_OK):
        sys.exit(f"exit_tail: {a.drainfs} missing; build it (cargo build --release -p drainfs)")
    base = tempfile.mkdtemp(prefix="drainfs-exit-tail-", dir="/dev/shm" if os.path.isdir("/dev/shm") else "/tmp")
    cases = [c for c in a.cases.split(",") if c]
    res = {c: [] for c in cases}
    held = {c: [] for c in cases}
    try:
        for run in range(a.runs):
            for c in cases:
                ms, h = one_run(a.drainfs, base, c, run)
                res[c].append(ms)
                held[c].append(h)
    finally:
        subprocess.run(["rm", "-rf", base])
    print(f"trigger -> exit right after a write, {a.runs} runs each, {a.drainfs}; loadavg {os.getloadavg()[0]:.2f}")
    print(f"{'trigger':<34} {'p50 ms':>8} {'p95 ms':>8} {'max ms':>8} {'held p50 ms':>12}")
    names = {"native": "SIGTERM, --native-sidecar", "exit_file": "exit file", "plain": "SIGTERM (plain: quiet period)"}
    for c in cases:
        v = res[c]
        print(f"{names.get(c, c):<34} {pct_interp(v, 0.5):8.1f} {pct_interp(v, 0.95):8.1f} {max(v):8.1f} {statistics.median(held[c]):12.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
