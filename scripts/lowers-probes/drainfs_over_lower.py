# drainfs (current build) over a real lower: passthrough auto|never; files of several sizes; exit file
import os, sys, time, json, hashlib, subprocess
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__))); from probelib import *
kind, pt = sys.argv[1], sys.argv[2]
wd = f"{BASE}/w8-{kind}"; shutil.rmtree(wd, ignore_errors=True); os.makedirs(wd)
srv = L.start_server(kind, wd)
lower, mnt = wd + "/lower", wd + "/mnt"; os.makedirs(lower); os.makedirs(mnt)
argv = [os.environ.get("DRAINFS", os.path.join(os.path.dirname(os.path.dirname(HERE)), "target", "debug", "drainfs")), "run", "--lower", lower, "--mountpoint", mnt, "--passthrough", pt,
        "--exit-file", wd + "/exit", "--summary-file", wd + "/summary.json", "--"] + L.mount_argv(kind, wd, lower)
log = wd + "/drainfs.log"
d = L.spawn(argv, log, env=dict(os.environ, RCLONE_LOG_LEVEL=os.environ.get("RLL", "INFO")))
try:
    t0 = time.monotonic()
    while time.monotonic() - t0 < 30:
        e = L.mountinfo_entry(mnt)
        if e and e["fstype"] != L.FSTYPES[kind]: break
        if d.poll() is not None: break
        time.sleep(0.1)
    print("drainfs mount:", L.mountinfo_entry(mnt), "rc", d.poll())
    want = {}
    for name, size in [("small.txt", 100), ("one-mb.bin", 1 << 20), ("big.bin", 200 << 20)]:
        data = os.urandom(size)
        t = time.monotonic()
        try:
            with open(f"{mnt}/{name}", "wb") as f:
                f.write(data)
            print(f"wrote {name} in {time.monotonic()-t:.2f}s")
        except OSError as ex:
            print(f"write {name}: {ex}")
        want[name] = (size, hashlib.sha256(data).hexdigest())
    print("server right after the closes:", {k: v["size"] for k, v in L.objects(kind, wd).items()})
    time.sleep(3)
    got = L.objects(kind, wd)
    for k, (sz, h) in want.items():
        g = got.get(k); print(" ", k, "want", sz, "got", g and g["size"], "sha ok" if g and g["sha256"] == h else "SHA MISMATCH/MISSING")
    open(wd + "/exit", "w").close()
    try: rc = d.wait(60)
    except subprocess.TimeoutExpired: rc = "still running"
    print("drainfs exit:", rc, "| mounts left:", L.mountinfo_entry(mnt), L.mountinfo_entry(lower))
    print(L._tail(log, 8)[-3000:])
finally:
    if d.poll() is None: d.send_signal(signal.SIGTERM); d.wait(30)
    L.unmount(mnt); L.unmount(lower); L.stop(wd)
