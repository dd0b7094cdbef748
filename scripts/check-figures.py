#!/usr/bin/env python3
"""Every measured figure of README.md and docs/*.md names its record (issue #35, part 3).

A *figure* is a number with a unit of measure: ms, s, µs, x (a ratio), %, MiB/s, GiB/s, IOPS,
CPU-seconds; a range or a pair (`0.92-1.07x`, `5,016 / 5,023 ms`) is one figure per number. In a
table, every cell that holds only numbers (and `/`, `-`, `x`, `%`) is figures too. A *section* is
the text between two headings (any level). A figure's *record* is a file under docs/results/
that the section links.

A section is checked when it says so, with a line `<!-- figures: checked -->`; then:
  * it links at least one record, and every figure's number occurs in one of them (numbers are
    compared without thousands separators, and a record's number rounded to the decimals the
    page shows: `5,016` matches `5016`, `5.5` matches `5.50`; so a figure of one or two
    significant digits is a weak check: it needs some record number that rounds to it);
  * except the numbers its `<!-- figures: not measured: N, N, ... -->` lines list: a
    parameter (a grace period, a file size, a configured round trip), a default or a constant,
    and its `<!-- figures: derived: N, ... -->` lines: arithmetic on recorded numbers (a share
    of a CPU), each to be recomputed by whoever changes the record.
A figure in a section not marked checked is a failure too (a figure with no record named):
every section that quotes a figure is checked. A figure whose run left no record is measured
again, with its record kept under docs/results/, or removed.

Usage: check-figures.py [--list] [--self-test]. Exit 0 when every section's figures hold, 1
otherwise (each failure printed as `path:line: what`; per page, the count of figures in
sections not marked checked); --list prints each of those figures.
"""
from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NUM = r"(?<![\w.,])\d{1,3}(?:,\d{3})+(?:\.\d+)?|(?<![\w.,])\d+(?:\.\d+)?"
UNIT = r"(?:ms|µs|us|s|x|%|MiB/s|GiB/s|MB/s|IOPS|CPU-seconds)(?![\w/])"
FIGURE = re.compile(rf"((?:{NUM})(?:\s*(?:-|–|/)\s*(?:{NUM}))*)\s?{UNIT}")
NUMBER = re.compile(NUM)
CELL = re.compile(rf"^\s*(?:{NUM})(?:\s*(?:x|%))?(?:\s*(?:-|–|/)\s*(?:{NUM})(?:\s*(?:x|%))?)*\s*$")
HEADING = re.compile(r"^#{1,6}\s")
RECORD_LINK = re.compile(r"\]\(((?:\.\./)*(?:docs/)?results/[^)#\s]+)")
MARK = re.compile(r"<!--\s*figures:\s*(checked|not measured:|derived:)([^>]*)-->")


def norm(n: str) -> str:
    return n.replace(",", "")


def recorded_as(n: str, recorded: set[str]) -> bool:
    """Whether the figure `n` is one of the record's numbers, rounded to as many decimals as
    the figure shows (a page writes 5.5 for a record's 5.50, 0.65 for its 0.648)."""
    if n in recorded:
        return True
    places = len(n.split(".")[1]) if "." in n else 0
    want = float(n)
    return any(abs(round(float(r), places) - want) < 1e-9 for r in recorded)


def sections(path: Path):
    """Yields (first line number, lines) per section of `path`, code blocks left out."""
    start, lines, fence = 1, [], False
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if line.lstrip().startswith("```"):
            fence = not fence
            lines.append((i, ""))
            continue
        if not fence and HEADING.match(line):
            yield start, lines
            start, lines = i, []
        lines.append((i, "" if fence else line))
    yield start, lines


def figures(lines):
    """(line, number) of every figure in a section's lines (prose and table cells)."""
    out = []
    for i, line in lines:
        text = re.sub(r"<!--.*?-->", "", line)
        text = re.sub(r"\]\([^)]*\)", "]", text)  # link targets hold no figures
        if text.lstrip().startswith("|") and not re.match(r"^\s*\|[\s:|-]+\|\s*$", text):
            cells = [c for c in text.strip().strip("|").split("|")]
            for c in cells:
                if CELL.match(c):
                    out += [(i, m.group(0)) for m in NUMBER.finditer(c)]
                    text = text.replace(c, " ", 1)
        for m in FIGURE.finditer(text):
            out += [(i, n.group(0)) for n in NUMBER.finditer(m.group(1))]
    return out


def check_page(path: Path, root: Path):
    """(failures, unchecked figures) of one page."""
    fails, unchecked = [], []
    for start, lines in sections(path):
        raw = "\n".join(l for _, l in lines)
        marks = MARK.findall(raw)
        checked = any(k == "checked" for k, _ in marks)
        exempt = {norm(x.strip()) for k, v in marks if k != "checked" for x in v.split(",") if x.strip()}
        figs = figures(lines)
        if not checked:
            unchecked += [(i, n) for i, n in figs]
            continue
        records = []
        for target in RECORD_LINK.findall(raw):
            p = (path.parent / target).resolve()
            if not p.is_file():
                fails.append(f"{path.relative_to(root)}:{start}: record {target} does not exist")
                continue
            records.append(norm(p.read_text(errors="replace")))
        todo = [(i, n) for i, n in figs if norm(n) not in exempt]
        if todo and not records:
            fails.append(f"{path.relative_to(root)}:{start}: a checked section with figures and no record linked")
            continue
        recorded = {m.group(0) for r in records for m in re.finditer(r"\d+(?:\.\d+)?", r)}
        for i, n in todo:
            if not recorded_as(norm(n), recorded):
                fails.append(f"{path.relative_to(root)}:{i}: {n} is in none of the section's records")
    return fails, unchecked


def run(root: Path, listing: bool) -> int:
    pages = [root / "README.md", *sorted((root / "docs").glob("*.md"))]
    all_fails, total = [], 0
    for p in pages:
        if not p.is_file():
            continue
        fails, unchecked = check_page(p, root)
        all_fails += fails
        total += len(unchecked)
        if unchecked:
            print(f"check-figures: {p.relative_to(root)}: {len(unchecked)} figures in sections not marked checked (no record named)")
            if listing:
                for i, n in unchecked:
                    print(f"  {p.relative_to(root)}:{i}: {n}")
    for f in all_fails:
        print(f"check-figures: {f}")
    print(f"check-figures: {total} figures in sections not marked checked; {len(all_fails)} failures in checked sections")
    return 1 if all_fails or total else 0


def self_test() -> int:
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        (root / "docs" / "results").mkdir(parents=True)
        (root / "docs" / "results" / "r.txt").write_text("stop -> exit p50 5016 ms, ratio 0.92 and 1.07\n| 1,131 |\n")
        good = ("# T\n\n## A\n<!-- figures: checked -->\n<!-- figures: not measured: 5 -->\n"
                "From [the run](results/r.txt): 5,016 ms, 0.92-1.07x, the grace period 5 s.\n\n"
                "| job | MiB/s |\n| --- | ---: |\n| seq | 1,131 |\n\n## B\nNo figure here.\n")
        (root / "docs" / "good.md").write_text(good)
        if run(root, False) != 0:
            print("self-test: a page whose figures are in its record failed")
            return 1
        cases = {
            "a figure not in the record": good.replace("5,016 ms", "5,017 ms"),
            "a table cell not in the record": good.replace("| seq | 1,131 |", "| seq | 1,132 |"),
            "a range's end not in the record": good.replace("0.92-1.07x", "0.92-1.08x"),
            "a checked section without a record": good.replace("From [the run](results/r.txt)", "From the run"),
            "a record that does not exist": good.replace("results/r.txt", "results/gone.txt"),
            "a figure in a section not marked checked": good.replace("No figure here.", "Unchecked: 12 ms."),
        }
        for what, text in cases.items():
            (root / "docs" / "good.md").write_text(text)
            if run(root, False) == 0:
                print(f"self-test: {what} passed")
                return 1
    print("check-figures: self-test passed")
    return 0


if __name__ == "__main__":
    if "--self-test" in sys.argv[1:]:
        sys.exit(self_test())
    sys.exit(run(ROOT, "--list" in sys.argv[1:]))
