# Sourced by scripts/test.sh and scripts/demo.sh: makes sure FUSE 3 userspace tools exist.
# Installs Debian's fuse3 when fusermount3 is missing (as root, or through sudo).
ensure_fuse() {
  if command -v fusermount3 >/dev/null 2>&1; then
    return 0
  fi
  echo "fusermount3 not found: installing fuse3 from Debian" >&2
  local sudo=""
  if [ "$(id -u)" != 0 ]; then
    sudo="sudo"
  fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq fuse3 >/dev/null
  command -v fusermount3 >/dev/null 2>&1 || {
    echo "error: could not install fuse3 (fusermount3 still missing)" >&2
    return 1
  }
  if [ ! -e /dev/fuse ]; then
    $sudo modprobe fuse 2>/dev/null || echo "warning: /dev/fuse is missing; mount tests will skip" >&2
  fi
}
