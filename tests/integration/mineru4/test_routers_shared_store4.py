# ruff: noqa: F811 - the fixtures are imported from mineru4_support and named as parameters
"""Several live 4.0 routers on one PostgreSQL (issue 35): ``kill -9`` of one mid-stream.

The 3.x test's scenario (``integration/test_routers_shared_store.py``) on MinerU 4.0:
three patched ``mineru-router`` processes share one real PostgreSQL (``conftest.postgres``),
each under its own ``ROUTER_ID`` with a 3 s lease, in front of the same two remote
``mineru-api`` workers (``--upstream-url``, flash tier, text PDFs), which outlive any
router. A client spreads its submissions over the three routers through ``/v1/tasks``
and asks each job's status of another router than the one that accepted it (4.0 alone
answers 404 there; a cancel there is 409: only the owner changes a job). Router 0 is
killed with SIGKILL while its jobs run: one survivor takes them over (its log says so),
every accepted job completes, its result, its markdown output and that file's metadata
come through a router that did not accept it and are its own document's, no status was
answered 404, and each job was parsed once: the workers ran one job per document, and no
router sent one again.
"""

from __future__ import annotations

import os
import re
import signal
import time
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
from mineru_health.demo.sandbox import Processes
from shared_routers import start_routers, wait_for_one_takeover

pytestmark = pytest.mark.integration

LEASE_S = 3.0
ROUTERS = 3


def test_4_0_a_killed_routers_jobs_are_taken_over_and_any_router_answers_them(
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
        clients = [Client(r.base, LINE4, poll_s=0.2) for r in routers]
        accepted: list[tuple[str, int, int]] = []  # (job id, its router, its document)
        not_found: list[tuple[str, int]] = []

        def submit(n: int) -> None:
            number = len(accepted)
            job_id, refusal = clients[n].submit(f"doc{number}.pdf", text_pdf(8, seed=number))
            assert job_id, (n, refusal)
            accepted.append((job_id, n, number))

        def status_of(job_id: str, n: int) -> dict[str, Any]:
            response = http("GET", f"{routers[n].base}/v1/tasks/{job_id}", 10.0)
            if response.status_code == 404:
                not_found.append((job_id, n))
            assert response.status_code == 200, (n, response.status_code, response.text[:300])
            body: dict[str, Any] = response.json()
            return body

        for i in range(2 * ROUTERS):  # two a router
            submit(i % ROUTERS)
        for i, (job_id, n, _) in enumerate(accepted):  # asked of another router than its own
            assert status_of(job_id, (n + 1 + i % 2) % ROUTERS)["task_id"] == job_id
        last, owner, _ = accepted[-1]  # a cancel is its owner's alone: 409, never 404
        cancel = http("DELETE", f"{routers[(owner + 1) % ROUTERS].base}/v1/tasks/{last}", 10.0)
        assert cancel.status_code == 409, cancel.text[:300]
        code = cancel.json()["error"]["code"]
        assert code in ("owned_by_another_router", "job_already_terminal"), cancel.text[:300]
        first_jobs = [j for j, n, _ in accepted if n == 0]
        assert any(status_of(j, 1)["status"] not in LINE4.terminal for j in first_jobs)

        os.kill(routers[0].proc.pid, signal.SIGKILL)
        routers[0].proc.wait(30.0)
        killed_at = time.monotonic()
        survivors = [1, 2]
        for n in survivors:  # the stream goes on through the survivors
            submit(n)
        for job_id in first_jobs:  # answered by the survivors before and after the takeover
            for n in survivors:
                status_of(job_id, n)

        taker = wait_for_one_takeover(routers, survivors, "router-0", 10 * LEASE_S)
        took_s = time.monotonic() - killed_at
        taker_log = routers[taker].proc.log_tail(20000)
        unfinished = re.search(r"taken over from router 'router-0'.*, (\d+) unfinished", taker_log)
        assert unfinished is not None and int(unfinished.group(1)) >= 1, taker_log[-3000:]
        print(
            f"router-0's jobs taken over {took_s:.1f} s after its kill -9 (lease {LEASE_S:g} s), "
            f"{unfinished.group(1)} of {len(first_jobs)} unfinished"
        )

        for i, (job_id, n, number) in enumerate(accepted):
            outcome = clients[survivors[i % 2]].wait(job_id, timeout_s=120.0)
            assert outcome.status == "completed", (job_id, n, outcome.detail)
            other = survivors[(i + 1) % 2]  # never router 0, and for half, not the owner
            result = clients[other].result(job_id)
            assert result.status_code == 200, (job_id, n, result.text[:300])
            output = outcome.detail["files"][0]["output_files"]["markdown"]
            content = http("GET", f"{routers[other].base}/v1/files/{output['file_id']}/content", 60)
            assert content.status_code == 200, (job_id, n, content.text[:300])
            assert f"Document {number}," in content.text
            metadata = http("GET", f"{routers[other].base}/v1/files/{output['file_id']}", 10.0)
            assert metadata.json()["id"] == output["file_id"], metadata.text[:300]
        assert not_found == []
        for n in survivors:
            assert routers[n].metric("mineru_router_task_resubmissions_total") == 0
        ran = [len(w.get("/v1/parse/jobs?limit=100").json()["data"]) for w in workers]
        assert sum(ran) == len(accepted), ran  # one job a document: none parsed twice
