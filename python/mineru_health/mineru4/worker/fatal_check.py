"""MinerU 4.0's question "is this engine error fatal?", answered by the judge; and the
worker's verdict (a :class:`~mineru_health.runtime.verdict.TaskVerdict`) on a job failed
with its engine (:func:`job_verdict`).

4.0 asks ``mineru.model.vlm.errors.is_fatal_engine_error(exc)`` in three
places: its VLM runtime thread (``async_runtime``, which then refuses every
later request), ``_run_job`` (which then fails every unfinished job through
``JobStore.fail_engine``) and the model preload. Two of them imported the
function by name, so :func:`rebind` replaces it in every namespace that holds
it. The replacement hands the exception to the runtime's judge, with MinerU's
own function as its :class:`~mineru_health.runtime.worker.judge.Opinion` and
the job in context as the item (the judge records the verdict in the native
worker state, so the native endpoint and ``/v1/health`` answer 503 from then
on, and the trigger), and answers True for a fatal one, so MinerU's own
``fail_engine`` path fails the other jobs.

It answers True when the native verdict is fatal (an ambiguous device error
that exhausts the error budget included), or when MinerU's own function says
so (never narrower than upstream), except for a remote engine
(``server_url`` set: the http-client backend), which condemns the worker only when
that server, the operator's, is down (:mod:`~mineru_health.runtime.worker.dependency`;
checked on a thread of its own, so the job that met it fails as MinerU failed it, and
the worker's watcher acts on the record).
A failure that escaped a call into a local engine
(:func:`~mineru_health.runtime.worker.engine_calls.raised_by_local_engine`) is
verified as a local one all the same. Such a failure is decided where it escapes
the engine call, on the parse thread (engines 4.0 drives synchronously: llama.cpp,
lmdeploy, MLX), so that verification can finish before ``_run_job`` asks on the
loop: a dead engine found by verification then fails its own job ``engine_dead``
too, and the router resubmits it.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, MutableMapping
from typing import Any

from ...runtime.worker import engine_calls, judge, remote_waits
from ...runtime.worker.log import log
from ...runtime.worker.worker_runtime import WorkerRuntime
from ...safe_text import describe_exception
from .. import ENGINE_DEAD_CODE

NAME = "is_fatal_engine_error"
#: Modules of 4.0.12 that hold the function (``errors`` defines it, the others import it).
MODULES = ("mineru.model.vlm.errors", "mineru.model.vlm.async_runtime", "mineru.parser.api_server")
_MARK = "__mineru_health__"
#: The answer already given for an exception: 4.0 asks twice for one failure
#: (runtime thread, then ``_run_job``), and an ambiguous one must count once.
_ANSWER_ATTR = "__mineru_health_fatal__"
#: The verdict kept on a job record (``_JobRecord``) that failed ``engine_dead``.
VERDICT_ATTR = "__mineru_health_verdict__"


def _remote_engine(runtime: WorkerRuntime) -> bool:
    """True when the app whose job runs here parses through a remote VLM server."""
    return bool(_server_url(runtime))


def _server_url(runtime: WorkerRuntime) -> str:
    """The remote VLM server of the app whose job runs here ("" for a local engine): 4.0
    takes it from its configuration only (``--vlm-server-url``), the operator's."""
    module = sys.modules.get("mineru.model.vlm.async_runtime")
    owner_var = getattr(module, "runtime_owner", None)
    owner = owner_var.get() if owner_var is not None else None
    for app in runtime.apps:
        state = getattr(app, "state", None)
        store = getattr(state, "job_store", None)
        if owner is None or getattr(store, "runtime_owner", None) is owner:
            return str(getattr(getattr(state, "vlm_config", None), "server_url", None) or "")
    return ""


#: The rule of a death only MinerU's own check saw.
MINERU_RULE = "mineru.is_fatal_engine_error"


def _decide(
    runtime: WorkerRuntime, error: BaseException, upstream: Callable[[BaseException], bool]
) -> bool:
    server_url = _server_url(runtime)
    outcome = judge.judge(
        runtime,
        error,
        remote_engine=bool(server_url),
        item_id=engine_calls.current_task_id(),
        opinion=judge.Opinion(MINERU_RULE, upstream),
        own_server=remote_waits.server_name(server_url),  # the operator's, the worker's engine
    )
    if outcome.first and outcome.rule != MINERU_RULE:  # MinerU's own: logged where recorded
        judge.log_outcome(engine_calls.current_task_id() or "?", outcome)
    return outcome.fatal


def job_verdict(runtime: WorkerRuntime, record: Any) -> dict[str, Any] | None:
    """The worker's verdict on a job that failed ``engine_dead`` (None for any other job).

    Kept on the record once made (and in its task store row), so that a
    restarted worker answers with the same verdict: ``role`` ``trigger`` for
    the job whose own failure was the first fatal one, ``collateral`` for
    the jobs failed with it. The router counts triggers against documents
    (poison guard), as on 3.x.
    """
    kept = getattr(record, VERDICT_ATTR, None)
    if isinstance(kept, dict):
        return kept
    files = getattr(record, "files", None) or ()
    if not any(getattr(getattr(f, "error", None), "code", None) == ENGINE_DEAD_CODE for f in files):
        return None
    first = runtime.health.snapshot().first_fatal
    if first is None:
        return None
    trigger = judge.is_trigger(runtime, getattr(record, "id", None))
    verdict = judge.trigger_or_collateral(first, trigger).to_wire()
    with contextlib.suppress(Exception):  # a record refusing attributes is judged again
        setattr(record, VERDICT_ATTR, verdict)
    return verdict


def make_replacement(
    runtime: WorkerRuntime, upstream: Callable[[BaseException], bool]
) -> Callable[[BaseException], bool]:
    """MinerU's check, answered by the judge of ``runtime``."""

    def is_fatal_engine_error(error: BaseException) -> bool:
        known = getattr(error, _ANSWER_ATTR, None)
        if isinstance(known, bool):
            judge.note_trigger(runtime, error, engine_calls.current_task_id())
            return known
        try:
            answer = _decide(runtime, error, upstream)
        except Exception as failure:  # noqa: BLE001 - MinerU must keep its own handling
            log("ERROR", f"classifying an engine error failed: {describe_exception(failure)}")
            return upstream(error)
        with contextlib.suppress(Exception):  # an exception refusing attributes is asked again
            setattr(error, _ANSWER_ATTR, answer)
        return answer

    setattr(is_fatal_engine_error, _MARK, True)
    is_fatal_engine_error.__doc__ = "MinerU's check, decided by mineru-health's classifier."
    return is_fatal_engine_error


def rebind(runtime: WorkerRuntime, namespace: MutableMapping[str, Any] | None = None) -> int:
    """Replaces the function in 4.0's modules and in ``namespace`` by one answered by
    ``runtime``'s judge, also its judge of local engine failures; returns how many."""
    spaces: list[MutableMapping[str, Any]] = [
        vars(m) for m in map(sys.modules.get, MODULES) if m is not None
    ]
    if namespace is not None and not any(space is namespace for space in spaces):
        spaces.append(namespace)
    errors = sys.modules.get(MODULES[0])
    upstream = getattr(errors, NAME, None)
    if upstream is None or getattr(upstream, _MARK, False):
        upstream = getattr(upstream, "__wrapped__", None)
    if upstream is None:
        log("WARNING", f"{MODULES[0]}.{NAME} not found; MinerU's engine checks stay its own")
        return 0
    replacement = make_replacement(runtime, upstream)
    replacement.__wrapped__ = upstream  # type: ignore[attr-defined]
    runtime.failure_judge = replacement
    count = 0
    for space in spaces:
        current = space.get(NAME)
        if current is not None and (current is upstream or getattr(current, _MARK, False)):
            space[NAME] = replacement
            count += 1
    return count
