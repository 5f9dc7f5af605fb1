#!/usr/bin/env python3
"""Keeps docs/architecture.md true, and the client library in floors.

1. Every file or folder the page names in backticks (`client/src/plan.rs`, `mds/src/service/`)
   exists.
2. Every `Type::function` the page names right after a file (`client/src/file/read.rs`
   `File::read_into`) is a function of that file; one named alone (`File::verify_piece`) is a
   function of some file that speaks of the type.
3. The client's modules import only their own floor or the floors below it (the table in the
   page's "The client library in floors"), and no two modules import each other, directly or
   round a loop. A module the table does not place fails too.

  scripts/check-architecture.py          exits 1 and says what is wrong, else prints a summary
"""
import os, re, sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGE = os.path.join(ROOT, "docs", "architecture.md")
SKIP = {"target", "vendor", ".git", "fuzz"}

def rust_files():
    for dp, dn, fn in os.walk(ROOT):
        dn[:] = [d for d in dn if d not in SKIP and not d.startswith(".")]
        for f in fn:
            if f.endswith(".rs"):
                yield os.path.join(dp, f)

def defines_fn(text, name):
    return re.search(r'\bfn ' + re.escape(name) + r'\b', text) is not None

def check_page(page, errors):
    sources = {p: open(p).read() for p in rust_files()}
    paths = set()
    for m in re.finditer(r'`([\w./-]+(?:\.rs|/))`', page):
        path = m.group(1)
        if "/" not in path.rstrip("/"):
            continue  # a bare file name (`object.rs`) next to its folder
        paths.add(path)
        if not os.path.exists(os.path.join(ROOT, path)):
            errors.append(f"the page names {path}, which does not exist")
    named = 0
    # A file, then `Type::function` right after it.
    for m in re.finditer(r'`([\w./-]+\.rs)`\s+`([A-Z]\w*)::(\w+)`', page):
        path, ty, fn = m.groups()
        full = os.path.join(ROOT, path)
        named += 1
        if os.path.exists(full) and not defines_fn(open(full).read(), fn):
            errors.append(f"{path} has no function {fn} (the page names {ty}::{fn} there)")
    # Any `Type::function` alone: some file defining the function speaks of the type.
    for m in re.finditer(r'`([A-Z]\w*)::([a-z_]\w*)`', page):
        ty, fn = m.groups()
        named += 1
        if not any(defines_fn(t, fn) and re.search(r'\b' + ty + r'\b', t) for t in sources.values()):
            errors.append(f"no file defines {fn} beside {ty} (the page names {ty}::{fn})")
    return len(paths), named

def client_modules():
    base = os.path.join(ROOT, "client", "src")
    mods = {}
    for dp, dn, fn in os.walk(base):
        for f in fn:
            if not f.endswith(".rs"):
                continue
            rel = os.path.relpath(os.path.join(dp, f), base)[:-3]
            top = rel.split("/")[0]
            if top in ("lib", "main"):
                continue
            mods.setdefault(top, []).append(os.path.join(dp, f))
    return mods

def imports(files, known, me):
    deps = set()
    for p in files:
        text = open(p).read().split("#[cfg(test)]")[0]
        text = "\n".join(l for l in text.split("\n") if not l.strip().startswith("//"))
        for d in re.findall(r'crate::(\w+)', text):
            if d in known and d != me:
                deps.add(d)
        for group in re.findall(r'use crate::\{([^}]*)\}', text):
            for d in re.findall(r'(\w+)', group):
                if d in known and d != me:
                    deps.add(d)
    return deps

def floors(page, errors):
    section = page.split("## The client library in floors", 1)
    if len(section) < 2:
        errors.append("the page has no section \"The client library in floors\"")
        return {}
    floor_of = {}
    for row in re.finditer(r'^\| (\d+): [^|]*\| ([^|]*)\|', section[1], re.M):
        for m in re.findall(r'`(\w+)(?:/)?`', row.group(2)):
            floor_of.setdefault(m, int(row.group(1)))
    return floor_of

def check_layers(page, errors):
    floor_of = floors(page, errors)
    mods = client_modules()
    edges = {m: imports(f, mods, m) for m, f in mods.items()}
    for m in mods:
        if m not in floor_of:
            errors.append(f"client module {m} is on no floor of the page's table")
    for m, deps in edges.items():
        for d in deps:
            if m in floor_of and d in floor_of and floor_of[d] > floor_of[m]:
                errors.append(f"client module {m} (floor {floor_of[m]}) imports {d} (floor {floor_of[d]})")
    # Loops: depth-first, each module's path back to itself.
    state = {}
    def visit(m, path):
        state[m] = 1
        for d in sorted(edges[m]):
            if state.get(d) == 1:
                loop = path[path.index(d):] + [d]
                errors.append("client modules import each other: " + " -> ".join(loop))
            elif d not in state:
                visit(d, path + [d])
        state[m] = 2
    for m in sorted(mods):
        if m not in state:
            visit(m, [m])
    return len(mods), sum(len(d) for d in edges.values())

def main():
    page = open(PAGE).read()
    errors = []
    paths, named = check_page(page, errors)
    modules, edges = check_layers(page, errors)
    for e in errors:
        print(f"check-architecture: {e}", file=sys.stderr)
    if errors:
        sys.exit(1)
    print(f"docs/architecture.md: {paths} paths and {named} functions named, all there; "
          f"client: {modules} modules, {edges} imports, each to its floor or below, no cycle")

if __name__ == "__main__":
    main()
