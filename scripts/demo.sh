#!/usr/bin/env bash
# The main job on a built-in demo dataset: builds shufflefs, packs 10 M positional u32 tokens
# (token i has value i, so every row shows which window of the stream it is), mounts them at
# mount/ as 4 ranks x 3 epochs of batches of 8 x 2049 tokens, shows the tree and a step read
# with numpy (if installed), and stays mounted until Ctrl-C.
#
#   scripts/demo.sh           # interactive: stays mounted until Ctrl-C
#   scripts/demo.sh --check   # shows the same, then unmounts and exits (used by CI)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/ensure-fuse.sh
ensure_fuse

check=0
if [ "${1:-}" = "--check" ]; then
  check=1
fi

cargo build --release --quiet
bin=target/release/shufflefs
data=target/demo
mnt=mount
plan=(--window 2049 --stride 2048 --batch-size 8 --ranks 4 --epochs 3 --seed 1234)

# A dataset left by an older build (other format version) is rebuilt.
"$bin" inspect "$data/dataset" >/dev/null 2>&1 || rm -rf "$data"
if [ ! -f "$data/dataset/manifest.json" ]; then
  mkdir -p "$data"
  "$bin" synth "$data/tokens.bin" --tokens 10000000 --dtype u32
  "$bin" pack "$data/dataset" "$data/tokens.bin" --dtype u32 --shard-size 8MiB
fi
mkdir -p "$mnt"
if grep -q " $(realpath "$mnt") " /proc/self/mountinfo; then
  "$bin" unmount --lazy "$mnt" >/dev/null 2>&1 || true
fi

"$bin" mount "$data/dataset" "$mnt" "${plan[@]}"
cleanup() {
  "$bin" unmount "$mnt" >/dev/null 2>&1 || "$bin" unmount --lazy "$mnt" >/dev/null 2>&1 || true
  echo "unmounted $mnt/"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

run() {
  echo
  echo "\$ $*"
  "$@"
}
run ls "$mnt"
run ls "$mnt/epoch" "$mnt/epoch/0/rank"
run sh -c "ls $mnt/epoch/0/rank/3/step | head -6"
run cat "$mnt/info.json"
run cat "$mnt/epoch/0/rank/3/step/17.json"
run "$bin" plan "$data/dataset" "${plan[@]}" --epoch 0 --rank 3 --step 17
if python3 -c "import numpy" >/dev/null 2>&1; then
  run python3 - "$mnt" <<'PY'
import json, sys
import numpy as np
mnt = sys.argv[1]
batch = np.load(f"{mnt}/epoch/0/rank/3/step/17.npy")
meta = json.load(open(f"{mnt}/epoch/0/rank/3/step/17.json"))
print("shape", batch.shape, "dtype", batch.dtype)
print("first tokens of each row:", batch[:, 0].tolist())
print("observations * 2048:     ", [o * 2048 for o in meta["observations"]])
x, y = batch[:, :-1], batch[:, 1:]   # next-token inputs and targets
print("inputs", x.shape, "targets", y.shape, "targets == inputs + 1:", bool((y == x + 1).all()))
PY
else
  echo
  echo "(numpy not installed: pip install numpy to see the step read as an array)"
  run sh -c "head -c 128 $mnt/epoch/0/rank/3/step/17.npy | od -c | head -8"
fi

if [ "$check" = 1 ]; then
  exit 0
fi
echo
echo "Mounted at $mnt/ (dataset $data/dataset). Press Ctrl-C to unmount."
while true; do
  sleep 3600 &
  wait $! || true
done
