# signal the FUSE client while a 200 MiB file is being written / open idle / inside close()
import sys, time, json, threading, signal, queue, os
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__))); from probelib import *
kind, signame, phase = sys.argv[1], sys.argv[2], sys.argv[3]
sig = getattr(signal, signame)
p = Pair(kind, f"{BASE}/w3-{kind}"); c = p.mount()
t0 = time.monotonic()
def T(): return round(time.monotonic() - t0, 2)
try:
    watch = []
    def watcher():
        last = None
        while True:
            rc = c.poll(); ms = p.mount_state()
            cur = (rc, ms)
            if cur != last: watch.append((T(), "client rc", rc, ms)); last = cur
            if rc is not None and ms != "mounted, ok": break
            time.sleep(0.02)
    threading.Thread(target=watcher, daemon=True).start()
    pause = "100:12" if phase == "idle" else None
    if phase == "none":
        time.sleep(0.5); c.send_signal(sig); print(T(), "sent", signame, "(no file open)")
        try: c.wait(20)
        except subprocess.TimeoutExpired: print("client did not exit in 20s")
        time.sleep(0.2); print("\n".join(map(str, watch))); raise SystemExit
    w = writer(p.mnt + "/f.bin", 200, "-", pause)
    q = queue.Queue()
    threading.Thread(target=lambda: [q.put(json.loads(l)) for l in w.stdout] + [q.put(None)], daemon=True).start()
    sent = None; evs = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try: e = q.get(timeout=0.1)
        except queue.Empty: e = "tick"
        if e is None: break
        if e != "tick":
            e["T"] = T(); evs.append(e)
            if sent is not None or e["ev"] not in ("wrote",): print("writer", e)
        if sent is None and e != "tick":
            trig = (phase == "write" and e["ev"] == "wrote" and e["mib"] == 100) or \
                   (phase == "idle" and e["ev"] == "pausing") or \
                   (phase == "close" and e["ev"] == "close-start")
            if trig:
                if phase == "idle": time.sleep(1)
                if phase == "close": time.sleep(0.7 if kind == "s3" else 0.3)
                c.send_signal(sig); sent = T(); print(sent, "sent", signame, "to client; server size:", p.stat("f.bin"))
    else:
        print(T(), "writer still running after 60s; killing it"); w.kill()
    w.wait()
    try: rc = c.wait(20); print(T(), "client exit status:", rc, "(Popen: negative = killed by signal)")
    except subprocess.TimeoutExpired: print(T(), "client still running 20s after the writer finished:", p.mount_state())
    print(T(), "mount:", p.mount_state())
    time.sleep(2)
    o = p.objects().get("f.bin"); print(T(), "server object:", o and o["size"])
    cs = [e for e in evs if e["ev"] == "close-start"]
    if o and cs: print("sha matches written data:", o["sha256"] == cs[0]["sha256"])
    print("\n".join(map(str, watch)))
    print("client log tail:"); print(L._tail(p.log, 6))
finally:
    p.close()
    print("after cleanup:", p.mount_state())
