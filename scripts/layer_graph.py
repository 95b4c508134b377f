"""The import graph between launcher/'s top-level parts (every import, those inside
functions too, as grimp sees them): its edge count and any cycle. `lint-imports` enforces
the layer order; this prints the numbers behind it:
    .venv/bin/python scripts/layer_graph.py [PACKAGE_DIR_PARENT]
"""

from __future__ import annotations

import sys

import grimp


def main() -> int:
    if len(sys.argv) > 1:
        sys.path.insert(0, sys.argv[1])
    graph = grimp.build_graph("launcher", cache_dir=None)
    edges: set[tuple[str, str]] = set()
    for module in graph.modules:
        for imported in graph.find_modules_directly_imported_by(module):
            a, b = (".".join(name.split(".")[:2]) for name in (module, imported))
            if a != b and a != "launcher" and b != "launcher":
                edges.add((a, b))
    parts = sorted({p for edge in edges for p in edge})
    print(f"{len(parts)} parts, {len(edges)} edges between them")
    in_cycles = _strongly_connected(parts, edges)
    print("cycles:", in_cycles or "none")
    return 1 if in_cycles else 0


def _strongly_connected(parts: list[str], edges: set[tuple[str, str]]) -> list[list[str]]:
    reach = {p: {b for a, b in edges if a == p} for p in parts}
    changed = True
    while changed:  # transitive closure: a few dozen parts
        changed = False
        for p in parts:
            more = set().union(*(reach[q] for q in reach[p])) - reach[p]
            if more:
                reach[p] |= more
                changed = True
    groups: list[list[str]] = []
    for p in parts:
        group = sorted(q for q in parts if q in reach[p] and p in reach[q])
        if group and group not in groups:
            groups.append(group)
    return groups


if __name__ == "__main__":
    sys.exit(main())
