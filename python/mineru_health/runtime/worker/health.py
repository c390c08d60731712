"""Whether this worker can still serve, and the native endpoint that says so.

    >>> health = WorkerHealth(loop_hang_s=60.0, stall_s=300.0)
    >>> outcome = health.record(exc)      # classifies, then records the outcome
    >>> outcome.fatal, health.healthy
    (True, False)
    >>> endpoint = HealthEndpoint.start(health, port=9123)   # /health, /livez, /readyz

The state lives in the native core: the fatal record, the event loop's last
tick, engine calls in flight and the last progress, MinerU's task figures.
The endpoint answers from it on a native thread, so a worker whose event loop
is busy (MinerU blocks it for seconds under load) answers at once, and a
watcher thread can block in :meth:`WorkerHealth.wait_until_unhealthy`
without holding the GIL.

Thread-safety: every method may be called from any thread at once.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from ... import _native
from ..._names import enum_name
from ...classifier import Classification, Rules, classify
from ...errors import HealthEndpointError
from ...safe_text import describe_exception, exception_type_name, valid_utf8

if TYPE_CHECKING:
    from typing_extensions import Self

    from .verification import Verification

__all__ = [
    "FatalInfo",
    "HealthEndpoint",
    "HealthPhase",
    "HealthSnapshot",
    "Recorded",
    "WorkerHealth",
    "fatal_cause",
]

#: One recorded fatal failure: ``error`` (may quote a user's document), ``rule``,
#: ``category``, ``unix_time``, ``exception_type``, and from the native core ``since``
#: (ISO 8601 UTC) and ``cause`` (``"engine_dead, rule vllm.engine_dead"``). Read-only.
FatalInfo = _native.FatalRecord

#: A consistent copy of the worker state, evaluated at one instant. ``phase`` is a
#: ``HealthPhase``: ``STARTING``, ``HEALTHY`` (busy included), ``UNHEALTHY`` (MinerU's own
#: task manager says so), ``LOOP_HUNG`` or ``FATAL``. Read-only.
HealthSnapshot = _native.WorkerSnapshot
HealthPhase = _native.HealthPhase


def fatal_cause(fatal: FatalInfo | None) -> str:
    """``fatal.cause`` (safe to show anyone), or ``"unknown cause"`` when there is none."""
    return fatal.cause if fatal is not None else "unknown cause"


@dataclass(frozen=True, slots=True)
class Recorded:
    """What :meth:`WorkerHealth.record` decided for one failure.

    ``fatal`` is true when the worker is now unusable because of this failure
    (a fatal verdict, or an ambiguous one that exhausted the error budget);
    ``first`` when this failure is the one that made it so.
    ``verification``: what checking the engine found, when the verdict left
    the failure undecided (:func:`mineru_health.runtime.worker.judge.confirm`).
    """

    verdict: Classification
    fatal: bool
    first: bool
    rule: str
    category: str
    verification: Verification | None = None


class WorkerHealth:
    """The worker's health record: healthy until a fatal failure, then unhealthy until reset.

    ``loop_hang_s``: a loop blocked longer is hung (503); shorter blocks are
    busy. ``stall_s``: work in progress with no engine progress for longer is
    a stalled engine (fatal; 0 disables). ``error_budget`` ambiguous device
    errors within ``error_budget_window_s`` are fatal (0 disables). A task
    with no progress of its own for ``task_hang_s`` is hung (0 disables).
    A remote wait fails its task after ``task_hang_s`` of its server's
    silence or ``remote_wait_s`` in all (0 disables either).
    """

    __slots__ = ("_state",)

    def __init__(
        self,
        *,
        loop_hang_s: float = 60.0,
        stall_s: float = 300.0,
        error_budget: int = 3,
        error_budget_window_s: float = 60.0,
        task_hang_s: float = 900.0,
        remote_wait_s: float = 2400.0,
    ) -> None:
        options = _native.WorkerStateOptions()
        options.loop_hang = timedelta(seconds=loop_hang_s)
        options.stall = timedelta(seconds=stall_s)
        options.error_budget = error_budget
        options.error_budget_window = timedelta(seconds=error_budget_window_s)
        options.task_hang = timedelta(seconds=task_hang_s)
        options.remote_wait = timedelta(seconds=remote_wait_s)
        self._state = _native.WorkerState(options)

    @property
    def native(self) -> _native.WorkerState:
        """The native state (for the endpoint, which shares it)."""
        return self._state

    @property
    def healthy(self) -> bool:
        """False once a fatal failure was recorded (a busy or hung loop is not one)."""
        return self._state.healthy()

    def snapshot(self) -> HealthSnapshot:
        return self._state.snapshot()

    def answer(self, path: str = "/health", *, expose_errors: bool = False) -> tuple[int, bytes]:
        """(status, JSON body) exactly as the native endpoint answers ``path`` now."""
        answer = _native.health_answer(path, self._state.snapshot(), expose_errors)
        return answer.status, answer.body.encode("utf-8")

    def body(self, path: str = "/health", *, expose_errors: bool = False) -> dict[str, Any]:
        """The answer's JSON body as a dict."""
        body: dict[str, Any] = json.loads(self.answer(path, expose_errors=expose_errors)[1])
        return body

    # -- failures ----------------------------------------------------------------
    def record(
        self,
        failure: BaseException,
        *,
        rules: Rules | None = None,
        remote_engine: bool = False,
        unix_time: float | None = None,
    ) -> Recorded:
        """Classifies ``failure`` (its whole chain) and records the outcome."""
        verdict = classify(failure, rules=rules, remote_engine=remote_engine)
        if not (verdict.fatal or verdict.ambiguous):  # the common case: nothing to keep
            self._state.record_task_local(verdict.remote_engine)
            return Recorded(verdict, False, False, verdict.rule, verdict.category)
        record = _native.FatalRecord(
            describe_exception(failure),
            verdict.rule,
            verdict.category,
            time.time() if unix_time is None else unix_time,
            exception_type_name(failure),
        )
        if verdict.fatal:
            first = self._state.record_fatal(record)
            return Recorded(verdict, True, first, verdict.rule, verdict.category)
        if self._state.record_ambiguous(record):  # ambiguous: counts against the budget
            budget = self._state.snapshot().first_fatal
            assert budget is not None
            return Recorded(verdict, True, True, budget.rule, budget.category)
        return Recorded(verdict, False, False, verdict.rule, verdict.category)

    def record_fatal(
        self,
        error: str,
        *,
        rule: str,
        category: str,
        exception_type: str = "",
        unix_time: float | None = None,
    ) -> bool:
        """Records a fatal failure decided elsewhere (a liveness check...); True if first."""
        when = time.time() if unix_time is None else unix_time
        record = _native.FatalRecord(valid_utf8(error), rule, category, when, exception_type)
        return self._state.record_fatal(record)

    def record_task_local(self) -> None:
        self._state.record_task_local()

    def record_storage_full(self) -> None:
        """A submission refused because its storage is full (the worker stays healthy)."""
        self._state.record_storage_full()

    # -- progress and figures (cheap: called from the event loop) -----------------
    def loop_tick(self) -> None:
        """The event loop is alive (called every 100 ms by a callback it runs)."""
        self._state.loop_tick()

    def engine_call_started(self) -> None:
        self._state.engine_call_started()

    def engine_call_finished(self) -> None:
        self._state.engine_call_finished()

    def progress(self) -> None:
        """One engine request answered, or a task finished."""
        self._state.progress()

    def task_started(self, task_id: str) -> None:
        self._state.task_started(task_id)

    def task_progress(self, task_id: str) -> None:
        """Progress made for this task (an engine call or request of its own ended)."""
        self._state.task_progress(task_id)

    @contextlib.contextmanager
    def remote_wait(self, task_id: str, server: str = "") -> Iterator[None]:
        """The task waits on a remote engine (``server``: host:port) inside the block.

        Never hung meanwhile; its own bounds apply (:meth:`take_expired_remote_waits`).
        """
        self._state.remote_wait_started(task_id, server)
        try:
            yield
        finally:
            self._state.remote_wait_finished(task_id)

    def remote_asked(self, task_id: str, server: str = "") -> None:
        """A request went to the task's remote server: its silence counts from now."""
        self._state.remote_asked(task_id, server)

    def remote_heard(self, task_id: str, server: str = "") -> None:
        """Bytes came from the task's remote server: its silence starts again."""
        self._state.remote_heard(task_id, server)

    def remote_wait_status(self, task_id: str) -> _native.RemoteWaitStatus | None:
        """The task's remote wait now (``reason`` set once past a bound), or None."""
        return self._state.remote_wait_status(task_id)

    def take_expired_remote_waits(self) -> list[_native.RemoteWaitStatus]:
        """Remote waits past a bound, each once (counted task-local, remote engine)."""
        return list(self._state.take_expired_remote_waits())

    def task_finished(self, task_id: str) -> None:
        self._state.task_finished(task_id)

    def take_hung_tasks(self) -> list[str]:
        """Tasks hung now, each once; all hung makes the worker fatal (tasks_hung)."""
        return list(self._state.take_hung_tasks())

    def set_tasks(
        self, queued: int, processing: int, completed: int, failed: int, manager_error: str = ""
    ) -> None:
        self._state.set_tasks(
            _native.TaskCounts(queued, processing, completed, failed), valid_utf8(manager_error)
        )

    def set_service(
        self,
        *,
        version: str,
        protocol_version: int,
        max_concurrent_requests: int,
        processing_window_size: int,
        task_retention_seconds: int,
        task_cleanup_interval_seconds: int,
    ) -> None:
        self._state.set_service(
            _native.ServiceInfo(
                version,
                protocol_version,
                max_concurrent_requests,
                processing_window_size,
                task_retention_seconds,
                task_cleanup_interval_seconds,
            )
        )

    def reset(self) -> None:
        """Back to starting with zero counters."""
        self._state.reset()

    def wait_until_unhealthy(self, timeout: float) -> bool:
        """Blocks (without the GIL) until unhealthy or ``timeout`` seconds pass."""
        return self._state.wait_until_unhealthy(max(0.0, float(timeout)))

    def __repr__(self) -> str:
        snap = self.snapshot()
        if snap.healthy:
            return (
                f"WorkerHealth({enum_name(snap.phase)}, loop_lag_s={snap.loop_lag_s}, "
                f"task_local_failures={snap.task_local_count})"
            )
        first = snap.first_fatal
        assert first is not None
        return (
            f"WorkerHealth(unhealthy since {first.since}, rule={first.rule!r}, "
            f"category={first.category!r}, fatal_failures={snap.fatal_count})"
        )


class HealthEndpoint:
    """The native ``/health``, ``/livez`` and ``/readyz`` of a worker, on a port of its own.

    Served by a libmicrohttpd thread from the native state alone (never the
    GIL or the event loop); bounded connections, idle timeout, small request
    budget. Loopback by default.
    """

    __slots__ = ("_server",)

    def __init__(self, server: _native.HealthServer) -> None:
        self._server = server

    @classmethod
    def start(
        cls,
        health: WorkerHealth,
        *,
        port: int = 0,
        bind: str = "127.0.0.1",
        expose_errors: bool = False,
    ) -> HealthEndpoint:
        """Binds ``bind:port`` (0: ephemeral) and serves; raises :class:`HealthEndpointError`."""
        options = _native.HealthServerOptions()
        options.bind_address = bind
        options.port = port
        options.expose_errors = expose_errors
        server, error = _native.HealthServer.start(health.native, options)
        if server is None:
            raise HealthEndpointError(error)
        return cls(server)

    @property
    def port(self) -> int:
        return int(self._server.port)

    @property
    def bind_address(self) -> str:
        return str(self._server.bind_address)

    @property
    def url(self) -> str:
        host = self.bind_address
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}"

    def stop(self) -> None:
        self._server.stop()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"HealthEndpoint({self.url})"
