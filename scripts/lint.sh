#!/usr/bin/env bash
# Fails on format drift (clang-format, Google style), ruff findings and mypy (strict) errors.
set -euo pipefail
cd "$(dirname "$0")/.."
files=$(git ls-files 'cpp/*.h' 'cpp/*.cc' 'bench/*.cc')
if [ -n "$files" ]; then
  clang-format --dry-run --Werror $files
fi
ruff check python tests bench
mypy
