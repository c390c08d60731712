"""Writes mineru_health/_native.pyi, the type stub of a built extension, with pybind11-stubgen.

    python scripts/native_stub.py EXTENSION.so OUT.pyi

The build runs this (CMake, when MINERU_HEALTH_STUB is on): the stub is
generated, never kept by hand, so a binding (a config row included) needs no
second description. The extension is imported alone, from a scratch package
beside a copy of it, so that the build needs none of the package's
dependencies. pybind11-stubgen is a declared build requirement; a build
without it (``--no-build-isolation`` in an environment that lacks it) says so
and ships no stub rather than failing the install. Three fix-ups say what the
generator cannot know:

- members of the bound ``enum.Enum`` classes are written ``NAME = ...``, the
  form type checkers read as enum members;
- pybind11 takes ``bytes`` where a C++ string is expected and a number of
  seconds where a ``std::chrono`` duration is, so parameters say so (callers
  pass undecoded exception text and float timeouts);
- ``__hash__ = None`` (classes with ``__eq__``) carries typeshed's ignore.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

_ENUM_CLASS = re.compile(r"^class (\w+)\(enum\.Enum\):$", re.MULTILINE)
_ENUM_NEW = re.compile(r"^    @classmethod\n    def __new__\(cls, value\):\n        \.\.\.\n",
                       re.MULTILINE)
_NO_HASH = "__hash__: typing.ClassVar[None] = None"
#: The generator, as pyproject.toml requires it.
STUBGEN = "pybind11-stubgen==3.0.0"


def _loosen(annotations: str) -> str:
    annotations = re.sub(r"(?<![\w.])str\b", "str | bytes", annotations)
    return annotations.replace("datetime.timedelta", "datetime.timedelta | float")


def _parameters(line: str) -> str:
    head, arrow, tail = line.rpartition(") -> ")
    if not arrow:
        return line
    # A Mapping's key type is invariant (and the environment is never bytes): left as it is.
    parts = re.split(r"(Mapping\[[^\[\]]*\])", head)
    return "".join(p if p.startswith("Mapping[") else _loosen(p) for p in parts) + arrow + tail


def fix_up(stub: str) -> str:
    for name in _ENUM_CLASS.findall(stub):
        stub = re.sub(rf"^(    \w+): typing\.ClassVar\[{name}\]$", r"\1 = ...", stub,
                      flags=re.MULTILINE)
    stub = _ENUM_NEW.sub("", stub)
    stub = stub.replace(_NO_HASH, _NO_HASH + "  # type: ignore[assignment]")
    return "\n".join(_parameters(line) if line.lstrip().startswith("def ") else line
                     for line in stub.split("\n"))


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    extension, out = Path(argv[0]), Path(argv[1])
    out.unlink(missing_ok=True)
    if importlib.util.find_spec("pybind11_stubgen") is None:
        print(f"mineru-health: pybind11-stubgen is not installed for {sys.executable}: the type "
              "stub _native.pyi is not generated (the package works without it; "
              f"pip install {STUBGEN} before building to get it)", file=sys.stderr)
        return 0
    with tempfile.TemporaryDirectory(prefix="mineru-health-stub-") as scratch:
        package = Path(scratch, "mineru_health")
        package.mkdir()
        (package / "__init__.py").touch()
        shutil.copy(extension, package / extension.name)
        # pip's isolated build environment reaches its build requirements through
        # PYTHONPATH: the scratch directory goes in front of it, never in its place.
        inherited = os.environ.get("PYTHONPATH")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [scratch, inherited]))}
        subprocess.run([sys.executable, "-m", "pybind11_stubgen", "--exit-code", "-o", scratch,
                        "mineru_health._native"], check=True, env=env, cwd=scratch)
        stub = (package / "_native.pyi").read_text(encoding="utf-8")
    out.write_text(fix_up(stub), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
