"""MinerU 4.0's router answers for another router's jobs from the shared store (issue 35).

``mineru4/router/shared.py``'s middleware in front of a small ASGI app that reads routes
as 4.0's does (``registry.find``; a job route that is ``upstream_lost`` answered from its
payload), with a fake shared store holding another router's row: a status and a file's
content are answered from that row's routes, lent only to that request; a cancel is
409 naming the owner; a store that cannot be read is 503 with Retry-After, never 404;
another caller's job, this router's own row, and an id no row has stay 4.0's 404.
"""

from __future__ import annotations

import asyncio
import copy
import json
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import httpx
from mineru_health.mineru4.router.shared import (
    CHANGE,
    RESULT,
    STATUS,
    AnotherRoutersJobs,
    Asked,
    asked,
)
from mineru_health.runtime.router.store import Saved
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

WORKER_URL = "http://127.0.0.1:9001"
CALLER = "anonymous"


@dataclass
class Route:  # 4.0's ResourceRoute, its fields
    kind: str
    public_id: str
    owner_scope: str
    worker_id: str
    upstream_id: str
    created_at: str = "2026-01-01T00:00:00Z"
    metadata: dict[str, Any] = field(default_factory=dict)


class Registry:
    def __init__(self) -> None:
        self.routes: dict[tuple[str, str], Route] = {}

    def find(self, kind: str, public_id: str) -> Route | None:
        return self.routes.get((kind, public_id))


class ProxyError(Exception):
    def __init__(self, status_code: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status_code, self.code, self.message = status_code, code, message


def job_row(key: str = "job-1", status: str = "queued", scope: str = CALLER) -> Saved:
    payload = {"job_id": key, "status": status, "files": []}
    files = [
        {
            "public_id": "file-out",
            "owner_scope": scope,
            "worker_id": "remote-0",
            "upstream_id": "up-file-out",
            "created_at": "2026-01-01T00:00:00Z",
            "payload": None,
        }
    ]
    record = {
        "route": {
            "public_id": key,
            "owner_scope": scope,
            "worker_id": "remote-0",
            "upstream_id": f"up-{key}",
            "created_at": "2026-01-01T00:00:00Z",
            "payload": payload,
        },
        "files": files,
    }
    return Saved(key, status, "remote-0", f"up-{key}", WORKER_URL, ["remote-0"], "", None, record)


class Store:
    """The shared store's reads: another router's rows, by key and by a name in them."""

    router_id = "router-b"

    def __init__(self, *rows: tuple[str, Saved]) -> None:
        self.rows = list(rows)
        self.failing: Exception | None = None

    def row(self, key: str) -> tuple[str, Saved] | None:
        if self.failing is not None:
            raise self.failing
        return next(((o, s) for o, s in self.rows if s.key == key), None)

    def row_naming(self, word: str) -> tuple[str, Saved] | None:
        if self.failing is not None:
            raise self.failing
        return next(
            ((o, s) for o, s in self.rows if json.dumps(word) in json.dumps(s.record)), None
        )


class World:
    """Router b: its registry (empty), its pool (the shared worker), the line's namespace,
    and the inner app standing for 4.0's routes."""

    def __init__(self, store: Store, worker_url: str = WORKER_URL) -> None:
        self.registry = Registry()
        self.fetched: list[str] = []
        self.worker_jobs: dict[str, dict[str, Any]] = {}  # upstream id -> the worker's payload
        worker = SimpleNamespace(worker_id="remote-0", base_url=worker_url, generation=1)
        fleet = SimpleNamespace(client=SimpleNamespace(get=self._status))
        pool = SimpleNamespace(workers=[worker], get=lambda worker_id: worker, fleet=fleet)
        supervisor = SimpleNamespace(
            store=store, find=lambda key: None, retry_after_s=2, status_timeout_s=1.0
        )
        namespace = {
            "_caller_scope": lambda request: request.headers.get("authorization") or CALLER,
            "ResourceRoute": Route,
            "JSONResponse": JSONResponse,
            "RouterProxyError": ProxyError,
            "request_upstream": self._upstream,
            "_successful_json": lambda upstream: upstream.json(),
        }
        line = SimpleNamespace(supervisor=supervisor, pool=pool, namespace=namespace)
        self.app = AnotherRoutersJobs(self._routes, line=line, registry=self.registry)

    async def _upstream(self, pool: Any, worker: Any, method: str, path: str, **_: Any) -> Any:
        self.fetched.append(f"{method} {worker.base_url}{path}")
        return httpx.Response(200, json={"id": path.split("/")[3], "object": "file"})

    async def _status(self, url: str, timeout: float) -> httpx.Response:
        self.fetched.append(f"GET {url}")
        job = self.worker_jobs.get(url.rsplit("/", 1)[1])
        request = httpx.Request("GET", url)
        return httpx.Response(200 if job else 404, json=job or {}, request=request)

    async def _routes(self, scope: Any, receive: Any, send: Any) -> None:
        """4.0's routes as they read a route: 404 when the registry does not find it."""
        question = asked(scope["method"], scope["path"])
        assert question is not None
        route = self.registry.find(question.kind, question.public_id)
        if route is None or route.owner_scope != Request(scope).headers.get(
            "authorization", CALLER
        ):
            response: Response = JSONResponse({"error": {"code": "not_found"}}, status_code=404)
        elif route.metadata.get("upstream_lost"):
            response = JSONResponse(copy.deepcopy(route.metadata["payload"]))
        else:
            response = JSONResponse({"from": route.worker_id, "file": route.upstream_id})
        await response(scope, receive, send)

    def ask(self, method: str, path: str, **headers: str) -> httpx.Response:
        async def go() -> httpx.Response:
            transport = httpx.ASGITransport(app=self.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://b") as client:
                return await client.request(method, path, headers=headers)

        return asyncio.run(go())


def test_requests_name_a_job_or_a_file_and_what_they_ask() -> None:
    assert asked("GET", "/v1/parse/jobs/job-1") == Asked("job", "job-1", STATUS)
    assert asked("GET", "/v1/tasks/job-1") == Asked("job", "job-1", STATUS)
    assert asked("GET", "/v1/tasks/job-1/result") == Asked("job", "job-1", RESULT)
    assert asked("DELETE", "/v1/tasks/job-1") == Asked("job", "job-1", CHANGE)
    assert asked("GET", "/v1/files/file-1/content") == Asked("file", "file-1", RESULT)
    assert asked("DELETE", "/v1/files/file-1") == Asked("file", "file-1", CHANGE)
    assert asked("GET", "/v1/files/file-1") == Asked("file", "file-1", "metadata")
    for method, path in [
        ("POST", "/v1/tasks"),
        ("GET", "/v1/parse/jobs"),
        ("POST", "/v1/parse/jobs/job-1"),
        ("DELETE", "/v1/files/file-1/content"),
        ("GET", "/v1/health"),
    ]:
        assert asked(method, path) is None, (method, path)


def test_another_routers_job_is_answered_from_its_row_and_its_file_from_its_worker() -> None:
    world = World(Store(("router-a", job_row())))
    status = world.ask("GET", "/v1/tasks/job-1")
    assert status.status_code == 200 and status.json()["status"] == "queued"  # the row's
    # Its worker runs it now: that word shows, nothing else of the worker's payload.
    world.worker_jobs["up-job-1"] = {"status": "running", "started_at": "t1", "files": ["x"]}
    running = world.ask("GET", "/v1/parse/jobs/job-1").json()
    assert running == {"job_id": "job-1", "status": "running", "started_at": "t1", "files": []}
    world.worker_jobs["up-job-1"] = {"status": "failed"}  # the owner's to judge
    assert world.ask("GET", "/v1/parse/jobs/job-1").json()["status"] == "queued"
    content = world.ask("GET", "/v1/files/file-out/content")
    assert content.json() == {"from": "remote-0", "file": "up-file-out"}
    metadata = world.ask("GET", "/v1/files/file-out")
    assert metadata.json() == {"id": "file-out", "object": "file"}  # the public id
    assert world.fetched == [
        *[f"GET {WORKER_URL}/v1/parse/jobs/up-job-1"] * 3,
        f"GET {WORKER_URL}/v1/files/up-file-out",
    ]
    # Lent for those requests only: router b's registry holds nothing of it.
    assert world.registry.find("job", "job-1") is None and world.registry.routes == {}


def test_a_cancel_is_the_owners_and_an_ended_jobs_is_refused_as_4_0_does() -> None:
    world = World(Store(("router-a", job_row()), ("router-a", job_row("job-2", "completed"))))
    refused = world.ask("DELETE", "/v1/parse/jobs/job-1")
    assert refused.status_code == 409 and refused.headers["retry-after"] == "2"
    error = refused.json()["error"]
    assert error["code"] == "owned_by_another_router" and "'router-a'" in error["message"]
    ended = world.ask("DELETE", "/v1/tasks/job-2")
    assert (ended.status_code, ended.json()["error"]["code"]) == (409, "job_already_terminal")
    assert world.ask("DELETE", "/v1/files/file-out").status_code == 409
    assert world.fetched == []


def test_an_unreadable_store_is_503_with_retry_after_never_404() -> None:
    store = Store(("router-a", job_row()))
    store.failing = OSError("connection refused")
    world = World(store)
    for path in ("/v1/parse/jobs/job-1", "/v1/files/file-out/content"):
        answer = world.ask("GET", path)
        assert answer.status_code == 503 and answer.headers["retry-after"] == "2", path
        assert answer.json()["error"]["code"] == "store_unreachable"


def test_what_is_no_other_routers_for_this_caller_stays_4_0s_404() -> None:
    world = World(
        Store(("router-b", job_row("mine")), ("router-a", job_row("theirs", scope="auth:x")))
    )
    assert world.ask("GET", "/v1/parse/jobs/mine").status_code == 404  # this router's own
    assert world.ask("GET", "/v1/parse/jobs/theirs").status_code == 404  # another caller's
    assert world.ask("DELETE", "/v1/parse/jobs/theirs").status_code == 404
    assert world.ask("GET", "/v1/parse/jobs/theirs", authorization="auth:x").status_code == 200
    assert world.ask("GET", "/v1/parse/jobs/none").status_code == 404


def test_a_result_on_another_routers_own_worker_is_503_not_this_routers_worker() -> None:
    # Router b's remote-0 is not at the URL the row names (another router's local worker).
    world = World(
        Store(("router-a", job_row("job-1", "completed")), ("router-a", job_row("job-2"))),
        "http://127.0.0.1:9",
    )
    for path in ("/v1/tasks/job-1/result", "/v1/files/file-out/content"):
        answer = world.ask("GET", path)
        assert answer.status_code == 503 and answer.headers["retry-after"] == "2", path
        assert answer.json()["error"]["code"] == "worker_of_another_router"
    assert world.ask("GET", "/v1/tasks/job-1").json()["status"] == "completed"  # the row's
    assert world.ask("GET", "/v1/tasks/job-2").json()["status"] == "queued"  # the row's
    assert world.fetched == []  # nothing asked of a worker that is not this router's
