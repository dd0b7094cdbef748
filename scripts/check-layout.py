#!/usr/bin/env python3
"""Checks drainfs's layout (issue #18): no source file over MAX_FILE lines and no function over
MAX_FN lines, outside tests and test daemons; and no import circle between sibling modules of
the drainfs crate (`a` uses `b` and `b` uses `a`, directly or through other siblings).

Counted: `src/**/*.rs` and `fuse-tests/src/*.rs` (the shared test harness), without
`#[cfg(test)]` modules, files named `tests.rs`/`*_tests.rs` and `fuse-tests/src/bin/` (test
daemons). A function's length is the lines from its `fn` line to its closing brace.

Imports: every `crate::`, `super::` and `self::` path outside tests, `use` trees included, is
resolved to the deepest module it names. An edge between modules a and b counts between the two
children of their closest common ancestor that hold them (so `fs::handles` -> `fs::inodes` is an
edge of `fs`'s children, `summary` -> `lifecycle::x` one of the crate's); an edge between a module
and its own ancestor (a child using its parent's types) is not a circle.

Usage: check-layout.py [--report] [ROOT], or --self-test (checks that a tree with a long file,
a long function and a circle is caught, and a clean one passes). Exit 0 when within the limits, 1 otherwise (each
offender printed as `path:line: what`); --report prints every file and the longest functions.
"""
import os
import re
import sys

MAX_FILE = 800
MAX_FN = 80

FN_RE = re.compile(r"^\s*(?:pub(?:\([^)]*\))?\s+)?(?:const\s+)?(?:async\s+)?(?:unsafe\s+)?(?:extern\s+\"[^\"]*\"\s+)?fn\s+(\w+)")


def strip(src):
    """Blanks comments, string and char literals (keeping newlines), so braces can be counted."""
    out = []
    i, n = 0, len(src)
    while i < n:
        c = src[i]
        if src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif src.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if src.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif src.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(re.sub(r"[^\n]", " ", src[i:j]))
            i = j
        elif c == "r" and re.match(r'r#*"', src[i:i + 10]) and not (i and (src[i - 1].isalnum() or src[i - 1] == "_")):
            m = re.match(r'r(#*)"', src[i:])
            end = '"' + m.group(1)
            j = src.find(end, i + len(m.group(0)))
            j = n if j < 0 else j + len(end)
            out.append(re.sub(r"[^\n]", " ", src[i:j]))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and src[j] != '"':
                j += 2 if src[j] == "\\" else 1
            j += 1
            out.append(re.sub(r"[^\n]", " ", src[i:j]))
            i = j
        elif c == "'":
            # A char literal ('x', '\n', '\u{..}') or a lifetime ('a).
            m = re.match(r"'(\\u\{[0-9a-fA-F]+\}|\\.|[^\\'])'", src[i:])
            if m:
                out.append(" " * len(m.group(0)))
                i += len(m.group(0))
            else:
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def drop_test_modules(lines):
    """Blanks `#[cfg(test)]` items (modules and functions) in stripped lines; on a struct field
    or a field in a struct expression (`name: ...,` on one line), only that line."""
    res = list(lines)
    i = 0
    while i < len(res):
        if re.match(r"\s*#\[cfg\((all\()?test", res[i]):
            if i + 1 < len(res) and re.match(r"\s*(pub(\([^)]*\))?\s+)?\w+\s*:[^:].*,\s*$", res[i + 1]):
                res[i] = res[i + 1] = ""
                i += 2
                continue
            j, depth, opened = i, 0, False
            while j < len(res):
                depth += res[j].count("{") - res[j].count("}")
                opened = opened or "{" in res[j]
                if opened and depth <= 0 or (not opened and res[j].rstrip().endswith(";")):
                    break
                j += 1
            for k in range(i, min(j + 1, len(res))):
                res[k] = ""
            i = j + 1
        else:
            i += 1
    return res


def functions(lines):
    """(name, first line index, length) of every fn with a body."""
    found = []
    for i, line in enumerate(lines):
        m = FN_RE.match(line)
        if not m:
            continue
        depth, j, opened = 0, i, False
        while j < len(lines):
            for ch in lines[j]:
                if ch == "{":
                    depth, opened = depth + 1, True
                elif ch == "}":
                    depth -= 1
                elif ch == ";" and not opened and depth == 0:
                    break
            else:
                if opened and depth <= 0:
                    break
                j += 1
                continue
            break
        if opened:
            found.append((m.group(1), i, j - i + 1))
    return found


def files(root):
    for base in ("src", "fuse-tests/src"):
        for d, dirs, names in os.walk(os.path.join(root, base)):
            rel = os.path.relpath(d, root)
            if rel.startswith("fuse-tests/src/bin"):
                continue
            for name in sorted(names):
                if not name.endswith(".rs") or name == "tests.rs" or name.endswith("_tests.rs"):
                    continue
                yield os.path.join(rel, name)


def module_of(rel):
    """`src/fs/mod.rs` -> ("fs",), `src/relay/engine.rs` -> ("relay", "engine"); None outside src."""
    if not rel.startswith("src/"):
        return None
    parts = rel[len("src/"):-len(".rs")].split("/")
    if parts[-1] == "mod":
        parts = parts[:-1]
    if parts in (["lib"], ["main"]):
        return ()
    return tuple(parts)


def path_trees(text):
    """Every `crate::`/`super::`/`self::` path in stripped source, `use` trees expanded:
    yields (line index, first segment, [segments...])."""
    for m in re.finditer(r"(?<![\w:])(crate|super|self)::", text):
        line = text.count("\n", 0, m.start())
        for segs in expand(text, m.end()):
            yield line, m.group(1), segs


def expand(text, i):
    """Parses `a::b::{c, d::e}` at text[i:], returning the list of segment lists."""
    segs = []
    while True:
        while i < len(text) and text[i] in " \t\n":
            i += 1
        if i < len(text) and text[i] == "{":
            out, depth, j, start = [], 1, i + 1, i + 1
            items = []
            while j < len(text) and depth:
                if text[j] == "{":
                    depth += 1
                elif text[j] == "}":
                    depth -= 1
                    if depth == 0:
                        items.append(start)
                        break
                elif text[j] == "," and depth == 1:
                    items.append(start)
                    start = j + 1
                j += 1
            for st in items:
                for sub in expand(text, st):
                    out.append(segs + sub)
            return out or [segs]
        m = re.match(r"[A-Za-z_][A-Za-z0-9_]*", text[i:])
        if not m:
            return [segs]
        segs.append(m.group(0))
        i += len(m.group(0))
        if text.startswith("::", i):
            i += 2
            continue
        return [segs]


def resolve(mods, here, first, segs):
    """The deepest known module the path names, or None."""
    if first == "crate":
        base = ()
    elif first == "self":
        base = here
    else:
        base = here[:-1]
        while segs and segs[0] == "super":
            base, segs = base[:-1], segs[1:]
    best = base
    cur = base
    for s in segs:
        if s == "super":
            cur = cur[:-1]
            continue
        cur = cur + (s,)
        if cur in mods:
            best = cur
        else:
            break
    return best


def circles(edges):
    """Strongly connected components of more than one node in a graph {a: {b: where}} (Tarjan),
    each as a sorted list of nodes."""
    index, low, on, stack, out = {}, {}, set(), [], []
    nodes = sorted(set(edges) | {b for v in edges.values() for b in v})

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, {})):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in nodes:
        if v not in index:
            visit(v)
    return out


def import_circles(root, texts):
    """Offender lines for every circle among sibling modules."""
    mods = {module_of(rel): rel for rel in texts if module_of(rel) is not None}
    edges = {}
    for rel, text in texts.items():
        here = module_of(rel)
        if here is None:
            continue
        for line, first, segs in path_trees(text):
            to = resolve(mods, here, first, segs)
            if to is None or to == here:
                continue
            k = 0
            while k < min(len(here), len(to)) and here[k] == to[k]:
                k += 1
            if k == len(here) or k == len(to):
                continue  # an ancestor and its descendant
            a, b = here[: k + 1], to[: k + 1]
            edges.setdefault(a, {}).setdefault(b, f"{rel}:{line + 1}")
    bad = []
    for comp in circles(edges):
        name = lambda m: "::".join(m) or "crate"
        inner = [
            f"{name(a)} -> {name(b)} ({edges[a][b]})"
            for a in comp
            for b in sorted(edges.get(a, {}))
            if b in comp
        ]
        bad.append(
            f"{edges[comp[0]][next(b for b in sorted(edges[comp[0]]) if b in comp)]}: import circle among "
            f"{', '.join(name(m) for m in comp)}: " + "; ".join(inner)
        )
    return bad


def self_test():
    """Runs the checks on small trees made for the purpose; exit 0 when each finding is right."""
    import tempfile

    def tree(files):
        d = tempfile.mkdtemp(prefix="check-layout-")
        for rel, text in files.items():
            os.makedirs(os.path.dirname(os.path.join(d, rel)), exist_ok=True)
            with open(os.path.join(d, rel), "w") as f:
                f.write(text)
        return d

    def problems(files):
        import io, contextlib, shutil
        d = tree(files)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            rc = run(d, report=False)
        shutil.rmtree(d)
        return rc, out.getvalue()

    long_fn = "fn long() {\n" + "    let _x = 1;\n" * (MAX_FN + 5) + "}\n"
    short_fn = "fn short() {\n    let _s = \"}\";\n}\n"
    tests_only = "#[cfg(test)]\nmod tests {\n" + long_fn + "}\n"
    cases = [
        ("clean", {"src/lib.rs": "mod a;\nmod b;\n", "src/a.rs": "use crate::b::X;\n" + short_fn,
                   "src/b.rs": "pub struct X;\n" + tests_only}, 0, None),
        ("long function", {"src/lib.rs": "mod a;\n", "src/a.rs": long_fn}, 1, "fn long is"),
        ("long file", {"src/lib.rs": "mod a;\n", "src/a.rs": "// x\n" * (MAX_FILE + 1)}, 1,
         "lines outside tests"),
        ("circle", {"src/lib.rs": "mod a;\nmod b;\n", "src/a.rs": "use crate::b::Y;\npub struct X;\n",
                    "src/b.rs": "use crate::{a::X};\npub struct Y;\n"}, 1, "import circle among a, b"),
        ("nested circle", {"src/lib.rs": "mod fs;\n", "src/fs/mod.rs": "mod h;\nmod i;\n",
                           "src/fs/h.rs": "use super::i::I;\npub struct H;\n",
                           "src/fs/i.rs": "use super::h::H;\npub struct I;\n"}, 1,
         "import circle among fs::h, fs::i"),
        ("test-only field", {"src/lib.rs": "mod a;\n", "src/a.rs":
                             "pub struct S {\n    #[cfg(test)]\n    t: u32,\n    u: u32,\n}\n"
                             "fn make() -> S {\n    S {\n        #[cfg(test)]\n        t: 0,\n        u: 1,\n    }\n}\n"
                             + long_fn}, 1, "fn long is"),
        ("child uses parent", {"src/lib.rs": "mod fs;\n", "src/fs/mod.rs": "mod h;\npub use h::H;\npub struct P;\n",
                               "src/fs/h.rs": "use super::P;\npub struct H;\n"}, 0, None),
    ]
    bad = 0
    for name, files, want_rc, want_text in cases:
        rc, out = problems(files)
        ok = rc == want_rc and (want_text is None or want_text in out)
        print(f"  [{'ok' if ok else 'FAIL'}] {name}: exit {rc}")
        if not ok:
            print(out)
            bad += 1
    print("check-layout self-test: " + ("passed" if not bad else f"{bad} case(s) failed"))
    return 1 if bad else 0


def main(argv):
    if "--self-test" in argv:
        return self_test()
    report = "--report" in argv
    args = [a for a in argv if a != "--report"]
    root = args[0] if args else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    return run(root, report)


def run(root, report):
    """Checks the tree at `root`; prints the offenders; 0 when there are none, else 1."""
    bad, rows, fns, texts = [], [], [], {}
    for rel in sorted(files(root)):
        with open(os.path.join(root, rel), encoding="utf-8") as f:
            src = f.read()
        blanked = drop_test_modules(strip(src).split("\n"))
        lines = blanked
        texts[rel] = "\n".join(blanked)
        test_lines = sum(1 for a, b in zip(strip(src).split("\n"), blanked) if a != b)
        counted = len(src.rstrip("\n").split("\n")) - test_lines
        rows.append((counted, rel))
        if counted > MAX_FILE:
            bad.append(f"{rel}:1: {counted} lines outside tests (limit {MAX_FILE})")
        for name, at, length in functions(lines):
            fns.append((length, f"{rel}:{at + 1}", name))
            if length > MAX_FN:
                bad.append(f"{rel}:{at + 1}: fn {name} is {length} lines (limit {MAX_FN})")
    bad.extend(import_circles(root, texts))
    if report:
        for counted, rel in sorted(rows, reverse=True):
            print(f"{counted:6} {rel}")
        print()
        for length, at, name in sorted(fns, reverse=True)[:40]:
            print(f"{length:6} {at} {name}")
        print()
    for b in bad:
        print(b)
    if bad:
        print(f"check-layout: {len(bad)} problem(s) (limits: files {MAX_FILE} lines, functions {MAX_FN}; no import circle)")
        return 1
    print(f"check-layout: every file within {MAX_FILE} lines, every function within {MAX_FN}, no import circle")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
