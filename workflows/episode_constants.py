"""NodeRemediation's patch ids and the bounds its state keeps (its wire and state models are in
api/episode.py)."""

from __future__ import annotations

from datetime import timedelta

MAX_REJECTED_KEPT = 50
MAX_BOOTS_KEPT = 16
# workflow.patched ids: each names a change to workflow logic that old histories must not see.
PATCH_LOCAL_CLUSTER_CALLS = "local-cluster-calls"
# Do no harm: re-sent events are no recurrence; no disruptive step on a node not verifiably
# cordoned, drained or ours; an agent that is gone is `agent_missing`, never evidence for replace.
PATCH_DO_NO_HARM = "do-no-harm"
# Reports over their bounds are rejected, and the episode's lists keep their newest entries only.
PATCH_BOUNDED_STATE = "bounded-state"
# The guard admits quarantine (at most max_unhealthy cordoned), hears every ending, and lease
# requests are re-sent while waiting (issue: never wedged).
PATCH_GUARD_ADMISSION = "guard-admission"
# Reports cannot steer intake: an undecodable one is recorded as rejected, a sequence is clamped to
# the workflow's clock (one far ahead is rejected), a boot is retired only by the reboot the episode
# asked for, and a report whose events were all heard is a duplicate (issue 22: 7, 9, 15d).
PATCH_TRUSTED_INTAKE = "trusted-intake"
# The node comes from the workflow id, the cluster and the history limit from the controller (issue 22: 9).
PATCH_EPISODE_IDENTITY = "episode-identity"
# A node an earlier episode left quarantined (it still carries gpuheal's taint) is held for a person:
# a new episode on it records its reports and waits for an operator's `lift` (issue 22: 8).
PATCH_QUARANTINE_HOLD = "quarantine-hold"
# A report whose findings are only node conditions set before the node's last episode started (a
# sticky condition re-sent by another watcher replica) starts nothing (issue 22: 7).
PATCH_STICKY_CONDITIONS = "sticky-conditions"
# A report that arrives while the episode closes is recorded (history, status, result), not lost
# silently (issue 22: 15c).
PATCH_LATE_REPORTS = "late-reports"
# Issue 22 (do no harm, second pass), one id per defect so each can be told apart in a history.
PATCH_DRY_RUN_DENYLIST = "dry-run-no-denylist"  # 1: a dry run writes no denylist entry
PATCH_AGENT_MISSING_TOP = "agent-missing-at-reboot"  # 2: no replace for an agent that did not come back
PATCH_AGENT_BOOT = "agent-boot-ends-reboot"  # 2: only the node's agent from a new boot ends the reboot wait
PATCH_KILL_IMPLICATED = "kill-implicated-only"  # 4: no GPU implicated, nothing killed
PATCH_APP_AGENT_MISSING = "app-fault-agent-missing"  # 5: an application fault never reboots
PATCH_APPROVAL_NO_LEASE = "approval-without-lease"  # 6: no lease held while a person decides
PATCH_LEASE_REQUEST_IDS = "lease-request-ids"  # 12: a grant is taken only for the request outstanding
PATCH_REPLACE_THEN_DENY = "replace-then-denylist"  # 13: denylist once the replacement is under way
# 14 needed no workflow change (cloud.replace marks the Node, kube.check_node reads it): the id stays
# decided, as main listed it for a while, so no history that carries its marker is left unmatched.
PATCH_REPLACED_NODE = "replaced-node-done"
PATCH_APPROVE_RUNG = "approve-names-rung"  # 15a: approve says which rung
PATCH_REPEAT_PER_BOARD = "repeat-offender-per-board"  # 15b: repeat offenders counted per board
ISSUE22_PATCHES = (PATCH_DRY_RUN_DENYLIST, PATCH_AGENT_MISSING_TOP, PATCH_AGENT_BOOT, PATCH_KILL_IMPLICATED,
                   PATCH_APP_AGENT_MISSING, PATCH_APPROVAL_NO_LEASE, PATCH_LEASE_REQUEST_IDS, PATCH_REPLACE_THEN_DENY,
                   PATCH_REPLACED_NODE, PATCH_APPROVE_RUNG, PATCH_REPEAT_PER_BOARD)
# workflow.patched id: a profile's observe mode (record the triage, never cordon); admission records
# the node's baseline and keeps an observed node untainted.
PATCH_NODE_PROFILES = "node-profiles"
# A waiting episode re-sends its lease request on a doubling interval (capped), not every
# holder_check_interval: a long pause no longer grows each waiter's history without bound.
PATCH_LEASE_BACKOFF = "lease-request-backoff"
# Issue 22, red team: the next holes beside the fixes above, one id each (decided with ISSUE22_PATCHES).
PATCH_CHECK_REPORT_BOOT = "check-node-report-boot"  # 14: kube.check_node sees the report's boot id
PATCH_PAUSE_BEFORE_DRAIN = "pause-before-drain"  # a pause during the approval or lease wait holds the drain
PATCH_REBOOT_DOUBT = "reboot-doubt-left-for-a-person"  # 2/13: no proof a reboot happened is never a replace
# An episode whose starting report was rejected ends `rejected` when no valid one follows in time.
PATCH_FIRST_REPORT_DEADLINE = "first-report-deadline"
# A grant must name the request it answers: one without an id (a guard on code from before request
# ids, or any sender able to signal) is not a lease; the re-sent request gets a named grant.
PATCH_GRANT_NEEDS_ID = "grant-needs-request-id"
# A rung whose action could not be done (its calls failed) is no evidence: no climb to replace on it.
PATCH_FAILED_ACTION_NO_REPLACE = "failed-action-no-replace"
# A recurrence that would replace must come from the node's own agent (its probes), not a watcher's or
# anyone else's report.
PATCH_REPLACE_ON_AGENT_RECURRENCE = "replace-on-agent-recurrence"
# Only a platform finding implicates hardware: an application fault's GPU (Xid 13) is where a job
# failed, not a faulty board, and the denylist is permanent.
PATCH_IMPLICATE_PLATFORM_ONLY = "implicate-platform-findings-only"
# Local activities' markers are committed before the run ends or continues as new: a guard's answer
# arriving meanwhile failed the closing task (UNHANDLED_COMMAND), the retry ran the local activities
# again, their signals drew another answer, and so on for ever (safety simulation, seed 35).
PATCH_CLOSE_BARRIER = "commit-before-close"
# Kill and reset target only GPUs the node's own agent named: a report from anyone else naming a GPU
# (a manual one, say) signalled that GPU's tenants (safety soak, seed 1211).
PATCH_AGENT_GPUS = "target-agent-gpus-only"
# A node whose check the API server could not answer is held for a person: whether an earlier episode
# left it quarantined is unknown (safety soak, seeds 1460, 1562: a new episode drained such a node).
PATCH_HOLD_UNCHECKED = "hold-when-unchecked"
# ...and asks again on a timer, 5 min doubling to 1 h: a one-shot fault is re-sent only for a while,
# and the node stays in service, uncordoned, until the API server answers (red-team review).
HOLD_RECHECK_FIRST, HOLD_RECHECK_MAX = timedelta(minutes=5), timedelta(hours=1)
ISSUE22_REDTEAM_PATCHES = (PATCH_HOLD_UNCHECKED, PATCH_AGENT_GPUS, PATCH_CLOSE_BARRIER, PATCH_CHECK_REPORT_BOOT, PATCH_PAUSE_BEFORE_DRAIN, PATCH_REBOOT_DOUBT,
                           PATCH_FIRST_REPORT_DEADLINE, PATCH_GRANT_NEEDS_ID, PATCH_FAILED_ACTION_NO_REPLACE,
                           PATCH_REPLACE_ON_AGENT_RECURRENCE, PATCH_IMPLICATE_PLATFORM_ONLY)
# workflow.patched id: an episode the guard did not answer within admission_timeout tells it the node
# is quarantined (a plain fault notice, counted at once) before it cordons anyway: uncounted, a storm's
# timed-out cordons left room in the books that the guard then gave to others (guard storm, 2,000 of
# 10,000 nodes: 1,589 quarantined against max_unhealthy 1,000).
PATCH_COUNTED_BEFORE_CORDON = "counted-before-cordon"
# workflow.patched id: the cordon takes a quarantine slot the guard reserved ahead for this controller
# (guard.take_room, local) when there is one, with no round trip; the slot's token goes to the guard
# right after the cordon (issue 25: detect-to-cordon).
PATCH_ROOM_AHEAD = "room-ahead"
# workflow.patched id: a guard that has not answered within admission_timeout but runs, with a worker
# taking its tasks, is waited for; only a stuck one (not running, its task failing, no worker) is
# cordoned past (guard storm, 2,000 of 10,000: the timed-out cordons took 1,631 nodes past 1,000).
PATCH_SLOW_GUARD_WAITS = "slow-guard-waits"
MAX_ACTIONS_KEPT = 200
MAX_SEQ_SENDERS_KEPT = 32
MAX_RUN_IDS_KEPT = 50


