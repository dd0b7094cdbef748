#!/usr/bin/env python3
"""Helper of scripts/demo.sh: generates the workload's input files and prints the report.

Standard library only. Subcommands (all paths absolute):

  gen SRC BIG_MIB           write the input tree under SRC/job/ and SRC/expected.json
                            ({"key": {"size": N, "sha256": "hex"}}; key = path under SRC)
  summary FILE              print drainfs's JSON shutdown summary for a newcomer
  count EXPECTED OBJECTS.json
                            "N/M complete" (and how many are missing or differ), one line
  table EXPECTED LABEL=OBJECTS.json ...
                            per-object table (size, complete and sha256-equal?) for each run,
                            from `lowers.py objects` output, i.e. read from the server
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import sys

MIB = 1 << 20


def human(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    if n < MIB:
        return f"{n / 1024:.1f} KiB"
    return f"{n / MIB:.1f} MiB"


# ------------------------------------------------------------------ gen


def _write_random(path: str, size: int) -> dict:
    """`size` random bytes (os.urandom: incompressible, like real data)."""
    h = hashlib.sha256()
    with open(path, "wb") as f:
        left = size
        while left:
            chunk = os.urandom(min(left, 4 * MIB))
            f.write(chunk)
            h.update(chunk)
            left -= len(chunk)
    return {"size": size, "sha256": h.hexdigest()}


def _write_text(path: str, text: str) -> dict:
    data = text.encode()
    with open(path, "wb") as f:
        f.write(data)
    return {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def gen(src: str, big_mib: int) -> None:
    rnd = random.Random(42)
    files: dict[str, dict] = {}

    def put(rel: str, meta: dict) -> None:
        files[rel] = meta

    def p(rel: str) -> str:
        full = os.path.join(src, rel)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        return full

    put("job/config.json", _write_text(p("job/config.json"), json.dumps({
        "job": "nightly-training", "run": 42, "epochs": 3, "batch_size": 256,
        "input": "gs://drainfs-test/job/dataset/", "output": "gs://drainfs-test/job/",
    }, indent=2) + "\n"))
    # A metrics log the application writes line by line through Python's buffered I/O.
    lines = ["step,epoch,loss,accuracy,lr"]
    for step in range(60000):
        lines.append(f"{step},{step // 20000},{2.5 / (1 + step / 900) + rnd.random() / 50:.6f},"
                     f"{1 - 1 / (1 + step / 700):.6f},{0.001 * 0.5 ** (step // 20000):.6g}")
    put("job/metrics.csv", _write_text(p("job/metrics.csv"), "\n".join(lines) + "\n"))
    put("job/model-24MiB.bin", _write_random(p("job/model-24MiB.bin"), 24 * MIB))
    # The directory tree the application copies with `cp -r`.
    for i, size in enumerate([3 * MIB, 3 * MIB // 2, 700 * 1024, 256 * 1024, 64 * 1024, 5000]):
        rel = f"job/dataset/train/shard-{i:03d}.bin"
        put(rel, _write_random(p(rel), size))
    put("job/dataset/valid/shard-000.bin", _write_random(p("job/dataset/valid/shard-000.bin"),
                                                         900 * 1024))
    put("job/dataset/labels/classes.txt", _write_text(
        p("job/dataset/labels/classes.txt"),
        "".join(f"{i}\tclass-{i:04d}\n" for i in range(250))))
    put("job/dataset/notes for humans.txt", _write_text(
        p("job/dataset/notes for humans.txt"),
        "A file name with spaces, to check that nothing trips over it.\n"))
    put("job/dataset/_SUCCESS", _write_text(p("job/dataset/_SUCCESS"), ""))
    # The last and largest upload: the final checkpoint.
    rel = f"job/checkpoint-{big_mib}MiB.bin"
    put(rel, _write_random(p(rel), big_mib * MIB))

    with open(os.path.join(src, "expected.json"), "w") as f:
        json.dump(files, f, indent=1, sort_keys=True)
    total = sum(m["size"] for m in files.values())
    print(f"{len(files)} files, {human(total)}")


# ------------------------------------------------------------------ summary

PHASES = [
    ("door_closed_ms", "door closed", "new opens and creates refused (ESHUTDOWN); open files go on"),
    ("drained_ms", "drained", "nothing in flight, every open file closed, i.e. uploaded"),
    ("unmounted_ms", "unmounted", "drainfs's mount removed"),
    ("lower_exited_ms", "lower exited", "gcsfuse stopped after the SIGINT drainfs sent it (it unmounts and exits)"),
    ("exit_ms", "exit", "drainfs exits"),
]


def summary(path: str) -> None:
    with open(path) as f:
        s = json.load(f)
    t = s.get("timings") or {}
    cause = s.get("cause") or {}
    print(f"  drainfs's summary ({os.path.basename(path)}): outcome {s.get('outcome')!r}, "
          f"exit code {s.get('exit_code')}, cause {cause.get('cause')!r}"
          + (f", forced: {s['forced']}" if s.get("forced") else ""))
    print(f"  phase timings, ms after drainfs saw the trigger ({t.get('trigger')}):")
    for key, name, what in PHASES:
        v = t.get(key)
        print(f"    {name:<13} {('-' if v is None else str(v)):>6} ms   {what}")
    c = s.get("counts") or {}
    print(f"  counts: {c.get('opened_write', 0)} files written, {c.get('lower_flushes', 0)} lower "
          f"flushes (uploads inside close()), {c.get('lower_flush_errors', 0)} failed, "
          f"{human(c.get('bytes_written', 0))} written")
    lower = s.get("lower_exit")
    print(f"  gcsfuse: {lower}" + (" (gcsfuse unmounted and exited 0 after drainfs's SIGINT)"
                                   if lower == "exit 0" else ""))
    print("  full summary:")
    for k, v in s.items():
        print(f"    {k}: {json.dumps(v)}")


# ------------------------------------------------------------------ table


def verdict(want: dict, got: dict | None) -> str:
    if got is None:
        return "MISSING"
    if got["size"] == want["size"] and got["sha256"] == want["sha256"]:
        return "ok"
    if got["size"] < want["size"]:
        return f"TRUNCATED {human(got['size'])}"
    return "DIFFERENT"


def table(expected_path: str, runs: list[str]) -> int:
    with open(expected_path) as f:
        expected = json.load(f)
    labelled = []
    for arg in runs:
        label, _, path = arg.partition("=")
        with open(path) as f:
            labelled.append((label, json.load(f)))
    keys = sorted(expected, key=lambda k: (k.count("/"), k))
    kw = max(len("object"), *(len(k) for k in keys))
    cols = [max(len(label), 16) for label, _ in labelled]
    head = f"{'object':<{kw}}  {'size':>10}  " + "  ".join(
        f"{label:<{w}}" for (label, _), w in zip(labelled, cols))
    print(head.rstrip())
    print("-" * len(head.rstrip()))
    for k in keys:
        row = f"{k:<{kw}}  {human(expected[k]['size']):>10}  "
        row += "  ".join(f"{verdict(expected[k], objs.get(k)):<{w}}"
                         for (_, objs), w in zip(labelled, cols))
        print(row.rstrip())
    print("(ok: the object is in the bucket, with the source's size and sha256)")
    print()
    bad_runs = 0
    for label, objs in labelled:
        vs = [verdict(expected[k], objs.get(k)) for k in keys]
        ok = vs.count("ok")
        missing = vs.count("MISSING")
        trunc = sum(v.startswith("TRUNCATED") for v in vs)
        diff = vs.count("DIFFERENT")
        extra = sorted(set(objs) - set(expected))
        if ok == len(keys):
            line = (f"all {len(keys)} objects complete, sha256 equal to the source "
                    f"(read back from the server, not through a mount)")
        else:
            bad_runs += 1
            parts = [f"{ok} of {len(keys)} objects ok"]
            if missing:
                lost = sum(expected[k]["size"] for k, v in zip(keys, vs) if v == "MISSING")
                parts.append(f"{missing} MISSING ({human(lost)} lost)")
            if trunc:
                parts.append(f"{trunc} TRUNCATED")
            if diff:
                parts.append(f"{diff} DIFFERENT")
            line = ", ".join(parts)
        if extra:
            line += f"; unexpected objects: {', '.join(extra)}"
        print(f"  {label}: {line}")
    return bad_runs


def count(expected_path: str, objects_path: str) -> None:
    with open(expected_path) as f:
        expected = json.load(f)
    with open(objects_path) as f:
        objs = json.load(f)
    vs = [verdict(want, objs.get(k)) for k, want in expected.items()]
    line = f"{vs.count('ok')}/{len(vs)} complete"
    bad = len(vs) - vs.count("ok")
    if bad:
        line += f" ({bad} missing or different)"
    print(line)


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[0] == "count":
        count(argv[1], argv[2])
        return 0
    if len(argv) >= 3 and argv[0] == "gen":
        gen(argv[1], int(argv[2]))
        return 0
    if len(argv) == 2 and argv[0] == "summary":
        summary(argv[1])
        return 0
    if len(argv) >= 3 and argv[0] == "table":
        table(argv[1], argv[2:])
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
