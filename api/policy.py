"""The controller's policy as an episode takes it (activities/policy.py)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from api.cluster import NodeCheckResult
from policies.model import Policy


class PolicyRequest(BaseModel):
    node: str = Field(default="", description="Who asks (for the controller's log); the answer is the same for all.")
    check: bool = Field(default=False, description="Also check the node from the same read (`kube.check_node`'s "
                        "answer in `node_check`): one local activity fewer before a storm's cordons.")
    boot_id: str | None = Field(default=None, description="With `check`: the boot the report came from.")


class PolicySnapshot(BaseModel):
    """The controller's policy as an episode took it: recorded in the history, named in status."""

    name: str
    sha256: str = Field(description="Hash of the policy's canonical JSON: two controllers with one file agree.")
    source: str = Field(default="", description="Where the controller loaded it from (a path, or 'default').")
    policy: Policy
    cluster: str | None = Field(default=None, description="The controller's cluster: an episode's guard and budget "
                                "(None: a controller from before says nothing, the start input's stands).")
    profile: str | None = Field(default=None, description="The node's profile, when one applies (its overrides are in `policy`).")
    profile_reason: str = Field(default="", description="Why the node gets that profile (or none).")
    node_check: NodeCheckResult | None = Field(default=None, description="What `kube.check_node` would answer, when "
                                               "asked with `check` (None: not asked, or a controller that cannot say).")
