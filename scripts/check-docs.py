#!/usr/bin/env python3
"""Checks the operator docs (README.md, CHANGELOG.md, docs/*.md) against the repository.

1. Every relative link resolves: the file exists, and a `#anchor` names a heading of it
   (GitHub's anchors: lower case, punctuation dropped, spaces as hyphens).
2. Every command in a `sh`/`bash`/`console` code block runs here and exits 0, from the
   repository root, with the drainfs under test first on PATH (DRAINFS_BIN, default
   target/debug/drainfs). A command that cannot run here (a cluster, a container engine, a
   mount, a long build) is marked, with a reason the reader sees too:
     - a whole block: the line `<!-- docs-check: skip (REASON) -->` right before its fence;
     - one line: a trailing `# docs-check: skip (REASON)`.
   Blocks in other languages (yaml, json, text) are not run.

Usage: python3 scripts/check-docs.py [--self-test] [FILE...]     Exit 0 when every check passed.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUN_LANGS = {"sh", "bash", "console", "shell"}
SKIP_BLOCK = re.compile(r"^<!--\s*docs-check:\s*skip\s*\(([^)]+)\)\s*-->$")
SKIP_LINE = re.compile(r"#\s*docs-check:\s*skip\s*\(([^)]+)\)\s*$")
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(\s*)```(\w*)\s*$")
TIMEOUT_S = 120


def slug(heading: str) -> str:
    s = heading.strip().lower().replace("`", "")
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    in_code = False
    for line in path.read_text().splitlines():
        if FENCE.match(line):
            in_code = not in_code
            continue
        m = re.match(r"^#{1,6}\s+(.*)$", line)
        if m and not in_code:
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def check_links(path: Path) -> list[str]:
    problems = []
    in_code = False
    for no, line in enumerate(path.read_text().splitlines(), 1):
        if FENCE.match(line):
            in_code = not in_code
            continue
        if in_code:
            continue
        for target in LINK.findall(re.sub(r"`[^`]*`", "", line)):
            if re.match(r"^[a-z]+:", target):
                continue  # http:, https:, mailto:
            file_part, _, anchor = target.partition("#")
            # normpath, not resolve: a link is relative to the page as the repository lays it out
            # (target/ may be a link elsewhere: scripts/test.sh)
            dest = Path(os.path.normpath(path.parent / file_part)) if file_part else path
            if not dest.exists():
                problems.append(f"{path.relative_to(ROOT)}:{no}: link to {target}: no such file")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                problems.append(f"{path.relative_to(ROOT)}:{no}: link to {target}: no heading "
                                f"with anchor #{anchor} in {dest.relative_to(ROOT)}")
    return problems


def commands(path: Path) -> list[tuple[int, str]]:
    """The commands to run: (line number, command) from every unmarked shell block."""
    out = []
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        lang, start = m.group(2), i
        j = i + 1
        while j < len(lines) and not FENCE.match(lines[j]):
            j += 1
        prev = next((lines[k].strip() for k in range(start - 1, -1, -1) if lines[k].strip()), "")
        if lang in RUN_LANGS and not SKIP_BLOCK.match(prev):
            cmd, first = "", 0
            for k in range(start + 1, j):
                text = lines[k].strip()
                if not cmd and (not text or text.startswith("#")):
                    continue
                if not cmd:
                    first = k + 1
                if text.endswith("\\"):
                    cmd += text[:-1] + " "
                    continue
                cmd += text
                if not SKIP_LINE.search(cmd):
                    out.append((first, cmd))
                cmd = ""
        i = j + 1
    return out


def check_commands(path: Path, bin_dir: Path) -> list[str]:
    problems = []
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ.get('PATH', '')}")
    for no, cmd in commands(path):
        try:
            r = subprocess.run(["bash", "-c", cmd], cwd=ROOT, env=env, capture_output=True,
                               text=True, timeout=TIMEOUT_S)
            rc, err = r.returncode, (r.stderr or r.stdout).strip().splitlines()[-3:]
        except subprocess.TimeoutExpired:
            rc, err = "timeout", []
        if rc != 0:
            problems.append(f"{path.relative_to(ROOT)}:{no}: `{cmd}` exited {rc} here "
                            f"(mark it `# docs-check: skip (REASON)` if it cannot run here): "
                            + " | ".join(err))
        else:
            print(f"  ok  {path.relative_to(ROOT)}:{no}: {cmd}")
    return problems


def check(files: list[Path], bin_dir: Path) -> list[str]:
    problems = []
    for f in files:
        problems += check_links(f)
        problems += check_commands(f, bin_dir)
    return problems


def self_test(bin_dir: Path) -> int:
    with tempfile.TemporaryDirectory(dir=ROOT / "target") as d:
        d = Path(d)
        (d / "other.md").write_text("# A heading, with `code`\n")
        good = d / "good.md"
        good.write_text(
            "See [x](other.md#a-heading-with-code) and [y](https://example.com).\n\n"
            "```sh\ntrue\necho a \\\n  b\nfalse  # docs-check: skip (fails on purpose)\n```\n\n"
            "<!-- docs-check: skip (fails on purpose) -->\n```sh\nfalse\n```\n\n"
            "```yaml\nnot: run\n```\n")
        bad = d / "bad.md"
        bad.write_text("[x](missing.md) [y](other.md#nope)\n\n```sh\nfalse\n```\n")
        got_good = check([good], bin_dir)
        got_bad = check([bad], bin_dir)
    ok = not got_good and len(got_bad) == 3
    print(f"check-docs self-test: {'ok' if ok else 'FAILED'} ({got_good} / {len(got_bad)} problems)")
    return 0 if ok else 1


def main() -> int:
    args = sys.argv[1:]
    binary = Path(os.environ.get("DRAINFS_BIN", ROOT / "target" / "debug" / "drainfs")).resolve()
    if not binary.is_file():
        print(f"check-docs: no drainfs at {binary} (cargo build --bins, or set DRAINFS_BIN)",
              file=sys.stderr)
        return 1
    if args[:1] == ["--self-test"]:
        return self_test(binary.parent)
    files = [Path(a).resolve() for a in args] or [
        ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]
    problems = check(files, binary.parent)
    for p in problems:
        print(f"check-docs: {p}", file=sys.stderr)
    if problems:
        return 1
    print(f"check-docs: ok ({len(files)} files: links resolve, commands run)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
