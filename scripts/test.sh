#!/usr/bin/env bash
# Runs every test: lint, C++ (GoogleTest, normal and ASan/UBSan builds) and
# Python (unit, then integration against the real MinerU 3.4.4 processes).
# C++ runs four times: plain, ASan+UBSan, TSan, and clang with -Wthread-safety
# -Werror (the lock annotations proven at compile time); then libFuzzer
# targets, time-bounded.
# Expects scripts/setup.sh to have run.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PWD/.tools/usr/bin:$PATH"

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
# The MinerU 4.0 tests (tests/integration/mineru4) skip without it.
if [ -x .venv-mineru4/bin/python ]; then
  export MINERU_HEALTH_MINERU4_PYTHON="${MINERU_HEALTH_MINERU4_PYTHON:-$PWD/.venv-mineru4/bin/python}"
fi
# Run from tests/ so the installed package, not python/, is imported.
cd tests
python -m pytest -q -p no:cacheprovider "$@" .
