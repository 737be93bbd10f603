#!/usr/bin/env bash
# Read-path benchmark: step files through the mount vs the physical limit (pread of exactly
# the same windows straight from the shards), in one run, as medians of interleaved
# repetitions, with ratios against the 2-reader direct pread.
#
#   scripts/bench.sh [--gib N] [--reps N] [--files N] [--quick]
#
# Defaults: a 1 GiB dataset of u32 positional tokens, batches of 32 x 2048 tokens
# (262,272-byte files), 5 repetitions of 10,000 files per row. --quick: 64 MiB, 1 rep,
# 500 files (CI runs this so the script cannot rot; no thresholds).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/ensure-fuse.sh
ensure_fuse

gib=1; reps=5; files=10000; quick=0
while [ $# -gt 0 ]; do
  case "$1" in
    --gib) gib="$2"; shift 2 ;;
    --reps) reps="$2"; shift 2 ;;
    --files) files="$2"; shift 2 ;;
    --quick) quick=1; shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
tokens=$((gib * 268435456))
if [ "$quick" = 1 ]; then tokens=16777216; reps=1; files=500; fi

cargo build --release --quiet
bin=$PWD/target/release/shufflefs
work=$PWD/target/bench/t$tokens
plan=(--window 2048 --batch-size 32 --ranks 1 --epochs 64 --seed 7)
if [ ! -f "$work/dataset/manifest.json" ]; then
  mkdir -p "$work"
  "$bin" synth "$work/tokens.bin" --tokens "$tokens" --dtype u32 >/dev/null
  "$bin" pack "$work/dataset" "$work/tokens.bin" --dtype u32 --shard-size 256MiB >/dev/null
  rm -f "$work/tokens.bin"
fi
cat "$work"/dataset/shard-*.bin > /dev/null   # make the shards resident: measure CPU paths

mnt=$(mktemp -d)
trap '"$bin" unmount "$mnt" >/dev/null 2>&1 || "$bin" unmount --lazy "$mnt" >/dev/null 2>&1; rmdir "$mnt"' EXIT
"$bin" -q mount "$work/dataset" "$mnt" "${plan[@]}" --threads 2 >/dev/null

results=$(mktemp)
for rep in $(seq "$reps"); do
  for row in "direct 1" "direct 2" "mount 1" "mount 2"; do
    set -- $row
    extra=()
    if [ "$1" = mount ]; then extra=(--mountpoint "$mnt"); fi
    "$bin" bench "$work/dataset" "${plan[@]}" --source "$1" --readers "$2" --files "$files" \
      "${extra[@]}" >> "$results"
  done
done

python3 - "$results" "$tokens" "$reps" "$files" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
tokens, reps, files = sys.argv[2], sys.argv[3], sys.argv[4]
def med(source, readers):
    xs = [r["tokens_per_s"] for r in rows if r["source"] == source and r["readers"] == readers]
    return statistics.median(xs)
limit = med("direct", 2)
print(f"dataset {int(tokens)*4/2**30:.2f} GiB u32, step files 32 x 2048 (262,272 bytes), "
      f"median of {reps} interleaved reps x {files} files, warm page cache")
print(f"{'row':<44} {'M tokens/s':>11} {'files/s':>9} {'ratio':>6}")
for label, source, readers in [
    ("(1) direct pread of the same windows, 1 thread", "direct", 1),
    ("(1) direct pread of the same windows, 2 threads", "direct", 2),
    ("(3) mount, whole-file reads, 1 reader", "mount", 1),
    ("(3) mount, whole-file reads, 2 readers", "mount", 2),
]:
    t = med(source, readers)
    print(f"{label:<44} {t/1e6:>11.1f} {t/65536:>9.0f} {t/limit:>6.2f}")
PY
rm -f "$results"
