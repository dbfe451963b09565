"""Red team, issue 22 second pass: the cases right beside the ones each fix's test covers, run on the
time-skipping server with the project's stand-in activities (tests/workflows/fakes.py). Tests marked
xfail(strict) found a defect still on main; the others are regression tests of attacks that held."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from temporalio import activity

import api as c
from policies.findings import Finding, HealthReport
from policies.loader import default_policy
from tests.workflows.fake_node import FakeNode
from tests.workflows.fakes import DESTRUCTIVE, FakeFleet, xid
from tests.workflows.test_node_remediation import run_with_status
from workers.reporting import send_report

DISRUPTIVE_CALLS = {c.KUBE_QUARANTINE, c.KUBE_DRAIN, c.CLOUD_REBOOT, c.CLOUD_REPLACE, c.NODE_RESET, c.NODE_KILL}


def fleet_of(cls, ts_env, uniq, policy=None):
    return cls(client=ts_env.client, task_queue=f"tq-{uniq}", policy=policy or default_policy(), cluster=f"c-{uniq}")


def agent_policy():
    policy = default_policy()
    policy.validation.agent_timeout = timedelta(seconds=1)  # the test server waits for it in real time
    return policy


# --- defect 14: a replaced node is not replaced again ----------------------------------------------
async def test_old_host_report_after_the_new_host_took_the_name_starts_nothing(ts_env, uniq):
    fleet = fleet_of(FakeFleet, ts_env, uniq)
    n = fleet.add(FakeNode(f"samename-{uniq}", [xid(54)], cured_by="none"))
    async with fleet.workers():
        first = await (await fleet.report(n.name)).result()
        assert first.outcome == "replaced"
        # The replacement registered under the same name: the Node shows the new host's boot id.
        n.boot, n.faulty = 1, False
        calls = len(n.calls)
        # The terminated host is held running by a termination hook and its agent reports once more.
        old = HealthReport(node=n.name, boot_id=f"boot-{n.name}-0", seq=50, gpus=n.ids(), findings=[xid(54)],
                           detected_at=datetime.now(UTC))
        second = await (await send_report(fleet.client, old, node=n.name, cluster=fleet.cluster,
                                          task_queue=fleet.task_queue)).result()
    touched = DISRUPTIVE_CALLS & set(n.calls[calls:])
    assert not touched, f"the old host's report acted on the new host: {sorted(touched)} ({second.outcome})"
    assert len(fleet.records) == 1


async def test_new_host_under_the_same_name_is_still_remediated(ts_env, uniq):
    """The other side of the same mark: a fault the new host itself reports is ours (held)."""
    fleet = fleet_of(FakeFleet, ts_env, uniq)
    n = fleet.add(FakeNode(f"newhost-{uniq}", [xid(54)], cured_by="none"))
    async with fleet.workers():
        assert (await (await fleet.report(n.name)).result()).outcome == "replaced"
        n.boot, n.seq, n.faulty, n.findings, n.cured_by = 1, 0, True, [xid(48)], "reset"
        # The new host's Node does not carry the old host's quarantine taint: with it, the new episode
        # is held for a person (quarantine-hold) and, on the time-skipping server, never ends.
        n.cordoned = False
        second = await (await fleet.report(n.name)).result()
    assert second.outcome == "returned" and second.rungs == ["reset"]


# --- defects 2 and 13: reboots that did not happen, agents that went away ---------------------------
@dataclass
class RebootNotTaken(FakeFleet):
    """The reboot was answered `rebooted` but never happened (a RebootInstances whose connection
    failed, then a retry inside the boot window that does not send it again): the machine runs on,
    and its agent keeps reporting from the same boot."""

    @activity.defn(name=c.CLOUD_REBOOT)
    async def reboot(self, req: c.RebootRequest) -> c.RebootResult:
        n = self._node(req)
        await self.report(n.name)  # the agent, alive, from the boot it had before
        return c.RebootResult(instance_id=f"i-{n.name}", rebooted=True, from_boot=f"kubelet-{n.boot}")


async def test_reboot_that_never_happened_does_not_replace(ts_env, uniq):
    fleet = fleet_of(RebootNotTaken, ts_env, uniq)
    n = fleet.add(FakeNode(f"noboot-{uniq}", [xid(79)], cured_by="reboot"))
    result, status = await run_with_status(fleet, n)
    assert "cloud.replace" not in n.calls and fleet.denylist == {}, \
        f"replaced on a reboot that never happened: {result.outcome} {result.rungs}"


async def test_agent_gone_after_reboot_and_boot_id_unreadable_is_not_replaced(ts_env, uniq):
    fleet = fleet_of(FakeFleet, ts_env, uniq, agent_policy())
    # The agent reported the fault, then is gone from the new boot on; the boot id cannot be read.
    n = fleet.add(FakeNode(f"blind-{uniq}", [xid(79)], cured_by="reboot", after_reboot="none",
                           fail={c.CLOUD_BOOT_ID}))  # "none": neither the agent nor a watcher reports after it

    result, status = await run_with_status(fleet, n)
    assert "cloud.replace" not in n.calls and fleet.denylist == {}, f"{result.outcome}: {result.reason}"
    assert result.outcome == "quarantined"


@dataclass
class AgentDiesAfter(FakeFleet):
    """The node's agent dies right after the node-local rung ran (kill or reset)."""

    def _die_soon(self, name: str) -> None:
        self.nodes[name].agent = False
        asyncio.get_running_loop().create_task(self.stop_agent(name))  # not awaited: it runs this activity

    @activity.defn(name=c.NODE_KILL)
    async def kill(self, req: c.KillRequest) -> c.KillResult:
        n = self._node(req)
        n.apply("kill")
        if req.gpus:  # the kill of the job, not the one before a reset
            self._die_soon(n.name)
        return c.KillResult()

    @activity.defn(name=c.NODE_RESET)
    async def reset(self, req: c.ResetRequest) -> c.ResetResult:
        n = self._node(req)
        n.apply("reset")
        self._die_soon(n.name)
        return c.ResetResult(reset=req.gpus)


async def test_agent_gone_after_reset_is_rebooted_then_left_for_a_person(ts_env, uniq):
    """Agent missing after reset (not reboot): a reboot may bring it back; if it does not, nothing is
    replaced or denylisted (held)."""
    fleet = fleet_of(AgentDiesAfter, ts_env, uniq, agent_policy())
    n = fleet.add(FakeNode(f"resetgone-{uniq}", [xid(48)], cured_by="none"))
    result, status = await run_with_status(fleet, n)
    assert "cloud.replace" not in n.calls and fleet.denylist == {}
    assert result.outcome == "quarantined" and result.reason.startswith("agent_missing"), result.reason


async def test_application_fault_agent_gone_at_validation_is_not_rebooted(ts_env, uniq):
    """Defect 5's neighbour: the kill ran, then the agent died before the validation: no drain, no
    reboot, cordoned for a person (held)."""
    fleet = fleet_of(AgentDiesAfter, ts_env, uniq, agent_policy())
    n = fleet.add(FakeNode(f"appval-{uniq}", [xid(13)], cured_by="reset"))
    result, status = await run_with_status(fleet, n)
    assert not {c.KUBE_DRAIN, c.CLOUD_REBOOT, c.NODE_RESET, c.CLOUD_REPLACE} & set(n.calls), n.calls
    assert result.outcome == "quarantined" and "application fault" in result.reason, result.reason


# --- defect 1: dry run ------------------------------------------------------------------------------
async def test_dry_run_repeat_offender_writes_nothing(ts_env, uniq):
    """A dry run that reaches replace another way (repeat offender, straight to replace): nothing
    denylisted, every destructive request carries dry_run (held)."""
    fleet = fleet_of(FakeFleet, ts_env, uniq)
    n = fleet.add(FakeNode(f"dryrep-{uniq}", [xid(48, gpu=2)], cured_by="reset"))
    async with fleet.workers():
        for _ in range(2):
            n.faulty = True
            assert (await (await fleet.report(n.name)).result()).rungs == ["reset"]
        fleet.policy = fleet.policy.model_copy(update={"dry_run": True})
        n.faulty, n.requests = True, {}
        third = await (await fleet.report(n.name)).result()
    assert third.outcome == "dry_run" and third.rungs == ["replace"], (third.outcome, third.rungs)
    assert fleet.denylist == {}
    for kind, reqs in n.requests.items():
        if kind in DESTRUCTIVE:
            assert all(r.dry_run for r in reqs), f"{kind} sent without dry_run"


async def test_dry_run_kill_without_gpu_changes_nothing(ts_env, uniq):
    """Dry run meets defect 4's path (no GPU located: cordon for a person): the cordon is dry too."""
    policy = default_policy()
    policy.dry_run = True
    fleet = fleet_of(FakeFleet, ts_env, uniq, policy)
    lost = Finding(kind="xid", xid=13, pci="0000:99:00", message="Xid 13 at an unknown bus id")
    n = fleet.add(FakeNode(f"drylost-{uniq}", [lost], cured_by="kill"))
    result, _ = await run_with_status(fleet, n)
    assert all(r.dry_run for r in n.requests.get(c.KUBE_QUARANTINE, []))
    assert not n.requests.get(c.NODE_KILL) and fleet.denylist == {}


async def test_dry_run_admission_of_denylisted_hardware_changes_nothing(ts_env, uniq):
    """Dry run through admission (defect 1's other door): a node carrying denylisted hardware is
    not tainted, terminated or replaced for real (held)."""
    from tests.workflows.test_fleet_safety import admit
    policy = default_policy()
    policy.dry_run = True
    fleet = fleet_of(FakeFleet, ts_env, uniq, policy)
    n = fleet.add(FakeNode(f"dryadmit-{uniq}", [], faulty=False))
    fleet.denylist[f"SN-{n.name}-2"] = "replaced: Xid 79 on node old-7"
    async with fleet.workers():
        result = await admit(fleet, n, policy)
    assert result.outcome == "denied_admission"
    for kind in (c.KUBE_QUARANTINE, c.CLOUD_REPLACE):
        assert n.requests[kind] and all(r.dry_run for r in n.requests[kind]), kind
    assert all(e.dry_run for e in fleet.events)


@dataclass
class AgentDiesBetweenValidations(FakeFleet):
    """The agent comes back from the reboot, passes validation 1 of 2, and dies during the soak."""

    @activity.defn(name=c.NODE_VALIDATE)
    async def validate(self, req: c.ValidateRequest) -> c.ValidationResult:
        n = self._node(req)
        n.agent = False
        asyncio.get_running_loop().create_task(self.stop_agent(n.name))
        return c.ValidationResult(passed=not n.faulty, findings=n.findings if n.faulty else [], checks=["fake"])


async def test_agent_gone_between_the_two_validations_after_reboot_is_not_replaced(ts_env, uniq):
    """Defect 2's neighbour: the agent is gone during validation (not after a reset or at the
    reboot): quarantined for a person, nothing replaced or denylisted (held)."""
    fleet = fleet_of(AgentDiesBetweenValidations, ts_env, uniq, agent_policy())
    n = fleet.add(FakeNode(f"val2-{uniq}", [xid(79)], cured_by="reboot"))
    result, status = await run_with_status(fleet, n)
    assert "cloud.replace" not in n.calls and fleet.denylist == {}
    assert result.outcome == "quarantined" and result.reason.startswith("agent_missing"), result.reason


@dataclass
class DryRebootStays(FakeFleet):
    """A dry-run reboot reboots nothing: no new boot, no report from one (the stand-in reboots anyway)."""

    @activity.defn(name=c.CLOUD_REBOOT)
    async def reboot(self, req: c.RebootRequest) -> c.RebootResult:
        n = self._node(req)
        assert req.dry_run, "this stand-in serves dry runs only"
        return c.RebootResult(instance_id=f"i-{n.name}", rebooted=False, dry_run=True)


async def test_dry_run_starting_at_reboot_ends_dry_without_replacing(ts_env, uniq):
    """Defect 1 with another starting rung: a dry-run reboot brings no new boot; the episode waits,
    then says what it would have done, never climbing to a replacement or a denylist (held)."""
    policy = default_policy()
    policy.dry_run = True
    fleet = fleet_of(DryRebootStays, ts_env, uniq, policy)
    n = fleet.add(FakeNode(f"dryboot-{uniq}", [xid(79)], cured_by="reboot"))
    result, _ = await run_with_status(fleet, n)
    assert (result.outcome, [r.value for r in result.rungs]) == ("dry_run", ["reboot"])
    assert "cloud.replace" not in n.calls and fleet.denylist == {}
    for kind, reqs in n.requests.items():
        if kind in DESTRUCTIVE:
            assert all(r.dry_run for r in reqs), f"{kind} sent without dry_run"


async def test_watcher_saw_the_new_boot_agent_gone_boot_id_unreadable_is_not_replaced(ts_env, uniq):
    fleet = fleet_of(FakeFleet, ts_env, uniq, agent_policy())
    n = fleet.add(FakeNode(f"blindw-{uniq}", [xid(79)], cured_by="reboot", after_reboot="watcher",
                           fail={c.CLOUD_BOOT_ID}))
    result, status = await run_with_status(fleet, n)
    assert status.boot_id == "kubelet-1", "the watcher's report of the new boot was taken"
    assert "cloud.replace" not in n.calls and fleet.denylist == {}, f"{result.outcome}: {result.reason}"
