#!/usr/bin/env bash
# Installs the wheels built by scripts/build_wheels.sh into clean Debian roots
# that have none of our build dependencies (no compiler, no -dev package, no
# RE2/fmt/curl/microhttpd of their own) and tests them there, as a user would:
#
#   trixie   (Debian 13, glibc 2.41): its own python3.13 and a venv with the
#            cp313 wheel, mineru==$MINERU_HEALTH_TEST_MINERU (default 3.4.5)
#            and the test extras; the unit tests, then one real patched
#            mineru-api whose engine dies under a task: native /health 503.
#   bullseye (Debian 11, glibc 2.31, the wheels' floor): its own Python is 3.9,
#            which neither MinerU 3.4 nor mineru-health supports, so the root
#            gets a CPython 3.11 built here from Debian's own source package
#            (bookworm's python3.11, upstream 3.11.2, in the build root) and
#            the runtime libraries that interpreter links; then the cp311
#            wheel, the unit tests and the same worker test.
#   pyenv    (the trixie root again) for the CPythons no Debian suite served
#            here has, 3.10 and 3.12 (MinerU's own images run 3.12, conda
#            users often 3.10): this machine's pyenv build of each, copied in
#            without its headers or site-packages, the runtime libraries it
#            links from trixie, then the cp310 / cp312 wheel in a venv of it,
#            the unit tests and the same worker test; for 3.12 also the
#            Dockerfile's install steps with the prebuilt cp312 wheel.
#
#   sudo scripts/test_wheels.sh                      # all three
#   MINERU_HEALTH_TEST_ROOTS=trixie scripts/test_wheels.sh
#   MINERU_HEALTH_TEST_E2E=0 ...                     # no worker end to end
#   MINERU_HEALTH_TEST_DOCKER=0 ...                  # no Dockerfile steps (the build one: ~5 min)
#
# Only loopback is used by the tests; roots and the built CPython are cached
# (scripts/roots.sh). Prints the seconds each stage took.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=scripts/roots.sh
source "$repo/scripts/roots.sh"

dist=${MINERU_HEALTH_DIST:-$repo/dist}
mineru=${MINERU_HEALTH_TEST_MINERU:-3.4.5}
test_roots=${MINERU_HEALTH_TEST_ROOTS:-trixie bullseye pyenv}
pyenv_versions=${MINERU_HEALTH_TEST_PYENV:-3.10 3.12}
pyenv_root=${PYENV_ROOT:-$HOME/.pyenv}
# Other places CPythons live, as X.Y.Z/ or X.Y.Z/<arch>/ prefixes (actions/setup-python's
# tool cache, /opt/hostedtoolcache/Python, on the release workflow's runners).
python_roots=${MINERU_HEALTH_PYTHON_ROOTS:-}
arch=$(uname -m)
e2e=${MINERU_HEALTH_TEST_E2E:-1}
docker_steps=${MINERU_HEALTH_TEST_DOCKER:-1}
jobs=${MINERU_HEALTH_JOBS:-2}
cpython=3.11
# MinerU's opencv-python needs libGL and GLib at import time: MinerU's runtime
# needs, not ours (the wheel bundles what the extension links).
# The rest: what pyenv's CPythons (built on Debian 12) link, by trixie's names
# (one list for both uses of the root, so it is made once).
trixie_packages=(python3 python3-venv libgl1 libglib2.0-0t64
  libssl3t64 libffi8 libsqlite3-0 libexpat1 libbz2-1.0 liblzma5 libreadline8t64 libncursesw6
  libuuid1 zlib1g)
bullseye_packages=(libssl1.1 libffi7 zlib1g libsqlite3-0 libbz2-1.0 liblzma5 libncursesw6
  libreadline8 libuuid1 libgl1 libglib2.0-0)
cpython_build_packages=(libssl-dev zlib1g-dev libffi-dev libsqlite3-dev libbz2-dev liblzma-dev
  libncurses-dev libreadline-dev uuid-dev)

[[ $(id -u) == 0 ]] || { echo "test_wheels.sh needs root (debootstrap, chroot)" >&2; exit 2; }
trap unmount_all EXIT
timings=()
failures=0
# timed NAME COMMAND...: runs one stage (in a subshell, with set -e) and goes
# on after a failure, so that every root reports; the exit status counts them.
# Mounts are made outside stages, where the EXIT trap sees them.
timed() {
  local name=$1 start=$SECONDS status=passed rc
  shift
  log "$name"
  # Not `if (...)`: bash ignores set -e inside a tested command, subshell or not.
  set +e
  (set -e; "$@")
  rc=$?
  set -e
  if ((rc != 0)); then
    status=FAILED
    failures=$((failures + 1))
  fi
  timings+=("$name: $status in $((SECONDS - start)) s")
  log "$name: $status in $((SECONDS - start)) s"
}

wheel_for() {
  local tag=cp${1/./}
  local found
  found=$(ls "$dist"/mineru_health-*-"$tag"-"$tag"-manylinux_*.whl 2>/dev/null | head -1)
  [[ -n $found ]] || { echo "no $tag wheel in $dist: run scripts/build_wheels.sh" >&2; return 1; }
  echo "$found"
}

# The repository without python/ (so nothing can import the source tree):
# tests, their data, and the docs and deploy files some unit tests read.
copy_repo() {
  local root=$1
  rm -rf "$root/work/repo"
  mkdir -p "$root/work/repo"
  (cd "$repo" && git ls-files -co --exclude-standard -z | grep -zv '^python/' |
    tar --null --ignore-failed-read -cf - -T - 2>/dev/null) | tar -xf - -C "$root/work/repo"
}

make_venv() {
  local root=$1 python=$2 wheel=$3
  in_root "$root" rm -rf /opt/venv
  in_root "$root" "$python" -m venv /opt/venv
  in_root "$root" /opt/venv/bin/pip install -q -U pip
  cp "$wheel" "$root/tmp/"
  in_root "$root" /opt/venv/bin/pip install -q "/tmp/$(basename "$wheel")[test]" \
    "mineru==$mineru"
  in_root "$root" /opt/venv/bin/pip list --format=freeze >"$root/work/pip-freeze.txt"
}

unit_tests() {
  local root=$1
  in_root "$root" sh -c "cd /work/repo && TEST_INSTALLED_WHEEL=1 \
    /opt/venv/bin/python -m pytest -q -p no:cacheprovider -m 'not integration' \
    tests/unit tests/wheel"
}

worker_test() {
  local root=$1
  in_root "$root" sh -c "cd /work/repo && TEST_INSTALLED_WHEEL=1 \
    /opt/venv/bin/python -m pytest -q -p no:cacheprovider -m integration tests/wheel"
}

# CPython 3.11 for the bullseye root, built once in the build root from the
# orig tarball of Debian's python3.11 source package and cached there.
build_cpython() {
  local build_root=$roots_dir/bullseye-build
  [[ -d $build_root ]] || { echo "no build root: run scripts/build_wheels.sh" >&2; return 1; }
  [[ -x $build_root/opt/python$cpython/bin/python$cpython ]] && return
  mount_in "$build_root"
  in_root "$build_root" apt-get install -y -q --no-install-recommends \
    "${cpython_build_packages[@]}" >"$roots_dir/cpython-apt.log" 2>&1
  local apt_dir=$roots_dir/apt src_dir=$roots_dir/src
  mkdir -p "$src_dir"
  if ! compgen -G "$src_dir/python${cpython}_*.orig.tar.*" >/dev/null; then
    grep -qs "deb-src $debian_mirror bookworm main" "$apt_dir/etc/sources.list" ||
      echo "deb-src $debian_mirror bookworm main" >>"$apt_dir/etc/sources.list"
    APT_CONFIG=$apt_dir/apt.conf apt-get update -q >/dev/null
    (cd "$src_dir" && APT_CONFIG=$apt_dir/apt.conf \
      apt-get source --download-only -q "python$cpython/bookworm" >/dev/null)
  fi
  rm -rf "$build_root/build/cpython"
  mkdir -p "$build_root/build/cpython"
  tar -xf "$src_dir"/python"$cpython"_*.orig.tar.* -C "$build_root/build/cpython" \
    --strip-components=1
  in_root "$build_root" sh -c "cd /build/cpython && ./configure -q --prefix=/opt/python$cpython \
      >/build/cpython.configure.log 2>&1 && make -j$jobs >/build/cpython.make.log 2>&1 &&
    make altinstall >/build/cpython.install.log 2>&1" ||
    { tail -20 "$build_root"/build/cpython.*.log >&2; return 1; }
  rm -rf "$build_root/build/cpython"
}

# deploy/docker/Dockerfile's two steps, outside Docker (no registry here):
# the final stage (install.sh: install, ldd check, patch apply + check) on the
# venv's MinerU, with the prebuilt wheel build_wheel.sh picks from dist/.
docker_install_steps() {
  local root=$1 wheel=$2
  rm -rf "$root/work/repo/dist" "$root/tmp/docker-wheel"
  mkdir -p "$root/work/repo/dist"
  cp "$wheel" "$root/work/repo/dist/"
  # As on MinerU's image: MinerU there, mineru-health not yet.
  in_root "$root" /opt/venv/bin/pip uninstall -q -y mineru-health
  in_root "$root" sh -c "PYTHON=/opt/venv/bin/python SRC=/work/repo OUT=/tmp/docker-wheel \
      bash /work/repo/deploy/docker/build_wheel.sh &&
    PYTHON=/opt/venv/bin/python WHEEL_DIR=/tmp/docker-wheel \
      bash /work/repo/deploy/docker/install.sh &&
    /opt/venv/bin/mineru-health patch revert >/dev/null"
}

# The build stage's other path (no prebuilt wheel for the image's Python):
# build_wheel.sh in the build root, which has the -dev packages and the
# CPython 3.11 built for bullseye; its wheel must be a repaired manylinux one.
docker_build_step() {
  local build_root=$roots_dir/bullseye-build
  mount_in "$build_root"
  # A writable copy of the sources without dist/, as Docker's COPY makes one.
  rm -rf "$build_root/work/docker-src"
  mkdir -p "$build_root/work/docker-src"
  (cd "$repo" && git ls-files -co --exclude-standard -z |
    tar --null --ignore-failed-read -cf - -T - 2>/dev/null) | tar -xf - -C "$build_root/work/docker-src"
  # PATH without the root's build tools (/opt/build/bin): an image has none.
  in_root "$build_root" sh -c "rm -rf /tmp/docker-wheel &&
    PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin \
    PYTHON=/opt/python$cpython/bin/python$cpython SRC=/work/docker-src OUT=/tmp/docker-wheel \
      bash /work/docker-src/deploy/docker/build_wheel.sh >/build/docker-build.log 2>&1 &&
    ls /tmp/docker-wheel/mineru_health-*-cp${cpython/./}-*manylinux_2_31_$arch.whl" ||
    { tail -20 "$build_root/build/docker-build.log" >&2; return 1; }
}

# Nothing to build against in a test root: no compiler, none of our headers.
assert_clean() {
  local root=$1
  if in_root "$root" sh -c 'command -v cc || command -v c++ || test -e /usr/include/re2 ||
      test -e /usr/include/fmt || test -e /usr/include/curl ||
      test -e /usr/include/microhttpd.h || test -e /usr/include/nlohmann' >/dev/null 2>&1; then
    echo "$root has a compiler or our build dependencies: not a clean root" >&2
    return 1
  fi
}

test_trixie() {
  local root=$roots_dir/trixie-test wheel
  wheel=$(wheel_for 3.13)
  timed "trixie: root" make_root trixie-test trixie "${trixie_packages[@]}"
  assert_clean "$root"
  mount_in "$root"
  copy_repo "$root"
  timed "trixie: venv, $(basename "$wheel") and mineru==$mineru" make_venv "$root" python3 "$wheel"
  timed "trixie: unit tests" unit_tests "$root"
  [[ $e2e == 1 ]] && timed "trixie: worker end to end" worker_test "$root"
  [[ $docker_steps == 1 ]] &&
    timed "trixie: Dockerfile install steps" docker_install_steps "$root" "$wheel"
  return 0
}

test_bullseye() {
  local root=$roots_dir/bullseye-test wheel
  wheel=$(wheel_for "$cpython")
  timed "bullseye: root" make_root bullseye-test bullseye "${bullseye_packages[@]}"
  mount_in "$roots_dir/bullseye-build"
  timed "bullseye: CPython $cpython from Debian's source (cached)" build_cpython
  rm -rf "$root/opt/python$cpython"
  cp -a "$roots_dir/bullseye-build/opt/python$cpython" "$root/opt/"
  mount_in "$root"
  copy_repo "$root"
  assert_clean "$root"
  timed "bullseye: venv, $(basename "$wheel") and mineru==$mineru" \
    make_venv "$root" "/opt/python$cpython/bin/python$cpython" "$wheel"
  timed "bullseye: unit tests" unit_tests "$root"
  [[ $e2e == 1 ]] && timed "bullseye: worker end to end" worker_test "$root"
  [[ $docker_steps == 1 ]] &&
    timed "bullseye: Dockerfile build step from source" docker_build_step
  return 0
}

# pyenv_python X.Y ROOT: copies this machine's newest pyenv (or tool cache) CPython X.Y into
# ROOT at the same path (its RUNPATH names it), without include/ (nothing
# to build against) or site-packages, and prints its interpreter's path.
pyenv_python() {
  local version=$1 root=$2 prefix="" where
  for where in "$pyenv_root/versions" $python_roots; do
    prefix=$(ls -d "$where/$version".*/bin/python"$version" "$where/$version".*/*/bin/python"$version" \
      2>/dev/null | sort -V | tail -1) || true
    prefix=${prefix%/bin/python$version}
    [[ -z $prefix ]] || break
  done
  [[ -n $prefix && -x $prefix/bin/python$version ]] ||
    { echo "no CPython $version under $pyenv_root/versions $python_roots" >&2; return 1; }
  rm -rf "$root$prefix"
  mkdir -p "$root$prefix"
  tar -C "$prefix" --exclude=./include --exclude="./lib/python$version/site-packages/*" \
    --exclude="./lib/python$version/test" -cf - . | tar -C "$root$prefix" -xf -
  echo "$prefix/bin/python$version"
}

test_pyenv() {
  local root=$roots_dir/trixie-test version wheel python
  timed "pyenv: trixie root" make_root trixie-test trixie "${trixie_packages[@]}"
  mount_in "$root"
  copy_repo "$root"
  for version in $pyenv_versions; do
    wheel=$(wheel_for "$version") || { failures=$((failures + 1)); continue; }
    python=$(pyenv_python "$version" "$root") || { failures=$((failures + 1)); continue; }
    assert_clean "$root"
    timed "pyenv $version: $python and its stdlib's native modules load" \
      in_root "$root" sh -c "$python -V && $python -c 'import ssl, ctypes, sqlite3, bz2, lzma, uuid'"
    timed "pyenv $version: venv, $(basename "$wheel") and mineru==$mineru" \
      make_venv "$root" "$python" "$wheel"
    timed "pyenv $version: unit tests" unit_tests "$root"
    [[ $e2e == 1 ]] && timed "pyenv $version: worker end to end" worker_test "$root"
    # MinerU's images run 3.12: the Dockerfile's path with the prebuilt wheel.
    [[ $docker_steps == 1 && $version == 3.12 ]] &&
      timed "pyenv $version: Dockerfile install steps" docker_install_steps "$root" "$wheel"
  done
  return 0
}

for name in $test_roots; do
  "test_$name"
done
printf '%s\n' "${timings[@]}"
((failures == 0)) || { echo "$failures stage(s) failed" >&2; exit 1; }
