"""Hooks for MinerU's ``mineru-api`` worker (mineru/cli/fast_api.py, MinerU 3.4).

The shipped patch adds three lines to fast_api.py::

    import mineru_health.integration.worker as mineru_health_worker
    mineru_health_worker.install(app)                            # after app = create_app()
    await mineru_health_worker.on_task_failed(self, task, exc)   # first in _process_task's except

What they give the worker:

* **A native health endpoint** (``MINERU_HEALTH_PORT``): ``/health``, ``/livez`` and
  ``/readyz`` served by a native thread from the native state, so a worker
  whose event loop MinerU keeps busy answers at once (see
  :class:`~mineru_health.worker.HealthEndpoint`).
* **Loop lag**: a callback on the event loop ticks every 100 ms; a loop blocked
  past ``MINERU_HEALTH_LOOP_HANG_S`` is hung (native ``/health`` 503,
  ``"loop_hung": true``), shorter blocks are busy.
* **Engine stall watchdog**: engine calls and requests are tracked
  (:mod:`.engine_calls`); work in progress with no progress for
  ``MINERU_HEALTH_STALL_S`` makes the worker fatal (category ``engine_stalled``).
* **Classification off the loop**: a task failure is classified on a small
  thread pool (the native matcher releases the GIL). A fatal one is recorded
  natively, sets MinerU's ``last_worker_error``, fails every other pending or
  running task at once as *collateral* with a generic error, and wakes every
  waiter. An ambiguous device error counts against the error budget.
  The task's status payload carries the verdict (``verdict``, ``engine_dead``).
* **The main port**: ``GET /health`` answers 503 with the native body once the
  engine is dead, and advertises the native port when it is reachable;
  ``POST /tasks`` and ``POST /file_parse`` get 503 with ``Retry-After``.
* ``MINERU_HEALTH_EXIT_ON_FATAL=1``: after a fatal failure, exit with status 75
  (EX_TEMPFAIL) after ``MINERU_HEALTH_EXIT_GRACE_S`` seconds.
* ``MINERU_HEALTH_FAULT_PLAN=<path>``: fault injection for tests and demos.

Nothing here may break MinerU: every hook catches and logs its own errors,
except :func:`install`, which refuses a bad configuration at start-up.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import json
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Awaitable, Callable, MutableMapping
from datetime import UTC, datetime
from typing import Any

from .. import _native, liveness, metrics
from ..classifier import default_rules
from ..errors import ConfigError, HealthEndpointError
from ..safe_text import printable
from ..settings import WorkerSettings
from ..worker import (
    REFUSAL_ERROR_PREFIX,
    FatalInfo,
    HealthEndpoint,
    Recorded,
    WorkerHealth,
    configure_worker_health,
    describe_exception,
    worker_health,
)
from . import engine_calls, task_store

__all__ = [
    "EXIT_CODE",
    "HealthGate",
    "fail_outstanding_tasks",
    "install",
    "on_engine_dead",
    "on_task_failed",
]

#: EX_TEMPFAIL from sysexits.h: a temporary failure, worth a restart.
EXIT_CODE = 75
#: How often the event loop ticks; the watcher also pushes task figures every
#: 5 ticks and acts on a newly unhealthy state every 10.
TICK_S = 0.1
LIVENESS_INTERVAL_S = 1.0

GATED_POSTS = frozenset({"/tasks", "/file_parse"})
_PENDING = "pending"
_PROCESSING = "processing"
_FAILED = "failed"
#: Attribute set on MinerU's task objects: the verdict its status payload carries.
_VERDICT_ATTR = "_mineru_health_verdict"

ASGIApp = Callable[
    [MutableMapping[str, Any], Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]],
    Awaitable[None],
]


def _log(level: str, message: str) -> None:
    # Messages quote exceptions and task texts: escaped for the plain-text log.
    message = printable(message)
    try:
        from loguru import logger

        logger.opt(depth=1).log(level, "mineru-health: {}", message)
    except Exception:  # noqa: BLE001 - loguru missing or misconfigured: stderr still works
        print(f"mineru-health {level}: {message}", file=sys.stderr, flush=True)


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
        self.settings = WorkerSettings()
        self.endpoint: HealthEndpoint | None = None
        self.advertised_port: int | None = None
        self.faults: Any = None  # testing.faults.FaultInjector when a plan is set
        self.watcher: asyncio.Task[None] | None = None
        self.exit_watcher: threading.Thread | None = None
        self.liveness_thread: threading.Thread | None = None
        self.classify_pool: concurrent.futures.ThreadPoolExecutor | None = None
        # True once outstanding tasks were failed for the current fatal record.
        self.acted_on_fatal = False
        self.installed = False


_runtime = _Runtime()


def _health() -> WorkerHealth:
    return worker_health()


def _task_managers() -> list[Any]:
    managers = []
    for app in _runtime.apps:
        manager = getattr(getattr(app, "state", None), "task_manager", None)
        if manager is not None:
            managers.append(manager)
    return managers


# --- verdicts on MinerU's tasks ------------------------------------------------------------


def _set_verdict(task: Any, *, fatal: bool, engine_dead: bool, role: str | None, rule: str,
                 category: str, ambiguous: bool = False, remote_engine: bool = False) -> None:
    with contextlib.suppress(Exception):  # a task object that refuses attributes keeps working
        setattr(task, _VERDICT_ATTR, {
            "fatal": fatal,
            "engine_dead": engine_dead,
            "role": role,
            "rule": rule,
            "category": category,
            "ambiguous": ambiguous,
            "remote_engine": remote_engine,
        })


def _wrap_status_payload(task_class: type) -> None:
    """Adds the verdict to ``AsyncParseTask.to_status_payload`` (once)."""
    current = task_class.__dict__.get("to_status_payload")
    if current is None or getattr(current, "__mineru_health__", False):
        return

    @functools.wraps(current)
    def to_status_payload(task: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        payload: dict[str, Any] = current(task, *args, **kwargs)
        verdict = getattr(task, _VERDICT_ATTR, None)
        if isinstance(verdict, dict):
            payload["engine_dead"] = bool(verdict["engine_dead"])
            payload["verdict"] = dict(verdict)
        return payload

    to_status_payload.__mineru_health__ = True  # type: ignore[attr-defined]
    task_class.to_status_payload = to_status_payload  # type: ignore[attr-defined]


# --- failing outstanding tasks -------------------------------------------------------------


def _collateral_error(fatal: FatalInfo | None) -> str:
    """The error other users' tasks get: names the engine death, never another task's text."""
    if fatal is None:
        return "Task failed because the inference engine of this worker became unusable; " \
               "resubmit it to a healthy worker"
    return (
        f"Task failed because the inference engine of this worker became unusable "
        f"({fatal.category}, rule {fatal.rule}) while it was queued or running; "
        "resubmit it to a healthy worker"
    )


def fail_outstanding_tasks(manager: Any, fatal: FatalInfo | None, *, keep: Any = None) -> int:
    """Fails every pending or running task of ``manager`` except ``keep``; returns how many.

    They are *collateral*: their status says ``engine_dead`` with the rule and
    category, and a generic error. Their processors are cancelled (including
    those still waiting for MinerU's concurrency semaphore), queued ids are
    drained, and every waiter is woken so that no ``/file_parse`` request keeps
    waiting for a dead engine. Must run on the event loop thread.
    """
    module = sys.modules.get(type(manager).__module__)
    pending = getattr(module, "TASK_PENDING", _PENDING)
    processing = getattr(module, "TASK_PROCESSING", _PROCESSING)
    failed_status = getattr(module, "TASK_FAILED", _FAILED)
    now = _utc_now_iso()
    reason = _collateral_error(fatal)
    rule = fatal.rule if fatal else ""
    category = fatal.category if fatal else ""

    failed = 0
    for task in list(getattr(manager, "tasks", {}).values()):
        if task is keep or getattr(task, "status", None) not in (pending, processing):
            continue
        task.status = failed_status
        task.error = reason
        task.completed_at = now
        _set_verdict(task, fatal=False, engine_dead=True, role="collateral", rule=rule,
                     category=category)
        task_store.record(manager, task)  # task store: MinerU does not signal these
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


def on_engine_dead(manager: Any, fatal: FatalInfo | None, *, keep: Any = None) -> None:
    """Marks the task manager unhealthy and fails all outstanding tasks (loop thread)."""
    if manager is None:
        return
    what = f"{fatal.category}, rule {fatal.rule}" if fatal else "unknown cause"
    manager.last_worker_error = f"inference engine unusable ({what})"
    count = fail_outstanding_tasks(manager, fatal, keep=keep)
    _log("ERROR", f"inference engine unusable ({what}); failed {count} other task(s)")


def _act_on_fatal(*, keep_manager: Any = None, keep: Any = None) -> None:
    """Once per fatal record: fail every manager's outstanding tasks (loop thread)."""
    health = _health()
    if health.healthy or _runtime.acted_on_fatal:
        return
    _runtime.acted_on_fatal = True
    first = health.snapshot().first_fatal
    managers = _task_managers()
    if keep_manager is not None and not any(m is keep_manager for m in managers):
        managers.append(keep_manager)
    for manager in managers:
        on_engine_dead(manager, first, keep=keep if manager is keep_manager else None)


def _classify_pool() -> concurrent.futures.ThreadPoolExecutor:
    # Our own two threads: MinerU's parse work fills asyncio's default pool for
    # minutes at a time, and a verdict must not wait behind it.
    if _runtime.classify_pool is None:
        _runtime.classify_pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=2, thread_name_prefix="mineru-health-classify"
        )
    return _runtime.classify_pool


async def on_task_failed(manager: Any, task: Any, exc: BaseException) -> Recorded | None:
    """Hook at the top of ``AsyncTaskManager._process_task``'s except block. Never raises.

    Classifies ``exc`` off the event loop, attaches the verdict to ``task``,
    and on a fatal outcome fails every other outstanding task. MinerU then
    marks ``task`` failed as usual.
    """
    health = _health()
    try:
        remote_engine = str(getattr(task, "backend", "") or "").endswith("http-client")
        record = functools.partial(health.record, exc, remote_engine=remote_engine)
        outcome = await asyncio.get_running_loop().run_in_executor(_classify_pool(), record)
    except asyncio.CancelledError:
        raise
    except Exception as error:  # noqa: BLE001 - MinerU must keep its own failure handling
        _log("ERROR", f"on_task_failed hook failed: {describe_exception(error)}")
        return None
    try:
        verdict = outcome.verdict
        task_id = getattr(task, "task_id", "?")
        if outcome.fatal:
            metrics.record_worker_fatal(outcome.rule, outcome.category)
        else:
            metrics.record_worker_task_local(remote_engine=verdict.remote_engine)
        _set_verdict(
            task, fatal=outcome.fatal, engine_dead=outcome.fatal,
            role=("trigger" if outcome.first else "collateral") if outcome.fatal else None,
            rule=outcome.rule, category=outcome.category, ambiguous=verdict.ambiguous,
            remote_engine=verdict.remote_engine,
        )
        if not outcome.fatal:
            _log("INFO", f"task {task_id} failed task-locally "
                         f"({verdict.rule or 'no rule matched'}, {verdict.category or '-'})")
            return outcome
        if outcome.first:
            _log("ERROR", f"fatal failure in task {task_id}: rule {outcome.rule} "
                          f"({outcome.category}) matched {verdict.excerpt!r}")
        _act_on_fatal(keep_manager=manager, keep=task)
        return outcome
    except Exception as error:  # noqa: BLE001
        _log("ERROR", f"on_task_failed hook failed: {describe_exception(error)}")
        return outcome


# --- the main port's gate --------------------------------------------------------------------


async def _send_json(
    send: Callable[[Any], Awaitable[None]],
    status: int,
    payload: bytes,
    headers: list[tuple[bytes, bytes]] | None = None,
) -> None:
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


def _advertising_send(send: Callable[[Any], Awaitable[None]],
                      port: int) -> Callable[[Any], Awaitable[None]]:
    """Adds ``native_health_port`` to MinerU's small JSON /health body."""
    held: list[Any] = []

    async def wrapped(message: Any) -> None:
        kind = message.get("type")
        if kind == "http.response.start":
            held.append(message)
            return
        if kind == "http.response.body" and held and not message.get("more_body", False):
            start = held.pop()
            body = message.get("body", b"")
            headers = list(start.get("headers", []))
            encoded = any(k.lower() == b"content-encoding" for k, _ in headers)
            with contextlib.suppress(ValueError, TypeError):
                if not encoded:
                    data = json.loads(body)
                    if isinstance(data, dict):
                        data["native_health_port"] = port
                        body = json.dumps(data).encode("utf-8")
                        headers = [(k, v) for k, v in headers if k.lower() != b"content-length"]
                        headers.append((b"content-length", str(len(body)).encode("ascii")))
            await send({**start, "headers": headers})
            await send({**message, "body": body})
            return
        while held:
            await send(held.pop())
        await send(message)

    return wrapped


class HealthGate:
    """ASGI middleware on the main port: a dead engine answers 503 and refuses new work."""

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
            await self.app(scope, receive, _watch_lifespan(send))
            return
        if kind != "http":
            await self.app(scope, receive, send)
            return
        path = str(scope.get("path", "")).rstrip("/") or "/"
        method = scope.get("method", "")
        is_health = method in ("GET", "HEAD") and path == "/health"
        gated = is_health or (method == "POST" and path in GATED_POSTS)
        health = _health()
        if gated and not health.healthy:
            status, body = health.answer("/health", expose_errors=_runtime.settings.expose_errors)
            if is_health:
                await _send_json(send, status, body)
            else:
                data = json.loads(body)
                first = health.snapshot().first_fatal
                what = f"{first.category}, rule {first.rule}" if first else "unknown cause"
                data["error"] = f"{REFUSAL_ERROR_PREFIX} {what}"
                data["message"] = (
                    "The inference engine of this worker is unusable; the request was not "
                    "accepted. Retry on a healthy worker."
                )
                retry = str(_runtime.settings.retry_after_s).encode("ascii")
                await _send_json(send, 503, json.dumps(data).encode("utf-8"),
                                 [(b"retry-after", retry)])
            return
        if is_health and _runtime.advertised_port is not None:
            send = _advertising_send(send, _runtime.advertised_port)
        await self.app(scope, receive, send)


def _watch_lifespan(send: Callable[[Any], Awaitable[None]]) -> Callable[[Any], Awaitable[None]]:
    async def wrapped(message: Any) -> None:
        kind = message.get("type") if isinstance(message, dict) else None
        if kind == "lifespan.startup.complete":
            # MinerU's start-up (model preload included) is over: from here on a
            # blocked loop is a hung loop.
            _on_started()
        elif kind in ("lifespan.shutdown.complete", "lifespan.shutdown.failed"):
            _stop_watcher()
        await send(message)

    return wrapped


# --- the event-loop watcher --------------------------------------------------------------------


def _int_or(value: Any, default: int) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _report_service(manager: Any) -> None:
    """The static part of MinerU's /health body, as its own handler computes it."""
    module = sys.modules.get(type(manager).__module__)
    try:
        max_requests = module.get_max_concurrent_requests()  # type: ignore[union-attr]
        window = module.get_processing_window_size(  # type: ignore[union-attr]
            default=module.DEFAULT_PROCESSING_WINDOW_SIZE  # type: ignore[union-attr]
        )
    except Exception:  # noqa: BLE001 - a renamed helper must not stop the worker
        max_requests, window = 1, 1
    _health().set_service(
        version=_mineru_version(),
        protocol_version=_int_or(getattr(module, "API_PROTOCOL_VERSION", 0), 0),
        max_concurrent_requests=_int_or(max_requests, 1),
        processing_window_size=max(1, _int_or(window, 1)),
        task_retention_seconds=_int_or(getattr(manager, "task_retention_seconds", 0), 0),
        task_cleanup_interval_seconds=_int_or(
            getattr(manager, "task_cleanup_interval_seconds", 0), 0),
    )


def _report_tasks() -> None:
    """MinerU's task figures and its own health verdict, as its /health computes them."""
    counts = [0, 0, 0, 0]
    errors = []
    for manager in _task_managers():
        module = sys.modules.get(type(manager).__module__)
        stats = manager.get_stats()
        for index, (name, default) in enumerate(
            (("TASK_PENDING", _PENDING), ("TASK_PROCESSING", _PROCESSING),
             ("TASK_COMPLETED", "completed"), ("TASK_FAILED", _FAILED))
        ):
            counts[index] += _int_or(stats.get(getattr(module, name, default), 0), 0)
        if not manager.is_healthy():
            errors.append(str(manager.last_worker_error or "task manager unhealthy"))
    queued, processing, completed, failed = counts
    _health().set_tasks(queued, processing, completed, failed, "; ".join(errors))


async def _watch_loop() -> None:
    """Ticks the loop natively every 100 ms; pushes figures; acts on a new fatal record."""
    health = _health()
    ticks = 0
    while True:
        try:
            health.loop_tick()
            if _runtime.faults is not None:
                _runtime.faults.poll()
            if ticks % 5 == 0:
                _report_tasks()
            if ticks % 10 == 0 and not health.snapshot().healthy:
                _act_on_fatal()
        except Exception as error:  # noqa: BLE001 - the watcher must survive one bad step
            if ticks % 100 == 0:
                _log("WARNING", f"watcher step failed: {describe_exception(error)}")
        ticks += 1
        await asyncio.sleep(TICK_S)


def _on_started() -> None:
    managers = _task_managers()
    for manager in managers:
        module = sys.modules.get(type(manager).__module__)
        task_class = getattr(module, "AsyncParseTask", None)
        if isinstance(task_class, type):
            _wrap_status_payload(task_class)
        task_store.attach(manager)  # task store: restore finished tasks, record new ones
        engine_calls.follow_tasks(manager)  # upload names in context (fault plan `poison`)
        _report_service(manager)
    if managers:
        _report_tasks()
    if _runtime.watcher is None or _runtime.watcher.done():
        _runtime.watcher = asyncio.get_running_loop().create_task(
            _watch_loop(), name="mineru-health-loop-watcher"
        )


def _stop_watcher() -> None:
    if _runtime.watcher is not None:
        _runtime.watcher.cancel()
        _runtime.watcher = None


# --- threads: liveness checks and exit on fatal ------------------------------------------------


def _check_liveness(health: WorkerHealth) -> bool:
    """Runs the liveness checks once; records a dead engine as fatal. True if it did."""
    try:
        dead = liveness.dead_results()
    except Exception as error:  # noqa: BLE001 - a broken check must not stop the thread
        _log("WARNING", f"liveness checks failed: {describe_exception(error)}")
        return False
    if not dead or not health.healthy:
        return False
    first = dead[0]
    rule = f"liveness:{first.name}"
    if not health.record_fatal(f"engine died while idle: {first.detail or first.name}",
                               rule=rule, category="engine_dead"):
        return False
    metrics.record_worker_fatal(rule, "engine_dead")
    _log("ERROR", f"liveness check {first.name!r} failed: {first.detail}")
    return True


def _liveness_loop(health: WorkerHealth) -> None:
    """Runs the liveness checks every second, off the event loop, until unhealthy."""
    while not health.wait_until_unhealthy(LIVENESS_INTERVAL_S):
        _check_liveness(health)


def _exit_after_fatal(health: WorkerHealth, grace_s: float) -> None:
    while not health.wait_until_unhealthy(60.0):
        pass
    first = health.snapshot().first_fatal
    what = f"{first.category}, rule {first.rule}" if first else "unknown cause"
    _log("ERROR", f"exiting with status {EXIT_CODE} in {grace_s:g}s because the inference "
                  f"engine is unusable ({what}); MINERU_HEALTH_EXIT_ON_FATAL is set")
    # A plain wait: this daemon thread does nothing else, and the event loop
    # and the native endpoint keep answering 503 meanwhile.
    threading.Event().wait(grace_s)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed stream must not prevent the exit
            stream.flush()
    os._exit(EXIT_CODE)


#: After the router died, how long uvicorn's own graceful shutdown (on the
#: parent-death SIGTERM) may take before the worker exits regardless.
PARENT_GONE_GRACE_S = 30.0


def _exit_with_parent(parent_pid: int) -> None:
    """Dies with the router that launched this worker, however the router dies.

    The kernel sends SIGTERM when the router exits (uvicorn then shuts MinerU
    down cleanly); a watcher thread exits regardless if that has not ended
    the process within ``PARENT_GONE_GRACE_S``.
    """
    watch = _native.exit_with_parent(signal.SIGTERM, parent_pid)
    if watch is _native.ParentWatch.PARENT_GONE:
        _log("ERROR", f"the router (pid {parent_pid}) that launched this worker is gone; exiting")
        os._exit(1)
    if watch is _native.ParentWatch.UNSUPPORTED:
        _log("WARNING", "cannot ask the kernel to end this worker with its router; "
                        "watching the parent process instead")

    def watch_parent() -> None:
        while os.getppid() == parent_pid:
            time.sleep(1.0)
        _log("ERROR", f"the router (pid {parent_pid}) is gone; exiting")
        threading.Event().wait(PARENT_GONE_GRACE_S)
        os._exit(1)

    _start_thread(watch_parent, name="mineru-health-parent-watch")


def _start_thread(target: Callable[..., None], *args: Any, name: str) -> threading.Thread:
    thread = threading.Thread(target=target, args=args, name=name, daemon=True)
    thread.start()
    return thread


# --- install -------------------------------------------------------------------------------


def _main_host(argv: list[str]) -> str:
    """The ``--host`` mineru-api was started with (its default otherwise)."""
    for index, arg in enumerate(argv):
        if arg == "--host" and index + 1 < len(argv):
            return argv[index + 1]
        if arg.startswith("--host="):
            return arg.split("=", 1)[1]
    return "127.0.0.1"


def _advertise(endpoint: HealthEndpoint) -> int | None:
    """The native port, when a client of the main port can reach it too."""
    bind = endpoint.bind_address
    if bind in ("0.0.0.0", "::") or bind == _main_host(sys.argv):
        return endpoint.port
    return None


def _start_endpoint(health: WorkerHealth, settings: WorkerSettings) -> None:
    if settings.port is None or _runtime.endpoint is not None:
        return
    try:
        endpoint = HealthEndpoint.start(health, port=settings.port, bind=settings.bind,
                                        expose_errors=settings.expose_errors)
    except HealthEndpointError as error:
        variable = WorkerSettings.variable_name("port")
        raise ConfigError(f"{variable}: {error}", variable=variable) from error
    _runtime.endpoint = endpoint
    _runtime.advertised_port = _advertise(endpoint)
    _log("INFO", f"native health endpoint on {endpoint.url} (/health, /livez, /readyz)")


def install(app: Any) -> None:
    """Installs the health hooks on MinerU's FastAPI ``app``. Called once, at import.

    Raises :class:`~mineru_health.errors.ConfigError` (so the worker refuses to
    start) on a bad rules file, a bad ``MINERU_HEALTH_*`` value or a native
    health port that cannot be served.
    """
    if multiprocessing.current_process().name != "MainProcess":
        # A spawned helper process re-imports fast_api.py; it serves no requests.
        return
    if any(known is app for known in _runtime.apps):
        return
    rules = default_rules()  # a bad MINERU_HEALTH_RULES file stops the start-up here
    settings = WorkerSettings.from_env()
    first_install = not _runtime.installed
    if first_install:
        _runtime.settings = settings
        health = configure_worker_health(WorkerHealth(
            loop_hang_s=settings.loop_hang_s, stall_s=settings.stall_s,
            error_budget=settings.error_budget,
            error_budget_window_s=settings.error_budget_window_s,
        ))
        _start_endpoint(health, settings)
        task_store.configure(settings)  # task store: a bad MINERU_HEALTH_STATE_DIR stops start-up
    health = _health()
    _runtime.apps.append(app)
    app.add_middleware(HealthGate)
    metrics.mount_metrics(app, role="worker")
    metrics.bind_worker_healthy(lambda: _health().healthy)
    metrics.bind_worker_snapshot(lambda: _health().snapshot())
    if not first_install:
        return

    from ..testing.faults import FaultInjector

    injector = FaultInjector.from_env()
    if injector is not None:
        _runtime.faults = injector
        _log("WARNING", f"fault injection enabled, plan file {injector.plan_path}")
    engine_calls.install(_health, lambda: _runtime.faults)

    if settings.parent_pid:
        _exit_with_parent(int(settings.parent_pid))
    _runtime.liveness_thread = _start_thread(_liveness_loop, health,
                                             name="mineru-health-liveness")
    if settings.exit_on_fatal:
        _runtime.exit_watcher = _start_thread(_exit_after_fatal, health, settings.exit_grace_s,
                                              name="mineru-health-exit-on-fatal")
    _runtime.installed = True
    _log("INFO", f"worker health hooks installed ({rules!r}; {settings!r})")
