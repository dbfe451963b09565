"""The house's imports point one way and close no circle (issue 21): policies and the typed wire
(`api`) at the bottom, then health, activities, workflows; workers and sim at the top (they use each other: the CLI runs the
simulations, the simulations run the real processes), bench above all. Imports inside functions
count: a circle hidden in a function is still a circle."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LAYER = {"policies": 0, "api": 1, "health": 1, "activities": 2, "workflows": 3, "workers": 4, "sim": 4, "bench": 5}


def modules() -> dict[str, Path]:
    out = {}
    for pkg in LAYER:
        for p in (ROOT / pkg).rglob("*.py"):
            name = ".".join(p.relative_to(ROOT).with_suffix("").parts)
            out[name.removesuffix(".__init__")] = p
    return out


def import_graph() -> dict[str, set[str]]:
    mods = modules()

    def owner(name: str) -> str | None:  # the project module a dotted name lives in
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [f"{node.module}.{a.name}" for a in node.names]
            graph[m] |= {o for o in map(owner, names) if o and o != m}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
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
    return out


def test_the_scan_sees_the_house():
    graph = import_graph()
    assert len(graph) > 100 and "workflows.activities" not in graph
    assert "policies.model" in graph["workflows.episode"] | graph["workflows.episode_constants"]
    assert "api.names" in graph["workflows.lease"] and "api.episode" in graph["workers.reporting"]


def test_no_import_circle():
    assert circles(import_graph()) == []


def test_a_circle_is_found():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_imports_point_down():
    up = sorted(f"{m} -> {d}" for m, ds in import_graph().items() for d in ds
                if LAYER[d.split(".")[0]] > LAYER[m.split(".")[0]])
    assert not up, f"imports that point up a layer: {up}"


# The processes a person or a node runs reach the controller's workflows only by name, through api/.
BY_NAME_ONLY = ("workers.reporting", "workers.agent", "workers.operator", "workers.episode_history", "health")


def test_the_agent_and_the_cli_import_no_workflow():
    graph = import_graph()
    clients = [m for m in graph if m.startswith(BY_NAME_ONLY) or m.startswith("workers.cli")]
    assert len(clients) >= 8
    found = sorted(f"{m} -> {d}" for m in clients for d in graph[m] if d.startswith("workflows"))
    assert not found, f"a client imports a workflow module (use api/ names): {found}"


def test_api_imports_only_policies():
    graph = import_graph()
    api = [m for m in graph if m == "api" or m.startswith("api.")]
    assert len(api) >= 10
    assert all(d.split(".")[0] in ("api", "policies") for m in api for d in graph[m]), \
        {m: graph[m] for m in api}
