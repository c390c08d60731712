"""The worker's own daemon threads: liveness, exit on fatal, exit with the router; and the
processes it started, which end with it."""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from ... import _native
from ...safe_text import describe_exception
from ..settings import WorkerSettings
from . import verification
from .health import WorkerHealth, fatal_cause
from .log import log
from .worker_runtime import EXIT_CODE, LIVENESS_INTERVAL_S

#: The rule of an engine death the liveness thread finds.
LIVENESS_RULE = "liveness:mineru-engines"


def check_liveness(health: WorkerHealth) -> bool:
    """Reads MinerU's engine handles once; records an errored one as fatal. True if it did."""
    try:
        dead = verification.errored_engine()
    except Exception as error:  # noqa: BLE001 - a broken read must not stop the thread
        log("WARNING", f"liveness check failed: {describe_exception(error)}")
        return False
    if dead is None or not health.healthy:
        return False
    detail = f"engine handle {dead.where} ({type(dead.obj).__name__}) reports errored"
    if not health.record_fatal(
        f"engine died while idle: {detail}", rule=LIVENESS_RULE, category="engine_dead"
    ):
        return False
    log("ERROR", f"liveness check: {detail}")
    return True


def liveness_loop(health: WorkerHealth, stop: threading.Event) -> None:
    """Reads the engine handles every second, off the event loop, until unhealthy (or
    ``stop``: the interpreter exits)."""
    while not health.wait_until_unhealthy(LIVENESS_INTERVAL_S) and not stop.is_set():
        check_liveness(health)


def exit_after_fatal(
    health: WorkerHealth, stop: threading.Event, grace_s: float, tag: str = ""
) -> None:
    while not health.wait_until_unhealthy(LIVENESS_INTERVAL_S):
        if stop.is_set():
            return
    first = health.snapshot().first_fatal
    what = fatal_cause(first)
    log(
        "ERROR",
        f"exiting with status {EXIT_CODE} in {grace_s:g}s because the inference "
        f"engine is unusable ({what}); MINERU_HEALTH_EXIT_ON_FATAL is set",
    )
    # A plain wait: this daemon thread does nothing else, and the event loop
    # and the native endpoint keep answering 503 meanwhile.
    threading.Event().wait(grace_s)
    end_own_processes(tag)  # its engine processes must not outlive it
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed stream must not prevent the exit
            stream.flush()
    os._exit(EXIT_CODE)


#: When the worker ends what it started itself (its router gone, or its own
#: exit): how long they have between SIGTERM and SIGKILL.
CHILDREN_GRACE_S = 5.0


def lead_own_group() -> None:
    """Makes this worker the leader of a process group of its own, so that what it starts
    is in that group (3.x's router starts it in a session of its own already, 4.0's does
    not); before anything is started."""
    if os.getpgid(0) == os.getpid():
        return
    try:
        os.setpgid(0, 0)
    except OSError as error:
        log(
            "WARNING",
            f"cannot lead a process group of its own ({error}); the router finds "
            "this worker's processes by their tag",
        )


def end_own_processes(tag: str, grace_s: float = CHILDREN_GRACE_S) -> None:
    """Ends every process this worker started (its group, its descendants, what carries its
    ``tag``, sessions of their own included): SIGTERM, ``grace_s``, SIGKILL. Blocks."""
    scope = _native.ProcessScope()
    scope.leader = os.getpid()
    scope.tag = f"{WorkerSettings.variable_name('worker_tag')}={tag}" if tag else ""
    report = _native.end_scope(scope, grace_s)
    if report.terminated:
        log(
            "WARNING",
            f"ended {report.terminated} process(es) this worker started "
            f"({report.killed} needed SIGKILL, {report.survivors} left)",
        )


def take_children_along(tag: str) -> None:
    """At this worker's exit, however it exits short of SIGKILL (then its router, or the
    next one, ends them), the processes it started end too.

    A normal exit runs ``atexit``; a SIGTERM does not: uvicorn shuts down on
    it, then raises it again with the handler it found at start-up, which is
    this one (installed first, from the main thread): it ends the processes,
    then lets SIGTERM do what it did before.
    """
    owner = os.getpid()

    def end_children() -> None:
        if os.getpid() == owner:  # never from a forked child
            end_own_processes(tag)

    atexit.register(end_children)
    if threading.current_thread() is not threading.main_thread():
        return
    before = signal.getsignal(signal.SIGTERM)

    def on_sigterm(signum: int, frame: Any) -> None:
        end_children()
        if callable(before):
            before(signum, frame)
            return
        signal.signal(signal.SIGTERM, before if before is not None else signal.SIG_DFL)
        signal.raise_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_sigterm)


#: After the router died, how long uvicorn's own graceful shutdown (on the
#: parent-death SIGTERM) may take before the worker exits regardless.
PARENT_GONE_GRACE_S = 30.0


def exit_with_parent(
    parent_pid: int, tag: str = "", on_gone: Callable[[], None] = lambda: None
) -> None:
    """Dies with the router that launched this worker, however the router dies, and takes
    the processes it started along (``on_gone()`` first: the task store is sealed).

    The kernel sends SIGTERM when the router exits (uvicorn then shuts MinerU
    down cleanly); a watcher thread ends the processes the worker started at
    once (an engine in a session of its own would not see that SIGTERM), and
    exits regardless if the shutdown has not ended the process within
    ``PARENT_GONE_GRACE_S``.
    """
    watch = _native.exit_with_parent(signal.SIGTERM, parent_pid)
    if watch is _native.ParentWatch.PARENT_GONE:
        log("ERROR", f"the router (pid {parent_pid}) that launched this worker is gone; exiting")
        on_gone()
        end_own_processes(tag)
        os._exit(1)
    if watch is _native.ParentWatch.UNSUPPORTED:
        log(
            "WARNING",
            "cannot ask the kernel to end this worker with its router; "
            "watching the parent process instead",
        )

    def watch_parent() -> None:
        while os.getppid() == parent_pid:
            time.sleep(1.0)
        log("ERROR", f"the router (pid {parent_pid}) is gone; exiting")
        gone_at = time.monotonic()
        on_gone()
        end_own_processes(tag)
        threading.Event().wait(max(0.0, PARENT_GONE_GRACE_S - (time.monotonic() - gone_at)))
        os._exit(1)

    start_thread(watch_parent, name="mineru-health-parent-watch")


def start_thread(target: Callable[..., None], *args: Any, name: str) -> threading.Thread:
    thread = threading.Thread(target=target, args=args, name=name, daemon=True)
    thread.start()
    return thread


def start_waiting_thread(target: Callable[..., None], *args: Any, name: str) -> threading.Thread:
    """A daemon thread that waits on the native state, called ``target(health, stop,
    *rest)``, stopped and joined at the interpreter's exit: a native wait that returned
    during finalization would take the GIL back, and CPython ends such a thread by
    unwinding it through C++ frames, which aborts the process ("terminate called
    without an active exception")."""
    stop = threading.Event()
    health, *rest = args
    thread = start_thread(target, health, stop, *rest, name=name)

    def stop_and_join() -> None:
        stop.set()
        thread.join(LIVENESS_INTERVAL_S + 1.0)

    atexit.register(stop_and_join)
    return thread
