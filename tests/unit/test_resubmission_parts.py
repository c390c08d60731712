"""Small parts of issue 9: the poison fault word, task context, instance dirs, kept uploads."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from mineru_health.demo import fault_plugin, faults
from mineru_health.demo.faults import FaultInjector, write_plan
from mineru_health.mineru3.router.endpoints import retained_payload_class
from mineru_health.mineru3.router.pool import RetiredOutputs
from mineru_health.runtime.router.audit import AuditLog
from mineru_health.runtime.state_dirs import StateDirs
from mineru_health.runtime.worker import engine_calls
from mineru_health.runtime.worker.health import WorkerHealth

# --- fault plan: poison <file name> -----------------------------------------------------------


def test_poison_word_takes_a_file_name() -> None:
    assert faults.parse_plan("poison report.pdf") == ("poison", "report.pdf")
    assert faults.parse_plan("poison  my report.pdf \n") == ("poison", "my report.pdf")
    assert faults.parse_plan("poison") is None
    with pytest.raises(ValueError, match="needs a file name"):
        write_plan("/nonexistent/plan", "poison")


def test_poison_kills_the_engine_of_the_worker_that_parses_it(tmp_path: Path) -> None:
    plan = tmp_path / "plan"
    write_plan(plan, "poison bad.pdf")
    first, second = FaultInjector(plan), FaultInjector(plan)
    first.before_engine_call(("good.pdf",))  # other documents parse fine
    assert plan.exists()  # not consumed: every worker reading it is armed
    second.before_engine_call(("good.pdf",))
    with pytest.raises(Exception) as info:
        first.before_engine_call(("a.pdf", "bad.pdf"))
    assert type(info.value).__name__ == "EngineDeadError"
    with pytest.raises(Exception, match="EngineCore"):
        first.before_engine_call(("good.pdf",))  # dead for every later call, like engine_dead
    second.before_engine_call(("good.pdf",))  # the other worker is untouched
    assert first.applied == ["poison"]  # armed once, however often the plan is read


def test_task_upload_names_are_in_context_for_engine_calls() -> None:
    seen: list[tuple[str, ...]] = []

    class Manager:
        async def _run_task(self, task: Any) -> str:
            await asyncio.sleep(0)
            seen.append(fault_plugin.current_uploads())
            seen.append(await asyncio.to_thread(fault_plugin.current_uploads))
            return "done"

    manager = Manager()
    health = WorkerHealth()
    engine_calls.follow_tasks(manager, lambda: health)  # the worker's, then the plugin's
    fault_plugin.follow_uploads(manager)
    wrapped = manager._run_task
    fault_plugin.follow_uploads(manager)  # idempotent
    engine_calls.follow_tasks(manager, lambda: health)
    assert manager._run_task is wrapped
    task = type("Task", (), {"upload_names": ["a.pdf", "b.pdf"]})()
    assert asyncio.run(manager._run_task(task)) == "done"
    assert seen == [("a.pdf", "b.pdf"), ("a.pdf", "b.pdf")]
    assert fault_plugin.current_uploads() == ()


def test_job_file_names_are_in_context_for_4x_engine_calls() -> None:
    seen: list[tuple[str, ...]] = []

    async def _run_job(record: Any, *args: Any) -> str:
        seen.append(await asyncio.to_thread(fault_plugin.current_uploads))
        return "done"

    server = type(sys)("mh_fake_api_server")
    server._run_job = _run_job  # type: ignore[attr-defined]
    fault_plugin._wrap_functions(
        server,
        ("_run_job",),
        functools.partial(fault_plugin._with_uploads, names_of=fault_plugin._job_file_names),
    )
    files = [type("File", (), {"name": name})() for name in ("a.pdf", "b.pdf")]
    record = type("Record", (), {"files": files})()
    assert asyncio.run(server._run_job(record, "request")) == "done"  # type: ignore[attr-defined]
    assert seen == [("a.pdf", "b.pdf")]


# --- instance directories ----------------------------------------------


class _TempDir:
    def __init__(self, path: Path) -> None:
        self.name = str(path)
        path.mkdir()

    def cleanup(self) -> None:
        Path(self.name).rmdir()


def test_state_dirs_and_retired_outputs_are_kept_until_close(tmp_path: Path) -> None:
    dirs = StateDirs(base="")
    state = dirs.state_dir("local-gpu-0")
    assert state.is_dir() and dirs.state_dir("local-gpu-0") == state
    retired = RetiredOutputs(retention_s=3600)
    local = type("Local", (), {})()
    local.temp_dir = _TempDir(tmp_path / "instance-1")
    retired.retire(local)
    assert local.temp_dir is None and (tmp_path / "instance-1").is_dir()
    retired.retire(local)  # nothing left to retire
    assert len(retired) == 1
    retired.close()
    dirs.close()
    assert not (tmp_path / "instance-1").exists() and not state.exists()


def test_operator_state_dir_is_kept(tmp_path: Path) -> None:
    dirs = StateDirs(base=str(tmp_path))
    assert dirs.state_dir("remote-1") == tmp_path / "remote-1"
    dirs.close()
    assert (tmp_path / "remote-1").is_dir()


# --- kept uploads ----------------------------------------------------------------------------


@dataclasses.dataclass
class MultipartPayload:
    temp_dir: str
    fields: list[tuple[str, str]]
    uploads: list[Any]

    def cleanup(self) -> None:
        for entry in Path(self.temp_dir).iterdir():
            entry.unlink()
        Path(self.temp_dir).rmdir()


def test_retained_payload_waits_for_release(tmp_path: Path) -> None:
    cls = retained_payload_class(MultipartPayload)
    (tmp_path / "staged").mkdir()
    (tmp_path / "staged" / "a.pdf").write_bytes(b"%PDF")
    payload = cls(temp_dir=str(tmp_path / "staged"), fields=[], uploads=[])
    payload.retained = True
    payload.cleanup()  # MinerU's finally: the supervisor keeps it
    assert (tmp_path / "staged" / "a.pdf").exists()
    payload.release()  # the task is terminal
    assert not (tmp_path / "staged").exists()

    (tmp_path / "other").mkdir()
    unkept = cls(temp_dir=str(tmp_path / "other"), fields=[], uploads=[])
    unkept.cleanup()  # never handed over (submission failed): deleted as before
    assert not (tmp_path / "other").exists()


def test_router_originated_audit_record(tmp_path: Path) -> None:
    log = AuditLog(str(tmp_path / "audit.jsonl"))
    record = log.write_record(
        "poison_document_quarantined",
        worker_id="local-gpu-1",
        reason="killed two engines",
        workers=["a", "b"],
        unix_time=0.0,
    )
    log.close()
    line = json.loads((tmp_path / "audit.jsonl").read_text())
    assert line == record
    assert list(line)[:4] == ["time", "worker_id", "action", "reason"]
    assert line["time"].startswith("1970-01-01") and line["workers"] == ["a", "b"]
