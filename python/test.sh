#!/usr/bin/env bash
# Builds and tests the Python package: a venv under target/pyenv (kept between runs) with the
# pinned test requirements, `pip install ./python`, then pytest. Idempotent; a rerun with
# nothing changed takes the time of the tests plus an incremental build of the extension.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
venv=$root/target/pyenv
py=$venv/bin/python

if [ ! -x "$py" ] || ! "$py" -c 'import sys' 2>/dev/null; then
  rm -rf "$venv"
  python3 -m venv "$venv"
fi
# uv (from PyPI) installs the requirements: parallel downloads and a shared cache, so the
# ~3 GB of torch wheels cost ~80 s once and ~2 s in a fresh venv afterwards.
[ -x "$venv/bin/uv" ] || "$venv/bin/pip" install -q --disable-pip-version-check uv
start=$(date +%s)
"$venv/bin/uv" pip install -q --python "$py" -r python/requirements-test.txt
echo "requirements ready in $(( $(date +%s) - start )) s"

# The mount tests need the binary; the extension's dependencies share target/ with it.
cargo build --release --quiet --bin shufflefs
export CARGO_TARGET_DIR=$root/target
start=$(date +%s)
"$venv/bin/pip" install -q --disable-pip-version-check ./python
echo "pip install ./python: $(( $(date +%s) - start )) s"

# The extension crate: format and lints, as for the root crate.
cargo fmt --manifest-path python/rust/Cargo.toml --check
PYO3_PYTHON=$py cargo clippy --quiet --manifest-path python/rust/Cargo.toml \
  --all-targets -- -D warnings

cd python
# `pytest`, not `python -m pytest`: the latter would import ./shufflefs (no extension) instead
# of the installed package.
SHUFFLEFS_BIN=$root/target/release/shufflefs "$venv/bin/pytest" -q -p no:cacheprovider "$@"
