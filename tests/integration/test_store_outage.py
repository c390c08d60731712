"""The routers' PostgreSQL stopped under a stream of tasks, then started (issue 35), 3.x.

Before: a router whose database went down answered 507 ``insufficient_storage`` as for a
full disk ("do not retry soon"), and every submission first held its event loop for the
pool's whole wait. Now: three patched ``mineru-router`` processes on one real PostgreSQL
of the test's own, each with its own local worker and a lease of ``LEASE_S`` (the outage
is many leases: every router's lease lapses in the database meanwhile), tasks spread over
them in turn on a slow engine (tasks are in flight when the database stops), ``pg_ctl
stop -m fast`` for ``DOWN_S`` (``tests/store_outage.py``): every submission meanwhile is
answered 503 ``store_unreachable`` with Retry-After, naming the database, at once (not
after the pool's wait each); the tasks accepted before are answered and every router's
health stays 200, saying the store is unreachable; once the database is started again
every router accepts again, every accepted task completes (none lost), every row ends
completed in the database (the updates that failed meanwhile were written once it was
back) and still owned by the router that accepted it: no router took over a live peer's
tasks (leases.py: after failed renewals a router takes over no one for one lease, while
its peers renew). The 4.0 test (``mineru4/test_store_outage4.py``) is its twin.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from conftest import Router, http_get, make_pdf, wait_until
from mineru_health.demo.fleet import Client
from store_outage import (
    DOWN_S,
    EVERY_S,
    Spread,
    assert_kept_by_each_router,
    own_postgres,
    stop_and_start,
)

pytestmark = pytest.mark.integration

LEASE_S = 3.0  # DOWN_S is many leases
ROUTERS = 3


def test_three_routers_with_their_database_down_refuse_with_503_and_lose_nothing_accepted(
    launch_router: Callable[..., Router], fake_vlm_url: str
) -> None:
    pytest.importorskip("reportlab")
    import psycopg

    assert DOWN_S > 3 * LEASE_S
    with own_postgres() as server:
        url = server.new_database()
        routers = [  # booting side by side, each with its own local worker
            launch_router(
                {
                    "MINERU_ROUTER_HEALTH_PRESET": "fast",
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
        engine = f"{fake_vlm_url}/delay/1500/"
        spread = Spread([Client(r.base, r.line, engine_url=engine) for r in routers])
        pdf = make_pdf(text="mineru-health database outage page")

        def health() -> dict[str, Any]:
            bodies = {}
            for n, router in enumerate(routers):
                response = http_get(f"{router.base}/health")
                assert response is not None and response.status_code == 200  # it still serves
                bodies[f"router-{n}"] = response.json()
            return bodies

        run = stop_and_start(
            routers[0],
            spread,
            lambda n: (f"outage-{n:03d}.pdf", pdf),
            server,
            health,
            accepting=ROUTERS,
        )
        assert_kept_by_each_router(run, routers, spread, "cannot be reached")
        # Refused at once, not after the pool's wait each (2 s): most of DOWN_S / EVERY_S.
        assert len(run.down) >= DOWN_S / EVERY_S / 4, run.down
        assert all(s.get("task_id") == t for t, s in run.statuses_while_down.items()), run
        for body in health().values():
            assert body.get("store") == {"reachable": True}

        # Tasks that ended while it was down had their rows' updates written once it was
        # back, each row still its own router's.
        rows: dict[str, tuple[str, str]] = {}

        def all_completed() -> bool:
            with psycopg.connect(url) as conn:
                found = conn.execute("SELECT key, owner, state FROM submissions").fetchall()
            rows.update({key: (owner, state) for key, owner, state in found})
            return all(rows.get(t, ("", ""))[1] == "completed" for t in spread.task_ids)

        assert wait_until(all_completed, 30.0, 0.5), rows
        for task_id, n in spread.router_of.items():
            assert rows[task_id][0] == f"router-{n}", (task_id, n, rows[task_id])
