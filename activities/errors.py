"""The failure types workflows branch on, named once; activities raise them non-retryable."""

from __future__ import annotations

from temporalio.exceptions import ApplicationError

NODE_GONE = "NodeGone"  # the node or its instance no longer exists
NO_EFFECT = "NoEffect"  # the call returned but the effect is not there (a cordon that did not stick)
PERMISSION_DENIED = "PermissionDenied"  # 403 / AccessDenied: a retry cannot fix it
NOT_OWNED = "NotOwned"  # the instance lacks the ownership tag: gpuheal must not touch it
PROCESSES_REMAIN = "ProcessesRemain"  # a GPU reset refused while processes hold the GPU
MIG_ACTIVE = "MigActive"  # a GPU reset refused while MIG instances exist
DEPENDENCY_MISSING = "DependencyMissing"  # nvidia-smi / dcgmi / NVML not present: fail closed
INVALID_REQUEST = "InvalidRequest"

NON_RETRYABLE = [NODE_GONE, NO_EFFECT, PERMISSION_DENIED, NOT_OWNED, PROCESSES_REMAIN, MIG_ACTIVE,
                 DEPENDENCY_MISSING, INVALID_REQUEST]


def fail(error_type: str, message: str, **details) -> ApplicationError:
    """A non-retryable ApplicationError of one of the types above (raise the result)."""
    return ApplicationError(message, details or None, type=error_type, non_retryable=True)
