#!/usr/bin/env python3
"""Cycles among the source files of each crate: file A imports file B when A names a path
under `crate::` or `super::` that resolves to B's module (a `use`, or a path in the code).
Test modules at the end of a file (`#[cfg(test)] mod tests`) are left out. Prints, per crate,
the groups of files that import each other in a ring (strongly connected components of more
than one file), and a total.

    scripts/module-cycles.py [CRATE_DIR...]     # default: every crate, and tests/support
"""
import os
import re
import sys

PATH = re.compile(r"\b(crate|super)((?:::[A-Za-z_][A-Za-z0-9_]*)+)")


def module_files(src):
    """module path (tuple) -> file, for every .rs under src."""
    mods = {}
    for root, _, files in os.walk(src):
        for f in files:
            if not f.endswith(".rs"):
                continue
            rel = os.path.relpath(os.path.join(root, f), src)
            parts = rel[:-3].split(os.sep)
            if parts[-1] in ("lib", "main", "mod"):
                parts = parts[:-1]
            if parts and parts[0] == "bin":
                continue
            mods[tuple(parts)] = os.path.join(root, f)
    return mods


def code_of(path):
    text = open(path, encoding="utf-8").read()
    cut = re.search(r"^#\[cfg\(test\)\]\s*\n\s*mod tests\b", text, re.M)
    if cut:
        text = text[: cut.start()]
    # comments name paths too; they are not imports
    return re.sub(r"//[^\n]*", "", text)


def edges(mods):
    by_file = {f: m for m, f in mods.items()}
    out = {f: set() for f in by_file}
    for f, me in by_file.items():
        for root, rest in PATH.findall(code_of(f)):
            names = rest.split("::")[1:]
            if root == "crate":
                base = ()
            else:
                base = me[:-1]
                while names and names[0] == "super":
                    base, names = base[:-1], names[1:]
            # the longest prefix that is a module of its own file
            for n in range(len(names), -1, -1):
                target = base + tuple(names[:n])
                if target in mods:
                    if mods[target] != f and target != ():
                        out[f].add(mods[target])
                    break
    return out


def sccs(graph):
    index, low, on, stack, result, counter = {}, {}, set(), [], [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
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
            result.append(comp)

    sys.setrecursionlimit(10000)
    for v in graph:
        if v not in index:
            visit(v)
    return [c for c in result if len(c) > 1]


def main():
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    crates = sys.argv[1:] or sorted(
        d for d in os.listdir(here) if os.path.isfile(os.path.join(here, d, "Cargo.toml"))
    ) + [".", "tests/support"]
    total_files = total_groups = 0
    for c in crates:
        src = os.path.join(here, c, "src")
        if c == "tests/support":
            src = os.path.join(here, c)  # the integration tests' harness, a module tree
        if not os.path.isdir(src):
            continue
        groups = sccs(edges(module_files(src)))
        name = "strait (src/)" if c == "." else c
        n = sum(len(g) for g in groups)
        total_files += n
        total_groups += len(groups)
        print(f"{name}: {len(groups)} cycle group(s), {n} files")
        for g in groups:
            print("    " + " <-> ".join(sorted(os.path.relpath(f, here) for f in g)))
    print(f"total: {total_groups} cycle group(s), {total_files} files in cycles")


if __name__ == "__main__":
    main()
