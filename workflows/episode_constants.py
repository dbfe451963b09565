"""The bounds NodeRemediation's state keeps (its wire and state models are in api/episode.py)."""

from __future__ import annotations

from datetime import timedelta

MAX_REJECTED_KEPT = 50
MAX_BOOTS_KEPT = 16
# A node whose check the API server could not answer is held for a person and asked about again on
# a timer, 5 min doubling to 1 h: a one-shot fault is re-sent only for a while, and the node stays in
# service, uncordoned, until the API server answers.
HOLD_RECHECK_FIRST, HOLD_RECHECK_MAX = timedelta(minutes=5), timedelta(hours=1)
MAX_ACTIONS_KEPT = 200
MAX_SEQ_SENDERS_KEPT = 32
MAX_RUN_IDS_KEPT = 50
# The controller's policy and the node check come from one local activity and one read of the Node.
PATCH_POLICY_WITH_CHECK = "policy-with-node-check"
# ... used only this soon after (a pause between the policy and the triage asks the API again).
CHECK_FRESH = timedelta(seconds=30)
# A slot reserved ahead is handed out with its notice already told to the guard (activities/guard.py).
PATCH_SLOT_TOLD_WHEN_TAKEN = "slot-told-when-taken"
