#!/usr/bin/env bash
# Installs mineru-health the ways a user does, each into a fresh venv with nothing
# pre-installed (pip's default build isolation fetches what pyproject.toml declares):
#   1. `pip install <checkout>`
#   2. `python -m build` (sdist, then a wheel built from it), then `pip install <sdist>`
#   3. `pip install <wheel>` of step 2
# and checks each one as a user would: the extension and its type stub, `--version`,
# a classification, and `patch apply|check|revert` on copies of the MinerU releases it
# supports (byte-exact revert). Prints each path's install time.
# (MinerU's own environments get the same `pip install <checkout>` from setup.sh and
# test.sh; the integration tests run there.)
#
#   bash scripts/test_install.sh           # after scripts/setup.sh (uses .venv's `build`)
#   MINERU_HEALTH_SDIST_OUT=dist bash scripts/test_install.sh   # and keep the tested sdist
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
python=${PYTHON:-python3.11}
work=$(mktemp -d "${TMPDIR:-/tmp}/mineru-health-install.XXXXXX")
trap 'rm -rf "$work"' EXIT
wheels=${MINERU_HEALTH_RELEASE_WHEELS:-$repo/.cache/mineru-wheels}
summary=()

fail() { echo "test_install: $*" >&2; exit 1; }

# MinerU packages to patch: one release per line, unpacked from the wheels setup.sh fetched.
mineru_copies=()
for release in 3.4.5 4.0.12; do
  wheel=$wheels/mineru-$release-py3-none-any.whl
  [[ -f $wheel ]] || fail "$wheel is missing (scripts/setup.sh fetches it)"
  "$repo/.venv/bin/python" -m zipfile -e "$wheel" "$work/mineru-$release"
  mineru_copies+=("$work/mineru-$release/mineru")
done

check_install() {
  local venv=$1 what=$2
  local cli=$venv/bin/mineru-health
  "$venv/bin/python" -I -c 'import mineru_health._native, mineru_health.cli' ||
    fail "$what: the package does not import"
  "$venv/bin/python" -I -c '
import pathlib, mineru_health
stub = pathlib.Path(mineru_health.__file__).with_name("_native.pyi")
assert stub.is_file(), f"{stub} is missing"' || fail "$what: no type stub"
  local version
  version=$("$cli" --version)
  [[ $version == *"patches MinerU 3.3.0-3.4.5, 4.0.12"* ]] || fail "$what: --version says '$version'"
  local rc=0
  echo "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue." |
    "$cli" classify >/dev/null || rc=$?
  [[ $rc == 1 ]] || fail "$what: classify exited $rc for an engine death (1 expected)"
  local mineru copy
  for mineru in "${mineru_copies[@]}"; do
    copy=$work/patch-$(basename "$(dirname "$mineru")")
    rm -rf "$copy" && cp -a "$mineru" "$copy"
    "$cli" patch apply --mineru-path "$copy" >/dev/null || fail "$what: patch apply $mineru"
    "$cli" patch check --mineru-path "$copy" >/dev/null || fail "$what: patch check $mineru"
    "$cli" patch revert --mineru-path "$copy" >/dev/null || fail "$what: patch revert $mineru"
    find "$copy" -name '*.mineru-health.orig' -delete
    diff -r -x __pycache__ "$mineru" "$copy" >/dev/null || fail "$what: revert is not byte-exact"
  done
  echo "$what: $version"
}

fresh_venv() {
  rm -rf "$1"
  "$python" -m venv "$1"
  "$1/bin/pip" install -q --upgrade pip >/dev/null
}

timed_install() {
  local venv=$1 what=$2 target=$3 start=$SECONDS
  fresh_venv "$venv"
  "$venv/bin/pip" install -q "$target" || fail "$what: pip install $target failed"
  summary+=("$(printf '%-40s %4d s' "$what" $((SECONDS - start)))")
  check_install "$venv" "$what"
}

timed_install "$work/venv-checkout" "pip install <checkout>" "$repo"

start=$SECONDS
"$repo/.venv/bin/python" -m build --outdir "$work/dist" "$repo" >"$work/build.log" 2>&1 ||
  { tail -30 "$work/build.log" >&2; fail "python -m build failed"; }
summary+=("$(printf '%-40s %4d s' "python -m build (sdist + wheel)" $((SECONDS - start)))")
sdist=$(ls "$work"/dist/mineru_health-*.tar.gz)
wheel=$(ls "$work"/dist/mineru_health-*.whl)
# What the sdist must not carry: build outputs, environments, caches.
if tar -tzf "$sdist" | grep -E '/(build|dist|\.venv[^/]*|\.cache|\.tools)/' | head -3 | grep .; then
  fail "the sdist carries the files above"
fi

if [[ -n ${MINERU_HEALTH_SDIST_OUT:-} ]]; then  # the release workflow keeps the sdist it tested
  mkdir -p "$MINERU_HEALTH_SDIST_OUT" && cp "$sdist" "$MINERU_HEALTH_SDIST_OUT/"
fi

timed_install "$work/venv-sdist" "pip install <sdist>" "$sdist"
timed_install "$work/venv-wheel" "pip install <wheel of python -m build>" "$wheel"

echo "== install times (2 shared cores; each a fresh venv, build isolation)"
printf '%s\n' "${summary[@]}"
