"""What the benchmark drivers share (bench.py, relay.py, gcsfuse.py, exit_tail.py,
roundtrips.py). Python 3 stdlib only.

- processes: `Tracker` (every child PID in WORK/pids for lib.sh's EXIT trap, signalled only
  through its pidfd), `child_pids`, `proc_cpu_secs`, `proc_mem_kib`, `private_bins`;
- mounts: `mounted_paths`, `is_mounted`;
- waits: `wait_for` (a condition with a deadline that fails early when the process exits);
- workloads: `fio_env`, `run_fio`, `parse_fio`, `fio_value`, `run_mdbench`, `rotated`;
- results: `log`, `BenchError`, `write_results`, `med`, `pct_nearest`, `pct_interp`, `fmt_num`, `loadavg`,
  `read_json`, `read_jsonl`, `sha256`, `free_port`.

Nothing here kills by name: only PIDs this process started (and tracked) are signalled.
"""

import json
import math
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

# (key, ini file, direction, unit) -- unit "MiB/s" reports bandwidth, "IOPS" operations.
FIO_JOBS = [
    ("seq-read", "seq-read.ini", "read", "MiB/s"),
    ("seq-write", "seq-write.ini", "write", "MiB/s"),
    ("rand-read", "rand-read.ini", "read", "IOPS"),
    ("rand-write", "rand-write.ini", "write", "IOPS"),
]
MD_PHASES = ["create", "stat", "stat_hot", "open_close", "unlink"]
SOCKET_BUFFER = 212992
SIDECAR_UID = 65534


class BenchError(Exception):
    pass


def make_log(tag):
    """A `log(msg)` that prints `[TAG HH:MM:SS] msg` on stderr."""

    def log(msg):
        print(f"[{tag} {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    return log


log = make_log("bench")


# ---------------------------------------------------------------------------------------------
# processes and mounts


class Tracker:
    """Remembers every child PID in WORK/pids (for lib.sh's trap) and holds pidfds."""

    def __init__(self, work):
        self.path = os.path.join(work, "pids")
        self.live = {}

    def add(self, pid):
        self.live[pid] = os.pidfd_open(pid)
        with open(self.path, "a") as f:
            f.write(f"{pid}\n")

    def reaped(self, pid):
        fd = self.live.pop(pid, None)
        if fd is not None:
            os.close(fd)

    def signal(self, pid, sig):
        fd = self.live.get(pid)
        if fd is None:
            return False
        try:
            signal.pidfd_send_signal(fd, sig)
            return True
        except ProcessLookupError:
            return False


def child_pids(pid):
    """PIDs of the direct children of `pid` (any thread); none when it is gone."""
    out = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out += [int(x) for x in f.read().split()]
        except OSError:
            pass
    return out


def proc_cpu_secs(pid):
    """User + system CPU seconds of `pid` so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_mem_kib(pid):
    """`{"VmRSS": KiB, "VmHWM": KiB}` of `pid`."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "VmHWM"):
                out[k] = int(v.split()[0])
    return out


def mounted_paths():
    """Every mount point in this mount namespace (octal escapes decoded)."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            p = line.split(" ")[4]
            out.append(p.encode().decode("unicode_escape"))
    return out


def is_mounted(path):
    """Whether `path` (made absolute, symlinks resolved) is a mount point."""
    return os.path.realpath(path) in mounted_paths()


def wait_for(cond, timeout, what, proc=None, log_path=None):
    """Polls `cond()` every 10 ms for up to `timeout` s; raises BenchError on timeout, or at
    once when `proc` (a Popen) exits first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        if proc is not None and proc.poll() is not None:
            raise BenchError(f"{what}: the process exited ({proc.returncode}); see {log_path}")
        time.sleep(0.01)
    raise BenchError(f"{what}: not within {timeout} s; see {log_path}")


def private_bins(bin_dir, dest, names, who):
    """Copies each binary `names` from `bin_dir` into `dest` (made if missing) and returns
    `{name: copy}`: a concurrent `cargo build` must not swap a binary under test mid-run. Exits
    with a message naming `who` when one is missing."""
    os.makedirs(dest, exist_ok=True)
    out = {}
    for name in names:
        src = os.path.join(bin_dir, name)
        if not os.access(src, os.X_OK):
            sys.exit(f"{who}: {src} missing; build with cargo build --release -p drainfs -p fuse-tests --bins")
        out[name] = shutil.copy2(src, os.path.join(dest, name))
    return out


def free_port():
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------------------------------------
# workloads


def geo_interval(logs, resamples=4000):
    """(geometric mean, 2.5th, 97.5th percentile of a bootstrap of the mean) of a list of
    log-ratios: `resamples` resamples with replacement, seeded, so the same data give the same
    interval."""
    import random
    rnd = random.Random(1)
    n = len(logs)
    qs = sorted(math.exp(statistics.fmean(logs[rnd.randrange(n)] for _ in range(n))) for _ in range(resamples))
    return math.exp(statistics.fmean(logs)), qs[int(0.025 * resamples)], qs[int(0.975 * resamples) - 1]


def rotated(targets, rep):
    """`targets` rotated by `rep` (each repetition starts with another target)."""
    k = rep % len(targets)
    return targets[k:] + targets[:k]


def fio_env(p, directory, numjobs):
    """fio's environment for the job files in fio/ (profile `p`: size, runtime, ramp)."""
    env = dict(os.environ)
    env.update(BENCH_DIR=directory, BENCH_SIZE=p["size"], BENCH_RUNTIME=p["runtime"],
               BENCH_RAMP=p["ramp"], NUMJOBS=str(numjobs))
    return env


def parse_fio(path):
    with open(path) as f:
        text = f.read()
    return json.loads(text[text.index("{"):])  # fio may print a warning line before the JSON


def run_fio(p, ini, directory, numjobs, out, extra=(), timeout=600):
    """One fio job file; `extra` are fio options placed before it (global, e.g. --direct=1)."""
    cmd = ["fio", "--output-format=json", f"--output={out}", *extra, os.path.join(HERE, "fio", ini)]
    r = subprocess.run(cmd, env=fio_env(p, directory, numjobs), stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=timeout)
    if r.returncode != 0:
        raise BenchError(f"fio {ini} in {directory} failed ({r.returncode}):\n{r.stdout.decode(errors='replace')}")
    return parse_fio(out)


def fio_value(doc, direction, unit):
    job = doc["jobs"][0]
    if job.get("error"):
        raise BenchError(f"fio job error {job['error']}")
    d = job[direction]
    return d["bw_bytes"] / 2**20 if unit == "MiB/s" else d["iops"]


def run_mdbench(mdbench, root, files, threads, tag, timeout=600):
    """`mdbench` over `files` files in ROOT/md-TAG with `threads` threads; its JSON."""
    d = os.path.join(root, f"md-{tag}")
    cmd = [mdbench, "--dir", d, "--files", str(files), "--threads", str(threads)]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout)
    if r.returncode != 0:
        raise BenchError(f"mdbench in {root} failed: {r.stderr.decode(errors='replace')}")
    return json.loads(r.stdout)


# ---------------------------------------------------------------------------------------------
# results


def write_results(results, table, doc, json_name="results.json", sort_keys=True, logs=None):
    """Prints `table`, writes it to RESULTS/table.txt and `doc` to RESULTS/JSON_NAME, and copies
    the directory `logs` (the daemons' logs, when given) to RESULTS/logs."""
    print(table)
    with open(os.path.join(results, "table.txt"), "w") as f:
        f.write(table + "\n")
    with open(os.path.join(results, json_name), "w") as f:
        json.dump(doc, f, indent=1, sort_keys=sort_keys)
    if logs is not None:
        shutil.copytree(logs, os.path.join(results, "logs"), dirs_exist_ok=True)


def med(xs):
    return statistics.median(xs) if xs else None


def pct_nearest(xs, q):
    """The q-quantile (0..1) of xs, nearest rank (the ceil(q * n)-th smallest); None for no
    values."""
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s) - 1e-9) - 1))]


def pct_interp(values, q):
    """The q-quantile (0..1) by linear interpolation between closest ranks; NaN for none."""
    s = sorted(values)
    if not s:
        return float("nan")
    k = (len(s) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def fmt_num(v):
    if v is None:
        return "-"
    if v >= 1000:
        return f"{v:,.0f}"
    if v >= 100:
        return f"{v:.0f}"
    if v >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def read_json(path):
    """The JSON document in `path` (a drainfs summary file), or None while there is none."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def read_jsonl(path):
    """Complete JSON lines of a file (none if it does not exist yet)."""
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.endswith("\n")]
    except FileNotFoundError:
        return []


def sha256(path):
    import hashlib
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
