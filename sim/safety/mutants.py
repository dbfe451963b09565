"""Safeguards switched off one at a time, to show the safety simulation finds their absence.

Workers in the simulation run workflows unsandboxed, so patching the workflow classes here
changes what the next schedules run. Never used outside the simulation."""

from __future__ import annotations

import contextlib

MUTANTS = ["dry_run", "lease", "agent_missing", "kill_filter", "stale_requests", "room_limit"]


@contextlib.contextmanager
def applied(name: str | None):
    if not name:
        yield
        return
    if name not in MUTANTS:
        raise ValueError(f"unknown mutant {name!r}: one of {', '.join(MUTANTS)}")
    from workflows.lease import GuardClient
    from workflows.rungs import RungActions

    saved: list[tuple[object, str, object]] = []

    def patch(owner, attr, value):
        saved.append((owner, attr, getattr(owner, attr)))
        setattr(owner, attr, value)

    if name == "dry_run":
        act = RungActions._act

        async def act_for_real(self, rung):
            # The dry-run check gone: the rung's activities are asked for real.
            policy, self.policy = self.policy, self.policy.model_copy(update={"dry_run": False})
            try:
                return await act(self, rung)
            finally:
                self.policy = policy
        patch(RungActions, "_act", act_for_real)
    elif name == "lease":
        async def no_lease(self):
            return None
        patch(GuardClient, "_acquire_lease", no_lease)
    elif name == "agent_missing":
        # The agent-missing rule gone: a silent agent no longer stops the ladder.
        async def no_boot_id(self):
            return None
        patch(RungActions, "_agent_missing_stops", lambda self, rung: "")
        patch(RungActions, "_kubelet_boot_id", no_boot_id)
    elif name == "kill_filter":
        import api as c

        async def kill_everything(self, summary, rp, whole_node):
            # The GPU filter gone: every GPU's processes, every MIG tenant's.
            return await self._node_activity(c.NODE_KILL, c.KillRequest(
                node=self.node, all_gpus=True, dry_run=self.policy.dry_run), c.KillResult, summary, rp)
        patch(RungActions, "_stop_gpu_processes", kill_everything)
    elif name == "stale_requests":
        from workflows.fleet_guard import FleetGuard

        # The stale-request check gone: a duplicate of a request already given back is granted.
        patch(FleetGuard, "_stale", lambda self, req: False)
    elif name == "room_limit":
        from workflows import guard_room

        reserve = guard_room.reserve

        def reserve_past_the_limit(s, req, policy, now, free, new_token, reclaim=False, half=False):
            # The free-room bound gone: a pool reserves up to room_ahead whatever max_unhealthy leaves.
            return reserve(s, req, policy, now, None, new_token, reclaim, half)
        patch(guard_room, "reserve", reserve_past_the_limit)
    try:
        yield
    finally:
        for owner, attr, value in reversed(saved):
            setattr(owner, attr, value)
