import os, sys, time, json, errno, hashlib
# writer.py PATH MIB [fsync_at_mib] [pause_at_mib:seconds]
path, mib = sys.argv[1], int(sys.argv[2])
fsync_at = int(sys.argv[3]) if len(sys.argv) > 3 and sys.argv[3] != "-" else None
pause = None
if len(sys.argv) > 4:
    a, b = sys.argv[4].split(":"); pause = (int(a), float(b))
t0 = time.monotonic()
def ev(**k):
    k["t"] = round(time.monotonic() - t0, 3)
    print(json.dumps(k), flush=True)
blk = bytearray(os.urandom(1 << 20))
h = hashlib.sha256()
try:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
except OSError as e:
    ev(ev="open-err", errno=errno.errorcode[e.errno]); sys.exit(2)
ev(ev="opened")
for i in range(mib):
    blk[0:8] = i.to_bytes(8, "little")
    try:
        n = os.write(fd, blk)
        if n != len(blk):
            ev(ev="short-write", i=i, n=n)
            os.write(fd, blk[n:])
    except OSError as e:
        ev(ev="write-err", i=i, errno=errno.errorcode[e.errno]); break
    h.update(blk)
    if (i + 1) % 10 == 0:
        ev(ev="wrote", mib=i + 1)
    if fsync_at is not None and i + 1 == fsync_at:
        t = time.monotonic()
        try:
            os.fsync(fd); ev(ev="fsync-ok", dur=round(time.monotonic() - t, 3))
        except OSError as e:
            ev(ev="fsync-err", errno=errno.errorcode[e.errno])
    if pause and i + 1 == pause[0]:
        ev(ev="pausing"); time.sleep(pause[1]); ev(ev="resumed")
ev(ev="close-start", sha256=h.hexdigest())
t = time.monotonic()
try:
    os.close(fd)
    ev(ev="close-ok", dur=round(time.monotonic() - t, 3))
except OSError as e:
    ev(ev="close-err", errno=errno.errorcode[e.errno], dur=round(time.monotonic() - t, 3))
