//! Command-line types (clap derive only) and their value parsers. Each command converts its
//! arguments into library configuration in `cmd/`; the library never sees clap.
//!
//! A value that is a number of the wrong form is clap's usage error (exit 2); a value our own
//! parsers refuse (a size, a duration, a mode, a token type) is an [`Error`] naming the flag,
//! the value and what to write instead: `main.rs` prints it as it prints every other error,
//! and exits 1 ([`value_error`]).

use std::path::PathBuf;
use std::time::Duration;

use clap::builder::RangedU64ValueParser;
use clap::{Args, Parser, Subcommand};

use crate::error::{Error, Result};
use crate::format::dtype::ScalarType;

const PLAN_HEADING: &str = "Plan options (must match between mount and plan)";
const MOUNT_HEADING: &str = "Mount options";

// Every numeric flag is bounded to what it can mean; clap names the range in its error
// (`0 is not in 1..=256`). Values inside the bounds can still be refused for a given dataset
// (a window longer than the data, too many files to number).

/// Most tokens per row (`--window`; a row must also stay under 4 GiB).
pub(crate) const MAX_WINDOW: u64 = u32::MAX as u64;
/// Most rows per step file (`--batch-size`).
pub(crate) const MAX_BATCH_SIZE: u64 = 1 << 20;
/// Most ranks (`--ranks`).
pub(crate) const MAX_RANKS: u64 = 1 << 20;
/// Most epochs (`--epochs`).
pub(crate) const MAX_EPOCHS: u64 = 1_000_000;
/// Most FUSE threads and prefetch workers (more only add contention: the kernel serves one
/// queue).
pub(crate) const MAX_THREADS: u64 = 256;
/// Most dataset files open at once (`--max-open-shards`; the open-file limit lowers it).
pub(crate) const MAX_OPEN_FILES: u64 = 1 << 20;
/// Most tokens `synth` writes (4 TiB of u32).
pub(crate) const MAX_SYNTH_TOKENS: u64 = 1 << 40;
/// Most reader threads of `bench`.
pub(crate) const MAX_BENCH_READERS: u64 = 1024;
/// Longest pause of `bench --pace-us` (a minute).
pub(crate) const MAX_PACE_US: u64 = 60_000_000;

fn ranged(lo: u64, hi: u64) -> RangedU64ValueParser<u64> {
    RangedU64ValueParser::new().range(lo..=hi)
}

fn ranged_usize(lo: u64, hi: u64) -> RangedU64ValueParser<usize> {
    RangedU64ValueParser::new().range(lo..=hi)
}

fn ranged_u32(lo: u64, hi: u64) -> RangedU64ValueParser<u32> {
    RangedU64ValueParser::new().range(lo..=hi)
}

/// The error one of our value parsers gave, if `e` is one (see the module docs).
pub fn value_error(e: &clap::Error) -> Option<&Error> {
    std::error::Error::source(e)?.downcast_ref::<Error>()
}

/// A byte size: a number with an optional binary suffix (`K`/`KiB`, `M`/`MiB`, `G`/`GiB`,
/// `T`/`TiB`, case-insensitive) or `B`.
fn parse_size(text: &str) -> Option<u64> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, suffix) = t.split_at(split);
    let shift = match suffix.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kib" | "kb" => 10,
        "m" | "mib" | "mb" => 20,
        "g" | "gib" | "gb" => 30,
        "t" | "tib" | "tb" => 40,
        _ => return None,
    };
    let n: u64 = digits.parse().ok()?;
    n.checked_mul(1u64 << shift)
}

/// A byte size of `flag` ([`parse_size`]).
fn size(flag: &'static str) -> impl Fn(&str) -> Result<u64> + Clone + Send + Sync {
    move |text| {
        parse_size(text).ok_or_else(|| {
            Error::invalid(format!(
                "{flag} {text:?}: invalid size: use bytes with an optional suffix, e.g. 1GiB, \
                 512MiB, 4096"
            ))
        })
    }
}

/// A duration in seconds, decimals allowed (`0`: none, [`Duration::ZERO`]).
fn seconds(flag: &'static str) -> impl Fn(&str) -> Result<Duration> + Clone + Send + Sync {
    move |text| {
        text.trim()
            .parse()
            .ok()
            .filter(|s: &f64| s.is_finite() && *s >= 0.0 && *s <= 1e9)
            .map(Duration::from_secs_f64)
            .ok_or_else(|| {
                Error::invalid(format!(
                    "{flag} {text}: expected a number of seconds such as 30 or 0.5 (0 disables)"
                ))
            })
    }
}

/// Octal permission bits without write bits.
fn mode(flag: &'static str) -> impl Fn(&str) -> Result<u16> + Clone + Send + Sync {
    move |text| {
        let mode = u16::from_str_radix(text.trim().trim_start_matches("0o"), 8)
            .ok()
            .filter(|m| *m <= 0o7777)
            .ok_or_else(|| {
                Error::invalid(format!("{flag} {text}: expected octal bits such as 0444"))
            })?;
        if mode & 0o222 != 0 {
            return Err(Error::invalid(format!(
                "{flag} {text}: shufflefs is read-only; drop the write bits (e.g. {:04o})",
                mode & !0o222
            )));
        }
        Ok(mode)
    }
}

/// A token type (`--dtype`): see [`ScalarType::from_name`].
fn dtype(text: &str) -> Result<ScalarType> {
    ScalarType::from_name(text)
}

/// An integer token value (`--doc-sep`).
fn token(text: &str) -> Result<i128> {
    text.parse::<i128>()
        .map_err(|_| Error::invalid(format!("--doc-sep {text:?} is not an integer token")))
}

/// shufflefs: globally shuffled, rank-partitioned training batches as plain .npy files.
#[derive(Debug, Parser)]
#[command(name = "shufflefs", version, about, long_about = None)]
pub struct Cli {
    /// More log output (-v debug, -vv trace). RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,
    /// Less log output (-q warnings only, -qq errors only).
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub quiet: u8,
    /// The command to run.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Pack token files into a dataset directory (shards + manifest.json).
    Pack(PackArgs),
    /// Mount a dataset as epoch/N/rank/R/step/S.npy files.
    Mount(MountArgs),
    /// Unmount a shufflefs mount point.
    Unmount(UnmountArgs),
    /// Print a dataset's summary.
    Inspect(InspectArgs),
    /// Read every byte of a dataset and check it against the manifest's hashes and block
    /// checksums (exit 1 on any mismatch).
    Verify(VerifyArgs),
    /// Print one step's S.json without mounting.
    Plan(PlanArgs),
    /// Write a raw token file of positional tokens (token i has value i), for demos and tests.
    Synth(SynthArgs),
    /// Time reading step files: straight from the shards (the limit) or through a mount.
    Bench(BenchArgs),
}

/// `shufflefs pack`.
#[derive(Debug, Args)]
pub struct PackArgs {
    /// The dataset directory to create.
    pub dataset_dir: PathBuf,
    /// Input files, concatenated in this order: raw little-endian tokens (nanoGPT train.bin
    /// style), llm.c shards (the tokens after their header), 1-D .npy arrays (plain or
    /// structured), Megatron-LM PREFIX.bin (with PREFIX.idx beside it: dtype and documents
    /// from the index), datatrove X.ds (with X.ds.index beside it), Hugging Face parquet and
    /// Arrow files or a save_to_disk directory (copied), or JSON Lines documents (.jsonl:
    /// {"tokens": [...], "meta": ..., "spans": [{"start", "end", "meta"}]}). A directory
    /// stands for its files in name order, companions (.idx, .ds.index, ...) taken with their
    /// token files; a quoted glob (`'data/*.bin'`) for its matches. Other formats (archives,
    /// text...) are refused saying what to do.
    #[arg(required = true)]
    pub inputs: Vec<PathBuf>,
    /// Token type: u8 u16 u32 u64 i32 i64, or numpy's spelling (uint16, <u2) [default: the
    /// dtype of the first .npy or llm.c input].
    #[arg(long, value_parser = dtype)]
    pub dtype: Option<ScalarType>,
    /// End a document after every token equal to TOKEN (e.g. the EOS id of a token file:
    /// nanoGPT, OLMo/Dolma). Documents never span input files.
    #[arg(long, value_name = "TOKEN", allow_hyphen_values = true, value_parser = token)]
    pub doc_sep: Option<i128>,
    /// With --doc-sep EOS: a document ends only at an EOS immediately followed by TOKEN (the
    /// BOS), or at a final EOS: OLMo's rule when documents start with a BOS (with EOS = BOS,
    /// the pair EOS EOS).
    #[arg(long, value_name = "TOKEN", allow_hyphen_values = true, value_parser = token, requires = "doc_sep")]
    pub doc_bos: Option<i128>,
    /// Start a document at every token equal to TOKEN (a BOS prepended to each document, as
    /// llm.c's shards have); tokens before the first are a document too. With --in-place.
    #[arg(long, value_name = "TOKEN", allow_hyphen_values = true, value_parser = token, conflicts_with = "doc_sep")]
    pub doc_start: Option<i128>,
    /// What a document of a Megatron-LM dataset is: an input document (the sequences between
    /// two document indices), or each sequence (what Megatron's GPTDataset samples; they
    /// differ with preprocess_data.py --split-sentences).
    #[arg(long, value_enum, default_value_t = MegatronUnitArg::Document)]
    pub megatron_unit: MegatronUnitArg,
    /// The list-of-integers column of Hugging Face parquet/Arrow inputs, and the field of
    /// JSON Lines documents, that holds the token ids [default: input_ids, then tokens].
    #[arg(long, value_name = "NAME")]
    pub tokens_field: Option<String>,
    /// Do not show a progress bar.
    #[arg(long)]
    pub no_progress: bool,
    /// Write only the manifest and reference the input files (raw, .npy, llm.c) as shards,
    /// without copying them: each is identified by its size and 16 sampled pages, and
    /// referenced relative to DATASET_DIR when inside it (copy, archive or move the directory
    /// with its files). They must not change afterwards; a mount refuses a file whose content
    /// changed.
    #[arg(long)]
    pub in_place: bool,
    /// Upper bound of each shard file (bytes; suffixes KiB MiB GiB TiB).
    #[arg(long, default_value = "1GiB", value_parser = size("--shard-size"))]
    pub shard_size: u64,
    /// Replace a dataset that already exists in DATASET_DIR; also pack inputs that a
    /// heuristic refuses (text, or a raw file whose sampled values look like another token
    /// width than --dtype).
    #[arg(long)]
    pub force: bool,
}

/// `--megatron-unit`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum MegatronUnitArg {
    /// The sequences between two document indices.
    Document,
    /// Each sequence (index entry).
    Sequence,
}

/// The options that define the plan: shared by `mount` and `plan`.
#[derive(Debug, Args, Clone)]
pub struct PlanOptions {
    /// A run configuration (TOML): a mixture of datasets with weights and a schedule, and the
    /// plan (window, batch_size, ranks, seed, steps_per_epoch, epochs); replaces DATASET_DIR
    /// and the plan flags.
    #[arg(long, value_name = "RUN.toml", help_heading = PLAN_HEADING)]
    pub config: Option<PathBuf>,
    /// With --config whose file has [[plan]] tables: serve (or print) only this plan, at the
    /// root [default: mount every plan under plan/NAME/].
    #[arg(long, value_name = "NAME", requires = "config", help_heading = PLAN_HEADING)]
    pub plan: Option<String>,
    /// Tokens per observation (row). For next-token training use T+1 with --stride T.
    #[arg(long, value_parser = ranged(1, MAX_WINDOW), required_unless_present = "config", help_heading = PLAN_HEADING)]
    pub window: Option<u64>,
    /// Tokens between observation starts [default: --window].
    #[arg(long, value_parser = ranged(1, u64::MAX), help_heading = PLAN_HEADING)]
    pub stride: Option<u64>,
    /// Rows per step file, per rank.
    #[arg(long, value_parser = ranged(1, MAX_BATCH_SIZE), required_unless_present = "config", help_heading = PLAN_HEADING)]
    pub batch_size: Option<u64>,
    /// Number of ranks (data-parallel processes).
    #[arg(long, default_value_t = 1, value_parser = ranged(1, MAX_RANKS), help_heading = PLAN_HEADING)]
    pub ranks: u64,
    /// Shuffle seed.
    #[arg(long, default_value_t = 0, help_heading = PLAN_HEADING)]
    pub seed: u64,
    /// Number of epochs exposed under epoch/.
    #[arg(long, default_value_t = 1, value_parser = ranged(1, MAX_EPOCHS), help_heading = PLAN_HEADING)]
    pub epochs: u64,
    /// stream: rows are windows of the token stream; documents: rows are documents, truncated
    /// or padded to --window; packed: rows of whole documents packed best-fit, each starting
    /// with a document's first token (--bos), no padding.
    #[arg(long, value_enum, default_value_t = ModeArg::Stream, help_heading = PLAN_HEADING)]
    pub mode: ModeArg,
    /// The BOS token of --mode packed: a document that does not start with it gets it
    /// prepended, so every row starts with BOS.
    #[arg(long, value_name = "ID", help_heading = PLAN_HEADING)]
    pub bos: Option<u64>,
    /// Documents per block of --mode packed (each block is packed on its own, on demand)
    /// [default: 65536].
    #[arg(long, value_name = "N", value_parser = ranged(1, 1 << 22), help_heading = PLAN_HEADING)]
    pub pack_block_docs: Option<u64>,
    /// Stream mode: start epoch e's windows at a phase in [0, stride) drawn from (seed, e), so
    /// a token sits at another position of its window every epoch.
    #[arg(long, help_heading = PLAN_HEADING)]
    pub rewindow: bool,
    /// Observation ids never served (one per line, # comments): each row that would hold one
    /// takes an observation the epoch would otherwise drop; every other row is unchanged.
    #[arg(long, value_name = "FILE", help_heading = PLAN_HEADING)]
    pub quarantine: Option<PathBuf>,
    /// Padding token of --mode documents (first field of structured records; other fields 0)
    /// [default: 0].
    #[arg(long, allow_hyphen_values = true, help_heading = PLAN_HEADING)]
    pub pad_id: Option<i128>,
    /// Serve .npy files as i32 or i64 (numpy spellings work: int64, <i8) instead of the
    /// dataset's token type, e.g. for torch.nn.Embedding; values convert exactly (one that does
    /// not fit fails the read with EOVERFLOW). [default: the dataset's type]
    #[arg(long, value_parser = dtype, help_heading = PLAN_HEADING)]
    pub out_dtype: Option<ScalarType>,
}

/// `--mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ModeArg {
    /// Observation i is the window of --window tokens at token i * --stride.
    Stream,
    /// Observation i is document i.
    Documents,
    /// Rows of whole documents packed best-fit (`bestfit-blocks-v1`).
    Packed,
}

/// `shufflefs mount`.
#[derive(Debug, Args)]
pub struct MountArgs {
    /// The packed dataset directory (with --config, give only MOUNTPOINT).
    pub dataset_dir: PathBuf,
    /// Where to mount (an existing directory).
    #[arg(required_unless_present = "config")]
    pub mountpoint: Option<PathBuf>,
    /// The plan.
    #[command(flatten)]
    pub plan: PlanOptions,
    /// The mount's own options.
    #[command(flatten)]
    pub options: MountFlags,
}

/// The options of `shufflefs mount` beyond the plan. None of them changes a byte served, so
/// `plan` accepts them too (a mount command line pasted into `plan --info` works).
#[derive(Debug, Args, Clone)]
pub struct MountFlags {
    /// Stay attached to the terminal (logs on stderr; Ctrl-C unmounts).
    #[arg(long, short = 'f', help_heading = MOUNT_HEADING)]
    pub foreground: bool,
    /// FUSE worker threads [default: number of cores + 1, at most 256; one of them never
    /// reads shards].
    #[arg(long, value_parser = ranged_usize(1, MAX_THREADS), help_heading = MOUNT_HEADING)]
    pub threads: Option<usize>,
    /// Let other users read the mount (allow_other; the kernel checks the mode bits, as on
    /// every shufflefs mount).
    #[arg(long, help_heading = MOUNT_HEADING)]
    pub allow_other: bool,
    /// Log to this file once the daemon is in the background [default: syslog].
    #[arg(long, help_heading = MOUNT_HEADING)]
    pub log_file: Option<PathBuf>,
    /// Memory for finished step files, node-wide (suffixes KiB MiB GiB; 0 disables the cache
    /// and prefetch).
    #[arg(long, default_value = "256MiB", value_parser = size("--cache-size"), help_heading = MOUNT_HEADING)]
    pub cache_size: u64,
    /// Steps each rank's reader is followed ahead by background assembly (0 disables).
    #[arg(long, default_value_t = 4, value_parser = ranged(0, crate::prefetch::MAX_DEPTH), help_heading = MOUNT_HEADING)]
    pub prefetch_depth: u64,
    /// Benchmarking only: answer every step read from one in-memory file (wrong data!) to
    /// measure FUSE's own ceiling.
    #[arg(long, hide = true)]
    pub stub_reads: bool,
    /// Threads assembling prefetched steps. On a node whose cores are all busy reading, more
    /// workers only compete with the readers. Over remote data each worker waits a round trip
    /// per step: give one per rank reading on the node when a step's compute is shorter
    /// than that.
    #[arg(long, default_value_t = 1, value_parser = ranged_usize(0, MAX_THREADS), help_heading = MOUNT_HEADING)]
    pub prefetch_workers: usize,
    /// Refuse to mount unless the mount's fingerprint (info.json) is HEX: the guard for
    /// resuming a checkpoint with exactly the data order it was trained with.
    #[arg(long, value_name = "HEX", help_heading = MOUNT_HEADING)]
    pub expect_fingerprint: Option<String>,
    /// With --expect-fingerprint and --config: compare the fingerprint of this global step
    /// (the one its S.json carries), so schedule entries after the resume step do not matter
    /// [default: 0].
    #[arg(long, value_name = "STEP", requires = "expect_fingerprint", help_heading = MOUNT_HEADING)]
    pub resume_step: Option<u64>,
    /// A read that touches shards answers EIO after this many seconds (decimals allowed; 0
    /// disables the deadline, and reads then run on the FUSE threads).
    #[arg(long, value_name = "SECS", default_value = "30", value_parser = seconds("--read-timeout"), help_heading = MOUNT_HEADING)]
    pub read_timeout: Duration,
    /// Owner of the files [default: the mounting user].
    #[arg(long, value_parser = ranged_u32(0, u64::from(u32::MAX) - 1), help_heading = MOUNT_HEADING)]
    pub uid: Option<u32>,
    /// Group of the files [default: the mounting user's group].
    #[arg(long, value_parser = ranged_u32(0, u64::from(u32::MAX) - 1), help_heading = MOUNT_HEADING)]
    pub gid: Option<u32>,
    /// Permission bits of files, octal (write bits are not allowed).
    #[arg(long, value_name = "OCTAL", default_value = "0444", value_parser = mode("--file-mode"), help_heading = MOUNT_HEADING)]
    pub file_mode: u16,
    /// Permission bits of directories, octal (write bits are not allowed).
    #[arg(long, value_name = "OCTAL", default_value = "0555", value_parser = mode("--dir-mode"), help_heading = MOUNT_HEADING)]
    pub dir_mode: u16,
    /// Mount over a live shufflefs mount at MOUNTPOINT instead of refusing (the new mount
    /// hides the old one until it is unmounted).
    #[arg(long, help_heading = MOUNT_HEADING)]
    pub on_top: bool,
    /// Check every shard read against the dataset's block checksums before serving it (EIO on
    /// a mismatch). Reads whole 64 KiB blocks and hashes them: slower, for suspect storage.
    #[arg(long, help_heading = MOUNT_HEADING)]
    pub verify_reads: bool,
    /// Push prefetched step files into the kernel page cache, so a reader's open and read are
    /// served by the kernel without a round trip to the daemon (pages are dropped once read).
    #[arg(long, help_heading = MOUNT_HEADING)]
    pub prefill: bool,
    /// Serve every READ of a step file from the daemon, as on kernels without FUSE passthrough.
    /// By default (Linux 6.9+, a root daemon) an open of a step file the prefetcher has ready
    /// in a memory file hands that file to the kernel, so its reads, mmap and end-of-file
    /// probes cost no round trip.
    #[arg(long, conflicts_with = "prefill", help_heading = MOUNT_HEADING)]
    pub no_passthrough: bool,
    /// Most dataset files (shards, checksum and document files) kept open at once; beyond it
    /// files are reopened on demand and must still be the files validated at mount (ESTALE
    /// otherwise) [default: 4096, or what the open-file limit leaves].
    #[arg(long, value_name = "N", value_parser = ranged_usize(1, MAX_OPEN_FILES), help_heading = MOUNT_HEADING)]
    pub max_open_shards: Option<usize>,
    /// Most names a directory listing shows (the first N in listing order; every name beyond
    /// stays reachable by its path). 0: no bound.
    #[arg(long, value_name = "N", default_value_t = crate::tree::DEFAULT_MAX_LISTING, help_heading = MOUNT_HEADING)]
    pub max_listing: u64,
}

/// `shufflefs unmount`.
#[derive(Debug, Args)]
pub struct UnmountArgs {
    /// The mount point.
    pub mountpoint: PathBuf,
    /// Detach even if busy; the mount disappears when its last user leaves.
    #[arg(long)]
    pub lazy: bool,
}

/// `shufflefs verify`.
#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// The packed dataset directory.
    pub dataset_dir: PathBuf,
    /// Add block checksum files to shards that have none (in-place datasets, or packed by
    /// format version 2) and rewrite the manifest, when everything else verifies. This changes
    /// the dataset's content hash and so the mount fingerprint.
    #[arg(long)]
    pub write_checksums: bool,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Do not show a progress bar.
    #[arg(long)]
    pub no_progress: bool,
}

/// `shufflefs inspect`.
#[derive(Debug, Args)]
pub struct InspectArgs {
    /// The packed dataset directory.
    pub dataset_dir: PathBuf,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// `shufflefs plan`.
#[derive(Debug, Args)]
pub struct PlanArgs {
    /// The packed dataset directory (not with --config).
    #[arg(required_unless_present = "config")]
    pub dataset_dir: Option<PathBuf>,
    /// Ignored (so a mount command line can be pasted as it is).
    #[arg(value_name = "MOUNTPOINT")]
    pub mountpoint: Option<PathBuf>,
    /// The plan.
    #[command(flatten)]
    pub plan: PlanOptions,
    /// Mount options: accepted so a mount command line can be pasted; none changes a byte.
    /// `--expect-fingerprint` is checked and `--max-listing` shows in info.json; the rest
    /// are ignored.
    #[command(flatten)]
    pub mount: MountFlags,
    /// Epoch of the step to print.
    #[arg(long, required_unless_present = "info")]
    pub epoch: Option<u64>,
    /// Rank of the step to print.
    #[arg(long, required_unless_present = "info")]
    pub rank: Option<u64>,
    /// Step to print.
    #[arg(long, required_unless_present = "info")]
    pub step: Option<u64>,
    /// Print the mount's info.json instead (its fingerprint is what --expect-fingerprint
    /// checks).
    #[arg(long, conflicts_with_all = ["epoch", "rank", "step"])]
    pub info: bool,
}

/// `shufflefs synth`.
#[derive(Debug, Args)]
pub struct SynthArgs {
    /// The raw token file to write.
    pub output: PathBuf,
    /// Number of tokens.
    #[arg(long, value_parser = ranged(1, MAX_SYNTH_TOKENS))]
    pub tokens: u64,
    /// Token type: u8 u16 u32 u64 i32 i64.
    #[arg(long, default_value = "u32", value_parser = dtype)]
    pub dtype: ScalarType,
}

/// Where `shufflefs bench` reads step files from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BenchSource {
    /// pread exactly the windows of each step file straight from the shards.
    Direct,
    /// Read whole step files through a mount (`--mountpoint`).
    Mount,
    /// Time the permutation alone: `--files` million indices on one thread.
    Permutation,
}

/// `shufflefs bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// The packed dataset directory.
    pub dataset_dir: PathBuf,
    /// The plan (must match the mount's).
    #[command(flatten)]
    pub plan: PlanOptions,
    /// Where to read from.
    #[arg(long, value_enum)]
    pub source: BenchSource,
    /// The mount point, with `--source mount`.
    #[arg(long)]
    pub mountpoint: Option<PathBuf>,
    /// Reader threads.
    #[arg(long, default_value_t = 1, value_parser = ranged_usize(1, MAX_BENCH_READERS))]
    pub readers: usize,
    /// Step files to read, in (epoch, step, rank) order, split round-robin over readers.
    #[arg(long, default_value_t = 10_000, value_parser = ranged(1, u64::MAX))]
    pub files: u64,
    /// Start this many step files into that order (so repeated runs read files no earlier run
    /// read, as a trainer would).
    #[arg(long, default_value_t = 0)]
    pub skip: u64,
    /// Which file of each step to read.
    #[arg(long, value_enum, default_value_t = BenchFile::Npy)]
    pub file: BenchFile,
    /// Pause this many microseconds after each file (a trainer computing on the batch); the
    /// output then reports read latency percentiles.
    #[arg(long, default_value_t = 0, value_parser = ranged(0, MAX_PACE_US))]
    pub pace_us: u64,
    /// With a `--prefill` mount: after each read the daemon hears of (the first, and every
    /// prefill trigger step), pause 40 ms so it stores the next steps, and time only the reads
    /// of steps already in the page cache.
    #[arg(long)]
    pub prestored: bool,
}

/// Which step file `shufflefs bench` reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BenchFile {
    /// S.npy
    Npy,
    /// S.json (with metadata rows when the dataset has documents)
    Json,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("1GiB"), Some(1 << 30));
        assert_eq!(parse_size("512MiB"), Some(512 << 20));
        assert_eq!(parse_size("3k"), Some(3072));
        assert_eq!(parse_size("2 TiB"), Some(2 << 40));
        for bad in ["", "GiB", "1.5GiB", "-1", "1XB", "99999999999999999999"] {
            assert_eq!(parse_size(bad), None, "{bad}");
        }
        assert_eq!(parse_size("16777216TiB"), None, "overflow");
        let e = size("--shard-size")("1.5GiB").unwrap_err().to_string();
        assert!(e.contains("--shard-size \"1.5GiB\": invalid size"), "{e}");
    }

    #[test]
    fn modes_and_durations() {
        assert_eq!(mode("--file-mode")("0o440").unwrap(), 0o440);
        let e = mode("--dir-mode")("0775").unwrap_err().to_string();
        assert!(
            e.contains("--dir-mode 0775: shufflefs is read-only; drop the write bits (e.g. 0555)"),
            "{e}"
        );
        assert_eq!(
            seconds("--read-timeout")("0.5").unwrap(),
            Duration::from_millis(500)
        );
        for bad in ["-1", "nan", "inf", "1e10", ""] {
            assert!(seconds("--read-timeout")(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_refused_value_is_our_error_and_a_malformed_number_is_clap_s() {
        let parse = |args: &[&str]| Cli::try_parse_from(args).unwrap_err();
        let e = parse(&["shufflefs", "pack", "d", "in", "--shard-size", "1.5GiB"]);
        assert!(value_error(&e).is_some_and(|e| e.to_string().contains("invalid size")));
        let e = parse(&["shufflefs", "synth", "out", "--tokens", "x"]);
        assert!(value_error(&e).is_none());
    }
}
