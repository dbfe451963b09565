"""Every workflow.patched id has an entry in workflows/patch_register.py saying when it may be
deprecated, and the register names no id the workflows do not define."""

from __future__ import annotations

import ast
from pathlib import Path

from workflows.patch_register import PATCHES, RETIRE_WHEN

WORKFLOWS = Path(__file__).resolve().parents[2] / "workflows"


def _trees():
    return {p.name: ast.parse(p.read_text()) for p in sorted(WORKFLOWS.glob("*.py")) if p.name != "patch_register.py"}


def defined_ids() -> dict[str, str]:
    """PATCH_* constant -> its id, over the workflow modules."""
    out = {}
    for tree in _trees().values():
        for node in tree.body:
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
                for t in node.targets:
                    if isinstance(t, ast.Name) and t.id.startswith("PATCH_") and isinstance(node.value.value, str):
                        out[t.id] = node.value.value
    return out


def patched_calls() -> list[tuple[str, ast.expr]]:
    """(module, argument) of every workflow.patched / deprecate_patch call."""
    calls = []
    for name, tree in _trees().items():
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("patched", "deprecate_patch")):
                calls.append((name, node.args[0]))
    return calls


def test_every_defined_patch_id_is_registered_and_no_entry_is_stale():
    ids = set(defined_ids().values())
    assert ids, "no PATCH_ constant found: the scan is broken"
    missing = sorted(ids - set(PATCHES))
    assert not missing, f"patch ids with no entry in workflows/patch_register.py: {missing}"
    stale = sorted(set(PATCHES) - ids)
    assert not stale, f"register entries no workflow module defines: {stale}"


def test_every_patched_call_names_a_registered_constant():
    consts = defined_ids()
    calls = patched_calls()
    assert len(calls) > 20, "too few workflow.patched calls found: the scan is broken"
    for module, arg in calls:
        if isinstance(arg, ast.Constant):
            assert arg.value in PATCHES, f"{module}: workflow.patched({arg.value!r}) is not in the register"
        elif isinstance(arg, ast.Name) and arg.id.startswith("PATCH_"):
            assert arg.id in consts, f"{module}: {arg.id} is not a PATCH_ constant of the workflow modules"
        else:
            # The one loop over the issue-22 tuples: its names are the constants checked above.
            assert module == "episode.py" and isinstance(arg, ast.Name), \
                f"{module}: workflow.patched({ast.unparse(arg)}) takes no register id"


def test_every_entry_says_when_it_may_be_deprecated():
    for p in PATCHES.values():
        assert p.since, f"{p.id}: no origin"
        assert p.workflows and set(p.workflows) <= set(RETIRE_WHEN), f"{p.id}: unknown workflow in {p.workflows}"


def test_a_patch_branched_on_in_a_workflow_lists_that_workflow():
    """Its retire condition must cover the runs that branch on it: a guard patch waits for the guards."""
    sources = {p.name: p.read_text() for p in WORKFLOWS.glob("*.py")}
    for const, pid in defined_ids().items():
        users = {name for name, text in sources.items() if const in text and not name.endswith("_types.py")}
        if users & {"fleet_guard.py", "guard_books.py", "guard_gates.py"}:
            assert "FleetGuard" in PATCHES[pid].workflows, f"{pid}: the guard branches on it"
        if "node_admission.py" in users:
            assert "NodeAdmission" in PATCHES[pid].workflows, f"{pid}: the admission branches on it"
