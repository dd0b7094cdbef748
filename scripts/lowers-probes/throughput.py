import os, sys, time, subprocess
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__))); from probelib import *
kind = sys.argv[1]
if not os.path.exists(f"{BASE}/rand200"):
    with open(f"{BASE}/rand200", "wb") as f: f.write(os.urandom(200 << 20))
p = Pair(kind, f"{BASE}/w11-{kind}"); p.mount()
try:
    for i in range(3):
        t = time.monotonic()
        r = subprocess.run([f"dd", f"if={BASE}/rand200", f"of={p.mnt}/t{i}.bin", "bs=1M"], capture_output=True, text=True)
        dt = time.monotonic() - t
        print(kind, f"run {i}: dd rc={r.returncode} {dt:.2f}s -> {200/dt:.1f} MiB/s (write+close)")
    t = time.monotonic(); subprocess.run(["cat", f"{p.mnt}/t0.bin"], stdout=subprocess.DEVNULL); dt = time.monotonic() - t
    print(kind, f"read back 200 MiB: {dt:.2f}s -> {200/dt:.1f} MiB/s")
    print({k: v["size"] for k, v in p.objects().items()})
finally:
    p.close()
