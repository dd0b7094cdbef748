# open-mode matrix: double opens for write, O_RDWR, no-O_TRUNC rewrite, O_APPEND, read-while-write
import os, sys, time, errno, hashlib
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__))); from probelib import *
kind = sys.argv[1]
p = Pair(kind, f"{BASE}/w6-{kind}"); c = p.mount()
W, C, T, RW = os.O_WRONLY, os.O_CREAT, os.O_TRUNC, os.O_RDWR
def E(x): return errno.errorcode.get(x.errno, x.errno) if isinstance(x, OSError) else repr(x)
def step(name, fn):
    try: r = fn(); return f"{name}=ok" + (f"({r})" if r is not None else "")
    except Exception as e: return f"{name}={E(e)}"
def obj(key):
    time.sleep(0.3)
    o = p.objects().get(key)
    if not o: return "object MISSING"
    return f"object size {o['size']}"
data = b"0123456789" * 100000  # ~1 MB
try:
    res = {}
    def case(label, seq, key):
        out = []
        for name, fn in seq: out.append(step(name, fn))
        out.append(obj(key))
        print(f"[{label}]", "; ".join(out), flush=True)
    fds = {}
    def o(k, path, fl): fds[k] = os.open(p.mnt + "/" + path, fl, 0o644)
    def w(k, b=data): return os.write(fds[k], b)
    def cl(k): os.close(fds.pop(k))
    def flush(k): os.close(os.dup(fds[k]))
    def closeall():
        for k in list(fds):
            try: cl(k)
            except OSError: fds.pop(k, None)
    def mk(path, b=b"seed-data\n"):
        with open(p.mnt + "/" + path, "wb") as f: f.write(b)
    case("S1 A=W|C|T, B=W, write A, close B, close A",
         [("openA", lambda: o("A", "s1", W|C|T)), ("openB", lambda: o("B", "s1", W)),
          ("writeA", lambda: w("A")), ("closeB", lambda: cl("B")), ("closeA", lambda: cl("A"))], "s1"); closeall()
    case("S2 A=W|C|T, B=W|C|T, write B, flush A, close A, close B (passthrough-like)",
         [("openA", lambda: o("A", "s2", W|C|T)), ("openB", lambda: o("B", "s2", W|C|T)),
          ("writeB", lambda: w("B")), ("flushA", lambda: flush("A")), ("closeA", lambda: cl("A")), ("closeB", lambda: cl("B"))], "s2"); closeall()
    case("S2b A=W|C|T, B=W|C|T, write B, flush B, close B, close A",
         [("openA", lambda: o("A", "s2b", W|C|T)), ("openB", lambda: o("B", "s2b", W|C|T)),
          ("writeB", lambda: w("B")), ("flushB", lambda: flush("B")), ("closeB", lambda: cl("B")), ("closeA", lambda: cl("A"))], "s2b"); closeall()
    case("S3 new file O_RDWR|C|T, write, close",
         [("open", lambda: o("A", "s3", RW|C|T)), ("write", lambda: w("A")), ("close", lambda: cl("A"))], "s3"); closeall()
    mk("s4")
    case("S4 existing file O_RDWR (no trunc), write at 0, close",
         [("open", lambda: o("A", "s4", RW)), ("write", lambda: w("A")), ("close", lambda: cl("A"))], "s4"); closeall()
    mk("s5")
    case("S5 existing file O_WRONLY (no trunc), write at 0, close",
         [("open", lambda: o("A", "s5", W)), ("write", lambda: w("A")), ("close", lambda: cl("A"))], "s5"); closeall()
    mk("s6")
    case("S6 existing file O_WRONLY|O_APPEND, write, close",
         [("open", lambda: o("A", "s6", W|os.O_APPEND)), ("write", lambda: w("A")), ("close", lambda: cl("A"))], "s6"); closeall()
    case("S7 A=W|C|T write; B=RDONLY open+read while A open; close A; close B",
         [("openA", lambda: o("A", "s7", W|C|T)), ("writeA", lambda: w("A")), ("openB", lambda: o("B", "s7", os.O_RDONLY)),
          ("readB", lambda: len(os.read(fds["B"], 100))), ("closeA", lambda: cl("A")), ("closeB", lambda: cl("B"))], "s7"); closeall()
    case("S8 non-sequential write: W|C|T, write at 0, pwrite at 10 MB, close",
         [("open", lambda: o("A", "s8", W|C|T)), ("write", lambda: w("A")), ("pwrite", lambda: os.pwrite(fds["A"], data, 10_000_000)), ("close", lambda: cl("A"))], "s8"); closeall()
    case("S9 W|C|T, ftruncate(0) then write, close",
         [("open", lambda: o("A", "s9", W|C|T)), ("ftrunc", lambda: os.ftruncate(fds["A"], 0)), ("write", lambda: w("A")), ("close", lambda: cl("A"))], "s9"); closeall()
    case("S10 W|C|T, write, fsync, write, close",
         [("open", lambda: o("A", "s10", W|C|T)), ("write", lambda: w("A")), ("fsync", lambda: os.fsync(fds["A"])), ("write2", lambda: w("A")), ("close", lambda: cl("A"))], "s10"); closeall()
    case("S11 W|C|T, no write, close (empty file)",
         [("open", lambda: o("A", "s11", W|C|T)), ("close", lambda: cl("A"))], "s11"); closeall()
    case("S12 mknod/creat then separate open W|T write (touch f; cat > f)",
         [("touch", lambda: mk("s12", b"")), ("open", lambda: o("A", "s12", W|T)), ("write", lambda: w("A")), ("close", lambda: cl("A"))], "s12"); closeall()
    print("client alive:", c.poll() is None, "|", p.mount_state())
    print("log:", L._tail(p.log, 15))
finally:
    p.close()
