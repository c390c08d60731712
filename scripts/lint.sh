#!/usr/bin/env bash
# Fails on format drift (clang-format, Google style), ruff findings, mypy (strict) errors and
# a _native.pyi that disagrees with the built extension (mypy.stubtest; install it first).
set -euo pipefail
cd "$(dirname "$0")/.."
files=$(git ls-files 'cpp/*.h' 'cpp/*.cc' 'bench/*.cc')
if [ -n "$files" ]; then
  clang-format --dry-run --Werror $files
fi
ruff check python tests bench
mypy
# The stub in the source tree against the installed extension (no allowlist): MYPYPATH makes
# mypy read python/mineru_health/_native.pyi while the runtime module is the installed one.
MYPYPATH=python python -m mypy.stubtest mineru_health._native
