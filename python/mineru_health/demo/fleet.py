"""A real MinerU fleet on loopback, either line: what the demo, tests and benchmarks run on.

    line = LINE3                                       # or LINE4: data, not two copies
    site = line.site(tmp / "mineru-site", python)      # patched copy, fault plugin loaded
    with Processes() as procs:
        vlm = start_fake_vlm(procs, tmp)               # 3.x's engine (vlm-http-client)
        router = start_router(procs, line, site, python, tmp / "router",
                              fault_plan="plan-{port}")
        servers = router.wait_in_rotation()            # both local workers
        client = Client(router.base, line, engine_url=vlm)
        with Stream(client, lambda n: (f"doc{n}.pdf", pdf), every_s=0.6, count=14) as stream:
            router.write_plan("engine_dead", victim_url)
            outcomes = stream.outcomes()
        worker = start_worker(procs, line, site, python, tmp / "worker", native=True)
    with fleet(LINE4, tmp, python, env=FLEET4_ENV) as router:   # started, both in rotation

What differs between the lines is data of two small classes (:class:`Line3`,
:class:`Line4`): the commands, the job API's paths (``/tasks`` or
``/v1/tasks``), a submission's shape (a form naming the VLM backend, or query
parameters naming the tier), the terminal statuses, and where the rotation
shows (3.x: the router's ``/health`` ``servers``; 4.0: ``/v1/usage``). 4.0
jobs are text PDFs with a real text layer (:func:`text_pdf`: the flash tier
parses them with no model weights). Everything runs on 127.0.0.1 and every
wait is bounded. Used from one thread, except :class:`Client` and
:class:`Stream`, which say so. What watches a running fleet for the tests
(its rotation, a health URL's latency, one fault run) is in ``tests/harness/samplers.py``.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import ssl
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from . import sandbox
from .faults import FAULT_PLAN_ENV, write_plan
from .processes import ManagedProcess, Processes
from .sandbox import HOST, SandboxError, free_port, wait_until

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = [
    "FLEET4_ENV",
    "LINE3",
    "LINE4",
    "LINE4_STANDARD",
    "Client",
    "Line",
    "Outcome",
    "Router",
    "Stream",
    "Unfinished",
    "Worker",
    "fleet",
    "http",
    "start_fake_vlm",
    "start_router",
    "start_worker",
    "text_document",
    "text_pdf",
]

START_TIMEOUT_S = 240.0
TASK_TIMEOUT_S = 180.0  # a document not terminal by then is hung
#: The 4.0 router of the tests, the demo and bench/recovery --line 4: the fast preset, a 3 s
#: main-port timeout (a worker without a native endpoint shows a hung loop that way), and in
#: the workers a loop blocked 5 s is hung and a stalled engine call is condemned after 10 s
#: (a parse here takes ~2 s and blocks the loop for milliseconds).
FLEET4_ENV = {
    "MINERU_ROUTER_HEALTH_PRESET": "fast",
    "MINERU_ROUTER_HEALTH_MAIN_PORT_TIMEOUT_S": "3",
    "MINERU_HEALTH_LOOP_HANG_S": "5",
    "MINERU_HEALTH_STALL_S": "10",
}
_ROUTER4 = (
    "import sys; from mineru.kit.router.cli import main; sys.argv[0] = 'mineru-router'; main()"
)


def text_pdf(pages: int = 2, *, seed: int = 0) -> bytes:
    """A PDF with 40 lines of real text a page; the text names ``seed`` ("Document 7, ...")."""
    return sandbox.make_pdf(
        pages,
        seed=seed,
        lines_per_page=40,
        text=f"Document {seed}, the quick brown fox jumps over the lazy dog",
    )


def text_document(number: int) -> tuple[str, bytes]:
    """Document ``number`` of a 4.0 stream: a two-page :func:`text_pdf` of its own."""
    return f"doc{number}.pdf", text_pdf(2, seed=number)


def _port(url: str) -> str:
    return url.rstrip("/").rsplit(":", 1)[-1]


@functools.cache
def _tls() -> ssl.SSLContext:
    return ssl.create_default_context()


def http(method: str, url: str, timeout_s: float, **kwargs: Any) -> Any:
    """One request: its ``httpx.Response`` (or ``httpx.HTTPError``).

    Every URL here is plain http on loopback; one shared TLS context spares
    httpx building one a call (some 25 ms of CPU on a loaded machine).
    """
    import httpx

    return httpx.request(method, url, timeout=timeout_s, verify=_tls(), **kwargs)


def _status_code(url: str, timeout_s: float = 5.0) -> int:
    import httpx

    try:
        return int(http("GET", url, timeout_s).status_code)
    except httpx.HTTPError:
        return 0


# --- the two lines ----------------------------------------------------------------------------


class Line:
    """One MinerU line as the harness drives it: :data:`LINE3` or :data:`LINE4`."""

    name: ClassVar[str]
    api: ClassVar[str]  # prefix of the job API and of a worker's health path
    terminal: ClassVar[frozenset[str]]
    started: ClassVar[frozenset[str]]  # a task on a worker's slot, not waiting for one
    worker_marker: ClassVar[str]  # in a worker's command line

    @property
    def tasks(self) -> str:
        return f"{self.api}/tasks"

    @property
    def health(self) -> str:
        """A worker's health path on its main port."""
        return f"{self.api}/health"

    def site(self, dest: Path, python: str, *, patched: bool = True, faults: bool = True) -> Path:
        """A copy of MinerU in ``dest`` for ``PYTHONPATH``: patched, and the fault plugin."""
        raise NotImplementedError

    def env(
        self, site: Path, scratch: Path, python: str, extra: Mapping[str, str]
    ) -> dict[str, str]:
        raise NotImplementedError

    def router_argv(self, python: str, port: int, local_gpus: str) -> list[str]:
        raise NotImplementedError

    def worker_argv(self, python: str, port: int, uploads: Path, args: Sequence[str]) -> list[str]:
        raise NotImplementedError

    def request(self, engine_url: str, formats: Sequence[str]) -> dict[str, Any]:
        """What goes with a submission's file (httpx keyword arguments)."""
        raise NotImplementedError

    def rotation(self, base: str) -> tuple[int, dict[str, dict[str, Any]]]:
        """Workers in rotation (-1: no answer) and, on 3.x, the ``/health`` servers by id."""
        raise NotImplementedError


class Line3(Line):
    name = "3"
    api = ""
    terminal = frozenset({"completed", "failed"})
    started = frozenset({"processing"})
    worker_marker = "mineru.cli.fast_api"

    def site(self, dest: Path, python: str, *, patched: bool = True, faults: bool = True) -> Path:
        if patched:
            return sandbox.patched_site(dest, python, faults=faults)
        site = sandbox.copy_mineru(dest, python)
        return sandbox.add_fault_plugin(site) if faults else site

    def env(
        self, site: Path, scratch: Path, python: str, extra: Mapping[str, str]
    ) -> dict[str, str]:
        return sandbox.mineru_env(
            site,
            health_path=_health_path(python, site),
            output_root=scratch / "output",
            extra=extra,
        )

    def router_argv(self, python: str, port: int, local_gpus: str) -> list[str]:
        return [
            python,
            "-m",
            "mineru.cli.router",
            "--host",
            HOST,
            "--port",
            str(port),
            "--local-gpus",
            local_gpus,
        ]

    def worker_argv(self, python: str, port: int, uploads: Path, args: Sequence[str]) -> list[str]:
        return [python, "-m", "mineru.cli.fast_api", "--host", HOST, "--port", str(port), *args]

    def request(self, engine_url: str, formats: Sequence[str]) -> dict[str, Any]:
        return {"data": {"backend": "vlm-http-client", "server_url": engine_url}}

    def rotation(self, base: str) -> tuple[int, dict[str, dict[str, Any]]]:
        import httpx

        try:
            response = http("GET", f"{base}/health", 10.0)
            entries = (
                response.json().get("servers", []) if response.status_code in (200, 503) else []
            )
            servers = {str(s["server_id"]): s for s in entries}
        except (httpx.HTTPError, ValueError, KeyError, TypeError, AttributeError):
            return -1, {}
        # MinerU's own router has no in_rotation: its healthy is the rotation there.
        routable = sum(bool(s.get("in_rotation", s.get("healthy"))) for s in servers.values())
        return (routable if servers else -1), servers


class Line4(Line):
    """MinerU 4.0 on one tier: ``flash`` (:data:`LINE4`: text PDFs, no model) or ``standard``
    (:data:`LINE4_STANDARD`: MinerU's VLM path, on :mod:`mineru_health.demo.engine`'s tiny
    llama.cpp model)."""

    name = "4.0"
    api = "/v1"
    terminal = frozenset({"completed", "partial", "failed", "canceled"})
    started = frozenset({"running"})
    worker_marker = "api-server"

    def __init__(self, tier: str = "flash") -> None:
        self.tier = tier  # of its workers and its jobs

    def site(self, dest: Path, python: str, *, patched: bool = True, faults: bool = True) -> Path:
        return sandbox.patched_site4(dest, python, faults=faults, patched=patched)

    def env(
        self, site: Path, scratch: Path, python: str, extra: Mapping[str, str]
    ) -> dict[str, str]:
        return sandbox.mineru4_env(
            site, scratch, borrow=_health_path(python, site) is not None, extra=extra
        )

    def router_argv(self, python: str, port: int, local_gpus: str) -> list[str]:
        return [
            python,
            "-c",
            _ROUTER4,
            "--host",
            HOST,
            "--port",
            str(port),
            "--local-gpus",
            local_gpus,
            "--worker-tier",
            self.tier,
        ]

    def worker_argv(self, python: str, port: int, uploads: Path, args: Sequence[str]) -> list[str]:
        return sandbox.mineru4_api_command(python, port, uploads, tier=self.tier, args=tuple(args))

    def request(self, engine_url: str, formats: Sequence[str]) -> dict[str, Any]:
        return {"params": [("tier", self.tier), *(("output_formats", f) for f in formats)]}

    def rotation(self, base: str) -> tuple[int, dict[str, dict[str, Any]]]:
        """4.0's ``/v1/usage`` (its own router's too): healthy workers x concurrency 1."""
        import httpx

        try:
            usage = http("GET", f"{base}/v1/usage", 10.0).json()
            return int(usage["limits"]["max_concurrent_jobs"]), {}
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            return -1, {}


LINE3, LINE4, LINE4_STANDARD = Line3(), Line4(), Line4("standard")


@functools.lru_cache(maxsize=8)
def _health_path(python: str, site: Path) -> str | None:
    return sandbox.health_path_for(python, site)


# --- the job API ----------------------------------------------------------------------------


@dataclass
class Outcome:
    """How one document ended: its line's terminal status, "hung" or "rejected" (refused)."""

    name: str
    status: str
    task_id: str = ""
    detail: dict[str, Any] = field(default_factory=dict)  # last status; a refusal's code, body
    number: int = 0  # its place in a Stream, from 0
    elapsed_s: float | None = None  # in a Stream: from its adding to its outcome

    @property
    def attempts(self) -> int:
        return int(self.detail.get("attempts", 1))


@dataclass(frozen=True)
class Unfinished:
    """A document of a :class:`Stream` without an outcome yet (:meth:`Stream.unfinished`)."""

    number: int
    name: str
    status: str  # its last non-terminal status ("": not accepted, or not asked, yet)
    waited_s: float  # since it was added
    running_s: float | None  # since it was first seen started (None: waiting for a slot)


class Client:
    """The job API of a router or a worker (3.x tasks, 4.0 jobs). Thread-safe.

    ``engine_url``: 3.x's VLM server (``vlm-http-client``); ``formats``: 4.0's
    output formats (none: the worker's default).
    """

    def __init__(
        self,
        base: str,
        line: Line,
        *,
        engine_url: str = "",
        formats: Sequence[str] = (),
        timeout_s: float = TASK_TIMEOUT_S,
        poll_s: float = 0.25,
        submit_timeout_s: float = 60.0,
    ) -> None:
        self.base = base
        self.line = line
        self.engine_url = engine_url
        self.formats = tuple(formats)
        self.timeout_s = timeout_s  # a task's wait
        self.poll_s = poll_s
        self.submit_timeout_s = submit_timeout_s
        self.task_ids: list[str] = []  # every task accepted by submit, in order

    def post(
        self,
        name: str,
        pdf: bytes,
        *,
        path: str | None = None,
        formats: Sequence[str] | None = None,
        timeout_s: float = 60.0,
    ) -> Any:
        """One submission as it is answered (an ``httpx.Response``)."""
        shape = self.line.request(self.engine_url, self.formats if formats is None else formats)
        return http(
            "POST",
            f"{self.base}{path or self.line.tasks}",
            timeout_s,
            files={"files": (name, pdf, "application/pdf")},
            **shape,
        )

    def submit(self, name: str, pdf: bytes) -> tuple[str, dict[str, Any]]:
        """The task id, or "" and the refusal: ``{"code", "body"}`` (code 0: no answer)."""
        import httpx

        try:
            response = self.post(name, pdf, timeout_s=self.submit_timeout_s)
        except httpx.HTTPError as exc:
            return "", {"code": 0, "body": f"{type(exc).__name__}: {exc}"}
        if response.status_code != 202:
            return "", {"code": response.status_code, "body": response.text[:2000]}
        task_id = str(response.json().get("task_id", ""))
        self.task_ids.append(task_id)
        return task_id, {}

    def status(self, task_id: str, timeout_s: float = 10.0) -> dict[str, Any]:
        """The task's status, or {} when it does not answer 200."""
        import httpx

        try:
            response = http("GET", f"{self.base}{self.line.tasks}/{task_id}", timeout_s)
            body = response.json() if response.status_code == 200 else {}
        except (httpx.HTTPError, ValueError):
            return {}
        return body if isinstance(body, dict) else {}

    def wait(self, task_id: str, name: str = "", timeout_s: float | None = None) -> Outcome:
        deadline = time.monotonic() + (self.timeout_s if timeout_s is None else timeout_s)
        status: dict[str, Any] = {}
        while time.monotonic() < deadline:
            status = self.status(task_id) or status
            if status.get("status") in self.line.terminal:
                return Outcome(name, str(status["status"]), task_id, status)
            time.sleep(self.poll_s)
        return Outcome(name, "hung", task_id, status)

    def run(self, name: str, pdf: bytes) -> Outcome:
        task_id, refusal = self.submit(name, pdf)
        return self.wait(task_id, name) if task_id else Outcome(name, "rejected", "", refusal)

    def file_parse(self, name: str, pdf: bytes) -> Outcome:
        """The synchronous ``file_parse``: completed (with the task's status) or failed."""
        import httpx

        try:
            response = self.post(
                name, pdf, path=f"{self.line.api}/file_parse", timeout_s=self.timeout_s
            )
        except httpx.HTTPError as exc:
            return Outcome(name, "failed", "", {"code": 0, "body": f"{type(exc).__name__}: {exc}"})
        task_id = response.headers.get("X-MinerU-Task-Id", "")
        if response.status_code == 200:
            return Outcome(name, "completed", task_id, self.status(task_id))
        return Outcome(
            name, "failed", task_id, {"code": response.status_code, "body": response.text[:2000]}
        )

    def result(self, task_id: str) -> Any:
        """``GET .../tasks/<id>/result`` as answered (an ``httpx.Response``)."""
        return http("GET", f"{self.base}{self.line.tasks}/{task_id}/result", 60.0)


class Stream:
    """Documents through a client, each followed to its end (a context manager). Thread-safe.

    ``add`` submits one on a pool thread; with ``every_s`` a thread of its own
    adds ``document(n)`` every ``every_s`` seconds, ``count`` of them (None:
    until ``stop``); with ``file_parse_every`` k, document n goes through the
    synchronous ``file_parse`` when n % k == 1. One thread asks for the status
    of every unfinished one each ``poll_s``; one not terminal
    ``task_timeout_s`` after its submission is hung (None: only the bound of
    :meth:`outcomes`). With ``in_flight`` n the feeding thread keeps at most n
    documents without an outcome: the next goes when one ends (and not sooner
    than ``every_s`` after the last), so a slow fleet sets the pace;
    :meth:`unfinished` says where the others stand.
    """

    def __init__(
        self,
        client: Client,
        document: Callable[[int], tuple[str, bytes]],
        *,
        every_s: float | None = None,
        count: int | None = None,
        file_parse_every: int = 0,
        task_timeout_s: float | None = TASK_TIMEOUT_S,
        poll_s: float = 0.5,
        in_flight: int | None = None,
    ) -> None:
        if in_flight is not None and in_flight < 1:
            raise ValueError(f"in_flight must be at least 1, not {in_flight}")
        self.client = client
        self.document = document
        self.every_s = every_s
        self.count = count
        self.file_parse_every = file_parse_every
        self.task_timeout_s = task_timeout_s
        self.poll_s = poll_s
        self.in_flight = in_flight
        self.most_in_flight = 0  # the most documents ever without an outcome at once
        self._lock = threading.Lock()
        self._names: list[str] = []
        self._outcomes: list[Outcome | None] = []
        self._pending: dict[int, tuple[str, float]] = {}  # number -> task id, deadline
        self._added_at: list[float] = []  # monotonic, by number
        # number -> its last non-terminal status, and since when it was seen started
        # (None: waiting for a slot); only for documents without an outcome
        self._last: dict[int, tuple[str, float | None]] = {}
        self._stop = threading.Event()
        self._closed = threading.Event()
        self._pool = ThreadPoolExecutor(max_workers=16)
        self._follower = threading.Thread(target=self._follow, daemon=True)
        self._feeder = threading.Thread(target=self._feed, daemon=True) if every_s else None

    def __enter__(self) -> Self:
        self._follower.start()
        if self._feeder is not None:
            self._feeder.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self._closed.set()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._follower.join(timeout=30)

    @property
    def submitted(self) -> int:
        return len(self._names)

    def wait_submitted(self, count: int, timeout_s: float = 60.0) -> None:
        if not wait_until(lambda: self.submitted >= count, timeout_s, 0.05):
            raise SandboxError(f"only {self.submitted} of {count} documents submitted")

    def add(self, document: tuple[str, bytes] | None = None, *, file_parse: bool = False) -> int:
        """Submits ``document`` (default: the stream's next); returns its number."""
        with self._lock:
            number = len(self._names)
            name, pdf = document if document is not None else self.document(number)
            self._names.append(name)
            self._outcomes.append(None)
            self._added_at.append(time.monotonic())
            self.most_in_flight = max(self.most_in_flight, self._outcomes.count(None))
        self._pool.submit(self._send, number, name, pdf, file_parse)
        return number

    def stop(self) -> None:
        """No more documents from the feeding thread (bounded join)."""
        self._stop.set()
        if self._feeder is not None and self._feeder.is_alive():
            self._feeder.join(timeout=180)

    def ended(self) -> list[Outcome]:
        """The documents with an outcome so far, in the order they were added."""
        with self._lock:
            return [o for o in self._outcomes if o is not None]

    def completed(self) -> list[Outcome]:
        return [o for o in self.ended() if o.status == "completed"]

    def unfinished(self) -> list[Unfinished]:
        """The documents without an outcome yet, as their last status showed them."""
        now = time.monotonic()
        with self._lock:
            return [
                Unfinished(n, self._names[n], *self._where(n, now))
                for n, o in enumerate(self._outcomes)
                if o is None
            ]

    def _where(self, number: int, now: float) -> tuple[str, float, float | None]:
        status, since = self._last.get(number, ("", None))
        return status, now - self._added_at[number], None if since is None else now - since

    def outcomes(self, timeout_s: float | None = None) -> list[Outcome]:
        """Every document's outcome once the feed ended (``count`` reached, or stopped now
        when endless) and each is terminal or hung, or ``timeout_s`` passed (then hung)."""
        if self._feeder is not None:
            if self.count is None:
                self.stop()
            self._feeder.join(timeout=(self.count or 0) * (self.every_s or 0) + 60.0)
        limit = timeout_s if timeout_s is not None else (self.task_timeout_s or 0) + 120.0
        wait_until(lambda: None not in self._outcomes, limit, 0.2)
        with self._lock:
            return [
                o or Outcome(self._names[n], "hung", number=n) for n, o in enumerate(self._outcomes)
            ]

    def _set(self, number: int, outcome: Outcome) -> None:
        outcome.number = number
        with self._lock:
            outcome.elapsed_s = time.monotonic() - self._added_at[number]
            self._pending.pop(number, None)
            self._last.pop(number, None)
            self._outcomes[number] = outcome

    def _send(self, number: int, name: str, pdf: bytes, file_parse: bool) -> None:
        if file_parse:
            self._set(number, self.client.file_parse(name, pdf))
            return
        task_id, refusal = self.client.submit(name, pdf)
        if not task_id:
            self._set(number, Outcome(name, "rejected", "", refusal))
            return
        timeout = math.inf if self.task_timeout_s is None else self.task_timeout_s
        with self._lock:
            self._pending[number] = (task_id, time.monotonic() + timeout)

    def _follow(self) -> None:
        while not self._closed.is_set():
            with self._lock:
                pending = dict(self._pending)
            for number, (task_id, deadline) in pending.items():
                status = self.client.status(task_id)
                if status.get("status") in self.client.line.terminal:
                    self._set(
                        number, Outcome(self._names[number], str(status["status"]), task_id, status)
                    )
                elif time.monotonic() > deadline:
                    self._set(number, Outcome(self._names[number], "hung", task_id, status))
                elif status.get("status"):
                    self._note(number, str(status["status"]))
            self._closed.wait(self.poll_s)

    def _note(self, number: int, status: str) -> None:
        """A document's non-terminal status; when it was first seen started, since it waited."""
        started = status in self.client.line.started
        with self._lock:
            if self._outcomes[number] is not None:
                return
            since = self._last.get(number, ("", None))[1]
            self._last[number] = (status, (since or time.monotonic()) if started else None)

    def _feed(self) -> None:
        k = self.file_parse_every
        while not self._stop.is_set() and (self.count is None or self.submitted < self.count):
            if self.in_flight is not None and len(self.unfinished()) >= self.in_flight:
                self._stop.wait(0.05)  # until one ends (or the stream stops)
                continue
            self.add(file_parse=bool(k) and self.submitted % k == 1)
            self._stop.wait(self.every_s or 0)


# --- a router and its workers, one worker -------------------------------------------------------


@dataclass
class Router:
    """A started ``mineru-router`` and its local workers (see :func:`start_router`)."""

    line: Line
    proc: ManagedProcess
    scratch: Path  # its log, audit file, fault plans and workers' output
    workers: int
    fault_plan: str | None = None  # MINERU_HEALTH_FAULT_PLAN, relative to scratch

    @property
    def base(self) -> str:
        return self.proc.base_url

    @property
    def audit(self) -> Path:
        return self.scratch / "audit.jsonl"

    def servers(self) -> dict[str, dict[str, Any]]:
        """3.x: the router's ``/health`` servers by id ({} while it does not answer); 4.0: {}."""
        return self.line.rotation(self.base)[1]

    def routable(self) -> int:
        """Workers the router routes work to now (-1: no answer)."""
        return self.line.rotation(self.base)[0]

    def wait_in_rotation(self, timeout_s: float = START_TIMEOUT_S) -> dict[str, dict[str, Any]]:
        """Until every worker is in rotation; returns :meth:`servers` as they were then."""
        seen: list[dict[str, dict[str, Any]]] = []

        def up() -> bool:
            if self.proc.poll() is not None:
                raise SandboxError(f"the router exited:\n{self.proc.log_tail()}")
            routable, servers = self.line.rotation(self.base)
            seen[:] = [servers]
            return routable == self.workers

        if not wait_until(up, timeout_s, 0.5):
            raise SandboxError(
                f"the router's workers were not in rotation within "
                f"{timeout_s:.0f} s:\n{self.proc.log_tail()}"
            )
        return seen[0]

    def wait_restarted(self, server_id: str, old_url: str, timeout_s: float = 180.0) -> None:
        """Until ``server_id`` is in rotation again on a new process (a new URL); 3.x."""

        def restarted() -> bool:
            entry = self.servers().get(server_id, {})
            return bool(entry.get("in_rotation")) and entry.get("base_url") != old_url

        if not wait_until(restarted, timeout_s, 0.5):
            raise SandboxError(
                f"{server_id} was not restarted: {self.servers()}\n{self.proc.log_tail()}"
            )

    def audit_records(self, since: float = 0.0) -> list[dict[str, Any]]:
        """The audit file's records at or after unix time ``since``."""
        if not self.audit.is_file():
            return []
        records = [
            json.loads(line)
            for line in self.audit.read_text(encoding="utf-8").splitlines()
            if line.strip()
        ]
        return [r for r in records if datetime.fromisoformat(r["time"]).timestamp() >= since]

    def worker_pids(self, ports: Iterable[str] | None = None) -> list[int]:
        """pids of its line's workers (command lines from /proc): those on ``ports`` (whoever
        their parent), else its children now."""
        wanted = None if ports is None else set(ports)
        found = []
        for entry in Path("/proc").iterdir():
            try:
                pid = int(entry.name)  # not a process: ValueError
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            port = self._worker_port(pid)
            if port is not None and (
                (port in wanted) if wanted is not None else ppid == self.proc.pid
            ):
                found.append(pid)
        return sorted(found)

    def _worker_port(self, pid: int) -> str | None:
        """The ``--port`` of process ``pid`` if it is one of its line's workers ("": none)."""
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode("utf-8", "replace")
        except OSError:
            return None
        args = argv.split("\0")
        if not any(self.line.worker_marker in arg for arg in args):
            return None
        return args[args.index("--port") + 1] if "--port" in args[:-1] else ""

    def worker_url(self, pid: int) -> str:
        """The main URL of worker process ``pid`` ("" when it is gone, or no worker)."""
        port = self._worker_port(pid)
        return f"http://{HOST}:{port}" if port else ""

    def worker_pid(self, url: str) -> int | None:
        pids = self.worker_pids({_port(url)})
        return pids[0] if pids else None

    def plan(self, worker_url: str = "") -> Path:
        """The fault plan file, of the worker at ``worker_url`` when the plan names its port."""
        if self.fault_plan is None:
            raise SandboxError("this router was started without a fault plan")
        if "{port}" in self.fault_plan and not worker_url:
            raise ValueError(f"the plan {self.fault_plan!r} is per worker: name the worker")
        return self.scratch / self.fault_plan.replace("{port}", _port(worker_url))

    def write_plan(self, word: str, worker_url: str = "") -> Path:
        path = self.plan(worker_url)
        write_plan(path, word)
        return path

    def metric_samples(self, *names: str) -> list[Any]:
        """The samples of the router's ``/metrics`` named one of ``names`` (one scrape)."""
        from prometheus_client.parser import text_string_to_metric_families

        response = http("GET", f"{self.base}/metrics", 10.0)
        if response.status_code != 200:
            raise SandboxError(f"/metrics answered {response.status_code}")
        return [
            sample
            for family in text_string_to_metric_families(response.text)
            for sample in family.samples
            if sample.name in names
        ]

    def metric(self, name: str, **labels: str) -> float:
        """The sum of the samples ``name`` with these labels."""
        return float(
            sum(
                s.value
                for s in self.metric_samples(name)
                if all(s.labels.get(k) == v for k, v in labels.items())
            )
        )


def start_router(
    procs: Processes,
    line: Line,
    site: Path,
    python: str,
    scratch: Path,
    *,
    env: Mapping[str, str] | None = None,
    fault_plan: str | None = None,
    local_gpus: str = "0,1",
    stdin_pipe: bool = False,
) -> Router:
    """``mineru-router`` from ``site`` with its own local workers, on a free loopback port.

    Its log, audit file (``MINERU_ROUTER_HEALTH_AUDIT_PATH``) and the workers'
    output go in ``scratch`` (made); ``fault_plan`` (e.g. ``plan-{port}``, one
    per worker) is ``MINERU_HEALTH_FAULT_PLAN`` there. ``env`` comes last. Not
    waited for: :meth:`Router.wait_in_rotation`.
    """
    scratch.mkdir(parents=True, exist_ok=True)
    extra = {"MINERU_ROUTER_HEALTH_AUDIT_PATH": str(scratch / "audit.jsonl")}
    if fault_plan is not None:
        extra[FAULT_PLAN_ENV] = str(scratch / fault_plan)
    port = free_port()
    proc = procs.start(
        "mineru-router",
        line.router_argv(python, port, local_gpus),
        env=line.env(site, scratch, python, {**extra, **(env or {})}),
        log_path=scratch / "router.log",
        cwd=scratch,
        stdin_pipe=stdin_pipe,
    )
    proc.base_url = f"http://{HOST}:{port}"
    return Router(line, proc, scratch, len(local_gpus.split(",")), fault_plan)


@contextlib.contextmanager
def fleet(
    line: Line,
    scratch: Path,
    python: str,
    *,
    site: Path | None = None,
    patched: bool = True,
    env: Mapping[str, str] | None = None,
    fault_plan: str | None = "plan",
    timeout_s: float = START_TIMEOUT_S,
) -> Iterator[Router]:
    """:func:`start_router` in processes of its own, both workers in rotation; all reaped after.

    ``site`` defaults to a copy in ``scratch``, ``patched`` or MinerU's own
    (the fault plugin either way).
    """
    site = site or line.site(scratch / "mineru-site", python, patched=patched)
    with Processes() as procs:
        router = start_router(procs, line, site, python, scratch, env=env, fault_plan=fault_plan)
        router.wait_in_rotation(timeout_s)
        yield router


@dataclass
class Worker:
    """A started ``mineru-api`` (see :func:`start_worker`)."""

    line: Line
    proc: ManagedProcess
    native_url: str  # its native endpoint ("" unless asked for)
    plan: Path  # its fault plan file, when asked for
    client: Client

    @property
    def base_url(self) -> str:
        return self.proc.base_url

    def get(self, path: str, timeout_s: float = 10.0) -> Any:
        return http("GET", f"{self.base_url}{path}", timeout_s)

    def native(self, path: str = "/health", timeout_s: float = 5.0) -> Any:
        return http("GET", f"{self.native_url}{path}", timeout_s)

    def submit(
        self,
        pdf: bytes,
        *,
        path: str | None = None,
        name: str = "doc.pdf",
        formats: Sequence[str] = ("markdown",),
        timeout_s: float = 60.0,
    ) -> Any:
        return self.client.post(name, pdf, path=path, formats=formats, timeout_s=timeout_s)

    def job(self, task_id: str) -> dict[str, Any]:
        """The task's status; raises unless it answers 200."""
        # 4.0 answers on the loop it blocks for most of a minute after a large job.
        response = self.get(f"{self.line.tasks}/{task_id}", 600.0)
        if response.status_code != 200:
            raise SandboxError(f"{task_id}: {response.status_code} {response.text[:500]}")
        body: dict[str, Any] = response.json()
        return body

    def wait_terminal(self, task_id: str, timeout_s: float = 300.0) -> dict[str, Any]:
        """Until the task is terminal (every status answered 200); its status then."""

        def terminal() -> dict[str, Any] | None:
            body = self.job(task_id)
            return body if body.get("status") in self.line.terminal else None

        body = wait_until(terminal, timeout_s, 0.2)
        if not body:
            raise SandboxError(f"job {task_id} did not finish:\n{self.proc.log_tail()}")
        result: dict[str, Any] = body
        return result


def start_worker(
    procs: Processes,
    line: Line,
    site: Path,
    python: str,
    scratch: Path,
    *,
    env: Mapping[str, str] | None = None,
    native: bool = False,
    faults: bool = False,
    args: Sequence[str] = (),
    uploads: Path | None = None,
    engine_url: str = "",
    wait: bool = True,
    timeout_s: float = START_TIMEOUT_S,
    name: str = "mineru-api",
) -> Worker:
    """One ``mineru-api`` from ``site`` on a free loopback port; its files in ``scratch`` (made).

    ``native``: its native endpoint on a port of its own (``MINERU_HEALTH_PORT``);
    ``faults``: its fault plan is ``scratch/fault-plan``. Waits until its health
    answers 200 unless not ``wait``. A port another process takes before the
    worker binds it (other suites on a shared machine): a new one, three tries.
    """
    scratch.mkdir(parents=True, exist_ok=True)
    plan = scratch / "fault-plan"
    extra = {FAULT_PLAN_ENV: str(plan)} if faults else {}
    native_url = ""
    if native:
        native_port = free_port()
        extra["MINERU_HEALTH_PORT"] = str(native_port)
        native_url = f"http://{HOST}:{native_port}"
    full_env = line.env(site, scratch, python, {**extra, **(env or {})})
    for attempt in range(3):
        port = free_port()
        argv = line.worker_argv(python, port, uploads or scratch / "uploads", args)
        proc = procs.start(
            name, argv, env=full_env, log_path=scratch / f"{name}-{attempt}.log", cwd=scratch
        )
        proc.base_url = f"http://{HOST}:{port}"
        worker = Worker(
            line, proc, native_url, plan, Client(proc.base_url, line, engine_url=engine_url)
        )
        if not wait:
            return worker

        def up(p: ManagedProcess = proc) -> bool:
            return p.poll() is not None or _status_code(f"{p.base_url}{line.health}", 2.0) == 200

        if wait_until(up, timeout_s, 0.2) and proc.poll() is None:
            return worker
        if "address already in use" not in proc.log_tail():
            break
    raise SandboxError(f"{name} did not start:\n{proc.log_tail()}")


def start_fake_vlm(
    procs: Processes,
    scratch: Path,
    python: str = sys.executable,
    env: Mapping[str, str] | None = None,
) -> str:
    """The fake OpenAI-compatible VLM server on a free port; its URL once it answers."""
    port = free_port()
    url = f"http://{HOST}:{port}"
    proc = procs.start(
        "fake-vlm",
        sandbox.fake_vlm_command(python, port),
        env=dict(os.environ if env is None else env),
        log_path=scratch / f"fake-vlm-{port}.log",
        cwd=scratch,
    )
    if not wait_until(lambda: _status_code(f"{url}/v1/models", 2.0) == 200, 60.0, 0.1):
        raise SandboxError(f"the fake VLM server did not start:\n{proc.log_tail()}")
    return url


# --- the fault run ------------------------------------------------------------------------------
