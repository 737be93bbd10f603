#!/usr/bin/env bash
# The test command: installs what it needs (fuse3), then runs the format check, clippy with
# warnings as errors, the whole test suite (the mount tests twice: with FUSE passthrough and
# without), the demo in check mode, a quick benchmark and the Python package's tests.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/ensure-fuse.sh
ensure_fuse
source scripts/ensure-remote.sh
ensure_nginx
ensure_moto

echo "== cargo fmt --check"
cargo fmt --check
echo "== cargo clippy --all-targets -- -D warnings"
cargo clippy --all-targets -- -D warnings
# Step files are served by FUSE passthrough where the kernel has it (Linux 6.9+): there the
# tests must exercise it (tests/it/passthrough.rs fails rather than skips), and the mount tests
# run a second time with it off, the path of older kernels and unprivileged daemons.
if zcat /proc/config.gz 2>/dev/null | grep -q '^CONFIG_FUSE_PASSTHROUGH=y'; then
  export SHUFFLEFS_REQUIRE_PASSTHROUGH=1
fi
echo "== cargo test"
cargo test 2>&1 | tee target/test.log
passed=$(awk '/^test result:/ { for (i = 1; i < NF; i++) if ($(i + 1) == "passed;") s += $i } END { print s + 0 }' target/test.log)
echo "== cargo test --test it, without passthrough (SHUFFLEFS_NO_PASSTHROUGH=1)"
SHUFFLEFS_NO_PASSTHROUGH=1 cargo test --test it 2>&1 | tee target/test-nopass.log
passed=$((passed + $(awk '/^test result:/ { for (i = 1; i < NF; i++) if ($(i + 1) == "passed;") s += $i } END { print s + 0 }' target/test-nopass.log)))
echo "== demo (check mode)"
scripts/demo.sh --check
echo "== benchmark (quick: keeps the script working; no thresholds)"
scripts/bench.sh --quick
# ---- Python package (python/): venv under target/pyenv, pip install ./python, pytest --------
echo "== python package (python/test.sh)"
python/test.sh 2>&1 | tee target/pytest.log
py_passed=$(awk '/ passed/ { for (i = 2; i <= NF; i++) if ($i ~ /^passed/) s = $(i - 1) } END { print s + 0 }' target/pytest.log)
passed=$((passed + py_passed))
# ---- end of the Python package block ------------------------------------------------------
echo "== all checks passed"
echo "tests: ${passed} passed, 0 failed"
