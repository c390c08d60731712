"""How the package is built, versioned and released (the install paths themselves run in
scripts/test_install.sh and scripts/test_docker_fallback.sh: they take minutes)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import mineru_health
import pytest
from mineru_health import cli, patching

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "scripts"
WORKFLOW = REPO / ".github" / "workflows" / "release.yml"


def _pyproject() -> dict[str, Any]:
    tomllib = pytest.importorskip("tomllib")  # 3.11+
    return dict(tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8")))


def _script_module(name: str) -> ModuleType:
    path = SCRIPTS / f"{name}.py"
    if not path.is_file():
        pytest.skip(f"{path} is not next to the tests")
    spec = importlib.util.spec_from_file_location(f"_script_{name}", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --- one version, and what it patches ---------------------------------------------------------


def test_the_version_is_written_once() -> None:
    pyproject = _pyproject()
    assert "version" not in pyproject["project"]
    assert pyproject["project"]["dynamic"] == ["version"]
    source = pyproject["tool"]["scikit-build"]["metadata"]["version"]["input"]
    assert source == "python/mineru_health/__init__.py"
    assert importlib.metadata.version("mineru-health") == mineru_health.__version__


def test_version_names_the_mineru_releases_it_patches(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["--version"])
    assert exited.value.code == 0
    out = capsys.readouterr().out.strip()
    assert (
        out == f"mineru-health {mineru_health.__version__} (patches MinerU "
        f"{patching.supported_releases()})"
    )
    assert "3.3.0-3.4.5" in out and "4.0.12" in out


# --- the interpreter the demo and the tests start MinerU with ---------------------------------


def test_a_relative_mineru_python_is_made_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mineru_health.demo import sandbox

    venv_bin = tmp_path / "venv" / "bin"
    venv_bin.mkdir(parents=True)
    (venv_bin / "python").symlink_to(sys.executable)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(sandbox.MINERU_PYTHON_ENV, "venv/bin/python")
    monkeypatch.setenv(sandbox.MINERU4_PYTHON_ENV, "./venv/bin/python")
    # The link itself, not what it points to: a venv is where its python link lives.
    assert sandbox.mineru_python() == str(venv_bin / "python")
    assert sandbox.mineru4_python() == str(venv_bin / "python")


def test_a_bare_interpreter_name_is_looked_up_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    from mineru_health.demo import sandbox

    name = Path(sys.executable).name
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent))
    assert sandbox.interpreter(name) == shutil.which(name)


# --- the type stub's build step ---------------------------------------------------------------


def test_the_stub_step_keeps_the_build_environment_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pip's isolated build reaches its requirements through PYTHONPATH (issue: replacing
    it dropped pybind11-stubgen and failed every `pip install` of the source)."""
    stub = _script_module("native_stub")
    seen: dict[str, Any] = {}

    def run(argv: list[str], **kwargs: Any) -> None:
        seen.update(kwargs)
        raise RuntimeError("stop here")

    monkeypatch.setattr(stub.importlib.util, "find_spec", lambda name: object())
    monkeypatch.setattr(stub.subprocess, "run", run)
    monkeypatch.setenv("PYTHONPATH", "/pip-build-env/site")
    extension = tmp_path / "_native.so"
    extension.write_bytes(b"")
    with pytest.raises(RuntimeError):
        stub.main([str(extension), str(tmp_path / "_native.pyi")])
    paths = seen["env"]["PYTHONPATH"].split(os.pathsep)
    assert paths[1:] == ["/pip-build-env/site"]
    assert Path(paths[0]).name.startswith("mineru-health-stub-")


def test_a_missing_stub_generator_is_a_message_not_a_failed_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    stub = _script_module("native_stub")
    monkeypatch.setattr(stub.importlib.util, "find_spec", lambda name: None)
    out = tmp_path / "_native.pyi"
    out.write_text("stale", encoding="utf-8")
    assert stub.main([str(tmp_path / "_native.so"), str(out)]) == 0
    assert not out.exists()
    message = capsys.readouterr().err
    assert "pybind11-stubgen is not installed" in message and stub.STUBGEN in message


def test_the_stub_generator_pinned_for_the_build_is_the_one_named() -> None:
    stub = _script_module("native_stub")
    pyproject = _pyproject()
    assert stub.STUBGEN in pyproject["build-system"]["requires"]


# --- the release workflow ---------------------------------------------------------------------


def _workflow_runs() -> list[str]:
    yaml = pytest.importorskip("yaml")
    if not WORKFLOW.is_file():
        pytest.skip(f"{WORKFLOW} is not next to the tests")
    workflow = yaml.safe_load(WORKFLOW.read_text(encoding="utf-8"))
    return [
        step["run"] for job in workflow["jobs"].values() for step in job["steps"] if "run" in step
    ]


def test_the_release_workflow_is_valid_for_github() -> None:
    pytest.importorskip("check_jsonschema")
    if not WORKFLOW.is_file():
        pytest.skip(f"{WORKFLOW} is not next to the tests")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "check_jsonschema",
            "--builtin-schema",
            "vendor.github-workflows",
            str(WORKFLOW),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_release_workflow_runs_the_tested_scripts() -> None:
    runs = "\n".join(_workflow_runs())
    named = set(re.findall(r"scripts/[\w.]+\.sh", runs))
    assert {
        "scripts/build_wheels.sh",
        "scripts/test_wheels.sh",
        "scripts/test_install.sh",
        "scripts/fetch_release_wheels.sh",
    } <= named
    for script in named:
        assert (REPO / script).is_file(), script
        subprocess.run(["bash", "-n", str(REPO / script)], check=True, timeout=30)
    test_sh = (SCRIPTS / "test.sh").read_text(encoding="utf-8")
    assert "scripts/test_install.sh" in test_sh and "scripts/test_docker_fallback.sh" in test_sh
