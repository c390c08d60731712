# Debian roots made with debootstrap, shared by build_wheels.sh and
# test_wheels.sh (sourced, not run). Needs root. Roots are cached under
# $MINERU_HEALTH_ROOTS (default /var/tmp/mineru-health-roots), one directory
# per name, reused while their stamp matches; `rm -rf` that folder frees them.

roots_dir=${MINERU_HEALTH_ROOTS:-/var/tmp/mineru-health-roots}
debian_mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
debian_security=${DEBIAN_SECURITY_MIRROR:-$debian_mirror-security}
# Every chroot command runs with this environment only: the host's pip and
# proxy settings (find-links, extra indexes) do not exist inside a root.
chroot_env=(env -i PATH=/opt/venv/bin:/opt/build/bin:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin
  HOME=/root
  LANG=C.UTF-8 PIP_CERT=/etc/ssl/certs/ca-certificates.crt
  PIP_DISABLE_PIP_VERSION_CHECK=1 DEBIAN_FRONTEND=noninteractive)
mounted=()

log() { printf '[%s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }

need_debootstrap() {
  if ! command -v debootstrap >/dev/null; then
    log "installing debootstrap"
    apt-get install -y -q debootstrap >/dev/null
  fi
}

# make_root NAME SUITE PACKAGES... : a minbase SUITE root with PACKAGES
# installed, at $roots_dir/NAME. Rebuilt only when the suite or package list
# changes.
make_root() {
  local name=$1 suite=$2
  shift 2
  local root=$roots_dir/$name
  local stamp="$suite $*"
  if [[ -f $root/.mineru-health-root && $(cat "$root/.mineru-health-root") == "$stamp" ]]; then
    return
  fi
  # Same suite, other packages: install them rather than start again.
  if [[ -f $root/.mineru-health-root && $(cut -d' ' -f1 "$root/.mineru-health-root") == "$suite" ]]; then
    log "adding packages to $root"
    cp /etc/resolv.conf "$root/etc/resolv.conf"
    chroot "$root" "${chroot_env[@]}" apt-get update -q >"$roots_dir/$name.apt.log" 2>&1 &&
      chroot "$root" "${chroot_env[@]}" apt-get install -y -q --no-install-recommends "$@" \
        >>"$roots_dir/$name.apt.log" 2>&1 ||
      { tail -20 "$roots_dir/$name.apt.log" >&2; return 1; }
    chroot "$root" apt-get clean
    echo "$stamp" >"$root/.mineru-health-root"
    return
  fi
  need_debootstrap
  unmount_all
  rm -rf "$root" "$root.tmp"
  mkdir -p "$roots_dir"
  log "debootstrap $suite into $root"
  debootstrap --variant=minbase "$suite" "$root.tmp" "$debian_mirror" \
    >"$roots_dir/$name.debootstrap.log" 2>&1 ||
    { tail -20 "$roots_dir/$name.debootstrap.log" >&2; return 1; }
  # The host's extra CA certificates (a TLS-inspecting proxy's) so that pip
  # inside the root reaches PyPI the way the host does.
  if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
    mkdir -p "$root.tmp/usr/local/share/ca-certificates"
    cp /usr/local/share/ca-certificates/*.crt "$root.tmp/usr/local/share/ca-certificates/"
  fi
  cp /etc/resolv.conf "$root.tmp/etc/resolv.conf"
  # Point releases and security fixes too: the wheels bundle these libraries.
  printf 'deb %s %s main\ndeb %s %s-updates main\ndeb %s %s-security main\n' \
    "$debian_mirror" "$suite" "$debian_mirror" "$suite" "$debian_security" "$suite" \
    >"$root.tmp/etc/apt/sources.list"
  chroot "$root.tmp" "${chroot_env[@]}" apt-get update -q >"$roots_dir/$name.apt.log" 2>&1 ||
    { tail -20 "$roots_dir/$name.apt.log" >&2; return 1; }
  chroot "$root.tmp" "${chroot_env[@]}" apt-get install -y -q --no-install-recommends \
    ca-certificates "$@" >>"$roots_dir/$name.apt.log" 2>&1 ||
    { tail -20 "$roots_dir/$name.apt.log" >&2; return 1; }
  chroot "$root.tmp" "${chroot_env[@]}" update-ca-certificates >/dev/null
  chroot "$root.tmp" apt-get clean
  echo "$stamp" >"$root.tmp/.mineru-health-root"
  mv "$root.tmp" "$root"
}

# mount_in ROOT: /proc and /dev inside ROOT, undone by unmount_all (trap).
mount_in() {
  local root=$1
  local dir
  for dir in proc dev; do
    if ! mountpoint -q "$root/$dir"; then
      mount --bind "/$dir" "$root/$dir"
      mounted+=("$root/$dir")
    fi
  done
  cp /etc/resolv.conf "$root/etc/resolv.conf"
}

# bind_ro SOURCE ROOT TARGET: SOURCE read-only at ROOT/TARGET.
bind_ro() {
  local source=$1 target=$2/$3
  mkdir -p "$target"
  if mountpoint -q "$target"; then umount "$target"; fi
  mount --bind "$source" "$target"
  mount -o remount,bind,ro "$target"
  mounted+=("$target")
}

unmount_all() {
  local i
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do
    umount "${mounted[i]}" 2>/dev/null || umount -l "${mounted[i]}" 2>/dev/null || true
  done
  mounted=()
}

in_root() {
  local root=$1
  shift
  chroot "$root" "${chroot_env[@]}" "$@"
}
