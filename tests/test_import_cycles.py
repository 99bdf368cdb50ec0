"""Imports form no circle: within `mipruner/`, `components/` and app.py no module reaches itself through
the modules it imports, counting imports deferred into functions too (a circle means a concept sits in
the wrong file), and nothing the app's substrate is built on imports the evaluation or the benches."""
from __future__ import annotations

import os

from .test_layout import ROOT, imports_of, module_name, sources

# The library's top: command lines and evaluation. Nothing else in mipruner/ may import them.
TOP = ("mipruner.eval", "mipruner.bench", "mipruner.lmms")


def import_graph() -> dict[str, set[str]]:
    """module -> the project modules it imports. `from pkg import name` is an edge to `pkg.name` when that
    is a module (importing a submodule), else to `pkg`."""
    mods = {module_name(p): p for p in sources()}

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for me, path in mods.items():
        found = imports_of(path)
        submodule_lines = {-line for name, line in found if line < 0 and name in mods}
        deps = set()
        for name, line in found:
            if line > 0 and line in submodule_lines:
                continue  # `from pkg import submodule`: the edge is to the submodule, listed separately
            if line < 0 and name not in mods:
                continue  # `from mod import a_function`: already counted as an edge to mod
            target = resolve(name)
            if target and target != me:
                deps.add(target)
        graph[me] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index, low, on_stack, stack, out = {}, {}, set(), [], []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_the_cycle_finder_finds_a_planted_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    found = cycles(import_graph())
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_the_library_below_its_command_lines_imports_none_of_them():
    bad = []
    for me, deps in import_graph().items():
        if not me.startswith("mipruner") or me.startswith(TOP) or me == "mipruner":
            continue
        bad += [f"{me} imports {d}" for d in sorted(deps) if d.startswith(TOP)]
    assert not bad, "\n".join(bad)


def test_the_graph_sees_deferred_imports(tmp_path):
    """A function-level import counts (the circles this test guards against were deferred ones)."""
    graph = import_graph()
    assert "mipruner.models" in graph["mipruner"]  # `load` imports the adapters inside the function
    assert os.path.isdir(ROOT)
