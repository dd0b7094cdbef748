#!/usr/bin/env python3
"""FUSE requests per metadata operation, from drainfs's own metrics (a tuning aid, not run by
run.sh). As root:

    python3 fuse-tests/bench/roundtrips.py [--bin target/release/drainfs] [--files 2000]

Mounts drainfs (passthrough auto, then never) over a private tmpfs with --admin-addr, runs
create / stat / open+close / unlink over N files in one directory, within the entry TTL and
after it expired, and prints, per phase, the wall time per operation and how many requests of
each kind drainfs answered per operation, with the daemon's mean time in each handler
(drainfs_requests_total and drainfs_request_duration_seconds deltas).
"""

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

from benchlib import REPO, free_port, is_mounted


def scrape(port):
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    count = {m[1]: int(m[2]) for m in re.finditer(r'^drainfs_requests_total\{op="(\w+)"\} (\d+)', text, re.M)}
    secs = {m[1]: float(m[2]) for m in
            re.finditer(r'^drainfs_request_duration_seconds_sum\{op="(\w+)"\} ([0-9.e+-]+)', text, re.M)}
    return count, secs


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.path.join(REPO, "target", "release", "drainfs"))
    ap.add_argument("--files", type=int, default=2000)
    ap.add_argument("--ttl", help="pass --ttl to drainfs (its default otherwise)")
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("roundtrips: must run as root")
    n = a.files
    names = [f"f{i:07d}" for i in range(n)]
    work = tempfile.mkdtemp(prefix="drainfs-roundtrips.", dir="/tmp")
    lower, mnt = os.path.join(work, "lower"), os.path.join(work, "mnt")
    os.makedirs(lower)
    os.makedirs(mnt)
    subprocess.run(["mount", "-t", "tmpfs", "drainfs-roundtrips", lower], check=True)
    proc = None
    try:
        for mode in ("auto", "never"):
            port = free_port()
            cmd = [a.bin, "run", "--lower", lower, "--mountpoint", mnt, "--passthrough", mode, "--native-sidecar",
                   "--admin-addr", f"127.0.0.1:{port}"] + (["--ttl", a.ttl] if a.ttl else [])
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            deadline = time.monotonic() + 30
            while not is_mounted(mnt):
                if proc.poll() is not None or time.monotonic() > deadline:
                    sys.exit(f"roundtrips: drainfs did not mount ({' '.join(cmd)})")
                time.sleep(0.01)
            time.sleep(0.3)
            d = os.path.join(mnt, f"d-{mode}")
            os.mkdir(d)
            dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)

            def create():
                for x in names:
                    os.close(os.open(x, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644, dir_fd=dfd))

            def stat():
                for x in names:
                    os.stat(x, dir_fd=dfd)

            def open_close():
                for x in names:
                    os.close(os.open(x, os.O_RDONLY, dir_fd=dfd))

            def unlink():
                for x in names:
                    os.unlink(x, dir_fd=dfd)

            print(f"== drainfs --passthrough {mode} ({n} files; 'expired' phases wait 1.2 s first)")
            for label, fn, pause in (("create", create, 0), ("stat (cached)", stat, 0), ("open+close (cached)", open_close, 0),
                                     ("stat (expired)", stat, 1.2), ("open+close (expired)", open_close, 1.2),
                                     ("unlink (expired)", unlink, 1.2)):
                time.sleep(pause)
                c0, s0 = scrape(port)
                t0 = time.perf_counter()
                fn()
                el = time.perf_counter() - t0
                time.sleep(0.2)  # async RELEASE/FORGET land
                c1, s1 = scrape(port)
                parts = []
                for op in sorted(c1):
                    k = c1[op] - c0.get(op, 0)
                    if k * 20 >= n:  # ignore stragglers (< 0.05 per op)
                        us = (s1.get(op, 0) - s0.get(op, 0)) / k * 1e6
                        parts.append(f"{op} {k / n:.2f} ({us:.1f}us)")
                print(f"  {label:22s} {el / n * 1e6:7.1f} us/op   requests/op (daemon time): {', '.join(parts) or 'none'}")
            os.close(dfd)
            os.rmdir(d)
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
            proc = None
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        if is_mounted(mnt):
            subprocess.run(["fusermount3", "-u", "-z", mnt], stderr=subprocess.DEVNULL)
        subprocess.run(["umount", lower], stderr=subprocess.DEVNULL)
        if not is_mounted(lower) and not is_mounted(mnt):
            os.rmdir(lower)
            os.rmdir(mnt)
            os.rmdir(work)


if __name__ == "__main__":
    main()
