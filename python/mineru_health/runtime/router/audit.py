"""The router's audit log: one JSON line per state change of a worker.

log = AuditLog(settings.audit_path)   # ConfigError if the path cannot be appended to
log.write(event)                      # a PollerEvent of kind AUDIT
log.write_record("poison_document_quarantined", worker_id="local-gpu-1",
                 reason="...", workers=[...])   # a record the router itself originates
log.close()
"""

from __future__ import annotations

import json
import sys
import time
from datetime import datetime, timezone
from typing import IO, Any, TextIO

from ... import _native, safe_text
from ..._names import enum_name
from ...errors import ConfigError

__all__ = ["AuditLog", "audit_record", "iso_time"]

_log = safe_text.logger("mineru_health.audit")


def iso_time(unix_time: float) -> str:
    return datetime.fromtimestamp(unix_time, tz=timezone.utc).isoformat()


def audit_record(event: Any) -> dict[str, Any]:
    """The JSON object of one audit event: time, worker_id, action, attempt, reason,
    cause (a failure cause name, "" when none), from, to."""
    audit = event.audit
    return {
        "time": iso_time(event.unix_time),
        "worker_id": event.worker_id,
        "action": enum_name(audit.action),
        "attempt": audit.attempt,
        "reason": audit.reason,
        "cause": audit.cause,
        "from": enum_name(audit.from_phase),
        "to": enum_name(audit.to_phase),
    }


class AuditLog:
    """Appends audit events as JSON lines to a file opened once (stderr when path is "").

    The path is checked at construction, as at the router's start-up: a path
    that cannot be appended to raises ``ConfigError`` naming the variable.
    Line-buffered, so each record reaches the file as one write. Not
    thread-safe: call it from the thread that drains the poller's events.
    """

    def __init__(self, path: str = "") -> None:
        self.path = path
        self._owned: IO[str] | None = None
        if path:
            variable = _native.config_variable_for(_native.ConfigComponent.ROUTER, "audit_path")
            _native.check_path(variable, path)
            try:
                self._owned = open(path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115
            except OSError as error:  # e.g. removed or made read-only since the check
                raise ConfigError(
                    f"{variable.name}={path} cannot be opened for appending: "
                    f"{error.strerror or error}",
                    variable=variable.name,
                ) from error
        self._stream: TextIO = self._owned if self._owned is not None else sys.stderr

    def write(self, event: Any) -> dict[str, Any]:
        record = audit_record(event)
        self._append(record)
        return record

    def write_record(
        self,
        action: str,
        *,
        worker_id: str,
        reason: str,
        unix_time: float | None = None,
        **fields: Any,
    ) -> dict[str, Any]:
        """Appends a record the router originates itself (not a policy transition).

        Same leading keys as ``audit_record`` (time, worker_id, action,
        reason), then ``fields`` (JSON-serialisable); no from/to phases.
        """
        record: dict[str, Any] = {
            "time": iso_time(time.time() if unix_time is None else unix_time),
            "worker_id": worker_id,
            "action": action,
            "reason": reason,
            **fields,
        }
        self._append(record)
        return record

    def _append(self, record: dict[str, Any]) -> None:
        try:
            self._stream.write(json.dumps(record, ensure_ascii=False, default=str) + "\n")
        except (OSError, ValueError) as exc:  # a full disk must not stop health handling
            _log.warning("cannot write audit record to %s: %s", self.path or "stderr", exc)

    def close(self) -> None:
        if self._owned is not None:
            self._owned.close()
            self._owned = None
            self._stream = sys.stderr

    def __repr__(self) -> str:
        return f"AuditLog(path={self.path!r})"
