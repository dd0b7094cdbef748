#!/usr/bin/env python3
"""Randomized stops of the hand-off (issue #34): the real gcsfuse (v3.11.2) on
fake-gcs-server, started by drainfs's drop-in in its default hand-off mode through GKE's real
sidecar mounter (v1.24.4, uid 65534, the fd over its socket from `fake-node-driver`'s CSI
mode), stopped as the sidecar mounter stops it. Not a CI step: a script beside the suite, as
root. Python 3 stdlib only.

Each run mounts a fresh volume, runs a workload in it, and stops it one of three ways, chosen
at random (weights: --mix):

- `native`: the workload writes 1-3 files (1-16 MiB each, each close() returning once
  gcsfuse has uploaded it) and exits; after a random delay (0 to --max-delay, so that some
  stops fall inside the idle window after the last I/O, 500 ms by default, or a tie's 2 s) the sidecar mounter
  gets SIGTERM with NATIVE_SIDECAR=TRUE (a native sidecar once the workload exited);
- `exit-file`: the same workload, then the regular container's exit file, which the sidecar
  mounter polls every 5 s before it signals the drop-in;
- `grace`: the pod's grace period runs out while the workload is inside close() of a large
  file (--grace-sizes MiB): it has printed that it is closing, and after a random 0-400 ms the
  workload is SIGKILLed and the sidecar mounter gets SIGTERM at once, as the kubelet does at
  the end of the grace period. The killed close()'s FLUSH is a forced request: it still waits
  for gcsfuse, so the workload's process ends when the upload ends (or gcsfuse does).
  A share of these runs (--stock-share) runs the stock sidecar (the sidecar mounter with the
  plain gcsfuse: SIGTERM, which gcsfuse ignores on /dev/fd/N, then SIGKILL 5 s later), to
  measure what stock allows an upload in flight.

Counted: silent losses (a file whose close() returned 0, missing or different in the bucket
read back from fake-gcs-server, not through a mount); for each upload in flight at the stop
(grace), whether it completed, how long after the stop the workload's close ended (the upload
was allowed to run that long), and when drainfs ended gcsfuse (its summary's
`timings.gcsfuse_exited_ms`, from the drop-in's SIGTERM). An upload in flight is cut shorter
than stock when it did not complete and the hand-off ended gcsfuse before stock would have
(its SIGKILL, 5 s after the SIGTERM: the shortest stop measured in this run's stock runs, or
5,000 ms). A hand-off run ended by the sidecar mounter's SIGKILL (it reports its child, drainfs,
SIGKILLed, and drainfs left no final summary) ended gcsfuse at stock's moment: since 4b4c922
drainfs leaves a busy gcsfuse to that SIGKILL instead of ending it at 4.5 s; such runs are
counted apart, with how many of their uploads were cut. Any other hand-off run without a final
summary counts as cut shorter when its upload did not complete. Also counted: uploads the
hand-off took for idle (its summary's `timings.idle_ms`) before the workload's close() ended,
complete or not (an upload whose last request had reached the server completes anyway).
Exit status 1 on any silent loss, any shorter cut, any such early idle or any failed run,
else 0.

The real kubelet SIGKILLs the whole sidecar container 2 s after its SIGTERM at the grace
period's end, which cuts stock and the hand-off alike; by default these runs leave that out,
so that the hand-off's own end is compared with the sidecar mounter's 5 s. `--kubelet-kill 2`
adds it to the grace runs: 2 s after the stop, every process under fake-node-driver (the
sidecar mounter, the drop-in, gcsfuse) is SIGKILLed at once; an upload cut by it is counted
apart, not as cut shorter than stock.

    fuse-tests/bench/handoff_stops.py [--runs 300] [--seed N] [--mix native:4,exit-file:2,grace:4]
                                      [--stock-share 0.25] [--grace-sizes 16-160] [--max-delay 2.5]
                                      [--kubelet-kill 2]
                                      [--bin-dir target/release] [--results DIR]

`stop` in its table is fake-node-driver's stop (the SIGTERM to the sidecar mounter, or the
exit file it wrote) to the sidecar mounter's exit; the exit file's includes the sidecar
mounter's poll. Results: fuse-tests/bench/results/handoff-stops-<time>/ (table.txt, runs.json
with every run, the sidecars' logs); 300 runs took 1,444 s in
docs/results/2026-12-07-handoff-stops-300-b201aff.txt (the exit file's poll and stock's 5 s
are most of a run).

It needs the release binaries (drainfs, fake-node-driver: `cargo build --release -p drainfs -p
fuse-tests --bins`) and scripts/install-lowers.sh's gcsfuse, sidecar mounter and
fake-gcs-server. Everything it mounts lives under one fresh $TMPDIR/drainfs-handoff-stops.XXXXXX
(TMPDIR default /tmp; its path must be reachable by uid 65534);
at the end (and on SIGTERM or Ctrl-C) it stops the processes it started, by PID, unmounts
whatever is still mounted there and removes it.
"""

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(REPO, "scripts"))

import benchlib  # noqa: E402
import lowers  # noqa: E402
from benchlib import SIDECAR_UID, BenchError, pct_nearest, private_bins, wait_for  # noqa: E402
from gcsfuse import render, sidecar_mount_options  # noqa: E402  (the table; the flags fake-gcs-server needs, metrics off)

log = benchlib.make_log("handoff-stops")

# The sidecar mounter's SIGKILL of its child after its SIGTERM (forceKillCmd after
# gracefulKillGracePeriod), ms: what stock allows an upload in flight when no stock run
# measured it.
STOCK_KILL_MS = 5000

# The workload: writes the files of a JSON spec [[name, size, seed], ...] into DIR, one after
# the other, 1 MiB at a time (a random block per file, each MiB prefixed with its index), and
# prints a JSON line per file before its close() ("closing", with the sha256 of its content)
# and after it ("closed": whether close() returned 0, the errno if not).
WORKLOAD = r"""
import hashlib, json, os, random, sys
d, spec = sys.argv[1], json.loads(sys.argv[2])
os.makedirs(d, exist_ok=True)
for name, size, seed in spec:
    block = random.Random(seed).randbytes(1 << 20)
    h = hashlib.sha256()
    rec = {"name": name, "size": size}
    try:
        fd = os.open(os.path.join(d, name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        off = 0
        while off < size:
            chunk = (off >> 20).to_bytes(8, "little") + block[8:]
            chunk = chunk[:size - off]
            os.write(fd, chunk)
            h.update(chunk)
            off += len(chunk)
        rec["sha256"] = h.hexdigest()
        print(json.dumps(dict(rec, event="closing")), flush=True)
        os.close(fd)
        print(json.dumps(dict(rec, event="closed", closed=True)), flush=True)
    except OSError as e:
        print(json.dumps(dict(rec, event="closed", closed=False, errno=e.errno)), flush=True)
"""


class Ctx:
    pass


def meminfo_mib(field):
    """A /proc/meminfo field in MiB (None when missing)."""
    with open("/proc/meminfo") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k == field:
                return int(v.split()[0]) >> 10
    return None


def rss_mib(pid):
    """Process `pid`'s resident memory in MiB (None when gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return next((int(x.split()[1]) >> 10 for x in f if x.startswith("VmRSS:")), None)
    except OSError:
        return None


def start_sidecar(ctx, n, tag, arr, stop):
    """fake-node-driver in its CSI mode with the real sidecar mounter running the drop-in
    (the hand-off) or stock gcsfuse; returns (Popen, stdout lines, ready event, reader thread,
    paths). The paths stay short: the socket's must fit in sun_path."""
    d = os.path.join(ctx.work, "r", str(n))
    mnt, base = os.path.join(d, "mnt"), os.path.join(d, "base")
    for x in (d, mnt, base):
        os.makedirs(x, exist_ok=True)
    os.chown(d, SIDECAR_UID, SIDECAR_UID)
    vol = f"drainfs-bench-{os.getpid()}-s{n}"
    with open(os.path.join(ctx.work, "global-dirs"), "a") as f:
        f.write(f"/gcsfuse-tmp/.volumes/{vol}\n/gcsfuse-buffer/.volumes/{vol}\n")
    summary = os.path.join(d, "summary.json")
    env = dict(os.environ, DRAINFS_REAL_GCSFUSE=ctx.gcsfuse, DRAINFS_SUMMARY_FILE=summary)
    env.pop("DRAINFS_DROPIN_MODE", None)  # the hand-off, the drop-in's default
    cmd = [ctx.fake_node_driver, "--mountpoint", mnt, "--volume-base-path", base, "--volume-name", vol,
           "--bucket", ctx.server["bucket"], "--stop", stop, "--grace-period", "30s", "--ready-timeout", "60s"]
    for o in sidecar_mount_options(ctx):
        cmd += ["--mount-option", o]
    cmd += ["--", ctx.sidecar_mounter, f"--gcsfuse-path={ctx.dropin if arr == 'handoff' else ctx.gcsfuse}"]
    logp = os.path.join(ctx.logs, f"{tag}.log")
    with open(logp, "ab") as logf:
        logf.write(("$ " + " ".join(cmd) + "\n").encode())
        logf.flush()
        p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=logf, env=env,
                             restore_signals=True, start_new_session=True)
    ctx.tracker.add(p.pid)
    lines, ready = [], threading.Event()

    def reader():
        for raw in p.stdout:
            line = raw.decode(errors="replace").strip()
            lines.append(line)
            if line == "ready":
                ready.set()

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    return p, lines, ready, t, dict(dir=d, mnt=mnt, summary=summary, log=logp)


def descendants(pid):
    """Every process under `pid` (children first found, then theirs)."""
    out, todo = [], [pid]
    while todo:
        for c in benchlib.child_pids(todo.pop()):
            out.append(c)
            todo.append(c)
    return out


def kill_container(p, res):
    """The kubelet's SIGKILL of the sidecar container at the end of the grace period: every
    process under fake-node-driver (the sidecar mounter, the drop-in, gcsfuse; processes this
    script's run started), at once, through pidfds; fake-node-driver itself is the node, not the
    container. Does nothing once the sidecar has exited."""
    if p.poll() is not None:
        return
    fds = []
    for pid in descendants(p.pid):
        try:
            fds.append(os.pidfd_open(pid))
        except OSError:
            pass
    res["killed_by_kubelet"] = bool(fds)
    for fd in fds:
        try:
            signal.pidfd_send_signal(fd, signal.SIGKILL)
        except ProcessLookupError:
            pass
        finally:
            os.close(fd)


def workload_spec(ctx, rng, scenario):
    """[[name, size, seed], ...]: 1-3 files of 1-16 MiB; for `grace`, 0-2 small files and the
    large one the stop finds inside close()."""
    if scenario == "grace":
        spec = [[f"small{i}.bin", rng.randint(1, 4) << 20, rng.getrandbits(32)] for i in range(rng.randint(0, 2))]
        return spec + [["large.bin", rng.randint(*ctx.grace_sizes) << 20, rng.getrandbits(32)]]
    return [[f"f{i}.bin", rng.randint(1, 16) << 20, rng.getrandbits(32)] for i in range(rng.randint(1, 3))]


def one_run(ctx, n, scenario, arr, rng):
    tag = f"{n:04d}-{scenario}-{arr}"
    stop = "exit-file" if scenario == "exit-file" else "native"
    spec = workload_spec(ctx, rng, scenario)
    res = {"run": n, "scenario": scenario, "arrangement": arr, "sizes": [s[1] for s in spec]}
    p, lines, ready, reader, paths = start_sidecar(ctx, n, tag, arr, stop)
    prefix = f"stops/{tag}"
    wl = None
    try:
        wait_for(ready.is_set, 60, f"{tag}: ready", p, paths["log"])
        wl_cmd = [sys.executable, "-c", WORKLOAD, os.path.join(paths["mnt"], prefix), json.dumps(spec)]
        recs = []
        if scenario == "grace":
            wl = subprocess.Popen(wl_cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True)
            ctx.tracker.add(wl.pid)
            closing = threading.Event()
            dead = {}

            def wl_reader():
                for raw in wl.stdout:
                    try:
                        r = json.loads(raw)
                    except ValueError:
                        continue  # a line cut by the SIGKILL
                    recs.append(r)
                    if r["event"] == "closing" and r["name"] == "large.bin":
                        closing.set()
                wl.wait()
                dead["t"] = time.monotonic()

            wt = threading.Thread(target=wl_reader, daemon=True)
            wt.start()
            wait_for(closing.is_set, 300, f"{tag}: the workload closing its large file", wl)
            delay = rng.uniform(0, 0.4)
            time.sleep(delay)
            res["delay_s"] = delay
            # The end of the grace period: the workload SIGKILLed, the native sidecar SIGTERMed.
            ctx.tracker.signal(wl.pid, signal.SIGKILL)
            p.stdin.close()
            t_stop = time.monotonic()
            killer = None
            if ctx.kubelet_kill is not None:
                killer = threading.Timer(ctx.kubelet_kill, kill_container, (p, res))
                killer.start()
            wt.join(60)
            if killer is not None:
                killer.join()
            if "t" not in dead:
                raise BenchError(f"{tag}: the workload did not end within 60 s of its SIGKILL")
            ctx.tracker.reaped(wl.pid)
            res["workload_ended_ms"] = (dead["t"] - t_stop) * 1000
        else:
            r = subprocess.run(wl_cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=300)
            recs = [json.loads(x) for x in r.stdout.decode().splitlines() if x.strip()]
            if r.returncode != 0:
                raise BenchError(f"{tag}: the workload failed ({r.returncode}): {r.stderr.decode()[-300:]}")
            delay = rng.uniform(0, ctx.max_delay)
            time.sleep(delay)
            res["delay_s"] = delay
            p.stdin.close()
        rc = p.wait(60)
        ctx.tracker.reaped(p.pid)
        # The machine's memory at the run's end, and fake-gcs-server's (memory pressure stalls
        # every process, gcsfuse too).
        res["mem_available_mib"] = meminfo_mib("MemAvailable")
        res["server_rss_mib"] = rss_mib(ctx.server["pid"])
        reader.join(10)
        ex = next((x for x in lines if x.startswith("sidecar exit: ")), "sidecar exit: ? after 0 ms")
        status, _, ms = ex[len("sidecar exit: "):].rpartition(" after ")
        res["sidecar_exit"], res["stop_ms"], res["fnd_exit"] = status, float(ms.split()[0]), rc
        res["gcsfuse_exit"] = next((x[len("gcsfuse exit: "):] for x in lines if x.startswith("gcsfuse exit: ")), "?")
        res["error_lines"] = [x[len("error file: "):] for x in lines if x.startswith("error file: ")]
        if arr == "handoff":
            try:
                with open(paths["summary"]) as f:
                    s = json.load(f)
                res["outcome"], res["idle"], res["still_ms"] = s.get("outcome"), s.get("idle"), s.get("still_ms")
                res["gcsfuse_exited_ms"] = (s.get("timings") or {}).get("gcsfuse_exited_ms")
                # When drainfs decided gcsfuse was idle (ms after its SIGTERM).
                res["idle_ms"] = (s.get("timings") or {}).get("idle_ms")
            except (OSError, ValueError):
                # SIGKILLed (the sidecar mounter's SIGKILL at 5 s with gcsfuse still busy, or
                # --kubelet-kill), or a failure: see the log
                res["outcome"] = "no summary"
                # The sidecar mounter reports its child (drainfs) SIGKILLed: its own SIGKILL 5 s
                # after its SIGTERM, which ends gcsfuse with drainfs at the moment it ends the
                # stock gcsfuse (unless the kubelet's SIGKILL came first).
                res["sidecar_sigkill"] = (res["gcsfuse_exit"] == "signal SIGKILL"
                                          and not res.get("killed_by_kubelet"))
        objs = lowers.objects("gcsfuse", ctx.lowers_dir, prefix=prefix + "/")
        closed = {r["name"]: r for r in recs if r["event"] == "closed" and r.get("closed")}
        closing = {r["name"]: r for r in recs if r["event"] == "closing"}
        res["closed_files"] = len(closed)
        res["silent_losses"] = []
        for name, r in closed.items():
            o = objs.get(f"{prefix}/{name}")
            if o is None or o["size"] != r["size"] or o["sha256"] != closing[name]["sha256"]:
                res["silent_losses"].append(name)
        if scenario == "grace":
            big = closing.get("large.bin")
            if big and "large.bin" not in closed:
                o = objs.get(f"{prefix}/large.bin")
                res["inflight"] = {"size": big["size"],
                                   "complete": bool(o and o["size"] == big["size"] and o["sha256"] == big["sha256"])}
        # Checked: off the server, whose memory backend would otherwise hold every run's objects
        # (an earlier run, before this, used up the machine's memory partway).
        lowers.delete_objects("gcsfuse", ctx.lowers_dir, prefix + "/")
        return res
    finally:
        if wl is not None and wl.poll() is None:
            ctx.tracker.signal(wl.pid, signal.SIGKILL)
        if p.poll() is None:
            if not p.stdin.closed:
                p.stdin.close()
            try:
                p.wait(40)
            except subprocess.TimeoutExpired:
                ctx.tracker.signal(p.pid, signal.SIGKILL)
                p.wait()
            ctx.tracker.reaped(p.pid)
        if lowers.mountinfo_entry(paths["mnt"]):
            lowers.unmount(paths["mnt"])
            res["left_mounted"] = True


def report(ctx, runs, failures):
    """The counts, as lines."""
    f = benchlib.fmt_num
    out = []
    rows = [["scenario", "arrangement", "runs", "files closed (0)", "silent losses", "stop p50 / p95 / max (ms)",
             "gcsfuse ended after the drop-in's SIGTERM p50 / max (ms)", "drainfs outcome", "sidecar exit",
             "error-file lines"]]
    for sc in ("native", "exit-file", "grace"):
        for arr in ("handoff", "stock"):
            rs = [r for r in runs if r["scenario"] == sc and r["arrangement"] == arr]
            if not rs:
                continue
            ms = [r["stop_ms"] for r in rs]

            def counts(k):
                c = {}
                for r in rs:
                    c[str(r.get(k))] = c.get(str(r.get(k)), 0) + 1
                return ", ".join(f"{v}x {k2}" for k2, v in sorted(c.items(), key=lambda kv: -kv[1]))
            err = {}
            for r in rs:
                for line in r["error_lines"]:
                    err[line[:60]] = err.get(line[:60], 0) + 1
            ends = [r["gcsfuse_exited_ms"] for r in rs if r.get("gcsfuse_exited_ms") is not None]
            rows.append([sc, arr, len(rs), sum(r["closed_files"] for r in rs), sum(len(r["silent_losses"]) for r in rs),
                         f"{pct_nearest(ms, 0.5):.0f} / {pct_nearest(ms, 0.95):.0f} / {max(ms):.0f}",
                         f"{pct_nearest(ends, 0.5):.0f} / {max(ends):.0f}" if ends else "-",
                         counts("outcome") if arr == "handoff" else "-", counts("sidecar_exit"),
                         "; ".join(f"{v}x {k}" for k, v in err.items()) or "none"])
    out.append(render(rows))
    stock_in = [r for r in runs if r["arrangement"] == "stock" and r.get("inflight")]
    hand_in = [r for r in runs if r["arrangement"] == "handoff" and r.get("inflight")]
    stock_allow = min((r["stop_ms"] for r in stock_in), default=None)
    allow = stock_allow if stock_allow is not None else STOCK_KILL_MS
    out.append("")
    out.append(f"Uploads in flight at the stop (grace runs: the workload SIGKILLed inside close()); stock allows one "
               f"{allow:.0f} ms after its SIGTERM ("
               + (f"the shortest stock stop of {len(stock_in)} measured here" if stock_allow is not None
                  else f"no stock run measured it: the sidecar mounter's {STOCK_KILL_MS} ms") + ")")
    for arr, rs in (("stock", stock_in), ("handoff", hand_in)):
        if not rs:
            out.append(f"  {arr}: none")
            continue
        done = [r for r in rs if r["inflight"]["complete"]]
        ran = [r["workload_ended_ms"] for r in rs]
        line = (f"  {arr}: {len(rs)} in flight, {len(done)} completed, {len(rs) - len(done)} cut; "
                f"close() ended after the stop p50 {f(pct_nearest(ran, 0.5))} / max {f(max(ran))} ms")
        if arr == "handoff":
            ends = [r["gcsfuse_exited_ms"] for r in rs if r.get("gcsfuse_exited_ms") is not None]
            if ends:
                line += f"; drainfs ended gcsfuse p50 {f(pct_nearest(ends, 0.5))} / max {f(max(ends))} ms after its SIGTERM"
        out.append(line)
    # Cut shorter: not complete, ended by drainfs before stock's end. Not cut shorter: ended by
    # the kubelet's SIGKILL of the whole sidecar, or by the sidecar mounter's SIGKILL of drainfs
    # (gcsfuse dies with it), each of which ends stock gcsfuse at the same moment. Any other run
    # without a summary counts as cut.
    by_sidecar = [r for r in hand_in if r.get("sidecar_sigkill")]
    shorter = [r for r in hand_in if not r["inflight"]["complete"] and not r.get("killed_by_kubelet")
               and not r.get("sidecar_sigkill")
               and (r.get("gcsfuse_exited_ms") is None or r["gcsfuse_exited_ms"] < allow)]
    by_kubelet = {arr: sum(1 for r in rs if r.get("killed_by_kubelet") and not r["inflight"]["complete"])
                  for arr, rs in (("stock", stock_in), ("handoff", hand_in))}
    cut_idle = [r for r in hand_in if not r["inflight"]["complete"] and r.get("idle")]
    # Idle too early, complete or not: drainfs decided gcsfuse was idle before the killed
    # workload's close() ended (its FLUSH was still in gcsfuse's hands). An upload whose last
    # request had already reached the server still completes; the decision was wrong all the
    # same. The drop-in's SIGTERM and the workload's SIGKILL are sent together (t_stop).
    early = [r for r in hand_in if r.get("idle_ms") is not None and r.get("workload_ended_ms") is not None
             and r["idle_ms"] < r["workload_ended_ms"]]
    losses = sum(len(r["silent_losses"]) for r in runs)
    out.append("")
    out.append(f"silent losses: {losses} in {len(runs)} runs"
               + (": " + ", ".join(f"run {r['run']} {r['silent_losses']}" for r in runs if r["silent_losses"]) if losses else ""))
    out.append(f"uploads in flight cut shorter than stock by the hand-off: {len(shorter)} of {len(hand_in)}"
               + (": " + ", ".join(f"run {r['run']} ({r['inflight']['size'] >> 20} MiB, gcsfuse ended at "
                                   f"{r.get('gcsfuse_exited_ms')} ms, {r.get('outcome')})" for r in shorter) if shorter else ""))
    out.append(f"of which the hand-off took gcsfuse for idle (idle window) while the upload was still running: {len(cut_idle)}")
    out.append(f"uploads in flight the hand-off took for idle before the workload's close() ended (complete or not): "
               f"{len(early)} of {len(hand_in)}"
               + (": " + ", ".join(f"run {r['run']} (idle at {r['idle_ms']} ms, close ended at {r['workload_ended_ms']:.0f} ms, "
                                   f"{'complete' if r['inflight']['complete'] else 'CUT'})" for r in early) if early else ""))
    out.append(f"hand-off runs whose gcsfuse was still busy at the sidecar mounter's SIGKILL (5 s, as stock's): "
               f"{len(by_sidecar)}, of which the upload was cut: "
               f"{sum(1 for r in by_sidecar if not r['inflight']['complete'])}")
    if ctx.kubelet_kill is not None:
        out.append(f"cut by the kubelet's SIGKILL {ctx.kubelet_kill:g} s after the stop (the whole sidecar, as for stock): "
                   f"stock {by_kubelet['stock']}, handoff {by_kubelet['handoff']}")
    out.append(f"failed runs: {len(failures)}" + ("".join(f"\n  {x}" for x in failures) if failures else ""))
    ok = not losses and not shorter and not early and not failures
    out.append("RESULT: " + ("ok" if ok else "FAILED"))
    return out, ok


def cleanup(ctx):
    for pid in list(ctx.tracker.live):
        ctx.tracker.signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + 8
    for pid in list(ctx.tracker.live):
        while time.monotonic() < deadline and os.path.exists(f"/proc/{pid}") and not _reaped(pid):
            time.sleep(0.1)
        if os.path.exists(f"/proc/{pid}") and not _reaped(pid):
            ctx.tracker.signal(pid, signal.SIGKILL)
        ctx.tracker.reaped(pid)
    for m in sorted((x for x in benchlib.mounted_paths() if x.startswith(ctx.work + "/")), reverse=True):
        log(f"unmounting leftover {m}")
        lowers.unmount(m)
    try:
        lowers.stop(ctx.lowers_dir)
    except Exception as e:  # noqa: BLE001
        log(f"stopping fake-gcs-server: {e}")
    try:
        with open(os.path.join(ctx.work, "global-dirs")) as f:
            for d in f.read().split():
                if d.startswith(("/gcsfuse-tmp/.volumes/drainfs-bench-", "/gcsfuse-buffer/.volumes/drainfs-bench-",
                                 "/gcsfuse-cache/.volumes/drainfs-bench-")):
                    shutil.rmtree(d, ignore_errors=True)
    except OSError:
        pass
    left = [x for x in benchlib.mounted_paths() if x.startswith(ctx.work + "/")]
    if left:
        log(f"MOUNTS LEFT BEHIND: {left}; keeping {ctx.work}")
        return False
    shutil.rmtree(ctx.work, ignore_errors=True)
    return True


def _reaped(pid):
    """Reaps `pid` if it is our child and has exited; True once it is gone."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        return done == pid
    except ChildProcessError:
        return not os.path.exists(f"/proc/{pid}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=300, help="runs (default 300)")
    ap.add_argument("--seed", type=int, help="random seed (default: from the clock; printed)")
    ap.add_argument("--mix", default="native:4,exit-file:2,grace:4", help="scenario weights (default native:4,exit-file:2,grace:4)")
    ap.add_argument("--stock-share", type=float, default=0.25,
                    help="share of the grace runs run with stock gcsfuse, to measure what stock allows (default 0.25)")
    ap.add_argument("--grace-sizes", default="16-160", help="MiB range of the file inside close() at the stop (default 16-160)")
    ap.add_argument("--max-delay", type=float, default=2.5,
                    help="longest delay (s) between the workload's exit and the stop (default 2.5: some stops fall "
                         "inside the idle window after the last I/O, 500 ms by default, or a tie's 2 s)")
    ap.add_argument("--kubelet-kill", type=float,
                    help="grace runs: the kubelet's SIGKILL of the whole sidecar this many seconds after the stop "
                         "(the kubelet gives 2); default: none, so that stock's 5 s and the hand-off's own end are "
                         "compared")
    ap.add_argument("--bin-dir", default=os.path.join(os.environ.get("CARGO_TARGET_DIR", os.path.join(REPO, "target")), "release"),
                    help="directory holding drainfs and fake-node-driver (default target/release)")
    ap.add_argument("--results", help="results directory (default fuse-tests/bench/results/handoff-stops-<time>)")
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("handoff_stops: must run as root")
    mix = []
    for part in a.mix.split(","):
        name, _, w = part.partition(":")
        if name not in ("native", "exit-file", "grace") or not w.isdigit():
            sys.exit(f"handoff_stops: --mix takes native:W,exit-file:W,grace:W, not {a.mix!r}")
        mix.append((name, int(w)))
    seed = a.seed if a.seed is not None else int(time.time())
    rng = random.Random(seed)

    ctx = Ctx()
    lo, _, hi = a.grace_sizes.partition("-")
    ctx.grace_sizes = (int(lo), int(hi or lo))
    ctx.max_delay = a.max_delay
    ctx.kubelet_kill = a.kubelet_kill
    ctx.work = tempfile.mkdtemp(prefix="drainfs-handoff-stops.")
    os.chmod(ctx.work, 0o755)
    results = a.results or os.path.join(HERE, "results", "handoff-stops-" + time.strftime("%Y%m%d-%H%M%S"))
    # The sidecars' logs go to the results directory: the work directory goes at the end.
    ctx.logs = os.path.join(results, "logs")
    ctx.lowers_dir = os.path.join(ctx.work, "lowers")
    os.makedirs(ctx.logs, exist_ok=True)
    ctx.tracker = benchlib.Tracker(ctx.work)
    for s in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, lambda *_: sys.exit(143))
    runs, failures = [], []
    t0 = time.monotonic()
    ok = False
    try:
        bindir = os.path.join(ctx.work, "bin")
        os.makedirs(bindir)
        for name, path in private_bins(a.bin_dir, bindir, ("drainfs", "fake-node-driver"), "handoff_stops").items():
            setattr(ctx, name.replace("-", "_"), path)
        ctx.dropin = os.path.join(ctx.work, "dropin", "gcsfuse")
        os.makedirs(os.path.dirname(ctx.dropin))
        shutil.copy2(ctx.drainfs, ctx.dropin)
        ctx.gcsfuse = lowers.binary("gcsfuse")
        ctx.sidecar_mounter = lowers.binary("gcs-fuse-csi-driver-sidecar-mounter")
        ctx.server = lowers.start_server("gcsfuse", ctx.lowers_dir)
        ctx.tracker.add(ctx.server["pid"])
        log(f"{a.runs} runs, seed {seed}, mix {a.mix}, grace sizes {ctx.grace_sizes} MiB, work dir {ctx.work}")
        names, weights = zip(*mix)
        for n in range(a.runs):
            scenario = rng.choices(names, weights)[0]
            arr = "stock" if scenario == "grace" and rng.random() < a.stock_share else "handoff"
            try:
                r = one_run(ctx, n, scenario, arr, rng)
            except (BenchError, subprocess.TimeoutExpired, OSError, ValueError) as e:
                failures.append(f"run {n} {scenario} {arr}: {e}")
                log(f"run {n + 1}/{a.runs} {scenario} {arr}: FAILED: {e}")
                if len(failures) >= 3 and not runs:
                    log("the first 3 runs failed: giving up")
                    break
                continue
            runs.append(r)
            if r.get("left_mounted"):
                failures.append(f"run {n} {scenario} {arr}: a mount was left behind")
            inflight = r.get("inflight")
            log(f"run {n + 1}/{a.runs} {scenario} {arr} {[x >> 20 for x in r['sizes']]} MiB: stop {r['stop_ms']:.0f} ms, "
                f"{r['sidecar_exit']}, {r.get('outcome', '-')}, losses {len(r['silent_losses'])}"
                + (f", in flight: {'complete' if inflight['complete'] else 'CUT'}, close ended "
                   f"{r['workload_ended_ms']:.0f} ms after the stop" if inflight else "")
                + f"; memory available {r['mem_available_mib']} MiB, server {r['server_rss_mib']} MiB")
        ok = True
    except (BenchError, lowers.LowersError) as e:
        failures.append(str(e))
        log(f"FAILED: {e}")
    except (KeyboardInterrupt, SystemExit):
        failures.append("interrupted")
        log("interrupted")
    finally:
        clean = cleanup(ctx)
        if not clean:
            failures.append("mounts left behind")
    lines, good = report(ctx, runs, failures)
    header = (f"handoff stops: {len(runs)} of {a.runs} runs, seed {seed}, mix {a.mix}, stock share of grace runs "
              f"{a.stock_share}; {time.monotonic() - t0:.0f} s; loadavg {benchlib.loadavg()}")
    text = "\n".join([header, ""] + lines)
    print(text)
    os.makedirs(results, exist_ok=True)
    with open(os.path.join(results, "table.txt"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(results, "runs.json"), "w") as f:
        json.dump({"seed": seed, "args": vars(a), "runs": runs, "failures": failures}, f, indent=1)
    log(f"results in {results}")
    return 0 if ok and good else 1


if __name__ == "__main__":
    sys.exit(main())
