"""A real, patched ``mineru-api`` 4.0.12 whose engine dies (fault plan), end to end.

The fault is raised at 4.0's parse call (where an engine raises) with the
engine's own exception: llama.cpp's ``EngineError``, PyTorch's sticky CUDA
``RuntimeError``, vLLM's ``EngineDeadError``. Upstream 4.0.12 recognises only
the last; with the hooks every one turns the worker's native ``/health`` and
``/v1/health`` to 503 and refuses new work, while a document's own error
leaves it healthy.
"""

# ruff: noqa: F811 - the fixtures are imported from mineru4_support and named as parameters
from __future__ import annotations

from datetime import datetime
from typing import Any

import httpx
import mineru_health
import pytest
from mineru4_support import (  # noqa: F401 - fixtures
    Worker,
    plan_consumed,
    python4,
    site4,
    start_worker4,
    text_pdf,
)
from mineru_health.demo import faults
from mineru_health.demo.faults import write_plan
from mineru_health.demo.sandbox import wait_until

pytestmark = pytest.mark.integration

DEATHS = {
    "llama_engine_dead": "llama.cpp EngineError",
    "cuda_illegal_address": "CUDA illegal memory access",
    "engine_dead": "vLLM EngineDeadError",
}
GATED = ("/v1/tasks", "/v1/parse/jobs", "/v1/file_parse")


def _classified_fatal(word: str) -> bool:
    """Whether this package's rules call the planned error fatal (llama.cpp needs its rules)."""
    make, module = faults.DEATHS[word]
    try:
        faults.raise_in(module, make())
    except Exception as error:  # noqa: BLE001 - the planned error itself
        return mineru_health.classify(error).fatal
    return False


def _assert_dead_body(body: dict[str, Any]) -> None:
    assert body["status"] == "unhealthy"
    assert body["engine_dead"] is True
    assert body["version"] == "4.0.12"
    assert body["rule"] and body["category"]
    assert datetime.fromisoformat(body["since"]).tzinfo is not None


@pytest.mark.parametrize("word", list(DEATHS), ids=list(DEATHS.values()))
def test_engine_death_makes_the_worker_unhealthy(start_worker4: Any, word: str) -> None:
    if not _classified_fatal(word):
        pytest.skip(f"no built-in rule calls the planned {DEATHS[word]} fatal yet")
    worker: Worker = start_worker4()
    healthy = worker.get("/v1/health")
    assert healthy.json()["native_health_port"] == int(worker.native_url.rsplit(":", 1)[1])
    assert worker.native().status_code == 200

    write_plan(worker.plan, word)
    plan_consumed(worker)
    submitted = worker.submit(text_pdf())
    assert submitted.status_code == 202, submitted.text
    job = worker.wait_terminal(submitted.json()["task_id"])
    assert job["status"] == "failed"
    assert job["files"][0]["error"]["code"] == "engine_dead"  # MinerU's own fail_engine path

    native = worker.native()
    assert native.status_code == 503, native.text
    _assert_dead_body(native.json())
    main = worker.get("/v1/health")
    assert main.status_code == 503, main.text
    _assert_dead_body(main.json())
    assert main.json()["rule"] == native.json()["rule"]
    for path in GATED:
        refused = worker.submit(text_pdf(1), path=path)
        assert refused.status_code == 503, (path, refused.text)
        assert int(refused.headers["retry-after"]) > 0
        assert "engine" in refused.json()["message"]


def test_document_error_keeps_the_worker(start_worker4: Any) -> None:
    worker: Worker = start_worker4()
    write_plan(worker.plan, "task_local")
    plan_consumed(worker)
    failed = worker.wait_terminal(worker.submit(text_pdf()).json()["task_id"])
    assert failed["status"] == "failed"
    assert failed["files"][0]["error"]["code"] == "parse_failed"

    assert worker.native().status_code == 200
    main = worker.get("/v1/health")
    assert main.status_code == 200, main.text
    assert worker.native().json()["task_local_failures"] >= 1
    done = worker.wait_terminal(worker.submit(text_pdf()).json()["task_id"])
    assert done["status"] == "completed", done


def test_remote_engine_never_condemns_the_worker(start_worker4: Any) -> None:
    # A VLM server URL makes the engine remote (http-client): its errors are the server's.
    worker: Worker = start_worker4(args=("--vlm-server-url", "http://127.0.0.1:9"))
    write_plan(worker.plan, "remote_engine_dead")
    plan_consumed(worker)
    failed = worker.wait_terminal(worker.submit(text_pdf()).json()["task_id"])
    assert failed["status"] == "failed"
    assert failed["files"][0]["error"]["code"] == "parse_failed"
    assert worker.native().status_code == 200
    assert worker.get("/v1/health").status_code == 200


def test_device_errors_exhaust_the_error_budget(start_worker4: Any) -> None:
    worker: Worker = start_worker4({"MINERU_HEALTH_ERROR_BUDGET": "2"})
    for round_ in range(2):
        write_plan(worker.plan, "device_oom")
        plan_consumed(worker)
        job = worker.wait_terminal(worker.submit(text_pdf()).json()["task_id"])
        assert job["status"] == "failed"
        expected = 200 if round_ == 0 else 503
        assert worker.native().status_code == expected, worker.native().text
    body = worker.get("/v1/health").json()
    assert body["engine_dead"] is True and body["category"], body


def test_engine_stall_fails_every_unfinished_job(start_worker4: Any) -> None:
    worker: Worker = start_worker4({"MINERU_HEALTH_STALL_S": "3"})
    write_plan(worker.plan, "engine_stall")
    plan_consumed(worker)
    first = worker.submit(text_pdf()).json()["task_id"]
    queued = worker.submit(text_pdf(), name="second.pdf").json()["task_id"]  # concurrency 1
    for task_id in (first, queued):
        job = worker.wait_terminal(task_id, timeout_s=60.0)
        assert job["status"] == "failed", job
        assert job["files"][0]["error"]["code"] == "engine_dead", job
    body = worker.native().json()
    assert body["engine_dead"] is True and body["category"] == "engine_stalled", body
    assert worker.get("/v1/health").status_code == 503


def test_native_endpoint_answers_while_the_loop_hangs(start_worker4: Any) -> None:
    worker: Worker = start_worker4({"MINERU_HEALTH_LOOP_HANG_S": "2"})
    write_plan(worker.plan, "hang 8")
    plan_consumed(worker)
    hung = wait_until(lambda: worker.native().json().get("loop_hung"), 6.0, 0.2)
    assert hung, worker.native().text
    answer = worker.native()
    assert answer.status_code == 503 and answer.elapsed.total_seconds() < 1.0
    with pytest.raises(httpx.TimeoutException):
        worker.get("/v1/health", timeout_s=1.0)
    recovered = wait_until(lambda: worker.native().status_code == 200, 20.0, 0.2)
    assert recovered, worker.native().text
    assert worker.get("/v1/health").status_code == 200


def test_exit_on_fatal(start_worker4: Any) -> None:
    worker: Worker = start_worker4(
        {"MINERU_HEALTH_EXIT_ON_FATAL": "1", "MINERU_HEALTH_EXIT_GRACE_S": "3"}
    )
    write_plan(worker.plan, "cuda_illegal_address")
    plan_consumed(worker)
    job = worker.wait_terminal(worker.submit(text_pdf()).json()["task_id"])
    assert job["files"][0]["error"]["code"] == "engine_dead"
    assert worker.proc.wait(30.0) == 75, worker.proc.log_tail()  # EX_TEMPFAIL


def test_poison_document_kills_the_engine_of_whoever_parses_it(start_worker4: Any) -> None:
    worker: Worker = start_worker4()
    write_plan(worker.plan, "poison poison.pdf")
    assert wait_until(lambda: worker.native().status_code == 200, 5.0)
    fine = worker.wait_terminal(worker.submit(text_pdf(), name="fine.pdf").json()["task_id"])
    assert fine["status"] == "completed", fine
    assert worker.native().status_code == 200
    bad = worker.wait_terminal(worker.submit(text_pdf(), name="poison.pdf").json()["task_id"])
    assert bad["files"][0]["error"]["code"] == "engine_dead", bad
    assert worker.native().status_code == 503
    assert worker.plan.exists()  # not consumed: a restarted worker is armed alike


def test_a_hung_parse_ends_as_task_hung_and_stalls_a_worker_with_nothing_else(
    start_worker4: Any,
) -> None:
    """Issue 17 on 4.0: a parse that hangs outside any engine call used to run forever."""
    # A bound no parse reaches on a loaded machine (a cold parse there took 16 s).
    worker: Worker = start_worker4({"MINERU_HEALTH_TASK_HANG_S": "30"})
    warm = worker.wait_terminal(worker.submit(text_pdf()).json()["task_id"])
    assert warm["status"] == "completed", warm
    write_plan(worker.plan, "parse_hang")
    plan_consumed(worker)
    job = worker.wait_terminal(worker.submit(text_pdf()).json()["task_id"], timeout_s=120.0)
    assert job["status"] == "failed", job
    assert job["files"][0]["error"]["code"] == "task_hung", job
    # Its only job hung: the worker is as good as stalled (concurrency 1).
    body = worker.native().json()
    assert body["engine_dead"] is True and body["rule"] == "watchdog.tasks_hung", body
    assert worker.get("/v1/health").status_code == 503


def test_building_the_app_installs_the_hooks_and_writes_no_store(
    python4: str, site4: Any, tmp_path: Any
) -> None:
    """Issue 25: 4.0 builds its app in ``create_app`` (no app at import); building it installs
    the hooks, and the task store is opened only when the worker starts serving."""
    import subprocess

    from mineru_health.demo import sandbox

    code = (
        "from mineru.parser.api_server import create_app; "
        "app = create_app(upload_dir='uploads'); "
        "print([m.cls.__name__ for m in app.user_middleware])"
    )
    done = subprocess.run(
        [python4, "-c", code],
        cwd=tmp_path,
        env=sandbox.mineru_env(site4),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "'Gate'" in done.stdout, done.stdout
    written = sorted(p.name for p in tmp_path.rglob("*") if p.is_file())
    assert written == [], written  # MinerU's own upload directories, empty; no store file
