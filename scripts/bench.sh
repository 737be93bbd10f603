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
#
# A second table measures metadata: S.json with per-row spans on a JSON Lines corpus of
# short documents (20-80 tokens, document metadata, a concept span on every other one),
# against S.npy of the same steps.
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
# Two ranks: with 2 readers each reads its own rank's steps in order, as two trainers would.
plan=(--window 2048 --batch-size 32 --ranks 2 --epochs 256 --seed 7)
# Every run reads step files no earlier run read (--skip), as a trainer does: a re-read would
# find them in the cache, or be skipped by the prefetcher as recently read.
next=0
# A dataset packed by an older build (unreadable, or an older format version) is rebuilt.
current() { "$bin" inspect "$1" --json 2>/dev/null | grep -q '"format_version": 4'; }
{ [ -f "$work/tokens.bin" ] && current "$work/dataset"; } || rm -rf "$work"
if [ ! -f "$work/dataset/manifest.json" ]; then
  mkdir -p "$work"
  "$bin" synth "$work/tokens.bin" --tokens "$tokens" --dtype u32 >/dev/null
  # In place: the token file itself is the shard (the naive loader below reads it too).
  "$bin" pack "$work/dataset" "$work/tokens.bin" --dtype u32 --in-place >/dev/null
fi
cat "$work/tokens.bin" > /dev/null   # make the data resident: measure CPU paths

mnt=$(mktemp -d)
pmnt=$(mktemp -d)
smnt=$(mktemp -d)
fmnt=$(mktemp -d)
qmnt=$(mktemp -d)
nmnt=$(mktemp -d)
cleanup() {
  for m in "$mnt" "$pmnt" "$smnt" "$fmnt" "$qmnt" "$nmnt"; do
    "$bin" unmount "$m" >/dev/null 2>&1 || "$bin" unmount --lazy "$m" >/dev/null 2>&1
    rmdir "$m"
  done
}
trap cleanup EXIT
# Default mounts (FUSE threads = cores + 1, 30 s read deadline): the plain read path (no
# cache), and the default mount (step cache + prefetch).
"$bin" -q mount "$work/dataset" "$mnt" "${plan[@]}" --cache-size 0 >/dev/null
"$bin" -q mount "$work/dataset" "$pmnt" "${plan[@]}" >/dev/null
# The plain read path without the read deadline: every read on the FUSE thread that got it.
"$bin" -q mount "$work/dataset" "$fmnt" "${plan[@]}" --cache-size 0 --read-timeout 0 \
  --threads 2 >/dev/null
# Prefill: prefetched step files pushed into the kernel page cache.
"$bin" -q mount "$work/dataset" "$qmnt" "${plan[@]}" --prefill >/dev/null
# The default mount with every READ answered by the daemon (as on kernels without FUSE
# passthrough).
"$bin" -q mount "$work/dataset" "$nmnt" "${plan[@]}" --no-passthrough >/dev/null
# The READ transport's own ceiling: every READ answered from one in-memory file.
"$bin" -q mount "$work/dataset" "$smnt" "${plan[@]}" --threads 2 --cache-size 0 --stub-reads \
  --no-passthrough >/dev/null 2>&1

results=$(mktemp)
for rep in $(seq "$reps"); do
  for row in "direct 1 -" "direct 2 -" "mount 1 $smnt" "mount 2 $smnt" "mount 1 $mnt" \
    "mount 2 $mnt" "mount 1 $fmnt" "mount 2 $fmnt" "mount 1 $pmnt" "mount 2 $pmnt" \
    "mount 1 $nmnt" "mount 2 $nmnt" "mount 1 $qmnt" "mount 2 $qmnt"; do
    set -- $row
    extra=()
    if [ "$1" = mount ]; then extra=(--mountpoint "$3"); fi
    tag=plain
    if [ "$3" = "$pmnt" ]; then tag=prefetch; fi
    if [ "$3" = "$smnt" ]; then tag=stub; fi
    if [ "$3" = "$fmnt" ]; then tag=nodeadline; fi
    if [ "$3" = "$qmnt" ]; then tag=prefill; fi
    if [ "$3" = "$nmnt" ]; then tag=nopass; fi
    "$bin" bench "$work/dataset" "${plan[@]}" --source "$1" --readers "$2" --files "$files" \
      --skip "$next" "${extra[@]}" | sed "s/^{/{\"tag\":\"$tag\",/" >> "$results"
    next=$((next + files))
  done
done
# (8) Paced consumers: read a step, 2 ms of "compute", read the next (1 and 2 consumers, one
# rank each): read latency through the default mount, with --prefill, and direct pread.
# Each run gets a fresh mount, so no run inherits another's prefetch state.
pfiles=$((quick == 1 ? 200 : 1000))
paced=$(mktemp)
pm=$(mktemp -d)
for rep in $(seq "$reps"); do
  for tag in direct default nopass prefill; do
    for readers in 1 2; do
      extra=(--source direct)
      if [ "$tag" != direct ]; then
        flags=()
        if [ "$tag" = prefill ]; then flags=(--prefill); fi
        if [ "$tag" = nopass ]; then flags=(--no-passthrough); fi
        "$bin" -q mount "$work/dataset" "$pm" "${plan[@]}" "${flags[@]}" >/dev/null
        extra=(--source mount --mountpoint "$pm")
      fi
      "$bin" bench "$work/dataset" "${plan[@]}" --readers "$readers" --files "$pfiles" \
        --skip "$next" --pace-us 2000 "${extra[@]}" \
        | sed "s/^{/{\"tag\":\"$tag\",/" >> "$paced"
      next=$((next + pfiles))
      if [ "$tag" = prefill ]; then
        python3 -c 'import json,sys; p=json.load(open(sys.argv[1]))["prefill"]; c=json.load(open(sys.argv[1]))["cache"]; print(json.dumps({"source": "counters", "tag": "prefill", "readers": int(sys.argv[2]), "served_by_kernel": p["served_by_kernel"], "reads_reaching_daemon": c["hits"] + c["misses"], "files": int(sys.argv[3])}))' \
          "$pm/stats.json" "$readers" "$pfiles" >> "$paced"
      fi
      if [ "$tag" != direct ]; then "$bin" unmount "$pm" >/dev/null; fi
    done
  done
done
# (9) Unpaced readers for long enough that the prefetch governor decides (its first experiment
# is after 5 s): the default mount against --prefill, fresh mounts, 2 readers.
lfiles=$((quick == 1 ? 2000 : 60000))
long=$(mktemp)
for tag in default nopass prefill; do
  flags=()
  if [ "$tag" = prefill ]; then flags=(--prefill); fi
  if [ "$tag" = nopass ]; then flags=(--no-passthrough); fi
  "$bin" -q mount "$work/dataset" "$pm" "${plan[@]}" "${flags[@]}" >/dev/null
  "$bin" bench "$work/dataset" "${plan[@]}" --source mount --mountpoint "$pm" --readers 2 \
    --files "$lfiles" --skip "$next" | sed "s/^{/{\"tag\":\"$tag\",/" >> "$long"
  next=$((next + lfiles))
  python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(json.dumps({"source": "counters", "tag": sys.argv[2], "paused": d["cache"]["prefetch_paused"], "active": d["prefetch_active"]}))' \
    "$pm/stats.json" "$tag" >> "$long"
  "$bin" unmount "$pm" >/dev/null
done
# (10) Pre-stored step files: with --prefill, time only the reads of steps already in the
# page cache (after each read the daemon hears of, the reader waits 40 ms for the stores), and
# direct pread of the same number of windows, 1 and 2 readers.
sfiles=$((quick == 1 ? 500 : 4000))
stored=$(mktemp)
for rep in $(seq "$reps"); do
  for readers in 1 2; do
    "$bin" -q mount "$work/dataset" "$pm" "${plan[@]}" --prefill >/dev/null
    "$bin" bench "$work/dataset" "${plan[@]}" --source mount --mountpoint "$pm" \
      --readers "$readers" --files "$sfiles" --skip "$next" --prestored \
      | sed "s/^{/{\"tag\":\"prestored\",/" >> "$stored"
    "$bin" unmount "$pm" >/dev/null
    "$bin" bench "$work/dataset" "${plan[@]}" --source direct --readers "$readers" \
      --files "$sfiles" --skip "$next" | sed "s/^{/{\"tag\":\"direct\",/" >> "$stored"
    next=$((next + sfiles))
  done
done
rmdir "$pm"
prefill_stats=$(python3 -c 'import json,sys; p=json.load(open(sys.argv[1]))["prefill"]; print("stored %d, served by the kernel %d, trigger reads %d, fallback reads %d, store failures %d" % (p["stored"], p["served_by_kernel"], p["trigger_reads"], p["fallback_reads"], p["store_failed"]))' "$qmnt/stats.json")
prefetch_stats=$(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); c=d["cache"]; print("hits %d, misses %d, waited %d, claimed %d, wasted %d, paused periods %d, active now %s" % (c["hits"], c["misses"], c["prefetch_waited"], c["prefetch_claimed"], c["prefetch_wasted"], c["prefetch_paused"], d["prefetch_active"]))' "$pmnt/stats.json")

# (4) Python consumers through the mount and (5) the naive numpy loader, one process each.
if ! python3 -c "import numpy" >/dev/null 2>&1; then
  pip install -q numpy >/dev/null 2>&1 || echo "(numpy not installable: Python rows skipped)"
fi
pyfiles=$((files / 2))
for rep in $(seq "$reps"); do
  for pm_tag in "$pmnt:" "$nmnt:_nopass"; do
  python3 - "${pm_tag%%:*}" "$work/tokens.bin" "$pyfiles" "$next" "${pm_tag#*:}" >> "$results" <<'PY' || true
import json, sys, time
import numpy as np
mnt, tokens, files, skip = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
suffix = sys.argv[5]
info = json.load(open(f"{mnt}/info.json"))
B, W, S = info["batch_size"], info["window"], info["stride"]
spe = info["steps_per_epoch"]
total = spe * info["epochs"]
# Rank 0's steps, the np.load run first, then readinto on the next ones (never re-read within
# a run: the order wraps only past every epoch of the plan).
steps = [i % total for i in range(skip // 2, skip // 2 + 2 * files)]
paths = [f"{mnt}/epoch/{i // spe}/rank/0/step/{i % spe}.npy" for i in steps]
def emit(tag, secs, n):
    if tag in ("np.load", "readinto"):
        tag += suffix
    print(json.dumps({"source": "python", "tag": tag, "readers": 1, "files": n,
                      "secs": secs, "tokens_per_s": n * B * W / secs}))
t = time.perf_counter()
for p in paths[:files]:
    a = np.load(p)
emit("np.load", time.perf_counter() - t, files)
buf = bytearray(info["step_file_bytes"])
t = time.perf_counter()
for p in paths[files:]:
    with open(p, "rb", buffering=0) as f:
        f.readinto(buf)
    a = np.frombuffer(buf, dtype=info["dtype"], offset=info["npy_header_bytes"]).reshape(B, W)
emit("readinto", time.perf_counter() - t, files)
if suffix:
    sys.exit(0)
# The loader people write by hand: memmap + a full permutation, gathering the same windows.
t = time.perf_counter()
data = np.memmap(tokens, dtype=np.uint32, mode="r")
n_obs = (len(data) - W) // S + 1
order = np.random.default_rng(7).permutation(n_obs)
startup = time.perf_counter() - t
for b in range(files):
    idx = order[(b * B) % (n_obs - B):][:B]
    batch = np.stack([data[i * S:i * S + W] for i in idx])
emit("naive", time.perf_counter() - t, files)
print(json.dumps({"source": "python", "tag": "naive_startup", "readers": 1, "files": 0,
                  "secs": startup, "tokens_per_s": 0}))
PY
  next=$((next + 4 * pyfiles))
  done
done

limit_file=$(mktemp)
python3 - "$results" "$tokens" "$reps" "$files" "$limit_file" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
tokens, reps, files = sys.argv[2], sys.argv[3], sys.argv[4]
def med(source, readers, tag="plain"):
    xs = [r["tokens_per_s"] for r in rows
          if r["source"] == source and r["readers"] == readers and r["tag"] == tag]
    return statistics.median(xs)
limit = med("direct", 2)
open(sys.argv[5], "w").write(str(limit))
print(f"dataset {int(tokens)*4/2**30:.2f} GiB u32, step files 32 x 2048 (262,272 bytes), "
      f"median of {reps} interleaved reps x {files} files, warm page cache")
print(f"{'row':<62} {'M tokens/s':>11} {'files/s':>9} {'ratio':>6}")
for label, source, readers, tag in [
    ("(1) direct pread of the same windows, 1 thread", "direct", 1, "plain"),
    ("(1) direct pread of the same windows, 2 threads", "direct", 2, "plain"),
    ("(2) READ ceiling: stub replies from memory, no passthrough, 1 rd", "mount", 1, "stub"),
    ("(2) READ ceiling: stub replies from memory, no passthrough, 2 rd", "mount", 2, "stub"),
    ("(3) mount, no cache, whole-file reads, 1 reader", "mount", 1, "plain"),
    ("(3) mount, no cache, whole-file reads, 2 readers", "mount", 2, "plain"),
    ("(3) ... no cache, --read-timeout 0 --threads 2, 1 reader", "mount", 1, "nodeadline"),
    ("(3) ... no cache, --read-timeout 0 --threads 2, 2 readers", "mount", 2, "nodeadline"),
    ("(3) mount, cache + prefetch + passthrough (default), 1 reader", "mount", 1, "prefetch"),
    ("(3) mount, cache + prefetch + passthrough (default), 2 readers", "mount", 2, "prefetch"),
    ("(3) ... default with --no-passthrough, 1 reader", "mount", 1, "nopass"),
    ("(3) ... default with --no-passthrough, 2 readers", "mount", 2, "nopass"),
    ("(7) mount with --prefill, unpaced, 1 reader", "mount", 1, "prefill"),
    ("(7) mount with --prefill, unpaced, 2 readers", "mount", 2, "prefill"),
]:
    t = med(source, readers, tag)
    print(f"{label:<62} {t/1e6:>11.1f} {t/65536:>9.0f} {t/limit:>6.2f}")
for readers in (1, 2):
    d, n, s = med("mount", readers, "prefetch"), med("mount", readers, "nopass"), med("mount", readers, "stub")
    print(f"    default, {readers} reader(s): {d / s:.2f}x the READ ceiling, "
          f"{d / n:.2f}x --no-passthrough")
py = [r for r in rows if r["source"] == "python"]
if py:
    for label, tag in [
        ("(4) Python, default mount: np.load", "np.load"),
        ("(4) Python, default mount: readinto + frombuffer", "readinto"),
        ("(4) Python, --no-passthrough: np.load", "np.load_nopass"),
        ("(4) Python, --no-passthrough: readinto + frombuffer", "readinto_nopass"),
        ("(5) naive numpy memmap + rng.permutation loader", "naive"),
    ]:
        t = statistics.median(r["tokens_per_s"] for r in py if r["tag"] == tag)
        print(f"{label:<62} {t/1e6:>11.1f} {t/65536:>9.0f} {t/limit:>6.2f}")
    naive = statistics.median(r["tokens_per_s"] for r in py if r["tag"] == "naive")
    ri = statistics.median(r["tokens_per_s"] for r in py if r["tag"] == "readinto")
    nl = statistics.median(r["tokens_per_s"] for r in py if r["tag"] == "np.load")
    print(f"    np.load vs readinto through the default mount: {nl / ri:.2f}")
    st = statistics.median(r["secs"] for r in py if r["tag"] == "naive_startup")
    print(f"    readinto consumer vs naive loader: {ri / naive:.2f}x; "
          f"naive loader startup (memmap + permutation): {st * 1000:.0f} ms")
PY
rm -f "$results"
echo "    prefetch mount counters after the run: $prefetch_stats"
echo
python3 - "$paced" "$pfiles" "$long" "$limit_file" "$stored" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
lat = [r for r in rows if r["source"] != "counters"]
print(f"(8) paced consumers (2 ms of compute per step, {sys.argv[2]} steps each), read latency, "
      "median over reps")
print(f"{'path':<44} {'consumers':>9} {'p50 us':>8} {'p99 us':>8} {'p50 vs default':>15}")
for readers in (1, 2):
    base = statistics.median(r["latency_p50_us"] for r in lat
                             if r["tag"] == "default" and r["readers"] == readers)
    for label, tag in [("direct pread of the windows (no FUSE)", "direct"),
                       ("default mount (passthrough + cache + prefetch)", "default"),
                       ("default mount with --no-passthrough", "nopass"),
                       ("mount with --prefill", "prefill")]:
        xs = [r for r in lat if r["tag"] == tag and r["readers"] == readers]
        p50 = statistics.median(r["latency_p50_us"] for r in xs)
        p99 = statistics.median(r["latency_p99_us"] for r in xs)
        print(f"{label:<44} {readers:>9} {p50:>8.0f} {p99:>8.0f} {p50 / base:>15.2f}")
    cs = [r for r in rows if r["source"] == "counters" and r["readers"] == readers]
    kernel = statistics.median(r["served_by_kernel"] / r["files"] for r in cs)
    print(f"    --prefill, {readers} consumer(s): {kernel * 100:.1f}% of step files served by the "
          f"kernel alone (median over reps)")
stored = [json.loads(l) for l in open(sys.argv[5])]
print()
print("(10) pre-stored step files (--prefill, only reads of steps already in the page cache "
      "timed) vs direct pread of as many windows, median over reps")
for readers in (1, 2):
    pre = statistics.median(r["tokens_per_s"] for r in stored
                            if r["tag"] == "prestored" and r["readers"] == readers)
    direct = statistics.median(r["tokens_per_s"] for r in stored
                               if r["tag"] == "direct" and r["readers"] == readers)
    print(f"    {readers} reader(s): {pre / 1e6:8.1f} M tokens/s vs direct {direct / 1e6:8.1f}: "
          f"{pre / direct:.2f}x")
longrows = [json.loads(l) for l in open(sys.argv[3])]
limit = float(open(sys.argv[4]).read())
print()
print("(9) 2 unpaced readers for long enough that the governor decides (fresh mounts)")
for tag in ("default", "nopass", "prefill"):
    r = next(r for r in longrows if r["tag"] == tag and r["source"] == "mount")
    c = next(r for r in longrows if r["tag"] == tag and r["source"] == "counters")
    print(f"    {tag:<8} {r['tokens_per_s'] / 1e6:8.1f} M tokens/s ({r['tokens_per_s'] / limit:.2f} of "
          f"the limit), governor paused prefetch {c['paused']} time(s), active at the end: "
          f"{c['active']}")
PY
rm -f "$paced" "$long" "$limit_file" "$stored"
echo "    prefill mount counters after the run: $prefill_stats"

# --- (6) time to mount + first step, and daemon memory, at 1 GiB and 4 TiB (sparse) ---------
big=$PWD/target/bench/sparse4t
if ! current "$big/dataset"; then
  rm -rf "$big"; mkdir -p "$big"
  for i in 0 1 2 3; do truncate -s 1T "$big/part$i.bin"; done
  "$bin" pack "$big/dataset" "$big"/part*.bin --dtype u32 --in-place >/dev/null
fi
echo
nread=$((quick == 1 ? 2000 : 100000))
echo "(6) mount + first step (median of 5); daemon RSS after the first step, after $((nread / 5)) step files and after $nread more"
for ds in "$work/dataset" "$big/dataset"; do
  mt=$(mktemp -d)
  times=()
  for rep in 1 2 3 4 5; do
    t0=$(date +%s%N)
    "$bin" -q mount "$ds" "$mt" "${plan[@]}" > "$mt.out"
    cat "$mt/epoch/0/rank/0/step/0.npy" > /dev/null
    t1=$(date +%s%N)
    times+=($(( (t1 - t0) / 1000 )))
    pid=$(sed -n 's/.*daemon pid \([0-9]*\).*/\1/p' "$mt.out")
    if [ "$rep" = 5 ]; then
      rss0=$(awk '/VmRSS/ {print $2}' "/proc/$pid/status")
      # A fifth of the files (the cache is full long before), then all of them: flat means
      # the second figure equals the first.
      "$bin" bench "$ds" "${plan[@]}" --source mount --mountpoint "$mt" --readers 2 \
        --files "$((nread / 5))" >/dev/null
      rss1=$(awk '/VmRSS/ {print $2}' "/proc/$pid/status")
      "$bin" bench "$ds" "${plan[@]}" --source mount --mountpoint "$mt" --readers 2 \
        --files "$nread" >/dev/null
      rss=$(awk '/VmRSS/ {print $2}' "/proc/$pid/status")
    fi
    "$bin" unmount "$mt" >/dev/null
    while [ -d "/proc/$pid" ] && ! grep -q ") Z " "/proc/$pid/stat" 2>/dev/null; do sleep 0.01; done
  done
  med=$(printf '%s\n' "${times[@]}" | sort -n | sed -n 3p)
  size=$("$bin" inspect "$ds" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["bytes"])')
  printf '  %-6s dataset: mount + first step %6.1f ms; RSS %6.1f, %6.1f, %6.1f MiB (cache 256 MiB)\n' \
    "$(numfmt --to=iec "$size")" "$(awk "BEGIN { print $med / 1000 }")" \
    "$(awk "BEGIN { print $rss0 / 1024 }")" "$(awk "BEGIN { print $rss1 / 1024 }")" \
    "$(awk "BEGIN { print $rss / 1024 }")"
  rm -f "$mt.out"; rmdir "$mt"
done
echo
"$bin" bench "$work/dataset" "${plan[@]}" --source permutation --files "$((quick == 1 ? 5 : 50))" \
  | python3 -c 'import json,sys; d=json.load(sys.stdin); print("permutation: %.1f M indices/s on one core, batched as the read path computes a step (one at a time: %.1f M/s; domain %d)" % (d["indices_per_s"] / 1e6, d["scalar_indices_per_s"] / 1e6, d["domain"]))'

# --- metadata: S.json rows on short documents ------------------------------------------
docs=200000; mfiles=1000
if [ "$quick" = 1 ]; then docs=5000; mfiles=100; fi
meta=$PWD/target/bench/meta$docs
mplan=(--window 2049 --stride 2048 --batch-size 32 --ranks 1 --epochs 64 --seed 7)
current "$meta/dataset" || rm -rf "$meta"
if [ ! -f "$meta/dataset/manifest.json" ]; then
  mkdir -p "$meta"
  python3 - "$meta/docs.jsonl" "$docs" <<'PY'
import json, random, sys
random.seed(1)
pos = 0
with open(sys.argv[1], "w") as f:
    for k in range(int(sys.argv[2])):
        n = random.randint(20, 80)
        d = {"tokens": list(range(pos, pos + n)),
             "meta": {"doc_id": f"web-{k}", "quality": round(random.random(), 3)}}
        if k % 2:
            d["spans"] = [{"start": 0, "end": n // 2, "meta": {"concepts": [k % 97, k % 89]}}]
        f.write(json.dumps(d) + "\n")
        pos += n
PY
  "$bin" pack "$meta/dataset" "$meta/docs.jsonl" --dtype u32 --no-progress >/dev/null
  rm -f "$meta/docs.jsonl"
fi
"$bin" unmount "$mnt" >/dev/null
"$bin" -q mount "$meta/dataset" "$mnt" "${mplan[@]}" --threads 2 --cache-size 0 >/dev/null
mresults=$(mktemp)
for rep in $(seq "$reps"); do
  for file in npy json; do
    for source in direct mount; do
      extra=()
      if [ "$source" = mount ]; then extra=(--mountpoint "$mnt"); fi
      "$bin" bench "$meta/dataset" "${mplan[@]}" --source "$source" --file "$file" \
        --files "$mfiles" "${extra[@]}" >> "$mresults"
    done
  done
done
python3 - "$mresults" "$mnt" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
step = json.load(open(f"{sys.argv[2]}/epoch/0/rank/0/step/0.json"))
spans = sum(len(r) for r in step["rows"])
print()
print(f"metadata: 32 x 2049-token steps over documents of 20-80 tokens "
      f"({spans} spans in step 0), median of interleaved reps")
print(f"{'file':<36} {'ms/step':>8} {'read syscalls/step (by the reader)':>35}")
for label, source, file in [
    ("S.npy, direct", "direct", "npy"), ("S.json with rows, direct", "direct", "json"),
    ("S.npy, through the mount", "mount", "npy"), ("S.json with rows, through the mount", "mount", "json"),
]:
    xs = [r for r in rows if r["source"] == source and r["file"] == file]
    ms = statistics.median(1000 / r["files_per_s"] for r in xs)
    sc = statistics.median(r["read_syscalls_per_file"] for r in xs)
    print(f"{label:<36} {ms:>8.3f} {sc:>35.1f}")
PY
rm -f "$mresults"

# ---- Remote storage: local disk against S3 (a loopback S3 server, 20 ms added per request) --
# examples/remote_bench: mount + first step, a paced trainer (read a step, 50 ms of compute),
# unpaced reads, and the daemon's memory on a 1 TiB dataset of virtual objects.
echo
echo "remote storage (examples/remote_bench)"
cargo build --release --quiet --example remote_bench
remote_args=()
if [ "$quick" = 1 ]; then remote_args=(--quick); fi
target/release/examples/remote_bench --bin "$bin" "${remote_args[@]}"
