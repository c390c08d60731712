"""A router restart loses nothing (issue 24): ``kill -9`` of the 3.x router mid-stream.

The patched ``mineru-router`` (MinerU 3.x) with two real local workers and
``MINERU_HEALTH_STATE_DIR`` set; a steady stream of tasks on a slow engine
(the fake VLM's ``/delay/``: each worker holds tasks when the kill comes);
``kill -9`` of the router (its workers die with it: parent watch); a new
router on the same state directory. Every task the first router accepted
answers through the new one (no 404), the ones in flight are finished
(sent again under the same id), every result is downloadable, none lost.
The same with the router's rows in PostgreSQL (``MINERU_ROUTER_HEALTH_STORE_URL``, a real
server: ``conftest.postgres``). A task on a remote worker (``--upstream-url``)
that outlives the router is followed there, not sent again. A router killed
while its worker restarts
after an engine death leaves a next router that restarts nothing: the new
worker instance restored the task as its previous instance failed it, and
that verdict is not the new instance's (issue 32). A router started on a
store of 1,000 unfinished tasks answers before its local worker is up and
serves while it reconciles them in the background (issue 32; its timings
are bench/resume's). A damaged router store is set aside with an
audit record, and the router runs.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from conftest import ManagedProcess, Router, free_port, make_pdf, wait_until
from mineru_health.demo.fleet import LINE3, Client
from mineru_health.demo.sandbox import HOST, Processes
from mineru_health.runtime.router.store import DB_NAME
from router_restart import DISRUPTIONS, fill_store3, kill_and_restart, kill_during_a_restart

pytestmark = pytest.mark.integration

ENV = {
    "MINERU_ROUTER_HEALTH_PRESET": "fast",
    "MINERU_ROUTER_HEALTH_RETRY_BUDGET_MIN": "12",
}


@pytest.mark.parametrize("store", ["sqlite", "postgresql"])
def test_a_router_killed_mid_stream_resumes_every_task(
    launch_router: Callable[..., Router],
    fake_vlm_url: str,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    store: str,
) -> None:
    pytest.importorskip("reportlab")
    pdf = make_pdf(text="mineru-health router restart page")
    env = {**ENV, "MINERU_HEALTH_STATE_DIR": str(tmp_path / "router-state")}
    if store == "postgresql":  # its rows in a real PostgreSQL, its kept uploads on its volume
        env["MINERU_ROUTER_HEALTH_STORE_URL"] = request.getfixturevalue("postgres").new_database()
        env["MINERU_ROUTER_HEALTH_ROUTER_ID"] = "mineru-router-0"
    first = launch_router(env)
    first.wait_in_rotation()

    def second() -> Router:
        router = launch_router(env)
        router.wait_in_rotation()
        return router

    def client(router: Router) -> Client:
        return Client(router.base, router.line, engine_url=f"{fake_vlm_url}/delay/700/")

    run = kill_and_restart(first, second, client, lambda n: (f"restart-{n:03d}.pdf", pdf))
    log = run.second.proc.log_tail(8000)
    assert run.completed_before and run.in_flight, (run.completed_before, run.in_flight)
    assert run.not_found == [], (run.not_found, log)
    assert run.lost == [], (run.lost, log)
    new = client(run.second)
    for _, task_id in run.accepted:
        response = new.result(task_id)
        assert response.status_code == 200, (task_id, response.text[:300], log)
        assert response.json().get("results"), response.text[:300]
    resent = [run.outcomes[t] for t in run.in_flight if run.outcomes[t]["attempts"] > 1]
    assert resent, [run.outcomes[t] for t in run.in_flight]
    assert run.second.metric(
        "mineru_router_task_resubmissions_total", reason="router_restart"
    ) >= len(resent)
    # Each worker's outputs live in its state directory, not in a temporary one.
    outputs = [p for p in (tmp_path / "router-state").glob("*/outputs/*") if p.is_dir()]
    assert len(outputs) >= len(run.accepted), outputs
    if store == "postgresql":  # every row was the database's, none in a file
        import psycopg

        assert not list((tmp_path / "router-state").rglob(DB_NAME))
        with psycopg.connect(env["MINERU_ROUTER_HEALTH_STORE_URL"]) as conn:
            owners = conn.execute("SELECT owner, count(*) FROM submissions GROUP BY owner")
            assert owners.fetchall() == [("mineru-router-0", len(run.accepted))]


def test_a_router_killed_during_an_engine_death_restart_restarts_nothing_healthy(
    launch_router: Callable[..., Router],
    fake_vlm_url: str,
    tmp_path: Path,
    tiny_pdf: bytes,
) -> None:
    env = {**ENV, "MINERU_HEALTH_STATE_DIR": str(tmp_path / "router-state")}
    # No retry budget: the task the engine death failed waits for the kill unsent.
    first = launch_router(
        {
            **env,
            "MINERU_ROUTER_HEALTH_RETRY_BUDGET_MIN": "0",
            "MINERU_ROUTER_HEALTH_RETRY_BUDGET_PERCENT": "0",
        },
        fault_plan="fault-plan",
    )
    first.wait_in_rotation()

    def second() -> Router:
        router = launch_router(env)
        router.wait_in_rotation()
        return router

    slow = Client(first.base, first.line, engine_url=f"{fake_vlm_url}/delay/1500/")
    new, ids = kill_during_a_restart(
        first, second, slow, [(f"doc{n}.pdf", tiny_pdf) for n in range(8)]
    )
    client = Client(new.base, new.line, engine_url=fake_vlm_url)
    outcomes = [client.wait(task_id) for task_id in ids]
    log = new.proc.log_tail(8000)
    assert [o.status for o in outcomes] == ["completed"] * len(ids), (
        [o.detail for o in outcomes],
        log,
    )
    assert client.run("after.pdf", tiny_pdf).status == "completed", log
    assert [r for r in new.audit_records() if r["action"] in DISRUPTIONS] == [], log


def test_a_router_on_a_thousand_stored_tasks_serves_while_it_reconciles_them(
    launch_router: Callable[..., Router],
    fake_vlm_url: str,
    tmp_path: Path,
    tiny_pdf: bytes,
) -> None:
    state = tmp_path / "router-state"
    keys = fill_store3(state, 1000, tiny_pdf, fake_vlm_url, "local-gpu-0")
    router = launch_router(
        {
            **ENV,
            "MINERU_HEALTH_STATE_DIR": str(state),
            "MINERU_ROUTER_HEALTH_MAX_KEPT_TASKS": "2000",
        },
        local_gpus="0",
    )
    client = Client(router.base, router.line, engine_url=fake_vlm_url)
    # It answers before its worker is up: it does not wait for the boot (the figures
    # are bench/resume's).
    assert wait_until(lambda: bool(client.status(keys[-1])), 120.0, 0.1), router.proc.log_tail()
    answered = time.time()
    router.wait_in_rotation()
    admitted = [
        datetime.fromisoformat(r["time"]).timestamp()
        for r in router.audit_records()
        if r["action"] == "admitted"
    ]
    assert admitted and min(admitted) > answered, (admitted, answered)
    # Asked about before its turn (the pass goes newest first): checked, sent again, at once.
    oldest = client.status(keys[0])
    assert oldest.get("status") in ("pending", "processing", "completed"), oldest
    assert wait_until(lambda: client.status(keys[0]).get("attempts") == 2, 60.0, 0.2), (
        router.proc.log_tail()
    )
    assert client.status(keys[-1]).get("status") in ("pending", "processing", "completed")
    task_id, refusal = client.submit("new.pdf", tiny_pdf)
    assert task_id, refusal
    # The router served before its background pass was over (the mechanism; the
    # figures are bench/resume's).
    log = router.proc.log()
    resumed = log.index("1000 unfinished one(s) being reconciled in the background")
    serving = log.index(f"Uvicorn running on {router.base}")
    reconciled = log.find("reconciled the 1000 unfinished submission(s)")
    assert resumed < serving and (reconciled == -1 or reconciled > serving), log[-3000:]


def test_a_damaged_router_store_is_set_aside_and_audited(
    launch_router: Callable[..., Router],
    fake_vlm_url: str,
    tmp_path: Path,
    tiny_pdf: bytes,
) -> None:
    state = tmp_path / "router-state"
    state.mkdir()
    (state / DB_NAME).write_bytes(b"overwritten with garbage\n" * 64)
    router = launch_router(
        {
            **ENV,
            "MINERU_HEALTH_STATE_DIR": str(state),
            "MINERU_ROUTER_HEALTH_MAX_KEPT_TASKS": "2000",
        },
        local_gpus="0",
    )
    router.wait_in_rotation()

    def audited() -> list[dict[str, Any]]:
        return [r for r in router.audit_records() if r["action"] == "state_file_set_aside"]

    assert wait_until(lambda: bool(audited()), 60.0, 0.2), router.proc.log_tail()
    (record,) = audited()
    assert record["worker_id"] == "router" and Path(record["path"]).parent == state, record
    assert Path(record["path"]).read_bytes().startswith(b"overwritten with garbage")
    assert (state / DB_NAME).read_bytes().startswith(b"SQLite format 3")
    done = Client(router.base, router.line, engine_url=fake_vlm_url).run("doc.pdf", tiny_pdf)
    assert done.status == "completed", (done.detail, router.proc.log_tail())


def test_a_task_on_a_remote_worker_that_outlived_the_router_is_followed_there(
    processes: Processes,
    mineru_api_factory: Callable[..., ManagedProcess],
    patched_mineru_site: Path,
    mineru_python: str,
    fake_vlm_url: str,
    tmp_path: Path,
    tiny_pdf: bytes,
) -> None:
    worker = mineru_api_factory(patched_mineru_site)  # not the router's: it stays up
    env = {**ENV, "MINERU_HEALTH_STATE_DIR": str(tmp_path / "router-state")}

    def remote_router(name: str) -> Router:
        scratch = tmp_path / name
        scratch.mkdir()
        port = free_port()
        argv = [*LINE3.router_argv(mineru_python, port, "none"), "--upstream-url", worker.base_url]
        proc = processes.start(
            "mineru-router",
            argv,
            env=LINE3.env(patched_mineru_site, scratch, mineru_python, env),
            log_path=scratch / "router.log",
            cwd=scratch,
        )
        proc.base_url = f"http://{HOST}:{port}"
        router = Router(LINE3, proc, scratch, 1)
        router.wait_in_rotation()
        return router

    first = remote_router("router")
    slow = Client(first.base, LINE3, engine_url=f"{fake_vlm_url}/delay/4000/")
    task_id, refusal = slow.submit("slow.pdf", tiny_pdf)
    assert task_id, refusal
    upstream = slow.status(task_id)
    os.kill(first.proc.pid, signal.SIGKILL)
    first.proc.wait(30.0)

    second = remote_router("router-1")
    done = Client(second.base, LINE3).wait(task_id)
    assert done.status == "completed", (done.detail, second.proc.log_tail())
    assert done.detail["workers_tried"] == ["remote-1"] and done.attempts == 1, done.detail
    assert Client(second.base, LINE3).result(task_id).status_code == 200
    assert upstream.get("status") in ("pending", "processing"), upstream
    assert second.metric("mineru_router_task_resubmissions_total") == 0
