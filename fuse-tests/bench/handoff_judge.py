#!/usr/bin/env python3
"""The hand-off against stock gcsfuse, job by job, over one or more runs of
`fuse-tests/bench/gcsfuse.sh --targets stock,stock-b,handoff` (their results.json files).

gcsfuse.sh judges each fio job by its medians: handoff / stock >= 0.98, or no further below 1
than stock-b / stock (stock again, its own mount and gcsfuse). With 5-9 repetitions on a noisy
machine that verdict flips from run to run on the same code. This script asks the question
the repetitions can answer: is there a cost? Each repetition ran the three targets back to
back (the order rotated from one repetition to the next), so it gives one paired ratio
handoff / stock-b (the hand-off against stock's own second run in the same repetition). Per
fio job, over every repetition of every run given:

  * the geometric mean of handoff / stock-b, and its 95% bootstrap interval (4000 resamples of
    the pairs, seeded: the same files give the same interval);
  * verdict `no cost shown` when the interval reaches 0.98 (a cost of more than 2% is not
    established), `COST` when it lies wholly below 0.98;
  * the same for CPU per GiB (gcsfuse + drainfs for the hand-off, gcsfuse for stock-b): `no
    extra CPU shown` when the interval reaches 1.02, `EXTRA CPU` when it lies wholly above;
  * handoff / stock and stock-b / stock (geometric means), for reference.

Then the same pooled over every job, and per run the control that shows what the median rule
can resolve: on how many jobs handoff's median over stock's falls below 0.98 (the bench's own
per-job statistic), and on how many stock-b's does (raw gcsfuse against itself, the same bar). Usage: handoff_judge.py RESULTS.json [RESULTS.json ...]
Exit 0 when no job shows a cost or extra CPU, 1 when one does, 2 on bad input. Python 3
stdlib only.
"""
from __future__ import annotations

import json
import math
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import geo_interval as interval  # noqa: E402

GOAL = 0.98
CPU_TOLERANCE = 1.02


def main(paths: list[str]) -> int:
    if not paths:
        print(__doc__.strip().splitlines()[0], file=sys.stderr)
        print("usage: handoff_judge.py RESULTS.json [RESULTS.json ...]", file=sys.stderr)
        return 2
    runs = []
    for p in paths:
        try:
            doc = json.load(open(p))
            raw = doc["raw"]
            raw["fio"], raw["cpu_per_gib"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            print(f"handoff_judge.py: {p}: not a gcsfuse.sh results.json ({e})", file=sys.stderr)
            return 2
        runs.append((p, doc.get("meta", {}), raw))
    jobs = sorted({k.rsplit("/", 1)[0] for _, _, raw in runs for k in raw["fio"] if k.endswith("/handoff")})
    if not jobs:
        print("handoff_judge.py: no handoff target in these runs", file=sys.stderr)
        return 2
    for p, meta, _ in runs:
        v = meta.get("versions", {})
        print(f"run: {p}: git {v.get('git_head', '?')}, {meta.get('params', {}).get('reps', '?')} reps")
    rows = [("fio job (cache/job/numjobs)", "pairs", "handoff/stock-b (95%)", "throughput",
             "handoff/stock", "stock-b/stock", "CPU per GiB handoff/stock-b (95%)", "CPU")]
    all_t, all_c, bad = [], [], []
    for j in jobs:
        t, c, hs, bs = [], [], [], []
        for _, _, raw in runs:
            f, cp = raw["fio"], raw["cpu_per_gib"]
            s, b, h = f.get(f"{j}/stock"), f.get(f"{j}/stock-b"), f.get(f"{j}/handoff")
            if not (s and b and h):
                continue
            for x, y, z in zip(s, b, h):
                if x > 0 and y > 0 and z > 0:
                    t.append(math.log(z / y))
                    hs.append(math.log(z / x))
                    bs.append(math.log(y / x))
            s, b, h = cp.get(f"{j}/stock"), cp.get(f"{j}/stock-b"), cp.get(f"{j}/handoff")
            if s and b and h:
                for y, z in zip(b, h):
                    if y[0] > 0 and sum(z) > 0:
                        c.append(math.log(sum(z) / y[0]))
        if len(t) < 2:
            continue
        m, lo, hi = interval(t)
        tv = "no cost shown" if hi >= GOAL else "COST"
        cm, clo, chi = interval(c) if len(c) >= 2 else (float("nan"),) * 3
        cv = "no extra CPU shown" if not c or clo <= CPU_TOLERANCE else "EXTRA CPU"
        if tv == "COST" or cv == "EXTRA CPU":
            bad.append(j)
        all_t += t
        all_c += c
        rows.append((j, str(len(t)), f"{m:.3f} ({lo:.3f}-{hi:.3f})", tv,
                     f"{math.exp(statistics.fmean(hs)):.3f}", f"{math.exp(statistics.fmean(bs)):.3f}",
                     f"{cm:.3f} ({clo:.3f}-{chi:.3f})", cv))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for n, r in enumerate(rows):
        print(" | ".join(x.ljust(w) for x, w in zip(r, widths)).rstrip())
        if n == 0:
            print("-+-".join("-" * w for w in widths))
    m, lo, hi = interval(all_t)
    print(f"pooled, every job ({len(all_t)} pairs): throughput handoff/stock-b {m:.3f} ({lo:.3f}-{hi:.3f})", end="")
    if all_c:
        cm, clo, chi = interval(all_c)
        print(f"; CPU per GiB handoff/stock-b {cm:.3f} ({clo:.3f}-{chi:.3f})")
    else:
        print()
    for p, _, raw in runs:
        f = raw["fio"]
        below = {"handoff": 0, "stock-b": 0}
        n = 0
        for j in jobs:
            s = f.get(f"{j}/stock")
            if not s:
                continue
            n += 1
            for t in below:
                # The bench's own statistic (gcsfuse.py's handoff_verdicts): the target's
                # median over stock's median.
                x = f.get(f"{j}/{t}")
                if x and statistics.median(s) > 0 and statistics.median(x) / statistics.median(s) < GOAL:
                    below[t] += 1
        print(f"median rule, {p}: handoff's median / stock's below {GOAL} on {below['handoff']} of {n} jobs; "
              f"stock-b's (raw gcsfuse against itself) below {GOAL} on {below['stock-b']} of {n}")
    print(f"jobs with a cost beyond {GOAL}x or CPU beyond +{CPU_TOLERANCE - 1:.0%} shown: "
          + (", ".join(bad) if bad else f"none of {len(rows) - 1}"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
