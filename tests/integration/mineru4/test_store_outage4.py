# ruff: noqa: F811 - the fixtures are imported from mineru4_support and named as parameters
"""The routers' PostgreSQL stopped under a stream of jobs, then started (issue 35), 4.0.

The 3.x test's scenario (``tests/store_outage.py``) on three patched MinerU 4.0
``mineru-router`` processes sharing one PostgreSQL, each with a lease of ``LEASE_S`` (the
outage is many leases: every router's lease lapses in the database meanwhile) and its own
local worker (cells: a job another router took over would be sent again on the taker's
worker, as its owner's cannot be reached from there: parsed twice), the stream spread
over them in turn. Every submission while the database is down is answered 503
``store_unreachable`` with Retry-After, in 4.0's error shape, naming the database; the
jobs accepted before are answered and ``/v1/health`` stays 200 on every router, saying
the store is unreachable. Once it is back every router accepts again and every accepted
job completes, none lost; and no router took over a live peer's jobs (leases.py: after
failed renewals a router takes over no one for one lease, while its peers renew): no log
says "taken over", no takeover or resubmission counted, every job's row still owned by
the router that accepted it and sent to one worker once.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from mineru4_support import (
    python4,  # noqa: F401 - fixture
    site4,  # noqa: F401 - fixture
)
from mineru_health.demo.fleet import FLEET4_ENV, LINE4, Client, start_router, text_pdf
from mineru_health.demo.sandbox import Processes
from store_outage import DOWN_S, Spread, assert_kept_by_each_router, own_postgres, stop_and_start

pytestmark = pytest.mark.integration

LEASE_S = 3.0  # DOWN_S is many leases
ROUTERS = 3


def test_4_0_three_routers_with_their_database_down_refuse_with_503_and_take_over_no_one(
    python4: str, site4: Path, tmp_path: Path
) -> None:
    import psycopg

    assert DOWN_S > 3 * LEASE_S
    with own_postgres() as server, Processes() as procs:
        url = server.new_database()
        routers = [  # booting side by side, each with its own local worker
            start_router(
                procs,
                LINE4,
                site4,
                python4,
                tmp_path / f"router-{n}",
                env={
                    **FLEET4_ENV,
                    "MINERU_ROUTER_HEALTH_STORE_URL": url,
                    "MINERU_ROUTER_HEALTH_ROUTER_ID": f"router-{n}",
                    "MINERU_ROUTER_HEALTH_LEASE_S": str(LEASE_S),
                },
                local_gpus="0",
            )
            for n in range(ROUTERS)
        ]
        for router in routers:
            router.wait_in_rotation()
        spread = Spread([Client(r.base, LINE4) for r in routers])

        def health() -> dict[str, Any]:
            bodies = {}
            for n, router in enumerate(routers):
                response = httpx.get(f"{router.base}/v1/health", timeout=10.0)
                assert response.status_code == 200, response.text  # it still serves
                bodies[f"router-{n}"] = response.json()
            return bodies

        run = stop_and_start(
            routers[0],
            spread,
            lambda n: (f"outage-{n:03d}.pdf", text_pdf(1, seed=n)),
            server,
            health,
            accepting=ROUTERS,
        )
        logs = assert_kept_by_each_router(run, routers, spread, '"store_unreachable"')
        assert all(s for s in run.statuses_while_down.values()), run.statuses_while_down
        for body in health().values():
            assert body.get("store") == {"reachable": True} and body.get("status") == "ok"
        for n, router in enumerate(routers):
            assert "submissions_taken_over" not in router.audit.read_text(), n
        assert any("found its lease lapsed" in log for log in logs), logs[0][-3000:]
        with psycopg.connect(url) as conn:
            rows = {
                key: (owner, json.loads(workers))
                for key, owner, workers in conn.execute(
                    "SELECT key, owner, workers FROM submissions"
                ).fetchall()
            }
        for job_id, n in spread.router_of.items():  # its own router's, sent once
            owner, workers = rows.get(job_id, ("", []))
            assert owner == f"router-{n}" and len(workers) == 1, (job_id, n, rows.get(job_id))
