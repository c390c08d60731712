#!/usr/bin/env bash
# Runs every test: the install paths (checkout, sdist, wheel, the Dockerfile's fallback),
# lint, C++ (GoogleTest, normal and ASan/UBSan builds) and Python (unit, then integration
# against real MinerU 3.4.5 and 4.0.12 processes, each line's mineru-health installed into
# its own venv, and the 3.x integration tests again on 3.4.4).
# C++ tests run three times: plain, ASan+UBSan and TSan; then libFuzzer targets,
# time-bounded, built by clang with -Wthread-safety -Werror (the lock annotations proven at
# compile time in that build: a build of its own cost CI 3-4 minutes).
# Expects scripts/setup.sh to have run. Every stage is bounded in time (CI has 2 cores and
# 90 minutes; the whole run must stay under 60: about 57 with the vLLM stage).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PWD/.tools/usr/bin:$PATH"
# Every MinerU release the manifests name (fetched by setup.sh), for the release matrix test.
export MINERU_HEALTH_RELEASE_WHEELS="$PWD/.cache/mineru-wheels"

# Into both MinerU environments, as a user installs it (pip's build isolation), unless what
# is there was built from this very source (setup.sh's stamp: CI's fresh setup just did it).
stamp=$(bash scripts/source_stamp.sh)
for venv in .venv .venv-mineru4; do
  [ -x $venv/bin/pip ] || continue
  if [ -n "$stamp" ] && [ "$(cat $venv/.mineru-health-source 2>/dev/null)" = "$stamp" ]; then
    echo "== mineru-health in $venv was built from this source by setup.sh: not rebuilt"
    continue
  fi
  echo "== reinstalling mineru-health from this checkout into $venv"
  rm -f $venv/.mineru-health-source
  timeout 900 $venv/bin/pip install -q --no-deps --force-reinstall .
  [ -z "$stamp" ] || echo "$stamp" > $venv/.mineru-health-source
done

# The ways users install, each from scratch (a full run only: `test.sh ARGS` passes ARGS
# to pytest and skips them).
if [ $# -eq 0 ]; then
  echo "== install paths: the checkout, an sdist and its wheel, each into a fresh venv"
  timeout 900 bash scripts/test_install.sh
  echo "== the Dockerfile's fallback build and install, in Debian roots"
  timeout 900 bash scripts/test_docker_fallback.sh
fi

echo "== lint"
bash scripts/lint.sh

for preset in default asan tsan; do
  echo "== C++ tests ($preset)"
  cmake --preset "$preset" >/dev/null
  timeout 1200 cmake --build --preset "$preset" -j2
  timeout 600 ctest --preset "$preset" -j2
done

echo "== fuzzing (${FUZZ_SECONDS:-30}s per target)"
timeout 900 bash scripts/fuzz.sh

echo "== Python tests"
# The MinerU 4.0 tests (tests/integration/mineru4) skip without it.
if [ -x .venv-mineru4/bin/python ]; then
  export MINERU_HEALTH_MINERU4_PYTHON="${MINERU_HEALTH_MINERU4_PYTHON:-$PWD/.venv-mineru4/bin/python}"
fi
# Run from tests/ so the installed package, not python/, is imported.
cd tests
# The real-vLLM tests run once, in a stage of their own below (a full run only).
vllm_tests=(integration/test_vllm_real.py integration/mineru4/test_vllm_real4.py)
not_here=()
[ $# -eq 0 ] && not_here=("${vllm_tests[@]/#/--ignore=}")
# The slowest tests listed at the end: where CI time goes (it must stay within its hour).
timeout 3000 python -m pytest -q -p no:cacheprovider --durations=15 "${not_here[@]}" "$@" .

# A real vLLM engine in patched workers, each MinerU line (the venvs of setup.sh): a request
# error, kill -9 and SIGSTOP of its EngineCore, the demo on a real vLLM, a dedicated vllm serve
# dying. ~10 min; missing venvs fail it, not skip it.
if [ $# -eq 0 ]; then
  echo "== Python tests: a real vLLM (3.4.5, 4.0.12)"
  TEST_VLLM_REQUIRED=1 timeout 1500 python -m pytest -q -p no:cacheprovider --durations=8 \
    "${vllm_tests[@]}"
fi

# The 3.x integration tests once more on the previous 3.x release (the one 0.2 supported):
# its wheel (fetched by setup.sh) unpacked and first on PYTHONPATH, so that the sandbox
# copies and patches that MinerU. Only on a full run; TEST_ALSO_MINERU3= skips it (a name outside
# MINERU_HEALTH_*, which workers refuse when they do not know it).
also=${TEST_ALSO_MINERU3-3.4.4}
if [ -n "$also" ] && [ $# -eq 0 ]; then
  echo "== Python integration tests on MinerU $also"
  site="$MINERU_HEALTH_RELEASE_WHEELS/../mineru-$also-site"
  rm -rf "$site"
  python -m zipfile -e "$MINERU_HEALTH_RELEASE_WHEELS/mineru-$also-py3-none-any.whl" "$site"
  export PYTHONPATH="$site"
  python -c "import mineru.version as v; assert v.__version__ == '$also', v.__version__"
  # This PYTHONPATH is 3.x's: the 4.0 tests already ran above, in their own venv.
  # The modules that drive what our patches touch in a 3.x release (the worker's fast_api.py,
  # the router's router.py, an engine death healed through both): the others test our own
  # runtime, which does not change with the MinerU release, and ran above on 3.4.5. Keeps
  # CI within its hour (the whole folder again took 14 min; test_resubmission.py, our
  # resubmission runtime again, 3 min; the hung parse, our task watchdog again, 1 min).
  env -u MINERU_HEALTH_MINERU4_PYTHON \
    timeout 1200 python -m pytest -q -p no:cacheprovider integration/test_worker.py \
      integration/test_router.py -k "not test_a_hung_parse_fails_alone"
fi
