# ruff: noqa: F811 - the fixtures are imported from mineru4_support and named as parameters
"""A paused 4.0 router is fenced and rejoins (issue 35): ``SIGSTOP`` past its lease, then
``SIGCONT``.

The 3.x test's scenario (``integration/test_router_paused.py``) on MinerU 4.0, in the shape
of ``test_routers_shared_store4.py``: three patched ``mineru-router`` processes share one
real PostgreSQL, each under its own ``ROUTER_ID`` with a 3 s lease, in front of the same two
remote ``mineru-api`` workers. A client spreads its submissions over the three routers.
Router 0 is stopped with ``SIGSTOP`` while its jobs run and the stream goes on through the
two others; one of them takes router 0's jobs over once its lease expired (its log says
so, and the rows' owner in PostgreSQL changes). Its clients' status questions wait in
router 0's socket meanwhile. Router 0 is then continued with ``SIGCONT``: those questions
are answered 200 (4.0 answers from the route it still has, whatever its renewal finds),
its next renewal finds its lease lost and it lets the jobs go (its log and its audit say
so; a write of its about them is refused: fenced), their rows stay the survivor's. It
holds a fresh lease and rejoins: it accepts new jobs, owns their rows and completes them.
Every job completes, none is lost, its result comes through a router that did not accept
it, and each was parsed once: the workers ran one job per document, no router sent one
again.
"""

from __future__ import annotations

import os
import signal
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from mineru4_support import (
    python4,  # noqa: F401 - fixture
    site4,  # noqa: F401 - fixture
)
from mineru_health.demo.fleet import (
    FLEET4_ENV,
    LINE4,
    Client,
    http,
    start_worker,
    text_pdf,
)
from mineru_health.demo.sandbox import Processes, wait_until
from shared_routers import owners, start_routers, wait_for_one_takeover

pytestmark = pytest.mark.integration

LEASE_S = 3.0
ROUTERS = 3
PAUSED = 0  # the router stopped and continued
SURVIVORS = (1, 2)


def test_4_0_a_paused_router_is_fenced_then_rejoins_and_no_job_is_lost_or_doubled(
    python4: str, site4: Path, postgres: Any, tmp_path: Path
) -> None:
    pytest.importorskip("psycopg", reason="psycopg is not installed")
    url = postgres.new_database()
    with Processes() as procs:
        workers = [  # booting while the routers boot: each waits for both in rotation
            start_worker(
                procs,
                LINE4,
                site4,
                python4,
                tmp_path / f"worker-{n}",
                wait=False,
                name="mineru-api-4",
            )
            for n in (0, 1)
        ]
        routers = start_routers(  # side by side, each with both workers in rotation
            procs,
            LINE4,
            python4,
            site4,
            [w.base_url for w in workers],
            url,
            tmp_path,
            count=ROUTERS,
            lease_s=LEASE_S,
            env=FLEET4_ENV,
        )
        paused = routers[PAUSED]
        clients = [Client(r.base, LINE4, poll_s=0.2) for r in routers]
        accepted: list[tuple[str, int, int]] = []  # (job id, its router, its document)

        def submit(n: int) -> None:
            number = len(accepted)
            job_id, refusal = clients[n].submit(f"doc{number}.pdf", text_pdf(8, seed=number))
            assert job_id, (n, refusal)
            accepted.append((job_id, n, number))

        for i in range(2 * ROUTERS):  # two a router
            submit(i % ROUTERS)
        its_jobs = [j for j, n, _ in accepted if n == PAUSED]
        before = owners(url, its_jobs)
        assert {owner for owner, _, _ in before.values()} == {"router-0"}, before
        assert any(clients[1].status(j).get("status") not in LINE4.terminal for j in its_jobs)

        os.kill(paused.proc.pid, signal.SIGSTOP)  # a process of this test's own
        asked: list[Future[Any]] = []
        with ThreadPoolExecutor(max_workers=len(its_jobs)) as asking:
            try:
                for n in SURVIVORS:  # the stream goes on through the others
                    submit(n)

                taker = wait_for_one_takeover(routers, SURVIVORS, "router-0", 10 * LEASE_S)
                survivor = f"router-{taker}"
                taken = owners(url, its_jobs)
                assert {owner for owner, _, _ in taken.values()} == {survivor}, taken
                assert all(taken[k][1] > before[k][1] for k in its_jobs), (before, taken)
                # Its clients' questions wait in its socket: answered first thing when it
                # goes on, racing its renewal.
                asked += [
                    asking.submit(http, "GET", f"{paused.base}/v1/tasks/{j}", 10 * LEASE_S)
                    for j in its_jobs
                ]
            finally:
                os.kill(paused.proc.pid, signal.SIGCONT)
            answers = [future.result() for future in asked]
        assert [a.status_code for a in answers] == [200] * len(its_jobs), [
            a.text[:300] for a in answers
        ]
        assert [a.json()["task_id"] for a in answers] == its_jobs

        # Its next renewal finds its lease lost: it lets go of the jobs the survivor drives
        # (those it did not see end first; its write of one it saw end was refused).
        assert wait_until(
            lambda: "found its lease lapsed" in paused.proc.log_tail(40000), 10 * LEASE_S
        ), paused.proc.log_tail(5000)
        let_go = [
            key
            for record in paused.audit_records()
            if record.get("action") == "submissions_taken_over"
            for key in record["task_ids"]
        ]
        assert set(let_go) <= set(its_jobs), let_go
        fenced = paused.metric("mineru_router_store_fenced_writes_total")
        if set(let_go) != set(its_jobs):  # one it saw end: its write of that was refused
            assert fenced >= 1, paused.proc.log_tail(5000)
        assert paused.metric("mineru_router_lease_lapses_total") == 1
        after = owners(url, its_jobs)
        assert {owner for owner, _, _ in after.values()} == {survivor}, (after, fenced)

        # It holds a lease again and rejoins: new jobs through it are its own.
        paused.wait_in_rotation()  # probes it had under way when stopped may have timed out
        for _ in range(2):
            submit(PAUSED)
        rejoined = [j for j, _, _ in accepted[-2:]]
        assert {owner for owner, _, _ in owners(url, rejoined).values()} == {"router-0"}

        for i, (job_id, n, _) in enumerate(accepted):
            asker = clients[(n + 1 + i % 2) % ROUTERS]  # another router than its own
            outcome = asker.wait(job_id, timeout_s=120.0)
            assert outcome.status == "completed", (job_id, n, outcome.detail)
            result = clients[(n + 2 - i % 2) % ROUTERS].result(job_id)
            assert result.status_code == 200, (job_id, n, result.text[:300])
        for job_id in its_jobs:  # the router that let them go still answers their results
            result = clients[PAUSED].result(job_id)
            assert result.status_code == 200, (job_id, result.text[:300])
        ended = owners(url, [j for j, _, _ in accepted])
        assert len(ended) == len(accepted)  # one row each, none lost
        assert {ended[k][0] for k in its_jobs} == {survivor}, ended
        assert {ended[k][0] for k in rejoined} == {"router-0"}, ended
        for router in routers:
            assert router.metric("mineru_router_task_resubmissions_total") == 0
        assert sum(r.metric("mineru_router_takeovers_total") for r in routers) == 1
        ran = [len(w.get("/v1/parse/jobs?limit=100").json()["data"]) for w in workers]
        assert sum(ran) == len(accepted), ran  # one job a document: none parsed twice
        print(
            f"router-0 paused past its {LEASE_S:g} s lease: {survivor} took its "
            f"{len(its_jobs)} jobs; {fenced:g} of its writes fenced after SIGCONT"
        )
