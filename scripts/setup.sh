#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine for mineru-health: system libraries,
# a Python 3.11 venv in .venv with mineru==3.4.5 (the newest 3.x) and this package (+ test, demo and
# postgres extras; Debian's postgresql is the real server the router store's tests start),
# and .venv-mineru4 with mineru==4.0.12 and this package (the 4.0 integration tests run there).
# Idempotent; safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

MINERU_VERSION="${MINERU_VERSION:-3.4.5}"
PYTHON="${PYTHON:-python3.11}"

apt_packages=(build-essential pkg-config libre2-dev libfmt-dev libcurl4-openssl-dev
              nlohmann-json3-dev libmicrohttpd-dev libgtest-dev clang-format ninja-build
              clang-14 libclang-rt-14-dev git debootstrap libc-ares-dev dnsmasq-base
              postgresql)
# Debian's own Python 3.11, with venv (ensurepip) and headers for the extension.
[ "$PYTHON" = python3.11 ] && apt_packages+=(python3.11 python3.11-venv python3.11-dev)
missing=()
for p in "${apt_packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "== installing system packages: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# promtool (to test the shipped alert rules) comes out of Debian's prometheus
# package, unpacked under .tools/ rather than installed: installing would also
# set up a Prometheus server we do not want.
if [ ! -x .tools/usr/bin/promtool ]; then
  echo "== unpacking promtool from Debian's prometheus package into .tools/"
  mkdir -p .tools/debs
  (cd .tools/debs && apt-get download prometheus >/dev/null 2>&1) || {
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq && (cd .tools/debs && apt-get download prometheus >/dev/null)
  }
  dpkg -x .tools/debs/prometheus_*.deb .tools
fi

if [ ! -x .venv/bin/python ]; then
  echo "== creating .venv with $PYTHON"
  "$PYTHON" -m venv .venv
fi
# mineru-health goes into each MinerU environment the way a user installs it: `pip install`
# of this checkout with pip's default build isolation (pip fetches the build requirements
# pyproject.toml declares; nothing is pre-installed for the build). CMake and Ninja in .venv
# are for the C++ presets of scripts/test.sh.
echo "== installing mineru==$MINERU_VERSION and mineru-health into .venv"
.venv/bin/pip install -q --upgrade pip >/dev/null
.venv/bin/pip install -q "mineru==$MINERU_VERSION" cmake ninja
.venv/bin/pip install -q ".[test,demo,postgres]"
bash scripts/source_stamp.sh > .venv/.mineru-health-source
PYTHON=.venv/bin/python bash scripts/fetch_release_wheels.sh .cache/mineru-wheels

# MinerU 4.0 brings its own FastAPI, pydantic, ...: a venv of its own, with its own
# mineru-health (the 4.0 integration tests run that one, never this venv's).
MINERU4_VERSION="${MINERU4_VERSION:-4.0.12}"
if [ ! -x .venv-mineru4/bin/python ]; then
  echo "== creating .venv-mineru4 with $PYTHON"
  "$PYTHON" -m venv .venv-mineru4
fi
if ! .venv-mineru4/bin/python -c "import importlib.metadata as m, sys; \
    sys.exit(m.version('mineru') != '$MINERU4_VERSION')" 2>/dev/null; then
  echo "== installing mineru==$MINERU4_VERSION into .venv-mineru4"
  .venv-mineru4/bin/pip install -q --upgrade pip >/dev/null
  timeout 1800 .venv-mineru4/bin/pip install -q "mineru==$MINERU4_VERSION"
fi
# The tiny llama.cpp VLM of the demo and the tests (mineru_health.demo.engine: gguf writes the
# GGUF pair) and the stand-ins for 4.0's small ONNX models (onnx writes them) are generated in
# this venv: the 4.0 demo's real engine death, the llama tests and bench/recovery's llama_real.
if ! .venv-mineru4/bin/python -c "import gguf, onnx" 2>/dev/null; then
  echo "== installing gguf and onnx into .venv-mineru4 (test models)"
  timeout 600 .venv-mineru4/bin/pip install -q "gguf>=0.17" "onnx>=1.16"
fi
echo "== installing mineru-health into .venv-mineru4"
.venv-mineru4/bin/pip install -q ".[postgres]"
bash scripts/source_stamp.sh > .venv-mineru4/.mineru-health-source
# The real vLLM of tests/integration/test_vllm_real*.py: one vLLM stack (.venv-vllm) layered
# over .venv and .venv-mineru4 (.venv-vllm3, .venv-vllm4). 1.5-3.5 min cold, 3.4 GB; idempotent.
timeout 900 bash scripts/vllm_venvs.sh all
echo "== ready: $(.venv/bin/mineru-health --version 2>/dev/null || echo mineru-health installed)"
