#!/usr/bin/env bash
# Prints a name for the source this checkout would build (the tree of HEAD with the working
# tree's changes to tracked files), or nothing outside git. setup.sh writes it beside each
# venv's mineru-health; test.sh reinstalls only where it differs (each build compiles the
# C++ core: two in CI's setup, two more in test.sh, for the same source).
set -euo pipefail
cd "$(dirname "$0")/.."
commit=$(git stash create 2>/dev/null) || exit 0
[ -n "$commit" ] || commit=HEAD
git rev-parse "$commit^{tree}" 2>/dev/null || true
