# sequential 200 MiB write: when does the object appear on the server; close() duration
import os, sys, time, json, threading
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__))); from probelib import *
kind = sys.argv[1]; mib = int(sys.argv[2]) if len(sys.argv) > 2 else 200
p = Pair(kind, f"{BASE}/w-{kind}"); p.mount()
try:
    t0 = time.monotonic(); seen = []; stop = False
    def poll():
        last = "x"
        while not stop:
            try: s = p.stat("big.bin")
            except Exception as e: s = repr(e)
            if s != last: seen.append((round(time.monotonic() - t0, 2), s)); last = s
            time.sleep(0.2)
    th = threading.Thread(target=poll); th.start()
    w = writer(p.mnt + "/big.bin", mib)
    evs = []
    for line in w.stdout:
        e = json.loads(line); e["T"] = round(time.monotonic() - t0, 2); evs.append(e)
    w.wait(); time.sleep(1); stop = True; th.join()
    for e in evs:
        if e["ev"] != "wrote" or e["mib"] % 50 == 0: print("writer", e)
    print("server size changes:", seen)
    o = p.objects().get("big.bin"); close_ev = [e for e in evs if e["ev"] == "close-start"][0]
    print("object after close:", o["size"] if o else None, "sha ok:", bool(o) and o["sha256"] == close_ev["sha256"])
    tot = evs[-1]["T"]; print(f"total incl close {tot}s -> {mib/tot:.1f} MiB/s")
finally:
    p.close()
