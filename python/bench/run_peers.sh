#!/usr/bin/env bash
# The package's rows next to the peers, in one run of the peer harness (../shared/bench-peers,
# see its README). Copies the harness to target/bench-peers (its venv and data stay there,
# never in git), adds sfpkg_peers.py, packs the raw shards in place, mounts world 1 and 8,
# runs, unmounts. Extra arguments go to bench_peers.py, e.g. --repeat 3 --seconds 5.
#
#   python/bench/run_peers.sh --repeat 3 --seconds 5
#   python/bench/run_peers.sh --plots      # instead: draw docs/img (python/bench/plots.py)
set -euo pipefail
plots=""
if [ "${1:-}" = "--plots" ]; then plots=1; shift; fi
cd "$(dirname "$0")/../.."
root=$PWD
src=${BENCH_PEERS:-$(cd "$(git rev-parse --git-common-dir)/../.." && pwd)/shared/bench-peers}
h=$root/target/bench-peers
mkdir -p "$h"
cp "$src"/*.py "$src"/requirements.lock "$h"/
cp python/bench/sfpkg_peers.py python/bench/plots.py "$h"/
python3 - "$h/bench_peers.py" <<'PY'
import sys
p = sys.argv[1]
s = open(p).read()
hook = 'import sfpkg_peers\nsfpkg_peers.register(globals())\n\n\nif __name__ == "__main__":'
s = s.replace('if __name__ == "__main__":', hook, 1)
open(p, "w").write(s)
PY

if [ ! -x "$h/.venv/bin/python" ]; then
  python3 -m venv "$h/.venv"
fi
[ -x "$h/.venv/bin/uv" ] || "$h/.venv/bin/pip" install -q uv
# The harness's exact lock (no triton), without resolving again.
"$h/.venv/bin/uv" pip install -q --python "$h/.venv/bin/python" --no-deps -r "$h/requirements.lock"
cargo build --release --quiet --bin shufflefs
CARGO_TARGET_DIR=$root/target "$h/.venv/bin/pip" install -q ./python
bin=$root/target/release/shufflefs

[ -f "$h/data/meta.json" ] || "$h/.venv/bin/python" "$h/gen_data.py"
if [ ! -f "$h/sfds/manifest.json" ]; then
  "$bin" pack "$h/sfds" "$h"/data/raw/shard_*.bin --dtype u32 --in-place --no-progress
fi
if [ -n "$plots" ]; then
  "$h/.venv/bin/pip" install -q 'matplotlib>=3.7,<4'
  m1=$(mktemp -d) mp=$(mktemp -d)
  trap '"$bin" unmount "$m1" || true; "$bin" unmount "$mp" || true; rmdir "$m1" "$mp"' EXIT
  "$bin" mount "$h/sfds" "$m1" --window 2048 --batch-size 32 --ranks 1 --seed 0
  "$bin" mount "$h/sfds" "$mp" --window 2048 --batch-size 32 --ranks 1 --seed 0 --prefill
  cd "$h"
  SHUFFLEFS_REPO=$root SHUFFLEFS_MOUNT=$m1 SHUFFLEFS_MOUNT_PREFILL=$mp \
    SHUFFLEFS_DATASET=$h/sfds "$h/.venv/bin/python" plots.py "$@"
  exit 0
fi
m1=$(mktemp -d) m8=$(mktemp -d)
trap '"$bin" unmount "$m1" || true; "$bin" unmount "$m8" || true; rmdir "$m1" "$m8"' EXIT
"$bin" mount "$h/sfds" "$m1" --window 2048 --batch-size 32 --ranks 1 --seed 0
"$bin" mount "$h/sfds" "$m8" --window 2048 --batch-size 32 --ranks 8 --seed 0
SHUFFLEFS_MOUNT=$m1 SHUFFLEFS_MOUNT_W8=$m8 SHUFFLEFS_DATASET=$h/sfds \
  "$h/.venv/bin/python" "$h/bench_peers.py" \
  --peers numpy_memmap,numpy_pread,litdata,mosaic,npy_dir,npy_dir_ri,shufflefs,shufflefs_ri,pkg_mount,pkg_mount_fresh,pkg_inproc \
  --out "$h/results-pkg.json" "$@"
