"""The Status document the API server answers failures with, and its clock."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta


def now_iso(plus_seconds: float = 0) -> str:
    return (datetime.now(UTC) + timedelta(seconds=plus_seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str, details: dict | None = None):
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details

    def status(self) -> dict:
        body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": self.message, "reason": self.reason, "code": self.code}
        if self.details:
            body["details"] = self.details
        return body
