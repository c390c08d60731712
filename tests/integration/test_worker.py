"""A real, patched ``mineru-api`` whose engine dies (fault plan), end to end.

Each test starts the real worker (``python -m mineru.cli.fast_api``) from a
patched copy of MinerU, with the fake OpenAI-compatible VLM server as its
``vlm-http-client`` engine, and injects faults through
``MINERU_HEALTH_FAULT_PLAN``. All waits are bounded deadline loops.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import (
    ManagedProcess,
    free_port,
    http_get,
    make_pdf,
    run_cli,
    submit_task,
    task_status,
    wait_task,
    wait_until,
    worker_health,
)
from mineru_health.demo.faults import write_plan

pytestmark = pytest.mark.integration

TASK_TIMEOUT_S = 120.0


def _assert_engine_dead_body(body: dict[str, Any]) -> None:
    assert body["status"] == "unhealthy"
    assert body["engine_dead"] is True
    assert re.fullmatch(r"3\.[34]\.\d+", body["version"])  # MinerU's own version field
    assert body["rule"] and body["category"] and body["error"]
    assert datetime.fromisoformat(body["since"]).tzinfo is not None


def _assert_refuses_work(proc: ManagedProcess, pdf: bytes, server_url: str) -> None:
    for path in ("/tasks", "/file_parse"):
        refused = submit_task(proc.base_url, pdf, server_url, path=path)
        assert refused.status_code == 503, (path, refused.text)
        assert int(refused.headers["retry-after"]) > 0
        assert "engine" in refused.json()["message"]


def test_engine_death_end_to_end(
    patched_mineru_site: Path,
    mineru_api_factory: Callable[..., ManagedProcess],
    fake_vlm_url: str,
    tiny_pdf: bytes,
    tmp_path: Path,
) -> None:
    plan = tmp_path / "fault-plan"
    health_port = free_port()
    proc = mineru_api_factory(
        patched_mineru_site,
        env={
            "MINERU_HEALTH_FAULT_PLAN": str(plan),
            "MINERU_API_MAX_CONCURRENT_REQUESTS": "1",
            "MINERU_HEALTH_PORT": str(health_port),
        },
    )
    health = worker_health(proc)
    assert health.status_code == 200
    assert health.json()["status"] == "healthy" and health.json()["protocol_version"] == 2

    first = submit_task(proc.base_url, tiny_pdf, fake_vlm_url)
    assert first.status_code == 202, first.text
    done = wait_task(proc, first.json()["task_id"])
    assert done["status"] == "completed", (done, proc.log_tail())
    result = httpx.get(f"{proc.base_url}/tasks/{done['task_id']}/result", timeout=30)
    assert result.status_code == 200

    synchronous = submit_task(proc.base_url, tiny_pdf, fake_vlm_url, path="/file_parse")
    assert synchronous.status_code == 200, synchronous.text

    # Four tasks on a slow engine with one task at a time: the first runs, the
    # others wait behind MinerU's semaphore when the engine dies.
    slow_url = f"{fake_vlm_url}/delay/1500/"
    ids = []
    for _ in range(4):
        submitted = submit_task(proc.base_url, tiny_pdf, slow_url)
        assert submitted.status_code == 202, submitted.text
        ids.append(submitted.json()["task_id"])
    assert wait_until(
        lambda: task_status(proc.base_url, ids[0])["status"] == "processing", TASK_TIMEOUT_S
    ), proc.log_tail()
    write_plan(plan, "engine_dead")

    finals = [wait_task(proc, task_id) for task_id in ids]
    statuses = [f["status"] for f in finals]
    assert "pending" not in statuses and "processing" not in statuses
    assert statuses.count("completed") <= 1  # only the call already in flight may finish
    failed = [f for f in finals if f["status"] == "failed"]
    assert failed, (finals, proc.log_tail())
    # One trigger (its own exception was the engine death), the others collateral:
    # a generic error that names the rule, never another task's text.
    triggers = [f for f in failed if f["verdict"]["role"] == "trigger"]
    assert len(triggers) == 1, finals
    assert "EngineCore encountered an issue" in triggers[0]["error"]  # its own text
    assert triggers[0]["verdict"]["fatal"] is True
    for final in failed:
        assert final["engine_dead"] is True and final["verdict"]["engine_dead"] is True
        if final is not triggers[0]:
            assert final["verdict"]["role"] == "collateral"
            assert "EngineCore" not in final["error"]
            assert final["verdict"]["rule"] in final["error"]
    # The last two never reached the engine: failed while queued.
    assert finals[-1]["started_at"] is None
    assert "inference engine of this worker became unusable" in finals[-1]["error"]

    health = worker_health(proc)
    assert health.status_code == 503
    _assert_engine_dead_body(health.json())
    assert health.json()["exception_type"] == "vllm.v1.engine.exceptions.EngineDeadError"
    assert "EngineCore" not in health.json()["error"]  # no task text unless opted in
    native = http_get(f"http://127.0.0.1:{health_port}/health", 5.0)
    assert native is not None and native.status_code == 503
    assert native.json()["rule"] == health.json()["rule"]
    assert native.json()["since"] == health.json()["since"]
    _assert_refuses_work(proc, tiny_pdf, fake_vlm_url)
    assert task_status(proc.base_url, ids[0])["task_id"] == ids[0]  # status endpoints still work
    assert proc.poll() is None

    scraped = httpx.get(f"{proc.base_url}/metrics", timeout=10)
    assert scraped.status_code == 200
    healthy_gauge = re.compile(r"^mineru_worker_healthy 0(\.0)?$", re.MULTILINE)
    assert healthy_gauge.search(scraped.text), scraped.text
    fatal_counter = re.compile(
        r"^mineru_worker_fatal_errors_total\{([^}]*)\} ([0-9.]+)$", re.MULTILINE
    )
    fatal = fatal_counter.search(scraped.text)
    assert fatal and 'category="engine_dead"' in fatal.group(1), scraped.text
    assert float(fatal.group(2)) >= 1


def test_task_local_failure_keeps_the_worker(
    patched_mineru_site: Path,
    mineru_api_factory: Callable[..., ManagedProcess],
    fake_vlm_url: str,
    tiny_pdf: bytes,
    tmp_path: Path,
) -> None:
    plan = tmp_path / "fault-plan"
    proc = mineru_api_factory(patched_mineru_site, env={"MINERU_HEALTH_FAULT_PLAN": str(plan)})
    write_plan(plan, "task_local")
    failed = wait_task(proc, submit_task(proc.base_url, tiny_pdf, fake_vlm_url).json()["task_id"])
    assert failed["status"] == "failed"
    assert "corrupt" in failed["error"]
    assert worker_health(proc).status_code == 200
    later = wait_task(proc, submit_task(proc.base_url, tiny_pdf, fake_vlm_url).json()["task_id"])
    assert later["status"] == "completed", proc.log_tail()
    health = worker_health(proc)
    assert health.status_code == 200
    assert health.json()["failed_tasks"] == 1 and health.json()["completed_tasks"] == 1


def test_engine_dies_while_idle(
    patched_mineru_site: Path,
    mineru_api_factory: Callable[..., ManagedProcess],
    fake_vlm_url: str,
    tiny_pdf: bytes,
    tmp_path: Path,
) -> None:
    plan = tmp_path / "fault-plan"
    proc = mineru_api_factory(patched_mineru_site, env={"MINERU_HEALTH_FAULT_PLAN": str(plan)})
    write_plan(plan, "engine_dead_idle")
    unhealthy = wait_until(lambda: worker_health(proc).status_code == 503, 30.0, 0.2)
    assert unhealthy, proc.log_tail()
    body = worker_health(proc).json()
    _assert_engine_dead_body(body)
    assert body["rule"].startswith("liveness:")
    _assert_refuses_work(proc, tiny_pdf, fake_vlm_url)


def test_exit_on_fatal(
    patched_mineru_site: Path,
    mineru_api_factory: Callable[..., ManagedProcess],
    fake_vlm_url: str,
    tiny_pdf: bytes,
    tmp_path: Path,
) -> None:
    plan = tmp_path / "fault-plan"
    proc = mineru_api_factory(
        patched_mineru_site,
        env={
            "MINERU_HEALTH_FAULT_PLAN": str(plan),
            "MINERU_HEALTH_EXIT_ON_FATAL": "1",
            "MINERU_HEALTH_EXIT_GRACE_S": "5",
        },
    )
    write_plan(plan, "engine_dead")
    task_id = submit_task(proc.base_url, tiny_pdf, fake_vlm_url).json()["task_id"]
    final = wait_task(proc, task_id)
    assert final["status"] == "failed" and final["verdict"]["role"] == "trigger"
    during_grace = http_get(f"{proc.base_url}/health", 2.0)
    assert during_grace is None or during_grace.status_code == 503
    assert proc.wait(60.0) == 75, proc.log_tail()
    assert "exiting with status 75" in proc.log()


def test_hang_stops_answering(
    patched_mineru_site: Path,
    mineru_api_factory: Callable[..., ManagedProcess],
    tmp_path: Path,
) -> None:
    plan = tmp_path / "fault-plan"
    proc = mineru_api_factory(
        patched_mineru_site,
        env={"MINERU_HEALTH_FAULT_PLAN": str(plan), "MINERU_HEALTH_FAULT_HANG_S": "6"},
    )
    write_plan(plan, "hang")
    assert wait_until(lambda: http_get(f"{proc.base_url}/health", 1.0) is None, 20.0, 0.1)
    assert wait_until(
        lambda: (
            (r := http_get(f"{proc.base_url}/health", 2.0)) is not None and r.status_code == 200
        ),
        60.0,
        0.2,
    ), proc.log_tail()


def _native_worker(
    factory: Callable[..., ManagedProcess], site: Path, tmp_path: Path, **env: str
) -> tuple[ManagedProcess, Path, int]:
    """A worker with a fault plan and its native endpoint on a port of its own."""
    plan, port = tmp_path / "fault-plan", free_port()
    env = {"MINERU_HEALTH_FAULT_PLAN": str(plan), "MINERU_HEALTH_PORT": str(port), **env}
    return factory(site, env=env), plan, port


def _native_health(port: int) -> httpx.Response | None:
    return http_get(f"http://127.0.0.1:{port}/health", 5.0)


def _native_503(proc: ManagedProcess, port: int, timeout_s: float) -> dict[str, Any]:
    """The native endpoint's body once it answers 503 (asserted within ``timeout_s``)."""
    answer = wait_until(
        lambda: (r := _native_health(port)) is not None and r.status_code == 503 and r,
        timeout_s,
        0.1,
    )
    assert answer, proc.log_tail()
    return answer.json()


def test_native_endpoint_tells_busy_from_hung(
    patched_mineru_site: Path,
    mineru_api_factory: Callable[..., ManagedProcess],
    tmp_path: Path,
) -> None:
    proc, plan, port = _native_worker(
        mineru_api_factory, patched_mineru_site, tmp_path, MINERU_HEALTH_LOOP_HANG_S="4"
    )
    assert worker_health(proc).json()["native_health_port"] == port
    native = _native_health(port)
    assert native is not None and native.status_code == 200
    assert native.json()["loop_hung"] is False and native.json()["loop_lag_s"] < 4

    # Busy: the loop is blocked for less than the hang limit. The main port
    # answers nothing meanwhile; the native endpoint answers 200 with the lag.
    write_plan(plan, "hang 3")

    def busy() -> dict[str, Any] | None:
        answer = _native_health(port)
        assert answer is not None and answer.status_code == 200, answer
        body: dict[str, Any] = answer.json()
        return body if body["loop_lag_s"] >= 1.5 else None

    body = wait_until(busy, 30.0, 0.1)
    assert body and body["status"] == "healthy" and not body["loop_hung"], proc.log_tail()
    assert http_get(f"{proc.base_url}/health", 0.5) is None
    assert wait_until(lambda: worker_health(proc).status_code == 200, 30.0, 0.2)

    # Hung: blocked past the limit. 503 with loop_hung; healthy again once it resumes.
    write_plan(plan, "hang 8")

    def hung() -> dict[str, Any] | None:
        answer = _native_health(port)
        assert answer is not None, "the native endpoint must answer while the loop is hung"
        body: dict[str, Any] = answer.json()
        return body if answer.status_code == 503 else None

    body = wait_until(hung, 30.0, 0.1)
    assert body and body["loop_hung"] is True and body["engine_dead"] is False, proc.log_tail()
    live = http_get(f"http://127.0.0.1:{port}/livez", 5.0)
    assert live is not None and live.status_code == 503
    assert wait_until(
        lambda: (r := _native_health(port)) is not None and r.status_code == 200, 30.0, 0.2
    ), proc.log_tail()


def test_engine_stall_is_fatal_and_fails_its_tasks(
    patched_mineru_site: Path,
    mineru_api_factory: Callable[..., ManagedProcess],
    fake_vlm_url: str,
    tiny_pdf: bytes,
    tmp_path: Path,
) -> None:
    stall_s = 4.0
    proc, plan, port = _native_worker(
        mineru_api_factory, patched_mineru_site, tmp_path, MINERU_HEALTH_STALL_S=str(stall_s)
    )
    write_plan(plan, "engine_stall")
    ids = [submit_task(proc.base_url, tiny_pdf, fake_vlm_url).json()["task_id"] for _ in range(3)]
    assert wait_until(
        lambda: (r := _native_health(port)) is not None and r.json()["engine_calls_in_flight"] > 0,
        60.0,
        0.1,
    ), proc.log_tail()
    # 503 within the stall time plus the watcher's second, while the HTTP server stays up.
    body = _native_503(proc, port, stall_s + 30.0)
    assert body["category"] == "engine_stalled" and body["engine_dead"] is True
    finals = [wait_task(proc, task_id) for task_id in ids]
    assert [f["status"] for f in finals] == ["failed"] * 3, finals
    for final in finals:
        assert final["verdict"]["role"] == "collateral"
        assert final["verdict"]["category"] == "engine_stalled"
    assert worker_health(proc).status_code == 503


@pytest.mark.parametrize("silent", ["tarpit"])
def test_a_remote_server_that_never_answers_fails_its_task_alone(
    patched_mineru_site: Path,
    mineru_api_factory: Callable[..., ManagedProcess],
    fake_vlm_url: str,
    tiny_pdf: bytes,
    silent: str,
) -> None:
    """Issues 17, 24 and 32: a user's ``server_url`` that never answers, not even the
    model listing (``tarpit``: its silence starts before any local work, which
    a cold first parse on a loaded machine makes longer than this bound).

    MinerU's HTTP client waits up to 600 s per read; past STALL_S the stall
    watchdog used to call those remote calls a stalled engine, and past
    TASK_HANG_S the task watchdog called the task hung (every task hung: the
    worker 503'd and was restarted); then (issue 24) the task waited on for
    good. A remote server is not this worker's engine: sending nothing for
    TASK_HANG_S fails the task alone, naming the server, and the worker stays
    healthy throughout.
    """
    port = free_port()
    bound_s = 6.0  # a cold first parse shows nothing for up to ~4 s here under load
    proc = mineru_api_factory(
        patched_mineru_site,
        env={
            "MINERU_HEALTH_PORT": str(port),
            "MINERU_HEALTH_STALL_S": str(bound_s),
            "MINERU_HEALTH_TASK_HANG_S": str(bound_s),
        },
    )
    # A first parse warms MinerU's page-render pool (a cold one can pass the bound
    # before it reaches any call: nothing to show for it meanwhile).
    warm = submit_task(proc.base_url, tiny_pdf, fake_vlm_url).json()["task_id"]
    assert wait_task(proc, warm)["status"] == "completed"
    tarpit = f"{fake_vlm_url}/{silent}/60000/"  # answers after 60 s
    task_id = submit_task(proc.base_url, tiny_pdf, tarpit).json()["task_id"]
    deadline = time.monotonic() + 60.0
    final: dict[str, Any] = {}
    while time.monotonic() < deadline and final.get("status") != "failed":
        native = _native_health(port)
        assert native is not None and native.status_code == 200, (native, proc.log_tail())
        assert native.json()["engine_calls_in_flight"] == 0
        final = task_status(proc.base_url, task_id)
        time.sleep(0.25)
    assert final.get("status") == "failed", (final, proc.log_tail())
    server = fake_vlm_url.removeprefix("http://")
    assert f"remote engine server {server} sent nothing for {bound_s:g} s" in final["error"], final
    assert final["engine_dead"] is False
    verdict = final["verdict"]
    assert verdict["kind"] == "task_local" and verdict["remote_engine"] is True, verdict
    assert verdict["rule"] == "watchdog.remote_wait" and "hung" not in verdict, verdict
    assert worker_health(proc).status_code == 200
    scraped = httpx.get(f"{proc.base_url}/metrics", timeout=10).text
    assert 'mineru_worker_remote_wait_failures_total{reason="silent"} 1.0' in scraped, scraped


def test_a_hung_parse_fails_alone_while_the_worker_serves_on(
    patched_mineru_site: Path,
    mineru_api_factory: Callable[..., ManagedProcess],
    fake_vlm_url: str,
    tiny_pdf: bytes,
    tmp_path: Path,
) -> None:
    """Issue 17: a parse that hangs outside any engine call used to stay processing forever."""
    hang_s = 30.0  # a bound no parse reaches on a loaded machine
    proc, plan, port = _native_worker(
        mineru_api_factory, patched_mineru_site, tmp_path, MINERU_HEALTH_TASK_HANG_S=str(hang_s)
    )
    # A first parse warms MinerU's page-render pool: its cold start alone can
    # take seconds on a loaded machine, with no progress to show meanwhile.
    warm = submit_task(proc.base_url, tiny_pdf, fake_vlm_url).json()["task_id"]
    assert wait_task(proc, warm)["status"] == "completed"
    write_plan(plan, "parse_hang")
    assert wait_until(lambda: not plan.exists(), 30.0, 0.1), proc.log_tail()
    hung_id = submit_task(proc.base_url, tiny_pdf, fake_vlm_url).json()["task_id"]
    assert wait_until(
        lambda: task_status(proc.base_url, hung_id)["status"] == "processing", 60.0, 0.1
    ), proc.log_tail()
    # Another task that keeps making progress past the hung one's bound: a page
    # answered every 5 s, one at a time (8 pages: 40 s, longer than the bound).
    pages = make_pdf(pages=8, seed=3)
    busy_id = submit_task(proc.base_url, pages, f"{fake_vlm_url}/serial/5000/").json()["task_id"]

    hung = wait_task(proc, hung_id)
    assert hung["status"] == "failed" and "no progress" in hung["error"]
    assert hung["engine_dead"] is False
    assert hung["verdict"]["hung"] is True and hung["verdict"]["role"] == "trigger"
    assert hung["verdict"]["category"] == "task_hung"
    native = _native_health(port)
    assert native is not None and native.status_code == 200, proc.log_tail()
    assert wait_task(proc, busy_id)["status"] == "completed"
    assert worker_health(proc).status_code == 200


def test_a_worker_whose_every_task_hangs_is_stalled(
    patched_mineru_site: Path,
    mineru_api_factory: Callable[..., ManagedProcess],
    fake_vlm_url: str,
    tiny_pdf: bytes,
    tmp_path: Path,
) -> None:
    proc, plan, port = _native_worker(
        mineru_api_factory, patched_mineru_site, tmp_path, MINERU_HEALTH_TASK_HANG_S="3"
    )
    write_plan(plan, "parse_hang")
    assert wait_until(lambda: not plan.exists(), 30.0, 0.1), proc.log_tail()
    task_id = submit_task(proc.base_url, tiny_pdf, fake_vlm_url).json()["task_id"]
    assert wait_task(proc, task_id)["verdict"]["hung"] is True
    body = _native_503(proc, port, 30.0)
    assert body["rule"] == "watchdog.tasks_hung"
    assert body["category"] == "engine_stalled"
    # Issue 25: the watchdog's death is in the fatal-errors counter, as a rule's is.
    scraped = httpx.get(f"{proc.base_url}/metrics", timeout=10).text
    assert (
        'mineru_worker_fatal_errors_total{category="engine_stalled",rule="watchdog.tasks_hung"} 1.0'
    ) in scraped, scraped


def test_importing_the_patched_server_module_writes_no_file(
    patched_mineru_site: Path,
    mineru_python: str,
    tmp_path: Path,
) -> None:
    """Issue 25: importing it made ``output/mineru-health-finished.sqlite3`` in the current
    directory; the task store opens when the worker starts serving."""
    from mineru_health.demo import sandbox

    env = sandbox.mineru_env(patched_mineru_site)
    done = subprocess.run(
        [mineru_python, "-c", "import mineru.cli.fast_api"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert not [p for p in tmp_path.rglob("*") if p.is_file()], list(tmp_path.rglob("*"))


def test_revert_restores_fast_api_byte_for_byte(mineru_copy: Path) -> None:
    fast_api = mineru_copy / "mineru" / "cli" / "fast_api.py"
    original = hashlib.sha256(fast_api.read_bytes()).hexdigest()
    assert run_cli("patch", "apply", "--mineru-path", str(mineru_copy / "mineru")).returncode == 0
    assert hashlib.sha256(fast_api.read_bytes()).hexdigest() != original
    reverted = run_cli("patch", "revert", "--mineru-path", str(mineru_copy / "mineru"))
    assert reverted.returncode == 0, reverted.stderr
    assert hashlib.sha256(fast_api.read_bytes()).hexdigest() == original


def test_bad_rules_file_stops_the_worker_at_start(
    patched_mineru_site: Path,
    mineru_api_factory: Callable[..., ManagedProcess],
    tmp_path: Path,
) -> None:
    rules = tmp_path / "rules.txt"
    rules.write_text(
        "# site rules\n"
        "site.ok task_local bad_input broken table\n"
        "site.broken fatal engine_dead (unclosed\n",
        encoding="utf-8",
    )
    proc = mineru_api_factory(
        patched_mineru_site, env={"MINERU_HEALTH_RULES": str(rules)}, wait_healthy=False
    )
    assert wait_until(lambda: proc.poll() is not None, 90.0, 0.2), "worker started anyway"
    assert proc.poll() != 0
    log = proc.log_tail(20000)
    assert f"{rules}:3" in log and "site.broken" in log and "missing )" in log, log
    assert http_get(f"{proc.base_url}/health", 1.0) is None


def test_operator_rule_makes_a_failure_fatal(
    patched_mineru_site: Path,
    mineru_api_factory: Callable[..., ManagedProcess],
    fake_vlm_url: str,
    tiny_pdf: bytes,
    tmp_path: Path,
) -> None:
    # Without a code change, an operator decides that this error kills the engine.
    rules = tmp_path / "rules.txt"
    # origin=any: the fault is a ValueError raised outside any engine module.
    rules.write_text("site.corrupt_kills fatal engine_dead origin=any corrupt\n", encoding="utf-8")
    plan = tmp_path / "fault-plan"
    proc = mineru_api_factory(
        patched_mineru_site,
        env={"MINERU_HEALTH_RULES": str(rules), "MINERU_HEALTH_FAULT_PLAN": str(plan)},
    )
    write_plan(plan, "task_local")
    failed = wait_task(proc, submit_task(proc.base_url, tiny_pdf, fake_vlm_url).json()["task_id"])
    assert failed["status"] == "failed"
    health = worker_health(proc)
    assert health.status_code == 503, health.text
    assert health.json()["rule"] == "site.corrupt_kills"
