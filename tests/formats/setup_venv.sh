#!/usr/bin/env bash
# Create (or reuse) the venv the reference scripts run in. Idempotent; CPU only, no torch.
#   tests/formats/setup_venv.sh [VENV]      (default: $FORMATS_VENV or /work/venv-formats)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="${1:-${FORMATS_VENV:-/work/venv-formats}}"
py="${PYTHON:-python3.11}"
command -v "$py" >/dev/null || py=python3
if [ ! -x "$venv/bin/python" ]; then
  "$py" -m venv "$venv"
fi
"$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$here/requirements.txt"
"$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps megatron-core==0.16.1
"$venv/bin/python" -c "import numpy, pyarrow, datasets, datatrove, tokenizers; from importlib import metadata; metadata.version('megatron-core')"
echo "$venv"
