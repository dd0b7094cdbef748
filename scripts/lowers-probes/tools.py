# everyday tools directly on each lower; verify in the bucket
import os, sys, time, subprocess, hashlib
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__))); from probelib import *
kind = sys.argv[1]
p = Pair(kind, f"{BASE}/w10-{kind}"); c = p.mount(); m = p.mnt
src = make_tree(BASE + "/tree")
def sh(label, cmd):
    t = time.monotonic()
    r = subprocess.run(cmd, shell=True, capture_output=True, text=True, cwd=BASE)
    out = (r.stdout + r.stderr).strip().replace("\n", " | ")
    print(f"[{label}] rc={r.returncode} {time.monotonic()-t:.2f}s {out[:600]}", flush=True)
    return r.returncode
def tree_hashes(root):
    out = {}
    for dp, dn, fn in os.walk(root):
        for f in fn:
            pth = os.path.join(dp, f)
            out[os.path.relpath(pth, root)] = hashlib.sha256(open(pth, "rb").read()).hexdigest()
    return out
def check(prefix):
    want = tree_hashes(src); got = L.objects(kind, p.wd, prefix + "/")
    got = {k[len(prefix) + 1:]: v["sha256"] for k, v in got.items()}
    missing = sorted(set(want) - set(got)); extra = sorted(set(got) - set(want))
    bad = sorted(k for k in want if k in got and got[k] != want[k])
    print(f"   bucket check {prefix}/: {len(want)} files, missing={missing} extra={extra} bad={bad}")
try:
    sh("mkdir; ls; rmdir", f"mkdir {m}/d1 && ls -la {m}/ | grep d1 && rmdir {m}/d1 && ls {m}")
    sh("mkdir -p + file", f"mkdir -p {m}/x/y/z && echo hi > {m}/x/y/z/f.txt && ls -R {m}/x")
    sh("empty dir survives remount?", f"mkdir -p {m}/emptydir && ls -d {m}/emptydir")
    sh("rename file same dir", f"echo one > {m}/r1 && mv {m}/r1 {m}/r2 && cat {m}/r2 && ls {m}/r1 2>&1")
    sh("rename file across dirs", f"mv {m}/r2 {m}/x/y/r3 && cat {m}/x/y/r3")
    sh("rename dir", f"mv {m}/x {m}/x2 && ls -R {m}/x2")
    sh("rename over existing", f"echo A > {m}/ra && echo B > {m}/rb && mv {m}/ra {m}/rb && cat {m}/rb")
    sh("unlink", f"echo z > {m}/u && rm {m}/u && ls {m}/u 2>&1")
    sh("rm -r", f"rm -r {m}/x2 && ls {m}")
    sh("cp -r", f"cp -r {src} {m}/cpr"); check("cpr")
    sh("tar x", f"tar -C {src} -cf {BASE}/tree.tar . && mkdir -p {m}/tarx && tar -C {m}/tarx -xf {BASE}/tree.tar"); check("tarx")
    sh("tar x --no-same-permissions -m", f"mkdir -p {m}/tarx2 && tar -C {m}/tarx2 --no-same-owner --no-same-permissions -m -xf {BASE}/tree.tar"); check("tarx2")
    sh("rsync -a", f"rsync -a {src}/ {m}/rs/"); check("rs")
    sh("rsync -r (no attrs)", f"rsync -r {src}/ {m}/rs2/"); check("rs2")
    sh("rsync -r --inplace", f"rsync -r --inplace {src}/ {m}/rs3/"); check("rs3")
    sh("python buffered write", f"python3 -c \"f=open('{m}/py.txt','w'); [f.write('line %d\\n' % i) for i in range(100000)]; f.close()\" && wc -l {m}/py.txt")
    sh("append >>", f"echo 1 > {m}/ap && echo 2 >> {m}/ap; cat {m}/ap")
    sh("overwrite > existing", f"echo new > {m}/rb && cat {m}/rb")
    sh("truncate -s", f"truncate -s 10 {m}/rb; stat -c %s {m}/rb")
    sh("chmod/touch", f"chmod 600 {m}/rb; touch -d 2001-01-01 {m}/rb; stat -c '%a %y' {m}/rb")
    sh("symlink", f"ln -s rb {m}/lnk; readlink {m}/lnk")
    sh("hardlink", f"ln {m}/rb {m}/hl")
    sh("xattr", f"python3 -c \"import os; os.setxattr('{m}/rb', 'user.k', b'v'); print(os.getxattr('{m}/rb','user.k'))\"")
    sh("stat dir nlink/ino", f"stat -c '%i %h %s' {m}/cpr {m}/cpr/a/f1.bin")
    sh("du/find", f"find {m}/cpr | wc -l")
    print("client alive:", c.poll() is None, p.mount_state())
    print("log:", L._tail(p.log, 12)[-2500:])
finally:
    p.close()
