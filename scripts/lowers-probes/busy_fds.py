# does an O_PATH fd (or a directory fd) on the lower keep the client's unmount busy?
import os, sys, time, signal
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__))); from probelib import *
kind, what = sys.argv[1], sys.argv[2]
p = Pair(kind, f"{BASE}/w5-{kind}"); c = p.mount()
try:
    with open(p.mnt + "/a.txt", "w") as f: f.write("hello\n")
    if what == "opath-file": fd = os.open(p.mnt + "/a.txt", os.O_PATH)
    elif what == "opath-root": fd = os.open(p.mnt, os.O_PATH)
    elif what == "dirfd-root": fd = os.open(p.mnt, os.O_RDONLY | os.O_DIRECTORY)
    time.sleep(1.5)
    c.send_signal(signal.SIGINT)
    try: rc = c.wait(20)
    except subprocess.TimeoutExpired: rc = "still running after 20 s"
    print(kind, what, "-> SIGINT exit", rc, ";", p.mount_state())
    os.close(fd); time.sleep(0.5); print("   after closing fd:", p.mount_state())
finally:
    p.close()
