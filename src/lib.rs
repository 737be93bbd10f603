//! shufflefs: a FUSE filesystem that serves a packed token dataset as globally shuffled,
//! rank-partitioned step files, `MOUNT/epoch/E/rank/R/step/S.npy`.
//!
//! The layers, bottom up: each module uses only those above it in this table (`error.rs` uses
//! nothing, `shuffle/` only `error.rs`; `cmd/` uses everything). Only `fuse/` knows fuser; everything else
//! is tested without a mount. docs/ARCHITECTURE.md has the read path as one picture and a
//! "which file do I open for which change" table.
//!
//! | module | owns | question it answers |
//! | --- | --- | --- |
//! | `error.rs` | `Error`, `CorruptKind`, errno and log level | what went wrong, and what to do? |
//! | `shuffle/` | `Permutation`, `Plan` (the global-step formula), mixtures | which observations are in (epoch, rank, step)? |
//! | `format/` | manifest, validation, hashes, checksums, document files, dtypes, `.npy` header, input recognition | what is on disk, byte for byte (readers beside writers)? |
//! | `storage/` | `ReadAt`, opening listed files as the dataset's owner, the descriptor pool | where do bytes come from? |
//! | `dataset/` | `Dataset`, `Shard`, documents | what are bytes `[a, b)` of the record stream? |
//! | `tree.rs`, `inode.rs` | `Node` and the path grammar; `Node` <-> inode number | which file is this name or number? |
//! | `view/` | `View`: step files, `S.json`/`I.json`/lookup JSON, `info.json` and the fingerprint | what are the bytes of every file? |
//! | `cache.rs`, `prefetch/`, `prefill.rs`, `stats.rs` | step cache, prefetcher and governor, prefill policy, `stats.json` | what is kept, assembled ahead, pushed, counted? |
//! | `fs/` | `ShuffleFs`: lookup, getattr, readdir, open, `read_or_job` -> `Read::Ready` or `Read::Job` | what does each request answer, without FUSE? |
//! | `fuse/` | the adapter, `dispatch.rs` (inline or the deadline pool), kernel cache, handles, session | how do kernel requests become calls and replies? |
//! | `mount/` | the mount point, the mount table, unmount | where is it mounted, and how does it go away cleanly? |
//! | `pack/`, `verify.rs` | inputs, JSON Lines, the shard writer, `--in-place`; `shufflefs verify` | how is a dataset written and checked? |
//! | `cli.rs`, `cmd/`, `logging.rs` | clap types and value parsers, one file per subcommand, log sinks | the `shufflefs` command line |

// Everything not re-exported below is `pub(crate)` at most: the compiler then reports dead code.
#![warn(unreachable_pub)]

mod cache;
pub mod cli;
mod cmd;
pub mod dataset;
mod error;
pub mod format;
pub mod fs;
mod fuse;
mod inode;
pub mod logging;
pub mod mount;
pub mod pack;
pub mod prefetch;
mod prefill;
pub mod runconfig;
mod shuffle;
mod stats;
mod stepbuf;
mod storage;
mod tree;
mod verify;
pub mod view;

/// Paths tests/it still name, until they name the crate root.
#[doc(hidden)]
pub mod dtype {
    pub use crate::format::dtype::ScalarType;
}
/// Paths tests/it still name, until they name the crate root.
#[doc(hidden)]
pub mod feistel {
    pub use crate::shuffle::feistel::{GOLDEN, Permutation, mix};
}
/// Paths tests/it still name, until they name the crate root.
#[doc(hidden)]
pub mod plan {
    pub use crate::shuffle::plan::StepKey;
}
/// Paths tests/it still name, until they name the crate root.
#[doc(hidden)]
pub mod npy {
    pub use crate::format::npy::header;
}

pub(crate) use logging::log_limited;

pub use error::{Error, Result};

pub use cli::{Cli, PlanOptions};
pub use cmd::run;
pub use dataset::Dataset;
pub use format::dtype::ScalarType;
pub use format::npy::header;
pub use format::{Manifest, VERSION, in_place_hash};
pub use fs::{DirEntry, DirSink, Kind, Loc, Node, ROOT_INO, ShuffleFs, Top};
pub use logging::{BURST, init};
pub use mount::{MountOptions, Mounted, detach, mount};
/// The format parsers, as tests/it/parsers.rs names them.
#[doc(hidden)]
pub use pack::formats::{datatrove, doc_scan, hf, megatron};
pub use pack::{PackOptions, pack, pack_in_place, write_positional};
pub use prefetch::PrefetchConfig;
pub use shuffle::feistel::{GOLDEN, Permutation, mix};
pub use shuffle::plan::StepKey;
pub use storage::{MAX_MANIFEST_BYTES, ReadAt, mtime_ns};
pub use view::{Mode, View, ViewConfig};
/// Paths tests/it still name, until they name the crate root.
#[doc(hidden)]
pub mod sniff {
    pub use crate::format::sniff::{LLMC, LLMC_HEADER};
}
