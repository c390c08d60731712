"""The router's PostgreSQL stopped under a stream of tasks, then started (issue 35), 3.x.

Before: a router whose database went down answered 507 ``insufficient_storage`` as for a
full disk ("do not retry soon"), and every submission first held its event loop for the
pool's whole wait. Now: the patched ``mineru-router`` with one local worker and its rows
in a real PostgreSQL of the test's own, tasks submitted one after another on a slow
engine (tasks are in flight when the database stops), ``pg_ctl stop -m fast`` for
``DOWN_S`` (``tests/store_outage.py``): every submission meanwhile is answered 503
``store_unreachable`` with Retry-After, naming the database, at once (not after the
pool's wait each); the tasks accepted before are answered and the router's health stays
200, saying the store is unreachable; once the database is started again submissions
are accepted again, every accepted task completes (none lost) and every accepted task's
row ends completed in the database (the updates that failed meanwhile were written once
it was back).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from conftest import Router, http_get, make_pdf, wait_until
from mineru_health.demo.fleet import Client
from store_outage import DOWN_S, EVERY_S, Spread, own_postgres, stop_and_start

pytestmark = pytest.mark.integration


def test_a_database_down_refuses_with_503_and_loses_nothing_accepted(
    launch_router: Callable[..., Router], fake_vlm_url: str
) -> None:
    pytest.importorskip("reportlab")
    import psycopg

    with own_postgres() as server:
        url = server.new_database()
        env = {
            "MINERU_ROUTER_HEALTH_PRESET": "fast",
            "MINERU_ROUTER_HEALTH_STORE_URL": url,
            "MINERU_ROUTER_HEALTH_ROUTER_ID": "mineru-router-0",
        }
        router = launch_router(env, local_gpus="0")
        router.wait_in_rotation()
        client = Client(router.base, router.line, engine_url=f"{fake_vlm_url}/delay/1500/")
        pdf = make_pdf(text="mineru-health database outage page")

        def health() -> dict[str, Any]:
            response = http_get(f"{router.base}/health")
            assert response is not None and response.status_code == 200  # it still serves
            body = response.json()
            return body if isinstance(body, dict) else {}

        run = stop_and_start(router, client, lambda n: (f"outage-{n:03d}.pdf", pdf), server, health)
        log = router.proc.log_tail(8000)
        assert [code for code, _, _ in run.before] == [202] * 3, run.before
        assert run.down and {code for code, _, _ in run.down} == {503}, (run.down, log)
        assert all(retry.isdigit() for _, retry, _ in run.down), run.down
        assert all("cannot be reached" in body for *_, body in run.down), run.down
        assert "127.0.0.1" in run.down[-1][2], run.down[-1]
        # Refused at once, not after the pool's wait each (2 s): most of DOWN_S / EVERY_S.
        assert len(run.down) >= DOWN_S / EVERY_S / 4, run.down
        assert all(s.get("task_id") == t for t, s in run.statuses_while_down.items()), run
        assert run.health_while_down.get("store", {}).get("reachable") is False, run
        assert {code for code, _, _ in run.back} <= {202, 503}, run.back
        assert [code for code, _, _ in run.back[-3:]] == [202] * 3, run.back
        assert health().get("store") == {"reachable": True}
        assert run.lost == [], (run.lost, router.proc.log_tail(8000))
        refused = sum(1 for code, _, body in run.answers if "cannot be reached" in body)
        assert router.metric("mineru_router_store_unreachable_refusals_total") == refused

        # Tasks that ended while it was down had their rows' updates written once it was back.
        rows: dict[str, str] = {}

        def all_completed() -> bool:
            with psycopg.connect(url) as conn:
                rows.update(conn.execute("SELECT key, state FROM submissions").fetchall())
            return all(rows.get(task_id) == "completed" for task_id in client.task_ids)

        assert wait_until(all_completed, 30.0, 0.5), rows


def test_three_routers_with_their_database_down_refuse_with_503_and_take_over_no_one(
    launch_router: Callable[..., Router], fake_vlm_url: str
) -> None:
    """The same outage under three routers on one PostgreSQL, each with its own local
    worker and a lease of ``LEASE_S`` (the outage is many leases): the stream spread over
    them in turn, none lost, and no router took over a live peer's tasks (leases.py: after
    failed renewals a router takes over no one for one lease, while its peers renew)."""
    pytest.importorskip("reportlab")
    import psycopg

    lease_s = 3.0
    assert DOWN_S > 3 * lease_s
    with own_postgres() as server:
        url = server.new_database()
        routers = [  # booting side by side
            launch_router(
                {
                    "MINERU_ROUTER_HEALTH_PRESET": "fast",
                    "MINERU_ROUTER_HEALTH_STORE_URL": url,
                    "MINERU_ROUTER_HEALTH_ROUTER_ID": f"router-{n}",
                    "MINERU_ROUTER_HEALTH_LEASE_S": str(lease_s),
                },
                local_gpus="0",
            )
            for n in range(3)
        ]
        for router in routers:
            router.wait_in_rotation()
        engine = f"{fake_vlm_url}/delay/1500/"
        spread = Spread([Client(r.base, r.line, engine_url=engine) for r in routers])
        pdf = make_pdf(text="mineru-health database outage page, three routers")

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
            accepting=len(routers),
        )
        logs = [router.proc.log_tail(20000) for router in routers]
        assert [code for code, _, _ in run.before].count(202) == 3, run.before
        assert run.down and {code for code, _, _ in run.down} == {503}, (run.down, logs)
        assert all(retry.isdigit() for _, retry, _ in run.down), run.down
        assert all("cannot be reached" in body for *_, body in run.down), run.down
        for body in run.health_while_down.values():
            assert body.get("store", {}).get("reachable") is False, run.health_while_down
        assert [code for code, _, _ in run.back[-3:]] == [202] * 3, run.back
        assert run.lost == [], (run.lost, logs)
        assert set(spread.router_of.values()) == {0, 1, 2}, spread.router_of

        # No live router's tasks changed hands: each lease lapsed, each was taken anew.
        logs = [router.proc.log_tail(200000) for router in routers]
        for n, router in enumerate(routers):
            assert "taken over from router" not in logs[n], logs[n][-3000:]
            assert router.metric("mineru_router_takeovers_total") == 0, n
            assert router.metric("mineru_router_task_resubmissions_total") == 0, n
        with psycopg.connect(url) as conn:
            rows = dict(conn.execute("SELECT key, owner FROM submissions").fetchall())
        for task_id, n in spread.router_of.items():  # still its own router's
            assert rows.get(task_id) == f"router-{n}", (task_id, n, rows.get(task_id))
