"""Admission under pressure (issue 31), either line: a burst against the caps, a full disk.

    answers = burst(client, documents, senders)        # [(code, Retry-After, task id)]
    with small_tmpfs(path) as state: ...              # 8 MiB file system (skips if not root)
    run = fill_and_empty(start_router, client_for, document, state)

``fill_and_empty``: one thread submits ``document(n)`` every ``every_s`` to
whichever router is up and records every answer; once a few are accepted
the state directory's file system is filled (a file written until ENOSPC),
submissions are refused, the router is killed with ``SIGKILL`` and a new one
started on the full directory (it must say so, and serve what it has); the
file is deleted, submissions are accepted again, then every accepted one is
followed through the new router to its end. Every wait is bounded; nothing
is timed.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from mineru_health.demo.fleet import Client, Router, http
from mineru_health.demo.sandbox import SandboxError, wait_until

__all__ = ["FullDiskRun", "burst", "fill_and_empty", "padded", "small_tmpfs"]

Answer = tuple[int, str, str]  # (status code, Retry-After, task id); code 0: no answer


def padded(pdf: bytes, size: int) -> bytes:
    """``pdf`` grown to ``size`` bytes by a comment after its end (readers ignore it)."""
    return pdf + b"\n%" + b"0" * max(0, size - len(pdf) - 2)


def _post(client: Client, name: str, pdf: bytes, timeout_s: float = 120.0) -> Answer:
    import httpx

    try:
        response = client.post(name, pdf, timeout_s=timeout_s)
    except httpx.HTTPError:
        return 0, "", ""
    task_id = ""
    if response.status_code == 202:
        task_id = str(response.json().get("task_id", ""))
    return response.status_code, response.headers.get("retry-after", ""), task_id


def burst(client: Client, documents: list[tuple[str, bytes]], senders: int) -> list[Answer]:
    """Every document submitted at once (``senders`` connections); their answers, in order."""
    with ThreadPoolExecutor(max_workers=senders) as pool:
        return list(pool.map(lambda doc: _post(client, *doc), documents))


@contextmanager
def small_tmpfs(path: Path, size: str = "8m") -> Iterator[Path]:
    """A tmpfs of ``size`` mounted at ``path`` (made) for the block; skips where mount is not
    permitted. Unmounted (lazily: a killed process may still hold it) afterwards."""
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()[:200]}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=30, check=False)


def fill(directory: Path) -> Path:
    """A file in ``directory`` written until its file system is full; returns it."""
    filler = directory / "filler"
    with filler.open("wb", buffering=0) as out:
        for chunk in (1 << 20, 1 << 12):  # MiBs, then the last pages
            for _ in range(64 * 1024):  # bounded: far more than any file system here
                try:
                    out.write(b"\0" * chunk)
                except OSError as error:
                    if error.errno != errno.ENOSPC:
                        raise
                    break
    return filler


@dataclass
class FullDiskRun:
    first: Router
    second: Router
    answers: list[Answer] = field(default_factory=list)  # every submission's, in order
    full_statuses: list[int] = field(default_factory=list)  # status codes read while full
    outcomes: dict[str, dict[str, Any]] = field(default_factory=dict)  # task id -> last status
    not_found: list[str] = field(default_factory=list)

    @property
    def accepted(self) -> list[str]:
        return [task_id for code, _, task_id in self.answers if code == 202]

    def count(self, code: int) -> int:
        return sum(1 for c, _, _ in self.answers if c == code)

    @property
    def lost(self) -> list[tuple[str, str]]:
        """Accepted ones the new router did not end completed: (task id, status)."""
        return [
            (t, str(self.outcomes.get(t, {}).get("status", "hung")))
            for t in self.accepted
            if self.outcomes.get(t, {}).get("status") != "completed"
        ]


class _Stream:
    def __init__(
        self, client: Client, document: Callable[[int], tuple[str, bytes]], every_s: float
    ) -> None:
        self.client, self.document, self.every_s = client, document, every_s
        self.answers: list[Answer] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        number = 0
        while not self._stop.is_set():
            answer = _post(self.client, *self.document(number), timeout_s=60.0)
            with self._lock:
                self.answers.append(answer)
            number += 1
            self._stop.wait(self.every_s)

    def count(self, code: int) -> int:
        with self._lock:
            return sum(1 for c, _, _ in self.answers if c == code)

    def snapshot(self) -> list[Answer]:
        with self._lock:
            return list(self.answers)

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


def fill_and_empty(
    start_router: Callable[[], Router],
    client_for: Callable[[Router], Client],
    document: Callable[[int], tuple[str, bytes]],
    state: Path,
    *,
    every_s: float = 0.1,
    task_timeout_s: float = 120.0,
) -> FullDiskRun:
    first = start_router()
    stream = _Stream(client_for(first), document, every_s)
    filler: Path | None = None
    try:
        if not wait_until(lambda: stream.count(202) >= 3, 60.0, 0.05):
            raise SandboxError(f"fewer than 3 accepted:\n{first.proc.log_tail()}")
        filler = fill(state)
        refused = stream.count(507)
        if not wait_until(lambda: stream.count(507) >= refused + 3, 60.0, 0.05):
            raise SandboxError(f"no 507 on a full disk:\n{first.proc.log_tail()}")
        run = FullDiskRun(first, first)
        os.kill(first.proc.pid, signal.SIGKILL)
        first.proc.wait(30.0)

        run.second = second = start_router()  # on the full directory
        stream.client = client_for(second)
        if not wait_until(lambda: "storage is full" in second.proc.log_tail(20000), 30.0, 0.1):
            raise SandboxError(f"no word of the full disk:\n{second.proc.log_tail()}")
        for _, _, task_id in stream.snapshot():  # what it has is served, full or not
            if task_id:
                run.full_statuses.append(_status(stream.client, task_id)[0])
        refused = stream.count(507)
        if not wait_until(lambda: stream.count(507) >= refused + 3, 60.0, 0.05):
            raise SandboxError(
                f"the new router took submissions on a full disk:\n{second.proc.log_tail()}"
            )
        filler.unlink()
        accepted = stream.count(202)
        if not wait_until(lambda: stream.count(202) >= accepted + 3, 60.0, 0.05):
            raise SandboxError(f"room returned, nothing accepted:\n{second.proc.log_tail()}")
    finally:
        stream.stop()
        if filler is not None:
            filler.unlink(missing_ok=True)
    run.answers = stream.snapshot()
    client = client_for(run.second)
    for task_id in run.accepted:

        def ended(task_id: str = task_id) -> bool:
            code, body = _status(client, task_id)
            if code == 404:
                run.not_found.append(task_id)
                return True
            if code == 200:
                run.outcomes[task_id] = body
            return code == 200 and body.get("status") in client.line.terminal

        wait_until(ended, task_timeout_s, 0.25)
    return run
