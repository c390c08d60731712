"""The worker and router integration paths import nothing only the demo or the tests need.

MinerU itself imports httpx, so each module is imported in a fresh
interpreter in which MinerU and the demo-only libraries are absent: an import
of one of them fails there, and what got loaded is listed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

# Only the demo (or the tests) may use these.
DEMO_ONLY = ("httpx", "reportlab", "PIL")
ABSENT = ("mineru", *DEMO_ONLY)

SCRIPT = r"""
import importlib, importlib.abc, json, sys

ABSENT = set(sys.argv[2].split(","))

class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ABSENT:
            raise ModuleNotFoundError(f"No module named {name!r} (absent in this test)", name=name)
        return None

sys.meta_path.insert(0, Absent())
before = set(sys.modules)
importlib.import_module(sys.argv[1])
print(json.dumps(sorted(set(sys.modules) - before)))
"""


@pytest.mark.parametrize(
    "module",
    [
        "mineru_health.mineru3.worker",
        "mineru_health.mineru4.worker",
        "mineru_health.mineru3.router",
        "mineru_health.mineru4.router",
        "mineru_health.metrics",
        "mineru_health.runtime.router.fleet",
    ],
)
def test_integration_imports_no_demo_dependency(module: str, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, module, ",".join(ABSENT)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=tmp_path,  # the installed package, not a source tree
    )
    assert done.returncode == 0, done.stderr[-3000:]
    loaded = json.loads(done.stdout)
    assert not [m for m in loaded if m.split(".")[0] in ABSENT], loaded
    ours = [m for m in loaded if m.startswith("mineru_health.")]
    assert not [m for m in ours if m.startswith("mineru_health.demo")]
    assert "mineru_health.tracebacks" not in ours  # printed tracebacks: the CLI's, the corpus's


def test_the_demo_names_its_extra_when_a_library_is_missing(tmp_path: Path) -> None:
    script = SCRIPT.replace(
        "importlib.import_module(sys.argv[1])",
        "from mineru_health.demo import main; raise SystemExit(main([]))",
    )
    done = subprocess.run(
        [sys.executable, "-c", script, "unused", "httpx"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode == 2, done.stderr[-3000:]
    assert "needs httpx" in done.stderr and "mineru-health[demo]" in done.stderr


def test_no_test_scaffolding_is_installed() -> None:
    """The tests' harness (corpus, samplers, fake engines) ships in no wheel; the fleet the demo
    runs on is the demo's, and only the CLI's ``demo`` command imports it."""
    import importlib.util

    import mineru_health

    package = Path(mineru_health.__file__).resolve().parent
    assert not (package / "testing").exists()
    harness = importlib.util.find_spec("harness")  # the tests' own, from tests/
    assert harness is not None and harness.origin is not None
    assert package.parent not in Path(harness.origin).resolve().parents
    importers = [
        str(path.relative_to(package))
        for path in package.rglob("*.py")
        if "demo" not in path.relative_to(package).parts
        and path.name != "cli.py"
        and (
            "from .demo" in (text := path.read_text(encoding="utf-8"))
            or "mineru_health.demo" in text
            or "from ..demo" in text
        )
    ]
    assert importers == []


def _imports(package: Path) -> dict[str, set[str]]:
    """Each module of ``package`` and the package modules it imports, ``TYPE_CHECKING`` ones
    included (a module importing its own parent package is not counted: Python always does)."""
    import ast

    modules: dict[str, tuple[Path, bool]] = {}
    for path in package.rglob("*.py"):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        modules[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    edges: dict[str, set[str]] = {}
    for name, (path, is_package) in modules.items():
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                base = name.split(".") if is_package else name.split(".")[:-1]
                if node.level:
                    base = base[: len(base) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                for alias in node.names:
                    full = f"{target}.{alias.name}"
                    found.add(full if full in modules else target)
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
        edges[name] = {
            t for t in found if t in modules and t != name and not name.startswith(t + ".")
        }
    return edges


def test_the_package_has_no_import_cycles() -> None:
    """No module needs another that needs it back, not even for a type (issue 25)."""
    import graphlib

    import mineru_health

    edges = _imports(Path(mineru_health.__file__).resolve().parent)
    assert "mineru_health.runtime.worker.judge" in edges  # the scan found the package
    try:
        tuple(graphlib.TopologicalSorter(edges).static_order())
    except graphlib.CycleError as error:
        pytest.fail(f"import cycle: {' -> '.join(error.args[1])}")
