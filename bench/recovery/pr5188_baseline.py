"""Baseline worker hooks for bench/recovery: MinerU 3.4.4 plus PR #5188's behaviour, emulated.

Restated from the PR's description (this is our own code, not the PR's):
one lower-cased text is built from the exception's module, the names of its
class hierarchy and its message; it is matched against fixed plain markers,
fixed alphanumeric-only markers, and "unrecoverable" together with "engine"
or "vllm". On a match the task manager's ``last_worker_error`` is set (so
MinerU's ``/health`` answers 503) and waiters are woken; anything else stays
task-local. Only the exception itself is examined, not its cause chain.

Both sides get the same fault injection as the real tests: the sandbox's
fault plugin (``MINERU_HEALTH_FAULT_PLAN``, loaded by the ``sitecustomize.py``
``run.py`` adds to each site), so both sides of the bench die the same way;
``install(app)`` only keeps each task's upload names in context for its
``poison`` word. The PR's behaviour is on only with ``BENCH_PR5188_MARKERS=1``;
without it the worker is upstream 3.4.4 plus fault injection.
"""

from __future__ import annotations

import os
import re
from typing import Any

#: Set to 1 in a baseline worker's environment to emulate PR #5188; unset: plain 3.4.4.
PR5188_ENV = "BENCH_PR5188_MARKERS"

PLAIN_MARKERS = (
    "engine dead",
    "engine is dead",
    "engine has died",
    "enginecore",
    "engine core",
    "inference engine is gone",
    "inference engine died",
    "async llm engine has failed",
)
COMPACT_MARKERS = ("enginedead", "enginecore", "unrecoverableengine", "engineunrecoverable")
_NON_ALNUM = re.compile(r"[^a-z0-9]+")


def _text(exc: BaseException) -> str:
    names = [cls.__name__ for cls in type(exc).__mro__ if cls is not object]
    try:
        message = str(exc)
    except Exception:  # noqa: BLE001 - a broken __str__ must not break the check
        message = ""
    return " ".join([type(exc).__module__, *names, message]).lower()


def is_engine_fatal(exc: BaseException) -> bool:
    """The marker check; also the baseline of bench/classify."""
    return is_engine_fatal_text(_text(exc))


def is_engine_fatal_parts(module: str, class_names: list[str], message: str) -> bool:
    """The same check on an exception described by its parts (bench/accuracy's corpus)."""
    return is_engine_fatal_text(" ".join([module, *class_names, message]).lower())


def is_engine_fatal_text(text: str) -> bool:
    text = text.lower()
    if any(marker in text for marker in PLAIN_MARKERS):
        return True
    compact = _NON_ALNUM.sub("", text)
    if any(marker in compact for marker in COMPACT_MARKERS):
        return True
    return "unrecoverable" in text and ("engine" in text or "vllm" in text)


class _FollowTasks:
    """ASGI middleware: puts the task's upload names in context (the plan's ``poison`` word)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        from mineru_health.demo import fault_plugin

        state = getattr(scope.get("app"), "state", None)
        manager = getattr(state, "task_manager", None)
        if manager is not None:
            fault_plugin.follow_uploads(manager)  # idempotent
        await self.app(scope, receive, send)


def install(app: Any) -> None:
    """The task's upload names in context, for the fault plugin; no health logic."""
    if os.environ.get("MINERU_HEALTH_FAULT_PLAN"):
        app.add_middleware(_FollowTasks)


def on_task_failed(manager: Any, exc: BaseException) -> None:
    """PR #5188's behaviour, only with ``BENCH_PR5188_MARKERS=1`` (else upstream 3.4.4's)."""
    if os.environ.get(PR5188_ENV) == "1" and is_engine_fatal(exc):
        manager.last_worker_error = f"{type(exc).__name__}: {exc}"
        manager._wake_waiters()
