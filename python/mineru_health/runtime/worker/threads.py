"""The worker's own daemon threads: liveness, exit on fatal, exit with the router."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from ... import _native, metrics, verification
from ...worker import WorkerHealth, describe_exception, fatal_cause
from .context import EXIT_CODE, LIVENESS_INTERVAL_S, log

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
    if not health.record_fatal(f"engine died while idle: {detail}", rule=LIVENESS_RULE,
                               category="engine_dead"):
        return False
    metrics.record_worker_fatal(LIVENESS_RULE, "engine_dead")
    log("ERROR", f"liveness check: {detail}")
    return True


def liveness_loop(health: WorkerHealth) -> None:
    """Reads the engine handles every second, off the event loop, until unhealthy."""
    while not health.wait_until_unhealthy(LIVENESS_INTERVAL_S):
        check_liveness(health)


def exit_after_fatal(health: WorkerHealth, grace_s: float) -> None:
    while not health.wait_until_unhealthy(60.0):
        pass
    first = health.snapshot().first_fatal
    what = fatal_cause(first)
    log("ERROR", f"exiting with status {EXIT_CODE} in {grace_s:g}s because the inference "
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


def exit_with_parent(parent_pid: int) -> None:
    """Dies with the router that launched this worker, however the router dies.

    The kernel sends SIGTERM when the router exits (uvicorn then shuts MinerU
    down cleanly); a watcher thread exits regardless if that has not ended
    the process within ``PARENT_GONE_GRACE_S``.
    """
    watch = _native.exit_with_parent(signal.SIGTERM, parent_pid)
    if watch is _native.ParentWatch.PARENT_GONE:
        log("ERROR", f"the router (pid {parent_pid}) that launched this worker is gone; exiting")
        os._exit(1)
    if watch is _native.ParentWatch.UNSUPPORTED:
        log("WARNING", "cannot ask the kernel to end this worker with its router; "
                        "watching the parent process instead")

    def watch_parent() -> None:
        while os.getppid() == parent_pid:
            time.sleep(1.0)
        log("ERROR", f"the router (pid {parent_pid}) is gone; exiting")
        threading.Event().wait(PARENT_GONE_GRACE_S)
        os._exit(1)

    start_thread(watch_parent, name="mineru-health-parent-watch")


def start_thread(target: Callable[..., None], *args: Any, name: str) -> threading.Thread:
    thread = threading.Thread(target=target, args=args, name=name, daemon=True)
    thread.start()
    return thread
