# ruff: noqa: F811 - the fixtures are imported from mineru4_support and named as parameters
"""Finished 4.0 jobs survive a restart: kill -9, a new worker on the same upload directory."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest
from mineru4_support import (
    Worker,
    python4,  # noqa: F401 - fixture
    site4,  # noqa: F401 - fixture
    start_worker4,  # noqa: F401 - fixture
    text_pdf,
)

pytestmark = pytest.mark.integration


def test_finished_jobs_survive_a_kill(start_worker4: Any, tmp_path: Path) -> None:
    uploads = tmp_path / "uploads"
    first: Worker = start_worker4(upload_dir=uploads)
    done = first.wait_terminal(first.submit(text_pdf(3)).json()["task_id"])
    assert done["status"] == "completed", done
    task_id = done["task_id"]
    before = first.get(f"/v1/tasks/{task_id}/result")
    assert before.status_code == 200, before.text

    first.proc.popen.send_signal(signal.SIGKILL)
    assert first.proc.wait(10.0) == -signal.SIGKILL

    second: Worker = start_worker4(upload_dir=uploads)
    again = second.job(task_id)
    assert again["status"] == "completed"
    assert again["files"] == done["files"]
    after = second.get(f"/v1/tasks/{task_id}/result")
    assert after.status_code == 200, after.text
    assert after.content == before.content
    markdown = again["files"][0]["output_files"]["markdown"]["file_id"]
    content = second.get(f"/v1/files/{markdown}/content")
    assert content.status_code == 200 and b"quick brown fox" in content.content
