# rclone/s3fs: two write handles on one file, object state after each step
import os, sys, time, errno
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__))); from probelib import *
kind = sys.argv[1]
p = Pair(kind, f"{BASE}/w7-{kind}"); c = p.mount()
W, C, T = os.O_WRONLY, os.O_CREAT, os.O_TRUNC
data = b"x" * 1000000
def st(key):
    time.sleep(0.3); s = p.stat(key); return "missing" if s is None else s
fds = {}
def run(label, key, steps):
    out = []
    for s in steps:
        op, h = s[:-1], s[-1]
        try:
            if op == "open": fds[h] = os.open(p.mnt + "/" + key, W | C | T, 0o644)
            elif op == "open-notrunc": fds[h] = os.open(p.mnt + "/" + key, W)
            elif op == "write": os.write(fds[h], data)
            elif op == "flush": os.close(os.dup(fds[h]))
            elif op == "fsync": os.fsync(fds[h])
            elif op == "close": os.close(fds.pop(h))
            r = "ok"
        except OSError as e:
            r = errno.errorcode[e.errno]
        except KeyError:
            r = "no-handle"
        out.append(f"{op}{h}:{r}->{st(key)}")
    print(f"[{label}]", "  ".join(out), flush=True)
    for h in list(fds): 
        try: os.close(fds.pop(h))
        except OSError: pass
try:
    run("T1 app-like: open A; open B; write B; flush A; flush B; close B; close A", "t1",
        ["openA", "openB", "writeB", "flushA", "flushB", "closeB", "closeA"])
    run("T2: open A; open B; write B; flush B; close A; close B", "t2",
        ["openA", "openB", "writeB", "flushB", "closeA", "closeB"])
    run("T3: open A; write A; flush A; close A (single handle baseline)", "t3",
        ["openA", "writeA", "flushA", "closeA"])
    run("T4: open A; flush A; close A (no writes)", "t4", ["openA", "flushA", "closeA"])
    run("T5: open A; open B(no O_TRUNC); write B; close B; close A", "t5",
        ["openA", "open-notruncB", "writeB", "closeB", "closeA"])
    run("T6: open A; write A; open B; write B; close A; close B", "t6",
        ["openA", "writeA", "openB", "writeB", "closeA", "closeB"])
    print("log:", L._tail(p.log, 12))
finally:
    p.close()
