# exit status after a completed write (all files closed), then SIGINT/SIGTERM
import os, sys, time, signal
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__))); from probelib import *
kind, signame, mode = sys.argv[1], sys.argv[2], sys.argv[3]
p = Pair(kind, f"{BASE}/w4-{kind}"); c = p.mount()
try:
    if mode == "written":
        with open(p.mnt + "/a.txt", "w") as f: f.write("hello\n")
    elif mode == "read":
        os.listdir(p.mnt)
    elif mode == "rdonly-open":
        with open(p.mnt + "/a.txt", "w") as f: f.write("hello\n")
        fh = open(p.mnt + "/a.txt"); fh.read()
    elif mode == "cwd":
        os.chdir(p.mnt)
    time.sleep(1.5)
    t = time.monotonic(); c.send_signal(getattr(signal, signame))
    try: rc = c.wait(20)
    except subprocess.TimeoutExpired: rc = "still running after 20 s"
    print(kind, signame, mode, "-> exit", rc, f"after {time.monotonic()-t:.2f}s;", p.mount_state(), "| log:", L._tail(p.log, 3).strip().replace("\n", " / ")[-300:])
    os.chdir("/")
finally:
    p.close()
