#!/usr/bin/env python3
"""Import circles between a crate's top-level modules (run by scripts/test.sh).

For each crate under crates/, every `crate::m` or `crate::{m, ..}` (and `super::m` in a
top-level module's own file) outside comments and `#[cfg(test)]` modules is an edge from the module whose file it is in to `m`.
A strongly connected set of two or more modules is a circle: each of them needs all the
others, so none can be read, tested or moved alone.

KNOWN lists the circles that exist today and are owned by an open issue; a circle not listed,
or a listed one that grew, fails the check, and a listed one that is gone asks to be struck.
Standard library only.
"""

import os
import re
import sys

# crate -> circles (sets of module names) that an open issue is to break.
KNOWN = {}

COMMENT = re.compile(r"//[^\n]*")
TESTS = re.compile(r"#\[cfg\(test\)\]\s*mod\s+\w+\s*\{")
GROUP = re.compile(r"\bcrate::\{([^}]*)\}")
PATH = re.compile(r"\bcrate::([a-z_][a-z_0-9]*)")
SUPER = re.compile(r"\bsuper::([a-z_][a-z_0-9]*)")


def strip_tests(text):
    """The text without its `#[cfg(test)] mod … { … }` blocks (brace-matched)."""
    out, i = [], 0
    for m in TESTS.finditer(text):
        if m.start() < i:
            continue
        out.append(text[i:m.start()])
        depth, j = 1, m.end()
        while j < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            j += 1
        i = j
    out.append(text[i:])
    return "".join(out)


def edges(src):
    """module -> modules it names, for the crate whose source root is `src`."""
    deps = {}
    for dirpath, _, files in os.walk(src):
        for f in files:
            if not f.endswith(".rs"):
                continue
            rel = os.path.relpath(os.path.join(dirpath, f), src)
            top = rel.split(os.sep)[0].removesuffix(".rs")
            if top in ("lib", "main"):
                continue
            with open(os.path.join(dirpath, f), encoding="utf-8") as fh:
                text = strip_tests(COMMENT.sub("", fh.read()))
            names = set(PATH.findall(text))
            for group in GROUP.findall(text):
                names |= {g.strip().split("::")[0] for g in group.split(",") if g.strip()}
            if os.sep not in rel:
                names |= set(SUPER.findall(text))
            deps.setdefault(top, set()).update(n for n in names if n != top)
    return deps


def circles(deps):
    """Strongly connected sets of two or more modules (Tarjan)."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(deps.get(v, ())):
            if w not in deps:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(comp)

    for v in sorted(deps):
        if v not in index:
            visit(v)
    return found


def main():
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "crates")
    problems = []
    for crate in sorted(os.listdir(root)):
        src = os.path.join(root, crate, "src")
        if not os.path.isdir(src):
            continue
        found = circles(edges(src))
        known = KNOWN.get(crate, [])
        for c in found:
            if c not in known:
                problems.append(f"{crate}: new import circle {sorted(c)}")
        for k in known:
            if k not in found:
                problems.append(f"{crate}: the known circle {sorted(k)} is gone or changed; "
                                "update KNOWN in scripts/check_imports.py")
    for p in problems:
        print(p, file=sys.stderr)
    if not problems:
        print("no new import circles")
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
