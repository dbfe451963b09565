"""The workflow modules stay deterministic by construction.

The controller passes `workflows` and `api` through the sandbox (workers/controller.WORKFLOW_RUNNER: the
per-run re-import was the largest cost of a cold workflow task), so what the re-import and its
restrictions guarded is checked here instead: no clocks, randomness, sleeps, threads or I/O, and no
module-level mutable state. The tests' own workers still run the workflows fully sandboxed."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = sorted([*(ROOT / "workflows").glob("*.py"), *(ROOT / "api").glob("*.py")])
FORBIDDEN_MODULES = {"time", "random", "uuid", "os", "subprocess", "socket", "threading", "secrets", "sqlite3",
                     "urllib", "http", "requests", "boto3", "kubernetes", "pynvml"}
FORBIDDEN_CALLS = {("datetime", "now"), ("datetime", "utcnow"), ("datetime", "today"), ("date", "today"),
                   ("asyncio", "sleep"), ("asyncio", "wait_for"), ("asyncio", "to_thread")}
FORBIDDEN_NAMES = {"open", "print", "input", "exec", "eval"}


def problems(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            out += [f"line {node.lineno}: imports {n}" for n in names if n.split(".")[0] in FORBIDDEN_MODULES]
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Name) and f.id in FORBIDDEN_NAMES:
                out.append(f"line {node.lineno}: calls {f.id}()")
            if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and (f.value.id, f.attr) in FORBIDDEN_CALLS:
                out.append(f"line {node.lineno}: calls {f.value.id}.{f.attr}()")
    for stmt in tree.body:  # module level: constants only, nothing a run could mutate for the next
        value = stmt.value if isinstance(stmt, ast.Assign | ast.AnnAssign) else None
        if isinstance(value, ast.List | ast.Dict | ast.Set | ast.ListComp | ast.DictComp | ast.SetComp):
            out.append(f"line {stmt.lineno}: module-level mutable {type(value).__name__.lower()}")
    return out


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_workflow_module_has_no_nondeterminism(path):
    assert problems(path) == []


def test_the_check_catches_what_it_must(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import random\nfrom datetime import datetime\nSEEN = []\n"
                   "def f():\n    open('x')\n    return datetime.now()\n")
    assert len(problems(bad)) == 4, problems(bad)
