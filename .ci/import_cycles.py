"""Fails when modules of gpuquota import each other in a cycle (``make lint``).

import-linter's layers contract orders the packages, but it cannot see a cycle between two modules of
one package (``ctl.commands`` -> ``ctl.nodes`` -> ``ctl.commands``): such a cycle works only as long
as one of its imports stays inside a function or under ``TYPE_CHECKING``, and it hides which module
depends on which. So every import counts here, lazy and ``TYPE_CHECKING`` ones included (grimp, which
import-linter uses, sees them all). Each strongly connected component of the module graph is printed
with one of its cycles; the exit status is 1 when there is any.

    python .ci/import_cycles.py [PACKAGE]     # default: gpuquota
"""

from __future__ import annotations

import sys
from itertools import pairwise

import grimp


def components(graph: grimp.ImportGraph) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            module, successors = work[-1]
            successor = next((s for s in successors if s in graph.modules), None)
            if successor is None:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[module])
                if low[module] == index[module]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == module:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
            elif successor not in index:
                index[successor] = low[successor] = len(index)
                stack.append(successor)
                on_stack.add(successor)
                work.append((successor, iter(sorted(graph.find_modules_directly_imported_by(successor)))))
            elif successor in on_stack:
                low[module] = min(low[module], index[successor])
    return sorted(found)


def one_cycle(graph: grimp.ImportGraph, component: list[str]) -> list[str]:
    """A shortest cycle through the component's first module."""
    first = component[0]
    best: tuple[str, ...] | None = None
    for imported in sorted(graph.find_modules_directly_imported_by(first)):
        if imported not in component:
            continue
        back = graph.find_shortest_chain(importer=imported, imported=first)
        if back is not None and (best is None or len(back) + 1 < len(best)):
            best = (first, *back)
    return list(best or component)


def line_of(graph: grimp.ImportGraph, importer: str, imported: str) -> str:
    details = graph.get_import_details(importer=importer, imported=imported)
    return f"{importer}:{details[0]['line_number']}" if details else importer


def main(argv: list[str]) -> int:
    package = argv[0] if argv else "gpuquota"
    graph = grimp.build_graph(package)
    cycles = components(graph)
    for component in cycles:
        cycle = one_cycle(graph, component)
        print(f"import cycle among {len(component)} modules: {', '.join(component)}")
        for importer, imported in pairwise(cycle):
            print(f"    {line_of(graph, importer, imported)} imports {imported}")
    if cycles:
        print(f"{len(cycles)} import cycle(s) in {package}: move what they share into a module of its own")
        return 1
    print(f"no import cycles among the {len(graph.modules)} modules of {package}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
