# Sourced by scripts/test.sh: the loopback servers of the remote-storage tests.
#   ensure_nginx   Debian's nginx if missing (no system service is started); exports SHUFFLEFS_NGINX
#   ensure_moto    a python that runs moto's S3 server (the system one if it has moto[server],
#                  else a venv under ${SHUFFLEFS_CACHE:-$HOME/.cache/shufflefs}); exports
#                  SHUFFLEFS_MOTO_PY
# The tests start and stop the servers themselves (tests/it/common/remote.rs), on 127.0.0.1.

MOTO_VERSION="${MOTO_VERSION:-5.2.1}"

_remote_sudo() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

ensure_nginx() {
  if [ ! -x /usr/sbin/nginx ]; then
    echo "nginx not found: installing Debian's nginx" >&2
    # Keep the package from starting a system nginx on port 80: a policy-rc.d that denies
    # service starts during the install (removed afterwards if we created it).
    local made_policy=""
    if [ ! -e /usr/sbin/policy-rc.d ]; then
      printf '#!/bin/sh\nexit 101\n' | _remote_sudo tee /usr/sbin/policy-rc.d >/dev/null
      _remote_sudo chmod +x /usr/sbin/policy-rc.d
      made_policy=1
    fi
    _remote_sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive _remote_sudo apt-get install -y -qq --no-install-recommends nginx >/dev/null
    local rc=$?
    if [ -n "$made_policy" ]; then _remote_sudo rm -f /usr/sbin/policy-rc.d; fi
    [ $rc = 0 ] && [ -x /usr/sbin/nginx ] || { echo "error: could not install nginx" >&2; return 1; }
  fi
  export SHUFFLEFS_NGINX=/usr/sbin/nginx
}

ensure_moto() {
  local check='import moto.server, flask, flask_cors, boto3'
  if python3 -c "$check" 2>/dev/null; then
    SHUFFLEFS_MOTO_PY=$(python3 -c 'import sys; print(sys.executable)')
  else
    local venv="${SHUFFLEFS_CACHE:-$HOME/.cache/shufflefs}/moto-$MOTO_VERSION"
    if ! "$venv/bin/python" -c "$check" 2>/dev/null; then
      echo "installing moto[server]==$MOTO_VERSION into $venv" >&2
      python3 -m venv "$venv" 2>/dev/null || {
        _remote_sudo apt-get update -qq
        DEBIAN_FRONTEND=noninteractive _remote_sudo apt-get install -y -qq python3-venv >/dev/null
        python3 -m venv "$venv"
      } || return 1
      "$venv/bin/pip" install -q "moto[server]==$MOTO_VERSION" || return 1
    fi
    SHUFFLEFS_MOTO_PY="$venv/bin/python"
  fi
  export SHUFFLEFS_MOTO_PY
}
