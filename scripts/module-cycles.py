#!/usr/bin/env python3
"""Import cycles between the modules of each crate.

Two sibling modules that use each other (directly or around a ring) are
one concept split in two, or two concepts tangled; either way a newcomer
cannot read one without the other. A file's references are its `use`
trees and inline `crate::`/`super::`/`self::` paths, outside
`#[cfg(test)] mod tests`. A reference from module `a::x` to `a::y::z`
is an edge between the siblings `a::x` and `a::y`; references between a
module and its own parent or children are not cycles.

With `--max-lines N`, a source file longer than N lines fails too: a file
is meant to be read in one sitting.

Usage: module-cycles.py [--max-lines N] CRATE_SRC_DIR...
(exit 1 when a cycle or an over-long file exists)
"""

import re
import sys
from pathlib import Path

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
INLINE = re.compile(rf"\b((?:crate|super|self)(?:::{IDENT})+)")
USE = re.compile(r"\buse\s+((?:crate|super|self)\b[^;]*);", re.S)
TESTS = re.compile(r"#\[cfg\(test\)\]\s*(?:pub(?:\([a-z]+\))?\s+)?mod\s+tests\s*\{", re.S)


def module_of(src: Path, file: Path) -> tuple[str, ...]:
    parts = list(file.relative_to(src).with_suffix("").parts)
    if parts[-1] in ("mod", "lib", "main"):
        parts.pop()
    return tuple(parts)


def expand(tree: str) -> list[str]:
    """`a::{b, c::{d, e}}` → a::b, a::c::d, a::c::e (aliases dropped)."""
    tree = re.sub(r"\s+as\s+" + IDENT, "", tree)
    tree = re.sub(r"\s+", "", tree)
    i = tree.find("{")
    if i < 0:
        return [tree]
    head, body = tree[:i], tree[i + 1 : tree.rfind("}")]
    out, depth, start = [], 0, 0
    for j, ch in enumerate(body + ","):
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        elif ch == "," and depth == 0:
            item = body[start:j]
            start = j + 1
            if item:
                out += [head + p for p in expand(item)]
    return out


def resolve(module: tuple[str, ...], path: str) -> tuple[str, ...] | None:
    segs = path.split("::")
    if segs[0] == "crate":
        base, rest = (), segs[1:]
    else:
        base, rest = module, segs
        while rest and rest[0] in ("super", "self"):
            if rest[0] == "super":
                if not base:
                    return None
                base = base[:-1]
            rest = rest[1:]
    return base + tuple(s for s in rest if s != "self")


def edges(src: Path) -> dict[tuple[str, ...], set[tuple[str, ...]]]:
    files = sorted(p for p in src.rglob("*.rs") if p.name != "tests.rs")
    modules = {module_of(src, f) for f in files}
    graph: dict[tuple[str, ...], set[tuple[str, ...]]] = {}
    for f in files:
        me = module_of(src, f)
        text = f.read_text()
        cut = TESTS.search(text)
        if cut:
            text = text[: cut.start()]
        text = re.sub(r"//[^\n]*", "", text)
        paths = [p for tree in USE.findall(text) for p in expand(tree)]
        paths += INLINE.findall(USE.sub("", text))
        for p in paths:
            target = resolve(me, p)
            if target is None:
                continue
            k = 0
            while k < min(len(me), len(target)) and me[k] == target[k]:
                k += 1
            if k == len(me) or k == len(target):
                continue  # own parent, own child, or itself
            a, b = me[: k + 1], target[: k + 1]
            if b in modules:
                graph.setdefault(a, set()).add(b)
    return graph


def cycles(graph):
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
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

    for v in list(graph):
        if v not in index:
            visit(v)
    return out


def main() -> int:
    sys.setrecursionlimit(10000)
    args = sys.argv[1:]
    max_lines = None
    if args[:1] == ["--max-lines"]:
        max_lines, args = int(args[1]), args[2:]
    found = False
    for arg in args:
        src = Path(arg)
        if max_lines is not None:
            for f in sorted(src.rglob("*.rs")):
                n = len(f.read_text().splitlines())
                if n > max_lines:
                    found = True
                    print(f"  {f}: {n} lines (at most {max_lines})")
        graph = edges(src)
        n_edges = sum(len(v) for v in graph.values())
        rings = cycles(graph)
        print(f"{src}: {len({m for e in graph.items() for m in (e[0], *e[1])})} modules, {n_edges} edges, {len(rings)} cycles")
        for ring in rings:
            found = True
            names = ["::".join(m) for m in ring]
            print(f"  cycle: {' ↔ '.join(names)}")
            for a in ring:
                for b in sorted(graph.get(a, ())):
                    if b in ring:
                        print(f"    {'::'.join(a)} → {'::'.join(b)}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
