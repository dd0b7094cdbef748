"""Helpers for the probes behind scripts/LOWERS-NOTES.md: a server + FUSE client pair whose
client is a child of the probe (so its exit status is observable), object stat on the server,
and a writer subprocess (writer.py) that reports progress and errnos as JSON lines."""
import os, sys, time, json, signal, subprocess, threading, urllib.parse, shutil
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
BASE = os.environ.get("PROBE_DIR", "/tmp/drainfs-probes")
os.makedirs(BASE, exist_ok=True)
import lowers as L

class Pair:
    def __init__(self, kind, wd):
        self.kind, self.wd = kind, wd
        shutil.rmtree(wd, ignore_errors=True)
        os.makedirs(wd)
        self.srv = L.start_server(kind, wd)
        self.mnt = os.path.join(wd, "mnt")
        self.client = None

    def mount(self, extra=()):
        os.makedirs(self.mnt, exist_ok=True)
        self.log = os.path.join(self.wd, f"client-{time.time():.0f}.log")
        argv = L.mount_argv(self.kind, self.wd, self.mnt) + list(extra)
        self.client = L.spawn(argv, self.log)
        L.wait_mount(self.mnt, 30, L.FSTYPES[self.kind], self.client, self.log)
        return self.client

    def stat(self, key):
        """size of object on server or None"""
        port, b = self.srv["port"], self.srv["bucket"]
        if self.kind == "gcs":
            st, body = L.http_request(port, "GET", f"/storage/v1/b/{b}/o/{urllib.parse.quote(key, safe='')}")
            if st == 404: return None
            return int(json.loads(body)["size"])
        path, h = L.s3_sign(port, "HEAD", f"/{b}/{urllib.parse.quote(key)}")
        import http.client
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        c.request("HEAD", path, headers=h); r = c.getresponse(); r.read(); c.close()
        if r.status == 404: return None
        return int(r.getheader("Content-Length"))

    def objects(self):
        return L.objects(self.kind, self.wd)

    def mount_state(self):
        ent = L.mountinfo_entry(self.mnt)
        if not ent: return "not mounted"
        try:
            os.stat(self.mnt); return "mounted, ok"
        except OSError as e:
            return f"mounted, stat: {os.strerror(e.errno)}"

    def close(self):
        if self.client and self.client.poll() is None:
            L.unmount(self.mnt)
            try: self.client.send_signal(signal.SIGINT); self.client.wait(10)
            except subprocess.TimeoutExpired: self.client.kill(); self.client.wait()
        L.unmount(self.mnt)
        L.stop(self.wd)

def writer(path, mib, fsync_at="-", pause=None):
    argv = [sys.executable, os.path.join(HERE, "writer.py"), path, str(mib), str(fsync_at)]
    if pause: argv.append(pause)
    return subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, start_new_session=True)

def make_tree(root):
    """A small source tree: nested dirs, sizes 0 B .. 5 MB, names with spaces, '+' and '%'."""
    if os.path.isdir(root):
        return root
    import random
    rnd = random.Random(4)
    files = {"a/f1.bin": 70013, "a/f2.bin": 140013, "a/f3.bin": 210013, "a/b/c/big.bin": 5000000,
             "d/e/hello.txt": 6, "d/empty": 0, "sp ace/we ird+name%.txt": 2}
    for rel, size in files.items():
        pth = os.path.join(root, rel)
        os.makedirs(os.path.dirname(pth), exist_ok=True)
        with open(pth, "wb") as f:
            f.write(rnd.randbytes(size))
    return root
