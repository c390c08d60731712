#!/usr/bin/env bash
# Runs every test: lint, C++ (GoogleTest, normal and ASan/UBSan builds) and
# Python (unit, then integration against the real MinerU 3.x processes (3.4.5 by default)).
# C++ runs four times: plain, ASan+UBSan, TSan, and clang with -Wthread-safety
# -Werror (the lock annotations proven at compile time); then libFuzzer
# targets, time-bounded.
# Expects scripts/setup.sh to have run.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PWD/.tools/usr/bin:$PATH"
# Every MinerU release the manifests name (fetched by setup.sh), for the release matrix test.
export MINERU_HEALTH_RELEASE_WHEELS="$PWD/.cache/mineru-wheels"

echo "== reinstalling mineru-health from this checkout"
pip install -q --no-build-isolation --no-deps --force-reinstall .

echo "== lint"
bash scripts/lint.sh

for preset in default asan tsan thread-safety; do
  echo "== C++ tests ($preset)"
  cmake --preset "$preset" >/dev/null
  cmake --build --preset "$preset" -j2
  ctest --preset "$preset" -j2
done

echo "== fuzzing (${FUZZ_SECONDS:-30}s per target)"
bash scripts/fuzz.sh

echo "== Python tests"
# Run from tests/ so the installed package, not python/, is imported.
cd tests
python -m pytest -q -p no:cacheprovider "$@" .
