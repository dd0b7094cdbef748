# fsync at 100 MiB then pause 5 s: is anything on the server before close?
import os, sys, time, json, threading
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__))); from probelib import *
kind = sys.argv[1]
p = Pair(kind, f"{BASE}/w2-{kind}"); p.mount()
try:
    t0 = time.monotonic()
    w = writer(p.mnt + "/f.bin", 200, 100, "100:5")
    for line in w.stdout:
        e = json.loads(line)
        if e["ev"] in ("fsync-ok", "fsync-err", "pausing", "resumed", "close-ok", "close-err", "write-err"):
            print(round(time.monotonic()-t0,2), e, "server size:", p.stat("f.bin"))
        if e["ev"] == "pausing":
            time.sleep(2.5); print(round(time.monotonic()-t0,2), "mid-pause server size:", p.stat("f.bin"))
    w.wait()
    o = p.objects().get("f.bin"); print("final", o and o["size"])
finally:
    p.close()
