"""Every workflow.patched id has an entry in workflows/patch_register.py saying when it may be
deprecated, and the register names no id the workflows do not define."""

from __future__ import annotations

import ast
from pathlib import Path

from workflows.patch_register import PATCHES, RETIRE_WHEN

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = ROOT / "workflows"
# An edited NodeRemediation that branches on an id nobody registered: the scan must see it.
UNREGISTERED = ROOT / "tests" / "workflows" / "changed_workflows.py"


def _trees(paths=None):
    paths = paths or [p for p in sorted(WORKFLOWS.glob("*.py")) if p.name != "patch_register.py"]
    return {p.name: ast.parse(p.read_text()) for p in paths}


def defined_ids(paths=None) -> dict[str, str]:
    """PATCH_* constant -> its id, over the workflow modules."""
    out = {}
    for tree in _trees(paths).values():
        for node in tree.body:
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
                for t in node.targets:
                    if isinstance(t, ast.Name) and t.id.startswith("PATCH_") and isinstance(node.value.value, str):
                        out[t.id] = node.value.value
    return out


def patched_calls(paths=None) -> list[tuple[str, ast.expr]]:
    """(module, argument) of every workflow.patched / deprecate_patch call."""
    calls = []
    for name, tree in _trees(paths).items():
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("patched", "deprecate_patch")):
                calls.append((name, node.args[0]))
    return calls


def unregistered(paths=None) -> list[str]:
    """What a scan of `paths` finds branched on without a register entry."""
    consts, found = defined_ids(paths), []
    for module, arg in patched_calls(paths):
        pid = arg.value if isinstance(arg, ast.Constant) else consts.get(arg.id) if isinstance(arg, ast.Name) else None
        if pid not in PATCHES:
            found.append(f"{module}: workflow.patched({ast.unparse(arg)})")
    return found


def test_every_patched_call_in_the_workflows_is_registered():
    missing = unregistered()
    assert not missing, f"branched on with no entry in workflows/patch_register.py: {missing}"


def test_the_scan_finds_an_unregistered_patch():
    # Without this, an empty register and a scan that sees nothing would pass together.
    assert unregistered([UNREGISTERED]) == ["changed_workflows.py: workflow.patched('triage-settle')"]


def test_no_entry_is_stale():
    stale = sorted(set(PATCHES) - set(defined_ids().values()))
    assert not stale, f"register entries no workflow module defines: {stale}"


def test_every_entry_says_when_it_may_be_deprecated():
    for p in PATCHES.values():
        assert p.since, f"{p.id}: no origin"
        assert p.workflows and set(p.workflows) <= set(RETIRE_WHEN), f"{p.id}: unknown workflow in {p.workflows}"


def test_a_patch_branched_on_in_a_workflow_lists_that_workflow():
    """Its retire condition must cover the runs that branch on it: a guard patch waits for the guards."""
    sources = {p.name: p.read_text() for p in WORKFLOWS.glob("*.py")}
    for const, pid in defined_ids().items():
        users = {name for name, text in sources.items() if const in text}
        if users & {"fleet_guard.py", "guard_books.py", "guard_gates.py", "guard_room.py"}:
            assert "FleetGuard" in PATCHES[pid].workflows, f"{pid}: the guard branches on it"
        if "node_admission.py" in users:
            assert "NodeAdmission" in PATCHES[pid].workflows, f"{pid}: the admission branches on it"
