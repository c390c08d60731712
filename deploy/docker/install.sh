#!/usr/bin/env bash
# The final stage of deploy/docker/Dockerfile: installs the wheel from $WHEEL_DIR
# into the image's Python, checks that the extension loads with every library
# it needs, patches MinerU and checks the patch. Any failure fails the build.
set -euo pipefail
python=${PYTHON:-python3}
wheel_dir=${WHEEL_DIR:-/tmp/mineru-health}

# The [postgres] extra (psycopg 3 with its own libpq, and its pool) lets the
# router keep its store in PostgreSQL (MINERU_ROUTER_HEALTH_STORE_URL), as
# several routers do; EXTRAS= (empty) installs the package alone.
extras=${EXTRAS-postgres}
wheels=("$wheel_dir"/mineru_health-*.whl)
[[ ${#wheels[@]} -eq 1 && -f ${wheels[0]} ]] ||
  { echo "mineru-health: expected one wheel in $wheel_dir" >&2; exit 1; }
requirement=${wheels[0]}${extras:+[$extras]}

# Images whose Python is marked as externally managed (PEP 668) still take
# packages in their own environment, as MinerU's own image does with pip.
PIP_BREAK_SYSTEM_PACKAGES=1 "$python" -m pip install --no-cache-dir "$requirement"

native=$("$python" -c 'import mineru_health._native as n; print(n.__file__)')
if ldd "$native" | grep 'not found'; then
  echo "mineru-health: $native needs the libraries above" >&2
  exit 1
fi
if [[ ,$extras, == *,postgres,* ]]; then
  "$python" -c 'import psycopg, psycopg_pool; print("psycopg", psycopg.__version__, "libpq", psycopg.pq.version())'
fi
mineru_health=$(dirname "$(command -v "$python")")/mineru-health
[[ -x $mineru_health ]] || mineru_health=mineru-health
# `patch apply` refuses MinerU files it does not know; `patch check` exits
# non-zero unless every target file is patched.
"$mineru_health" patch apply
"$mineru_health" patch check
"$mineru_health" --version
