import subprocess
import sys

import pytest

from policies.loader import PolicyError, default_policy, load_policy, policy_from_mapping
from policies.model import Policy


def test_default_policy_has_pinned_catalog():
    p = default_policy()
    assert p.xid_catalog_version.startswith("gpuheal-xid-")
    assert {13, 31, 48, 79, 154}.issubset(p.xids)
    assert p.ladder.reboot.requires_approval is False
    assert p.ladder.replace.requires_approval is False


def test_partial_file_merges_over_defaults(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text("ladder:\n  reboot:\n    return_timeout: 20m\nguard:\n  max_disruptive: '10%'\n")
    p = load_policy(f)
    assert p.ladder.reboot.return_timeout.total_seconds() == 1200
    assert p.ladder.reboot.retries == 3  # untouched default
    assert p.guard.max_disruptive == "10%"


@pytest.mark.parametrize("doc,problem", [
    ({"ladder": {"reboot": {"timeout": "10m"}}}, "ladder.reboot.timeout: unknown key"),
    ({"ladder": {"reboot": {"action_timeout": "ten"}}}, "ladder.reboot.action_timeout: must be a duration like 10m"),
    ({"guard": {"max_disruptive": "lots"}}, "guard.max_disruptive: must be a count like 3 or a percentage"),
    ({"drain": {"timeout_action": "panic"}}, "drain.timeout_action: Input should be 'escalate', 'wait' or 'force'"),
    ({"xid_overrides": {9999: {"action": "RESET_GPU"}}}, "xid_overrides.9999: no such Xid in the catalog"),
    ({"xid_overrides": {79: {"action": "PRAY"}}}, "xid_overrides.79.action"),
    ({"xids": {}}, "xids: the catalog is pinned"),
    ([1, 2], "(top level): must be a mapping"),
])
def test_bad_keys_are_named(doc, problem):
    with pytest.raises(PolicyError) as err:
        policy_from_mapping(doc, "test.yaml")
    assert any(line.startswith(problem) for line in err.value.problems), err.value.problems


def test_overrides_apply_per_generation():
    p = policy_from_mapping({"xid_overrides": {79: {"fault_class": "bus"}},
                             "generation_overrides": {"blackwell": {79: {"action": "RESET_GPU"}}}})
    assert p.xid_rule(79, "hopper").fault_class == "bus"
    assert p.xid_rule(79, "hopper").action == "RESTART_BM"
    assert p.xid_rule(79, "blackwell").action == "RESET_GPU"


def test_scaled_keeps_activity_timeouts_workable():
    p = default_policy().scaled(0.001)
    assert p.validation.soak.total_seconds() == pytest.approx(0.6)
    assert p.ladder.reset.action_timeout.total_seconds() == 10
    assert p.probation.total_seconds() == pytest.approx(1.8)


def test_policy_round_trips_through_json():
    p = default_policy()
    assert Policy.model_validate_json(p.model_dump_json()) == p


def test_cli_policy_check(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("ladder:\n  reboot:\n    timeout: soon\n")
    run = subprocess.run([sys.executable, "-m", "workers.cli", "policy", "check", str(bad)],
                         capture_output=True, text=True)
    assert run.returncode == 1
    assert "ladder.reboot.timeout: unknown key" in run.stderr
    good = tmp_path / "good.yaml"
    good.write_text("probation: 1h\n")
    run = subprocess.run([sys.executable, "-m", "workers.cli", "policy", "check", str(good)],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    missing = subprocess.run([sys.executable, "-m", "workers.cli", "policy", "check", str(tmp_path / "nope.yaml")],
                             capture_output=True, text=True)
    assert missing.returncode == 1 and "cannot read" in missing.stderr


def test_readme_policy_reference_is_generated_from_the_model():
    from pathlib import Path

    from policies.reference import END, START, policy_reference

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme[readme.index(START):readme.index(END) + len(END)]
    assert section == policy_reference(), "README's policy reference drifted: regenerate with `gpuheal policy reference`"
    assert "| `ladder.reboot.return_timeout` | 15m |" in section
