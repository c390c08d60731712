"""A router killed with ``kill -9`` mid-stream and a new one on its state directory, either line.

    run = kill_and_restart(first, start_second, clients, document)
    run.in_flight        # accepted by the first router, not terminal when it died
    run.completed_before # completed on the first router before it died
    run.outcomes         # every accepted one, as the second router ended it
    run.not_found        # every 404 the second router answered for one of them

One thread submits ``document(n)`` every ``every_s`` to whichever router is
up (a refused or unanswered submission is not accepted, and not counted);
once ``warm`` completed on the first router and ``in_flight`` more were
accepted, the first router's status of each is read (all at once) and it is
killed with ``SIGKILL`` right after. ``start_second()`` starts the new router on the same
state directory; the stream goes on there for ``after`` more accepted ones,
then every accepted one is followed through the second router to its end.
Every wait is bounded; nothing is timed.

    second, ids = kill_during_a_restart(first, start_second, client, documents)

``kill_during_a_restart`` (issue 32): one of the first router's workers
meets a dead engine under one of ``documents`` (the shared plan
``engine_dead``; they are sent one by one until one reached it), and the
router is killed once it ejected that worker (its
restart due or under way; with no retry budget, the task waits to be sent
again); the second router is started on the same state directory.

    keys = fill_store3(state, 1000, pdf, engine_url, "local-gpu-0")

``fill_store3`` writes what a killed 3.x router leaves in its store: unfinished
tasks (oldest first), each with its kept upload, last submitted to an
instance that is gone (a new router asks for each, then sends it again).
"""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mineru_health.demo.fleet import Client, Router, http
from mineru_health.demo.sandbox import SandboxError, wait_until

__all__ = ["DISRUPTIONS", "RestartRun", "fill_store3", "kill_and_restart", "kill_during_a_restart"]

#: Audit actions of a worker taken out of rotation or restarted.
DISRUPTIONS = (
    "ejected",
    "health_failed",
    "auto_restart_scheduled",
    "auto_restart_success",
    "auto_restart_failed",
    "auto_restart_gave_up",
)


@dataclass
class RestartRun:
    first: Router
    second: Router
    accepted: list[tuple[int, str]] = field(default_factory=list)  # (number, task id), in order
    completed_before: set[str] = field(default_factory=set)
    in_flight: set[str] = field(default_factory=set)
    outcomes: dict[str, dict[str, Any]] = field(default_factory=dict)  # task id -> last status
    not_found: list[tuple[str, str]] = field(default_factory=list)  # (task id, body)

    @property
    def lost(self) -> list[tuple[str, str]]:
        """Accepted tasks the second router did not end completed: (task id, status)."""
        return [
            (task_id, str(self.outcomes.get(task_id, {}).get("status", "hung")))
            for _, task_id in self.accepted
            if self.outcomes.get(task_id, {}).get("status") != "completed"
        ]


class _Feed:
    """Submits a document every ``every_s`` to the current client; keeps what was accepted."""

    def __init__(
        self, client: Client, document: Callable[[int], tuple[str, bytes]], every_s: float
    ) -> None:
        self.client = client
        self.document = document
        self.every_s = every_s
        self.accepted: list[tuple[int, str, Client]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        number = 0
        while not self._stop.is_set():
            client = self.client
            name, pdf = self.document(number)
            task_id, _refusal = client.submit(name, pdf)
            if task_id:
                with self._lock:
                    self.accepted.append((number, task_id, client))
                number += 1
            self._stop.wait(self.every_s)

    def count(self, client: Client | None = None) -> int:
        with self._lock:
            return sum(1 for _, _, c in self.accepted if client is None or c is client)

    def ids(self) -> list[tuple[int, str]]:
        with self._lock:
            return [(n, t) for n, t, _ in self.accepted]

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=120)


def _status(client: Client, task_id: str) -> tuple[int, dict[str, Any]]:
    import httpx

    try:
        response = http("GET", f"{client.base}{client.line.tasks}/{task_id}", 30.0)
    except httpx.HTTPError:
        return 0, {}
    try:
        body = response.json()
    except ValueError:
        body = {}
    return int(response.status_code), body if isinstance(body, dict) else {}


def kill_and_restart(
    first: Router,
    start_second: Callable[[], Router],
    client_for: Callable[[Router], Client],
    document: Callable[[int], tuple[str, bytes]],
    *,
    every_s: float = 0.4,
    warm: int = 3,
    in_flight: int = 3,
    after: int = 3,
    task_timeout_s: float = 240.0,
) -> RestartRun:
    first_client = client_for(first)
    feed = _Feed(first_client, document, every_s)
    try:
        terminal = first.line.terminal
        completed: set[str] = set()

        def warmed() -> bool:
            for _, task_id in feed.ids():
                if (
                    task_id not in completed
                    and _status(first_client, task_id)[1].get("status") == "completed"
                ):
                    completed.add(task_id)
            return len(completed) >= warm

        if not wait_until(warmed, task_timeout_s, 0.3):
            raise SandboxError(f"fewer than {warm} completed:\n{first.proc.log_tail()}")
        wanted = feed.count(first_client) + in_flight
        if not wait_until(lambda: feed.count(first_client) >= wanted, 60.0, 0.05):
            raise SandboxError(f"the stream stalled:\n{first.proc.log_tail()}")
        run = RestartRun(first, first)
        ids = [task_id for _, task_id in feed.ids()]
        with ThreadPoolExecutor(max_workers=8) as pool:  # the statuses just before the kill
            statuses = list(pool.map(lambda t: _status(first_client, t)[1].get("status"), ids))
        os.kill(first.proc.pid, signal.SIGKILL)
        for task_id, status in zip(ids, statuses, strict=True):
            if status == "completed":
                run.completed_before.add(task_id)
            elif status not in terminal:
                run.in_flight.add(task_id)
        first.proc.wait(30.0)

        run.second = start_second()
        second_client = client_for(run.second)
        feed.client = second_client
        if not wait_until(lambda: feed.count(second_client) >= after, task_timeout_s, 0.1):
            raise SandboxError(
                f"the new router accepted fewer than {after}:\n{run.second.proc.log_tail()}"
            )
    finally:
        feed.stop()
    run.accepted = feed.ids()
    deadline = time.monotonic() + task_timeout_s
    for _, task_id in run.accepted:
        while time.monotonic() < deadline:
            code, body = _status(second_client, task_id)
            if code == 404:
                run.not_found.append((task_id, str(body)[:300]))
            if code == 200:
                run.outcomes[task_id] = body
                if body.get("status") in terminal:
                    break
            time.sleep(0.25)
    return run


def kill_during_a_restart(
    first: Router,
    start_second: Callable[[], Router],
    client: Client,
    documents: list[tuple[str, bytes]],
) -> tuple[Router, list[str]]:
    """Arms ``engine_dead`` on one of ``first``'s workers, sends it ``documents`` one by one
    until one reached the doomed engine, ``kill -9`` the router once it ejected that worker;
    returns ``start_second()`` and the ids of the tasks sent."""
    first.write_plan("engine_dead")  # shared: the first worker that reads it is the victim
    if not wait_until(lambda: not first.plan().exists(), 60.0, 0.05):
        raise SandboxError(f"no worker read the fault plan:\n{first.proc.log_tail()}")

    def ejected() -> bool:
        return any(r["action"] == "ejected" for r in first.audit_records())

    # MinerU picks among equally loaded workers at random, so any one document may miss
    # the victim: send the next only once the last had time to fail there.
    ids = []
    for name, pdf in documents:
        task_id, refusal = client.submit(name, pdf)
        if not task_id:
            raise SandboxError(f"{name} was refused: {refusal}\n{first.proc.log_tail()}")
        ids.append(task_id)
        if wait_until(ejected, 5.0, 0.05):
            break
    if not wait_until(ejected, 120.0, 0.05):
        raise SandboxError(f"no worker was ejected:\n{first.proc.log_tail()}")
    os.kill(first.proc.pid, signal.SIGKILL)
    first.proc.wait(30.0)
    return start_second(), ids


def fill_store3(state: Path, count: int, pdf: bytes, engine_url: str, worker: str) -> list[str]:
    """``count`` unfinished 3.x tasks in the router's store under ``state``, written by the
    supervisor through the task line as a router writes them; their ids, oldest first."""
    from types import SimpleNamespace

    from mineru.cli import router
    from mineru_health.mineru3.router.tasks import Task, TaskLine
    from mineru_health.runtime.router.line import Kept
    from mineru_health.runtime.router.store import DB_NAME, KEPT_NAME, RouterStore
    from mineru_health.runtime.router.supervisor import Supervisor
    from mineru_health.runtime.settings import HealthSettings

    state.mkdir(parents=True, exist_ok=True)
    store = RouterStore(state / DB_NAME)
    supervisor = Supervisor(
        SimpleNamespace(),
        TaskLine(SimpleNamespace(), {}),  # type: ignore[arg-type]
        HealthSettings.preset("production"),
        store=store,
    )
    gone = "http://127.0.0.1:9"  # the instance each was last submitted to
    keys, first = [], time.time() - count
    for index in range(count):
        key, name = str(uuid.uuid4()), f"stored{index}.pdf"
        staged = state / KEPT_NAME / f"mineru-router-request-{key}"
        staged.mkdir(parents=True)
        (staged / name).write_bytes(pdf)
        record = router.RouterTaskRecord(
            task_id=key,
            upstream_server_id=worker,
            upstream_task_id=str(uuid.uuid4()),
            upstream_base_url=gone,
            backend="vlm-http-client",
            file_names=[name[:-4]],
            created_at="2026-12-06T00:00:00+00:00",
            status="pending",
        )
        payload = router.MultipartPayload(
            temp_dir=str(staged),
            fields=[("backend", "vlm-http-client"), ("server_url", engine_url)],
            uploads=[router.StagedUpload("files", name, "application/pdf", str(staged / name))],
        )
        kept = Kept(key, Task(record, payload, None), [worker], gone, None, 0)
        kept.accepted_at = first + index
        supervisor.save(kept)
        keys.append(key)
    store.close()
    return keys
