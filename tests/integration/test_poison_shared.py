"""A poison document sent to two routers that share one PostgreSQL store (issue 35).

Two real patched 3.x ``mineru-router`` processes, one local worker each, their
rows in one real PostgreSQL (``conftest.postgres``). Every worker that parses
``poison.pdf`` dies (the fault plan ``poison``). The document kills router A's
worker, then router B's: two deaths on two workers, each seen by a different
router, quarantine it fleet-wide. B's task fails naming both workers (each
with its router), and router A refuses the same bytes at submission once it
read B's quarantine from the database. Bounded waits; nothing timed.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from conftest import Router, make_pdf, wait_until
from harness.postgres import PostgresServer
from mineru_health.demo.fleet import Client

pytestmark = pytest.mark.integration

# One resubmission: router A's task dies on A's only worker, again on its restart (the
# same worker: still one death), and fails; router B's never goes further than its first.
ENV = {"MINERU_ROUTER_HEALTH_PRESET": "fast", "MINERU_ROUTER_HEALTH_TASK_RETRIES": "1"}


def test_a_poison_document_sent_to_two_routers_is_quarantined_fleet_wide(
    launch_router: Callable[..., Router],
    postgres: PostgresServer,
    fake_vlm_url: str,
    tmp_path: object,
) -> None:
    url = postgres.new_database()
    routers = {
        name: launch_router(
            {
                **ENV,
                "MINERU_ROUTER_HEALTH_STORE_URL": url,
                "MINERU_ROUTER_HEALTH_ROUTER_ID": name,
            },
            local_gpus="0",
            fault_plan="fault-plan",
        )
        for name in ("router-a", "router-b")
    }
    for router in routers.values():
        router.wait_in_rotation()
        router.write_plan("poison poison.pdf")  # every worker reads it; none consumes it
    a, b = (Client(r.base, r.line, engine_url=fake_vlm_url) for r in routers.values())
    poison = make_pdf(text="a document that kills inference engines")

    first = a.run("poison.pdf", poison)
    assert first.status == "failed", first.detail
    assert "Not sent again" not in first.detail["error"], first.detail  # one worker so far

    second = b.run("poison.pdf", poison)
    error = second.detail["error"]
    assert second.status == "failed" and "Not sent again" in error, second.detail
    assert "router-a/local-gpu-0" in error and "router-b/local-gpu-0" in error, error
    (record,) = [
        r
        for r in routers["router-b"].audit_records()
        if r["action"] == "poison_document_quarantined"
    ]
    assert sorted(record["workers"]) == ["router-a/local-gpu-0", "router-b/local-gpu-0"]

    # Router A reads B's quarantine from the database (every POISON_REFRESH_S), then
    # refuses the same bytes at submission, whatever their name (the fault plan poisons
    # only the name poison.pdf: one accepted before A knew parses harmlessly).
    def refused_by_a() -> bool:
        task_id, answer = a.submit("renamed.pdf", poison)
        return not task_id and answer["code"] == 422 and "Not sent again" in answer["body"]

    assert wait_until(refused_by_a, 60.0, 1.0), routers["router-a"].proc.log_tail()
