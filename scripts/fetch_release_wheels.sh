#!/usr/bin/env bash
# Downloads from PyPI the wheel of every MinerU release the patch manifests name
# (no dependencies, a few MB each) into the directory given (default
# .cache/mineru-wheels), for tests/unit/test_release_matrix.py. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
dest="${1:-.cache/mineru-wheels}"
mkdir -p "$dest"
# Read from the manifests themselves: no installed package needed.
python=${PYTHON:-python3}
releases=$("$python" -c 'import json, pathlib
print(*sorted({r for m in pathlib.Path("patches").glob("mineru-*/manifest.json")
               for f in json.loads(m.read_text())["files"] for v in f["variants"]
               for r in v["releases"]}))')
for release in $releases; do
  [ -f "$dest/mineru-$release-py3-none-any.whl" ] && continue
  timeout 300 "$python" -m pip download -q --no-deps --only-binary=:all: \
    -d "$dest" "mineru==$release" 2>&1 | grep -v '^WARNING: Location' || true
  [ -f "$dest/mineru-$release-py3-none-any.whl" ] || { echo "could not fetch mineru $release" >&2; exit 1; }
done
echo "== $(ls "$dest" | wc -l) MinerU release wheels in $dest"
