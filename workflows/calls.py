"""One way to call activities from workflows. Every call goes through `call`, and what a failure
means is said once, by which of the two the caller uses:

- `call`: a failure raises (an ActivityError; a local activity's ApplicationError comes
  unwrapped). For calls whose caller branches on the failure, or that retry until they work.
- `call_or_none`: a failure is handed to `on_failure` with its cause, and the answer is None:
  the caller records it and carries on, and says what None means for its step.

Retries always stop at the failure types that say a retry cannot help (activities.errors)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, TimeoutType
from temporalio.exceptions import TimeoutError as ActivityTimeout

with workflow.unsafe.imports_passed_through():
    from activities.errors import NON_RETRYABLE


async def call(name: str, arg: Any = None, result_type: type | None = None, *, summary: str, timeout: timedelta,
               attempts: int = 0, max_interval: timedelta | None = None, task_queue: str | None = None,
               schedule_to_start: timedelta | None = None, heartbeat: timedelta | None = None,
               local: bool = False) -> Any:
    """One activity, retried up to `attempts` times (0: until it works); `task_queue` for
    node-local work, where `schedule_to_start` catches a dead agent.
    `local` runs it in the controller: one marker event, no task-queue round trip; its summary
    goes on the marker (the UI shows it) as well as in the caller's step record."""
    retry = RetryPolicy(maximum_attempts=attempts, maximum_interval=max_interval,
                        non_retryable_error_types=NON_RETRYABLE)
    args = [] if arg is None else [arg]
    if local:
        return await workflow.execute_local_activity(name, args=args, result_type=result_type, summary=summary,
                                                     start_to_close_timeout=timeout, retry_policy=retry)
    return await workflow.execute_activity(
        name, args=args, result_type=result_type, task_queue=task_queue, schedule_to_start_timeout=schedule_to_start,
        start_to_close_timeout=timeout, heartbeat_timeout=heartbeat, summary=summary, retry_policy=retry)


async def call_or_none(on_failure: Callable[[str], None], name: str, arg: Any = None,
                       result_type: type | None = None, **how: Any) -> Any:
    """`call`, with a failure told to `on_failure(cause)` and answered None."""
    try:
        return await call(name, arg, result_type, **how)
    except (ActivityError, ApplicationError) as err:
        on_failure(cause(err))
        return None


def cause(err: ActivityError | ApplicationError) -> str:
    """The innermost failure, as a person reads it: `NoEffect: cordon did not stick`."""
    if isinstance(err, ApplicationError):
        return f"{type(err).__name__}: {err}"
    inner = err.cause
    while inner is not None and inner.cause is not None and not isinstance(inner, ApplicationError):
        inner = inner.cause
    return f"{type(inner).__name__}: {inner}" if inner is not None else str(err)


def agent_gone(err: ActivityError) -> bool:
    """The activity timed out waiting for a poller on node/<cluster>/<node>: the agent is gone, which says
    nothing about the node's hardware."""
    inner = err.cause
    return isinstance(inner, ActivityTimeout) and inner.type == TimeoutType.SCHEDULE_TO_START
