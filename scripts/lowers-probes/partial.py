# overwrite of an existing object, fsync at 100 MiB, client SIGKILLed while the file is open: what is left?
import os, sys, time, json, signal
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__))); from probelib import *
kind, signame = sys.argv[1], sys.argv[2]
p = Pair(kind, f"{BASE}/w12-{kind}"); c = p.mount()
try:
    with open(p.mnt + "/f.bin", "w") as f: f.write("old\n")
    time.sleep(0.5)
    w = writer(p.mnt + "/f.bin", 200, 100, "100:8")
    for line in w.stdout:
        e = json.loads(line)
        if e["ev"] == "pausing":
            time.sleep(1); print("before signal, server size:", p.stat("f.bin"))
            c.send_signal(getattr(signal, signame))
        if e["ev"] not in ("wrote",): print(" writer", e)
    w.wait(); rc = c.wait(20)
    time.sleep(1)
    print(kind, signame, "client rc", rc, "| server object after:", p.stat("f.bin"), "|", p.mount_state())
finally:
    p.close()
