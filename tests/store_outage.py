"""The router's PostgreSQL stopped under a stream of submissions, then started (issue 35).

    with own_postgres() as server: ...              # a PostgreSQL of the test's own
    run = stop_and_start(router, client, document, server)
    run = stop_and_start(router, Spread(clients), document, server, accepting=3)

``stop_and_start``: ``document(n)`` is submitted every ``EVERY_S`` to the router, one
after another; once 3 are accepted the database is stopped (``pg_ctl stop -m fast``),
submissions go on for ``DOWN_S`` (each answer recorded, with the tasks accepted before
asked for meanwhile), the database is started again, and submissions go on until
``accepting`` in a row are accepted (bounded), then 2 more; every accepted one is followed
to its end. Either line; every wait is bounded; nothing is timed. :class:`Spread` spreads
the stream over several routers in turn (each job asked of the router that accepted it).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mineru_health.demo.fleet import Client, Outcome, Router

__all__ = [
    "DOWN_S",
    "EVERY_S",
    "OutageRun",
    "Spread",
    "assert_kept_by_each_router",
    "own_postgres",
    "stop_and_start",
]

#: Seconds between two submissions, and of submissions while the database is down.
EVERY_S = 0.2
#: As issue 35 asks, and longer than the router's lease (LEASE_S, 15 s): the router's own
#: lease lapses in the database meanwhile, and it goes on driving what it kept.
DOWN_S = 20.0

Answer = tuple[int, str, str]  # (status, Retry-After, body of a refusal)


def own_postgres() -> contextlib.AbstractContextManager[Any]:
    """A PostgreSQL of the test's own (it is stopped and started again); skips without."""
    from harness.postgres import running

    return running()


@dataclass
class OutageRun:
    before: list[Answer] = field(default_factory=list)  # the database up
    down: list[Answer] = field(default_factory=list)  # stopped
    back: list[Answer] = field(default_factory=list)  # started again
    statuses_while_down: dict[str, dict[str, Any]] = field(default_factory=dict)
    health_while_down: dict[str, Any] = field(default_factory=dict)
    outcomes: list[Outcome] = field(default_factory=list)

    @property
    def answers(self) -> list[Answer]:
        return [*self.before, *self.down, *self.back]

    @property
    def lost(self) -> list[tuple[str, str]]:
        return [(o.task_id, o.status) for o in self.outcomes if o.status != "completed"]


class Spread:
    """Submissions through several routers' clients in turn; a job is asked of its own."""

    def __init__(self, clients: list[Client]) -> None:
        self.clients = clients
        self.task_ids: list[str] = []  # every job accepted, in order (stop_and_start's)
        self.router_of: dict[str, int] = {}  # job id -> the client that it was accepted by
        self._posted = 0

    def post(self, name: str, pdf: bytes, *, timeout_s: float) -> Any:
        n = self._posted % len(self.clients)
        self._posted += 1
        response = self.clients[n].post(name, pdf, timeout_s=timeout_s)
        if response.status_code == 202:
            body = response.json()
            self.router_of[str(body.get("task_id") or body.get("job_id"))] = n
        return response

    def status(self, task_id: str) -> dict[str, Any]:
        return self.clients[self.router_of[task_id]].status(task_id)

    def wait(self, task_id: str, timeout_s: float) -> Outcome:
        return self.clients[self.router_of[task_id]].wait(task_id, timeout_s=timeout_s)


def stop_and_start(
    router: Router,
    client: Client | Spread,
    document: Callable[[int], tuple[str, bytes]],
    server: Any,
    health: Callable[[], dict[str, Any]] = dict,
    *,
    accepting: int = 1,
) -> OutageRun:
    run = OutageRun()

    def send(into: list[Answer], count: int, until: Callable[[], bool]) -> None:
        for _ in range(count):  # bounded; each answer within the client's timeout
            response = client.post(*document(len(run.answers)), timeout_s=30.0)
            retry = response.headers.get("retry-after", "")
            if response.status_code == 202:
                body = response.json()
                client.task_ids.append(str(body.get("task_id") or body.get("job_id")))
                into.append((202, retry, ""))
            else:
                into.append((response.status_code, retry, response.text[:500]))
            if until():
                return
            time.sleep(EVERY_S)

    # Until 3 are accepted (4.0 may answer 503 until it has read its worker's capabilities).
    send(run.before, 50, lambda: sum(1 for c, _, _ in run.before if c == 202) >= 3)
    accepted = list(client.task_ids)
    server.pause()
    stopped = time.monotonic()
    send(run.down, 1000, lambda: time.monotonic() - stopped >= DOWN_S)
    for task_id in accepted:  # what the router holds is answered meanwhile
        run.statuses_while_down[task_id] = client.status(task_id)
    run.health_while_down = health()
    server.resume()
    # At most ~40 s of answers, until the last ``accepting`` (a Spread's every router) are.
    send(run.back, 200, lambda: [c for c, _, _ in run.back[-accepting:]] == [202] * accepting)
    send(run.back, 2, lambda: False)
    run.outcomes = [client.wait(task_id, timeout_s=120.0) for task_id in client.task_ids]
    return run


def assert_kept_by_each_router(
    run: OutageRun, routers: list[Router], spread: Spread, refusal: str
) -> list[str]:
    """What both lines' three-router outage tests check of ``run``: refused while down (503,
    Retry-After, ``refusal`` in each body, naming the database), each router's health saying
    so, accepting again, nothing lost, every router used, the refusals counted, and no live
    router's submissions taken over (each lease lapsed and was taken anew). Returns the
    routers' logs."""
    logs = [router.proc.log_tail(200000) for router in routers]
    assert [code for code, _, _ in run.before].count(202) == 3, run.before
    assert run.down and {code for code, _, _ in run.down} == {503}, (run.down, logs)
    assert all(retry.isdigit() for _, retry, _ in run.down), run.down
    assert all(refusal in body for *_, body in run.down), run.down
    assert "127.0.0.1" in run.down[-1][2], run.down[-1]
    for body in run.health_while_down.values():
        assert body.get("store", {}).get("reachable") is False, run.health_while_down
    assert {code for code, _, _ in run.back} <= {202, 503}, run.back
    assert [code for code, _, _ in run.back[-3:]] == [202] * 3, run.back
    assert run.lost == [], (run.lost, [log[-3000:] for log in logs])
    assert set(spread.router_of.values()) == set(range(len(routers))), spread.router_of
    refused = sum(1 for code, _, body in run.answers if "cannot be reached" in body)
    total = sum(r.metric("mineru_router_store_unreachable_refusals_total") for r in routers)
    assert total == refused, (total, refused)
    for n, router in enumerate(routers):
        assert "taken over from router" not in logs[n], logs[n][-3000:]
        assert router.metric("mineru_router_takeovers_total") == 0, n
        assert router.metric("mineru_router_task_resubmissions_total") == 0, n
    return logs
