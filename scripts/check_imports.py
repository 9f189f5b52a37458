#!/usr/bin/env python3
"""Import circles between the files of each crate (run by scripts/test.sh).

Every file of a crate is a node: `lib.rs` (or `main.rs`), each top-level module and each nested
one (`scheduler/run.rs` is `scheduler::run`). A path a file names outside comments and
`#[cfg(test)]` modules is an edge to the file that defines what it names:
- `crate::a::b::Item`, `super::Item`, `self::child::Item`, and a child module's bare name
  (`run::Scheduler` in the file that says `mod run;`) are resolved down the module tree;
- a name a module only re-exports (`pub use x::Item;`) is followed to the file that defines
  it, so `lib.rs` re-exporting an item is no edge of the files that import it through the
  root, and a module that names an item *defined* in `lib.rs` depends on `lib.rs`.
A strongly connected set of two or more files is a circle: each of them needs all the others,
so none can be read, tested or moved alone. That includes a crate's `lib.rs` (or a `mod.rs`)
and a module below it when each names what the other defines.

KNOWN lists the circles that exist today and are owned by an open issue; a circle not listed,
or a listed one that grew, fails the check, and a listed one that is gone asks to be struck.
Standard library only.
"""

import os
import re
import sys

# crate -> circles (sets of module paths, "lib" for the root) that an open issue is to break.
# Issue 53 owns these: a parent module (or lib.rs) that uses its children while they use what
# it defines. Each goes when the shared definitions move to a module of their own.
KNOWN = {
    "engine": [
        {"scheduler", "scheduler::embed", "scheduler::fault", "scheduler::handle", "scheduler::run", "scheduler::seq"},
    ],
    "hub": [
        {"synth", "synth::values", "synth::write"},
        {"synth::recipe", "synth::tensors"},
    ],
    "memory": [
        {"residency", "residency::experts"},
        {"residency::stream", "residency::stream::schedule"},
    ],
    "model": [
        {"arch", "arch::gemma2", "arch::gemma3", "arch::llama", "arch::phi3", "arch::qwen2", "arch::qwen2moe", "arch::qwen3", "arch::qwen3moe", "arch::smollm3"},
        {"attention", "attention::tiles"},
    ],
    "quant": [
        {"kernels", "kernels::avx2", "kernels::avx512", "kernels::avx512::kquants", "kernels::avx512::panel", "kernels::avx512::tile_panel", "kernels::neon", "kernels::scalar"},
    ],
    "server": [
        {"adapters", "agents", "agents::messages", "agents::responses", "api", "api::limits", "embeddings", "fim", "lib", "ollama", "openai", "replica", "requests", "routes", "ui"},
        {"metrics", "metrics::vllm"},
    ],
    "tokenizer": [
        {"lib", "pretok", "vocab"},
    ],
}

TESTS = re.compile(r"#\[cfg\(test\)\]\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+\w+\s*\{")
MOD_DECL = re.compile(r"^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+([a-z_][a-z_0-9]*)\s*;", re.M)
# `pub use a::b::{C, D as E};` (any visibility): what a module re-exports.
PUB_USE = re.compile(r"\bpub(?:\([^)]*\))?\s+use\s+([^;]+);")
IDENT = r"[A-Za-z_][A-Za-z_0-9]*"
PREFIXED = re.compile(r"\b(crate|super|self)((?:::(?:" + IDENT + r"|\{))+)")


def blank(text):
    """The code of `text` with comments removed and string and character literals emptied, read
    as the lexer reads them (raw strings, escapes, nested block comments), so that no literal
    hides code or shows a path."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if text.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif text.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
        elif c == "r" and re.match(r'r#*"', text[i:]) and not (i and (text[i - 1].isalnum() or text[i - 1] == "_")):
            hashes = re.match(r'r(#*)"', text[i:]).group(1)
            end = text.find('"' + hashes, i + len(hashes) + 2)
            out.append('""')
            i = n if end < 0 else end + 1 + len(hashes)
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append('""')
            i = j + 1
        elif c == "'":
            m = re.match(r"'(?:\\(?:x[0-9a-fA-F]{2}|u\{[0-9a-fA-F]+\}|.)|[^'\\\n])'", text[i:])
            if m:
                out.append("' '")
                i += m.end()
            else:  # a lifetime or a label
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def strip(text):
    """The code of `text` without comments, literals and `#[cfg(test)] mod … { … }` blocks."""
    text = blank(text)
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


def expand(text, i):
    """Paths of the use-tree starting at text[i] (just after a `::`): `a::b`, `{a, b::{c, d}}`.
    Returns (list of segment lists, end index)."""
    if i < len(text) and text[i] == "{":
        paths, j, depth, start = [], i + 1, 1, i + 1
        items = []
        while j < len(text) and depth:
            c = text[j]
            if c == "{":
                depth += 1
            elif c == "}":
                depth -= 1
                if depth == 0:
                    items.append(text[start:j])
            elif c == "," and depth == 1:
                items.append(text[start:j])
                start = j + 1
            j += 1
        for item in items:
            item = item.strip()
            if not item:
                continue
            sub = re.split(r"\s+as\s+", item)[0].strip()
            if "::" in sub:
                head, _, rest = sub.partition("::")
                for p in expand(rest.strip(), 0)[0]:
                    paths.append([head.strip()] + p)
            else:
                paths.append([sub])
        return paths, j
    m = re.match(IDENT + r"(?:::" + IDENT + r")*(::\{)?", text[i:])
    if not m:
        return [], i
    seg = m.group(0)
    if m.group(1):
        head = seg[: -len("::{")].split("::")
        subs, j = expand(text, i + m.end() - 1)
        return [head + p for p in subs], j
    return [seg.split("::")], i + m.end()


class Crate:
    def __init__(self, src):
        self.src = src
        self.files = {}  # module path (tuple) -> stripped text
        root = "lib.rs" if os.path.exists(os.path.join(src, "lib.rs")) else "main.rs"
        self.load((), os.path.join(src, root))

    def load(self, path, file):
        with open(file, encoding="utf-8") as fh:
            self.files[path] = strip(fh.read())
        base = os.path.dirname(file) if os.path.basename(file) in ("lib.rs", "main.rs", "mod.rs") \
            else os.path.splitext(file)[0]
        for child in MOD_DECL.findall(self.files[path]):
            for cand in (os.path.join(base, child + ".rs"), os.path.join(base, child, "mod.rs")):
                if os.path.exists(cand):
                    self.load(path + (child,), cand)
                    break

    def children(self, path):
        return {p[-1] for p in self.files if len(p) == len(path) + 1 and p[:-1] == path}

    def reexports(self, path):
        """name -> absolute path (segments) of what module `path` re-exports (None: another crate's)."""
        out = {}
        for body in PUB_USE.findall(self.files[path]):
            for p in expand(body.strip(), 0)[0]:
                out[p[-1]] = self.absolute(path, p)
        return out

    def absolute(self, here, segs):
        """Segments named in module `here`, from the crate root; None for another crate's path."""
        cur, segs = list(here), list(segs)
        if segs[0] == "crate":
            cur, segs = [], segs[1:]
        elif segs[0] == "self":
            segs = segs[1:]
        elif segs[0] == "super":
            while segs and segs[0] == "super":
                cur, segs = cur[:-1], segs[1:]
        elif segs[0] not in self.children(here):
            return None
        return cur + segs

    def resolve(self, segs, depth=0):
        """The module (path tuple) that defines what absolute `segs` names; None if another crate's."""
        if segs is None:
            return None
        cur = ()
        for k, s in enumerate(segs):
            if s in self.children(cur):
                cur = cur + (s,)
                continue
            if depth < 8:
                target = self.reexports(cur).get(s, ())
                if target != ():
                    return None if target is None else self.resolve(target + segs[k + 1:], depth + 1)
            return cur
        return cur

    def edges(self):
        deps = {p: set() for p in self.files}
        for path, text in self.files.items():
            names = []
            for m in PREFIXED.finditer(text):
                names += [[m.group(1)] + p for p in expand(text, m.start(2) + 2)[0]]
            for child in self.children(path):
                for m in re.finditer(r"(?<![:\w])" + child + r"::", text):
                    names += [["self", child] + p for p in expand(text, m.end())[0]]
            for segs in names:
                target = self.resolve(self.absolute(path, segs))
                if target is not None and target != path and target in self.files:
                    # A module re-exporting or declaring its own descendants is its face, not a
                    # dependency; only names it uses in its own code are edges (counted above).
                    deps[path].add(target)
        # `pub use child::X` alone in a parent is no edge: drop edges that only re-exports make.
        for path, text in self.files.items():
            used = strip_reexports(text)
            for target in list(deps[path]):
                if target[: len(path)] == path and len(target) > len(path):
                    child = target[len(path)]
                    if not re.search(r"(?<![:\w])" + child + r"::", used) and \
                            not re.search(r"\bself::" + child + r"::", used):
                        deps[path].discard(target)
        return deps


def strip_reexports(text):
    return PUB_USE.sub("", text)


def circles(deps):
    """Strongly connected sets of two or more nodes (Tarjan)."""
    index, low, stack, on, found = {}, {}, [], set(), []
    sys.setrecursionlimit(10000)

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


def name(path):
    return "::".join(path) if path else "lib"


def main():
    """Checks the tree against KNOWN; `--known` prints the KNOWN of the tree as it is."""
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "crates")
    problems, today = [], {}
    for crate in sorted(os.listdir(root)):
        src = os.path.join(root, crate, "src")
        if not os.path.isdir(src):
            continue
        found = [{name(p) for p in c} for c in circles(Crate(src).edges())]
        if found:
            today[crate] = sorted(sorted(c) for c in found)
        known = KNOWN.get(crate, [])
        for c in found:
            if c not in known:
                problems.append(f"{crate}: new import circle {sorted(c)}")
        for k in known:
            if k not in found:
                problems.append(f"{crate}: the known circle {sorted(k)} is gone or changed; "
                                "update KNOWN in scripts/check_imports.py")
    if sys.argv[1:] == ["--known"]:
        print("KNOWN = {")
        for crate, found in today.items():
            print(f'    "{crate}": [')
            for c in found:
                print("        {" + ", ".join(f'"{m}"' for m in c) + "},")
            print("    ],")
        print("}")
        return
    for p in problems:
        print(p, file=sys.stderr)
    if not problems:
        print("no new import circles")
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
