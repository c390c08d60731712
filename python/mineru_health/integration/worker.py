"""Hooks for MinerU's ``mineru-api`` worker (mineru/cli/fast_api.py, MinerU 3.4).

The shipped patch adds three lines to fast_api.py::

    import mineru_health.integration.worker as mineru_health_worker
    mineru_health_worker.install(app)                     # after app = create_app()
    mineru_health_worker.on_task_failed(self, task, exc)  # in _process_task's except block

What they give the worker:

* A task failure is classified (:mod:`mineru_health.classifier`). A fatal one
  (the inference engine died) is recorded natively, sets the task manager's
  ``last_worker_error``, fails every other pending or running task at once with
  an error naming the engine death, and wakes every waiter. A task-local one
  fails only its task.
* ``GET /health`` answers 503 with ``{"status": "unhealthy", "version", "error",
  "rule", "category", "since", "engine_dead": true}`` once the engine is dead,
  whether a task found out or a liveness check did (engine died while idle).
  Otherwise MinerU's own handler answers, unchanged.
* While the engine is dead, ``POST /tasks`` and ``POST /file_parse`` get 503
  with ``Retry-After`` before anything is read, saved or queued.
* ``MINERU_HEALTH_EXIT_ON_FATAL=1``: after a fatal failure the worker keeps
  answering 503 for ``MINERU_HEALTH_EXIT_GRACE_S`` seconds (default 5), then
  exits with status 75 (EX_TEMPFAIL) so a supervisor restarts it.
* ``MINERU_HEALTH_FAULT_PLAN=<path>``: fault injection for tests and demos
  (:mod:`mineru_health.testing.faults`).

Nothing here may break MinerU: every hook catches and logs its own errors,
except :func:`install`, which refuses a bad configuration at start-up.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import multiprocessing
import os
import sys
import threading
from collections.abc import Awaitable, Callable, MutableMapping
from datetime import UTC, datetime
from typing import Any

from .. import liveness, metrics
from ..classifier import Verdict, default_rules
from ..errors import ConfigError
from ..worker import HealthSnapshot, WorkerHealth, describe_exception, worker_health

__all__ = [
    "EXIT_CODE",
    "EXIT_GRACE_ENV",
    "EXIT_ON_FATAL_ENV",
    "RETRY_AFTER_ENV",
    "HealthGate",
    "fail_outstanding_tasks",
    "install",
    "on_engine_dead",
    "on_task_failed",
    "unhealthy_body",
]

EXIT_ON_FATAL_ENV = "MINERU_HEALTH_EXIT_ON_FATAL"
EXIT_GRACE_ENV = "MINERU_HEALTH_EXIT_GRACE_S"
RETRY_AFTER_ENV = "MINERU_HEALTH_RETRY_AFTER_S"
#: EX_TEMPFAIL from sysexits.h: a temporary failure, worth a restart.
EXIT_CODE = 75
DEFAULT_EXIT_GRACE_S = 5.0
DEFAULT_RETRY_AFTER_S = 30
#: How often the background monitor runs the liveness checks and reads the fault plan.
LIVENESS_INTERVAL_S = 1.0
FAULT_POLL_INTERVAL_S = 0.1

GATED_POSTS = frozenset({"/tasks", "/file_parse"})
_PENDING = "pending"
_PROCESSING = "processing"
_FAILED = "failed"

ASGIApp = Callable[
    [MutableMapping[str, Any], Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]],
    Awaitable[None],
]


def _log(level: str, message: str) -> None:
    try:
        from loguru import logger

        logger.opt(depth=1).log(level, "mineru-health: {}", message)
    except Exception:  # noqa: BLE001 - loguru missing or misconfigured: stderr still works
        print(f"mineru-health {level}: {message}", file=sys.stderr, flush=True)


def _env_float(name: str, default: float, *, minimum: float = 0.0) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a number", variable=name) from None
    if value < minimum:
        raise ConfigError(f"{name}={raw!r} must be at least {minimum:g}", variable=name)
    return value


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def _utc_now_iso() -> str:
    return datetime.now(UTC).isoformat()


def _mineru_version() -> str:
    module = sys.modules.get("mineru.version")
    version = getattr(module, "__version__", None)
    return version if isinstance(version, str) else "unknown"


class _Runtime:
    """What :func:`install` set up for this process."""

    def __init__(self) -> None:
        self.apps: list[Any] = []
        self.health: WorkerHealth = worker_health()
        self.retry_after_s = DEFAULT_RETRY_AFTER_S
        self.exit_on_fatal = False
        self.exit_grace_s = DEFAULT_EXIT_GRACE_S
        self.faults: Any = None  # testing.faults.FaultInjector when a plan is set
        self.monitor: asyncio.Task[None] | None = None
        self.exit_watcher: threading.Thread | None = None
        self.installed = False


_runtime = _Runtime()


def _task_managers() -> list[Any]:
    managers = []
    for app in _runtime.apps:
        manager = getattr(getattr(app, "state", None), "task_manager", None)
        if manager is not None:
            managers.append(manager)
    return managers


# --- failing outstanding tasks -------------------------------------------------------------


def fail_outstanding_tasks(manager: Any, reason: str, *, keep: Any = None) -> int:
    """Fails every pending or running task of ``manager`` except ``keep``; returns how many.

    Their processors are cancelled (including those still waiting for MinerU's
    concurrency semaphore), queued ids are drained, and every waiter is woken
    so that no ``/file_parse`` request keeps waiting for a dead engine.
    Must run on the event loop thread.
    """
    module = sys.modules.get(type(manager).__module__)
    pending = getattr(module, "TASK_PENDING", _PENDING)
    processing = getattr(module, "TASK_PROCESSING", _PROCESSING)
    failed_status = getattr(module, "TASK_FAILED", _FAILED)
    now = _utc_now_iso()

    failed = 0
    tasks = getattr(manager, "tasks", {})
    for task in list(tasks.values()):
        if task is keep or getattr(task, "status", None) not in (pending, processing):
            continue
        task.status = failed_status
        task.error = reason
        task.completed_at = now
        failed += 1

    try:
        current = asyncio.current_task()
    except RuntimeError:
        current = None
    for processor in list(getattr(manager, "active_tasks", ())):
        if processor is not current and not processor.done():
            processor.cancel()

    queue = getattr(manager, "queue", None)
    if queue is not None:
        while True:
            try:
                queue.get_nowait()
            except asyncio.QueueEmpty:
                break
            queue.task_done()

    wake = getattr(manager, "_wake_waiters", None)
    if callable(wake):
        wake()
    return failed


def on_engine_dead(manager: Any, error: str, *, keep: Any = None) -> None:
    """Marks the task manager unhealthy and fails all outstanding tasks (loop thread)."""
    if manager is None:
        return
    manager.last_worker_error = f"inference engine died: {error}"
    count = fail_outstanding_tasks(
        manager,
        f"Task failed because the inference engine of this worker died ({error}); "
        "resubmit it to a healthy worker",
        keep=keep,
    )
    _log("ERROR", f"inference engine is dead ({error}); failed {count} other task(s)")


def on_task_failed(manager: Any, task: Any, exc: BaseException) -> Verdict | None:
    """Hook for the except block of ``AsyncTaskManager._process_task``. Never raises."""
    try:
        health = _runtime.health
        already_dead = not health.healthy
        verdict = health.record(
            exc, remote_engine=str(getattr(task, "backend", "")).endswith("http-client"))
        if verdict.fatal:
            metrics.record_worker_fatal(verdict.rule, verdict.category)
        else:
            metrics.record_worker_task_local()
        if not verdict.fatal:
            _log(
                "INFO",
                f"task {getattr(task, 'task_id', '?')} failed task-locally "
                f"({verdict.rule or 'no rule matched'})",
            )
            return verdict
        error = describe_exception(exc)
        if task is not None:
            task.error = error
        if not already_dead:
            _log(
                "ERROR",
                f"fatal failure in task {getattr(task, 'task_id', '?')}: rule {verdict.rule} "
                f"({verdict.category}) matched {verdict.excerpt!r}",
            )
        on_engine_dead(manager, error, keep=task)
        return verdict
    except Exception as error:  # noqa: BLE001 - MinerU must keep its own failure handling
        _log("ERROR", f"on_task_failed hook failed: {describe_exception(error)}")
        return None


# --- health gate ---------------------------------------------------------------------------


def unhealthy_body(snapshot: HealthSnapshot) -> dict[str, Any]:
    """The /health 503 body for a dead engine."""
    first = snapshot.first_fatal
    return {
        "status": "unhealthy",
        "version": _mineru_version(),
        "error": first.error if first else "inference engine died",
        "rule": first.rule if first else "",
        "category": first.category if first else "",
        "since": first.since if first else _utc_now_iso(),
        "engine_dead": True,
    }


def _check_liveness() -> None:
    """Runs the liveness checks; a dead engine is recorded as fatal (loop thread)."""
    health = _runtime.health
    if not health.healthy:
        return
    try:
        dead = liveness.dead_results()
    except Exception as error:  # noqa: BLE001 - a broken check must not break /health
        _log("WARNING", f"liveness checks failed: {describe_exception(error)}")
        return
    if not dead or not health.healthy:
        return
    first = dead[0]
    reason = f"engine died while idle: {first.detail or first.name}"
    health.record_fatal(reason, rule=f"liveness:{first.name}", category="engine_dead")
    metrics.record_worker_fatal(f"liveness:{first.name}", "engine_dead")
    _log("ERROR", f"liveness check {first.name!r} failed: {first.detail}")
    for manager in _task_managers():
        on_engine_dead(manager, reason)


async def _send_json(
    send: Callable[[Any], Awaitable[None]],
    status: int,
    body: dict[str, Any],
    headers: list[tuple[bytes, bytes]] | None = None,
) -> None:
    payload = json.dumps(body).encode("utf-8")
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(payload)).encode("ascii")),
                *(headers or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": payload})


class HealthGate:
    """ASGI middleware: /health reports a dead engine; new work is refused while it is dead."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(
        self,
        scope: MutableMapping[str, Any],
        receive: Callable[[], Awaitable[Any]],
        send: Callable[[Any], Awaitable[None]],
    ) -> None:
        kind = scope.get("type")
        if kind == "lifespan":
            await self.app(scope, _watch_lifespan(receive), send)
            return
        if kind == "http":
            path = str(scope.get("path", "")).rstrip("/") or "/"
            method = scope.get("method", "")
            gated = (method == "GET" and path == "/health") or (
                method == "POST" and path in GATED_POSTS
            )
            if gated:
                _check_liveness()
                snapshot = _runtime.health.snapshot()
                if not snapshot.healthy:
                    body = unhealthy_body(snapshot)
                    if path == "/health":
                        await _send_json(send, 503, body)
                    else:
                        body["message"] = (
                            "The inference engine of this worker died; the request was not "
                            "accepted. Retry on a healthy worker."
                        )
                        retry = str(_runtime.retry_after_s).encode("ascii")
                        await _send_json(send, 503, body, [(b"retry-after", retry)])
                    return
        await self.app(scope, receive, send)


def _watch_lifespan(receive: Callable[[], Awaitable[Any]]) -> Callable[[], Awaitable[Any]]:
    async def wrapped() -> Any:
        message = await receive()
        kind = message.get("type") if isinstance(message, dict) else None
        if kind == "lifespan.startup":
            _start_monitor()
        elif kind == "lifespan.shutdown":
            _stop_monitor()
        return message

    return wrapped


# --- background monitor ----------------------------------------------------------------------


async def _monitor() -> None:
    """Runs the liveness checks every second and polls the fault plan, on the event loop."""
    loop = asyncio.get_running_loop()
    next_liveness = loop.time()
    while True:
        try:
            if _runtime.faults is not None:
                _runtime.faults.poll()
            if loop.time() >= next_liveness:
                next_liveness = loop.time() + LIVENESS_INTERVAL_S
                _check_liveness()
        except Exception as error:  # noqa: BLE001 - the monitor must survive one bad step
            _log("WARNING", f"monitor step failed: {describe_exception(error)}")
        await asyncio.sleep(
            FAULT_POLL_INTERVAL_S if _runtime.faults is not None else LIVENESS_INTERVAL_S
        )


def _start_monitor() -> None:
    if _runtime.monitor is None or _runtime.monitor.done():
        _runtime.monitor = asyncio.get_running_loop().create_task(
            _monitor(), name="mineru-health-monitor"
        )


def _stop_monitor() -> None:
    if _runtime.monitor is not None:
        _runtime.monitor.cancel()
        _runtime.monitor = None


# --- exit on fatal -------------------------------------------------------------------------


def _exit_after_fatal(health: WorkerHealth, grace_s: float) -> None:
    while not health.wait_until_unhealthy(60.0):
        pass
    snapshot = health.snapshot()
    first = snapshot.first_fatal
    _log(
        "ERROR",
        f"exiting with status {EXIT_CODE} in {grace_s:g}s because the inference engine died "
        f"({first.error if first else 'unknown'}); {EXIT_ON_FATAL_ENV} is set",
    )
    # A plain sleep: this daemon thread does nothing else, and the event loop
    # keeps answering 503 meanwhile.
    threading.Event().wait(grace_s)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed stream must not prevent the exit
            stream.flush()
    os._exit(EXIT_CODE)


# --- install -------------------------------------------------------------------------------


def install(app: Any) -> None:
    """Installs the health gate on MinerU's FastAPI ``app``. Called once, at import.

    Raises :class:`~mineru_health.errors.ConfigError` (so the worker refuses to
    start) on a bad rules file or a bad ``MINERU_HEALTH_*`` value.
    """
    if multiprocessing.current_process().name != "MainProcess":
        # A spawned helper process re-imports fast_api.py; it serves no requests.
        return
    if any(known is app for known in _runtime.apps):
        return
    rules = default_rules()  # a bad MINERU_HEALTH_RULES file stops the start-up here
    _runtime.retry_after_s = int(
        _env_float(RETRY_AFTER_ENV, DEFAULT_RETRY_AFTER_S, minimum=1.0)
    )
    _runtime.exit_on_fatal = _env_flag(EXIT_ON_FATAL_ENV)
    _runtime.exit_grace_s = _env_float(EXIT_GRACE_ENV, DEFAULT_EXIT_GRACE_S)
    _runtime.apps.append(app)
    app.add_middleware(HealthGate)
    metrics.mount_metrics(app, role="worker")
    metrics.bind_worker_healthy(lambda: _runtime.health.healthy)

    from ..testing.faults import FaultInjector

    injector = FaultInjector.from_env() if _runtime.faults is None else None
    if injector is not None:
        injector.install()
        _runtime.faults = injector
        _log("WARNING", f"fault injection enabled, plan file {injector.plan_path}")

    if _runtime.exit_on_fatal and _runtime.exit_watcher is None:
        _runtime.exit_watcher = threading.Thread(
            target=_exit_after_fatal,
            args=(_runtime.health, _runtime.exit_grace_s),
            name="mineru-health-exit-on-fatal",
            daemon=True,
        )
        _runtime.exit_watcher.start()
    _runtime.installed = True
    _log("INFO", f"worker health hooks installed ({rules!r})")
