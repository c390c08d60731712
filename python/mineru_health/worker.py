"""Whether this worker's inference engine is still usable.

    >>> health = WorkerHealth()
    >>> verdict = health.record(exc)     # classifies, then records fatal or task-local
    >>> health.healthy
    False

The state lives in the native core so that a watcher thread can block in
:meth:`WorkerHealth.wait_until_unhealthy` without holding the GIL.

Thread-safety: every method may be called from any thread at once.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime

from . import _native
from .classifier import Rules, Verdict, classify

__all__ = ["FatalInfo", "HealthSnapshot", "WorkerHealth", "describe_exception", "worker_health"]

#: Cap on the error text kept for /health; the full traceback goes to the log.
MAX_ERROR_CHARS = 2000


def describe_exception(exc: BaseException) -> str:
    """``"TypeName: message"``, short and safe to put in a JSON body."""
    try:
        message = str(exc)
    except Exception as error:  # noqa: BLE001 - a broken __str__ must not hide the failure
        message = f"<unprintable: {type(error).__name__} in __str__>"
    text = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    if len(text) > MAX_ERROR_CHARS:
        text = text[: MAX_ERROR_CHARS - 3] + "..."
    # JSON and the native side want valid UTF-8: lone surrogates become U+FFFD.
    return text.encode("utf-8", "replace").decode("utf-8")


@dataclass(frozen=True, slots=True)
class FatalInfo:
    """One recorded fatal failure."""

    error: str
    rule: str
    category: str
    unix_time: float

    @property
    def since(self) -> str:
        """ISO 8601 UTC time of the failure."""
        return datetime.fromtimestamp(self.unix_time, tz=UTC).isoformat()

    @classmethod
    def _from_native(cls, record: _native.FatalRecord | None) -> FatalInfo | None:
        if record is None:
            return None
        return cls(record.error, record.rule_id, record.category, record.unix_time)


@dataclass(frozen=True, slots=True)
class HealthSnapshot:
    """A consistent copy of the worker state."""

    healthy: bool
    fatal_count: int
    task_local_count: int
    first_fatal: FatalInfo | None
    last_fatal: FatalInfo | None


class WorkerHealth:
    """The worker's fatal record: healthy until a fatal failure, then unhealthy until reset."""

    __slots__ = ("_state",)

    def __init__(self) -> None:
        self._state = _native.WorkerState()

    @property
    def healthy(self) -> bool:
        return self._state.healthy()

    def snapshot(self) -> HealthSnapshot:
        snap = self._state.snapshot()
        return HealthSnapshot(
            healthy=snap.healthy,
            fatal_count=snap.fatal_count,
            task_local_count=snap.task_local_count,
            first_fatal=FatalInfo._from_native(snap.first_fatal),
            last_fatal=FatalInfo._from_native(snap.last_fatal),
        )

    def record(
        self,
        failure: BaseException | Verdict,
        *,
        error: str | None = None,
        rules: Rules | None = None,
        unix_time: float | None = None,
        remote_engine: bool = False,
    ) -> Verdict:
        """Classifies ``failure`` (unless it is already a verdict) and records the outcome.

        ``error`` is the text kept for /health; by default the exception's
        ``"Type: message"``, or the verdict's excerpt. ``remote_engine``: the
        task used a remote engine (an ``*-http-client`` backend), so only this
        process's own engine or device errors can make it unhealthy.
        """
        if isinstance(failure, Verdict):
            verdict = failure
            text = error if error is not None else verdict.excerpt
        else:
            verdict = classify(failure, rules=rules, remote_engine=remote_engine)
            text = error if error is not None else describe_exception(failure)
        if verdict.fatal:
            self.record_fatal(text, rule=verdict.rule, category=verdict.category,
                              unix_time=unix_time)
        else:
            self._state.record_task_local()
        return verdict

    def record_fatal(self, error: str, *, rule: str, category: str,
                     unix_time: float | None = None) -> None:
        """Records a fatal failure decided elsewhere (e.g. a liveness check)."""
        when = time.time() if unix_time is None else unix_time
        clean = error.encode("utf-8", "replace").decode("utf-8")
        self._state.record_fatal(_native.FatalRecord(clean, rule, category, when))

    def record_task_local(self) -> None:
        self._state.record_task_local()

    def reset(self) -> None:
        """Back to healthy with zero counters."""
        self._state.reset()

    def wait_until_unhealthy(self, timeout: float) -> bool:
        """Blocks (without the GIL) until unhealthy or ``timeout`` seconds pass."""
        return self._state.wait_until_unhealthy(max(0.0, float(timeout)))

    def __repr__(self) -> str:
        snap = self.snapshot()
        if snap.healthy:
            return f"WorkerHealth(healthy, task_local_failures={snap.task_local_count})"
        first = snap.first_fatal
        assert first is not None
        return (
            f"WorkerHealth(unhealthy since {first.since}, rule={first.rule!r}, "
            f"fatal_failures={snap.fatal_count})"
        )


_process_health = WorkerHealth()


def worker_health() -> WorkerHealth:
    """The process-wide instance the worker integration records into."""
    return _process_health
