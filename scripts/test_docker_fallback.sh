#!/usr/bin/env bash
# The two stages of deploy/docker/Dockerfile, run outside Docker in Debian roots
# (debootstrap, chroot), when dist/ has no prebuilt wheel:
#   build stage: a root like a MinerU image (a Python with pip, no compiler, no -dev
#     package) gets the source as `COPY . /src` would (.dockerignore's view: the files
#     git tracks or would track), then deploy/docker/build_wheel.sh installs the -dev
#     packages, builds the wheel and repairs it with auditwheel;
#   final stage: a fresh copy of that root, with MinerU's files installed, runs
#     deploy/docker/install.sh on the wheel: it installs with no apt package, every
#     library the extension links is found, `patch apply` and `patch check` pass.
# MinerU's image is Ubuntu 22.04 with Python 3.12; this root is Debian 12 (bookworm)
# with its Python 3.11, the closest Debian's mirror serves. Needs root (debootstrap,
# chroot, bind mounts); without it, or where the machine refuses a mount, it says so
# and exits 0 (the steps it could not run are named).
#
#   bash scripts/test_docker_fallback.sh
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=scripts/roots.sh
source "$repo/scripts/roots.sh"
wheels=${MINERU_HEALTH_RELEASE_WHEELS:-$repo/.cache/mineru-wheels}
mineru_release=${MINERU_RELEASE:-3.4.5}

skip() { echo "test_docker_fallback: SKIPPED: $* (the Dockerfile's fallback build was not run)"; exit 0; }
[[ $(id -u) == 0 ]] || skip "needs root for debootstrap and chroot"
probe=$(mktemp -d)
if ! mount --bind "$probe" "$probe" 2>/dev/null; then
  rmdir "$probe"
  skip "this machine refuses bind mounts"
fi
umount "$probe" && rmdir "$probe"
trap unmount_all EXIT

start=$SECONDS
# What a MinerU image has that matters here: a Python with pip and venv, no compiler.
make_root docker-image bookworm python3 python3-pip python3-venv
log "image root ready in $((SECONDS - start)) s"

stage_root() {  # stage_root NAME: a fresh copy of the image root
  local root=$roots_dir/$1 mount
  # A run that died may have left /proc or /dev bound inside: never delete through them.
  for mount in $(awk -v r="$root/" 'index($2, r) == 1 {print $2}' /proc/mounts | sort -r); do
    umount "$mount" 2>/dev/null || umount -l "$mount"
  done
  rm -rf --one-file-system "$root"
  cp -a "$roots_dir/docker-image" "$root"
  echo "$root"
}

# --- build stage -------------------------------------------------------------------------
start=$SECONDS
build=$(stage_root docker-build)
mkdir -p "$build/src"
(cd "$repo" && git ls-files -z --cached --others --exclude-standard |
  grep -zv '^dist/' | tar --null -T - -cf -) | tar -xf - -C "$build/src"
mount_in "$build"
in_root "$build" env SRC=/src OUT=/wheel bash /src/deploy/docker/build_wheel.sh \
  >"$roots_dir/docker-build.log" 2>&1 ||
  { tail -40 "$roots_dir/docker-build.log" >&2; echo "build stage failed" >&2; exit 1; }
wheel=$(cd "$build/wheel" && ls mineru_health-*-manylinux_*.whl)
log "build stage: $wheel in $((SECONDS - start)) s"

# --- final stage -------------------------------------------------------------------------
start=$SECONDS
final=$(stage_root docker-final)
mkdir -p "$final/tmp/mineru-health"
cp "$build/wheel/$wheel" "$final/tmp/mineru-health/"
cp "$repo/deploy/docker/install.sh" "$final/tmp/mineru-health-install.sh"
cp "$wheels/mineru-$mineru_release-py3-none-any.whl" "$final/tmp/"
mount_in "$final"
# MinerU's files (its dependencies are not what this stage tests: patch reads files only).
in_root "$final" env PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install -q --no-deps \
  "/tmp/mineru-$mineru_release-py3-none-any.whl" >"$roots_dir/docker-final.log" 2>&1 ||
  { tail -20 "$roots_dir/docker-final.log" >&2; exit 1; }
in_root "$final" bash /tmp/mineru-health-install.sh >>"$roots_dir/docker-final.log" 2>&1 ||
  { tail -40 "$roots_dir/docker-final.log" >&2; echo "final stage failed" >&2; exit 1; }
# The final image carries no compiler and no -dev package: the wheel brought what it needs.
if in_root "$final" sh -c 'command -v cc || ls /usr/include/re2' >/dev/null 2>&1; then
  echo "final stage: the root has a compiler or RE2 headers; it should not" >&2
  exit 1
fi
tail -1 "$roots_dir/docker-final.log"
log "final stage: installed, patched and checked in $((SECONDS - start)) s"
unmount_all
rm -rf --one-file-system "$build" "$final"
