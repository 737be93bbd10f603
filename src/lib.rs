//! shufflefs: a FUSE filesystem that serves a packed token dataset as globally shuffled,
//! rank-partitioned step files, `MOUNT/epoch/N/rank/R/step/S.npy`.
//!
//! Layers, in the order of the read path (docs/ARCHITECTURE.md has one section per module):
//!
//! | module | question it answers | FUSE? |
//! | --- | --- | --- |
//! | [`fuse`] | how do kernel requests become calls and replies? | yes (the only one) |
//! | [`fs`] | which node is this name or inode, what are its attributes and bytes? | no |
//! | [`cache`], [`prefetch`] | which finished step files are kept, which are assembled ahead? | no |
//! | [`view`] | what are the bytes of a step file, `S.json`, `info.json`? | no |
//! | [`plan`] | which observations are in (epoch, rank, step)? where is observation i? | no |
//! | [`mixture`] | how many rows of each source in a global step, which ones, in which slots? | no |
//! | [`feistel`] | the keyed permutation of `[0, n)` | no |
//! | [`window`] | which tokens make observation i? | no |
//! | [`npy`] | the `.npy` header, byte for byte as numpy writes it | no |
//! | [`dataset`] | read bytes `[a, b)` of the token stream from the shards | no |
//! | [`access`] | as whom are the files a manifest names opened? | no |
//! | [`format`] | what is in `manifest.json`, is it consistent? | no |
//! | [`dtype`] | record types and their numpy names | no |
//! | [`pack`] | write shards and manifest from input files | no |
//! | [`sniff`] | what is this input file: tokens (which format, which width) or what else? | no |
//! | [`mount`] | mount, unmount, stale mounts | via fuser's session |
//! | [`cmd`], [`cli`], [`logging`] | the `shufflefs` command line | no |

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
mod shuffle;
mod stats;
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
pub use fs::{DirEntry, DirSink, Kind, Node, ROOT_INO, ShuffleFs};
pub use logging::{BURST, init};
pub use mount::{MountOptions, Mounted, detach, mount};
pub use pack::{PackOptions, pack, pack_in_place, write_positional};
pub use prefetch::PrefetchConfig;
pub use shuffle::feistel::{GOLDEN, Permutation, mix};
pub use shuffle::plan::StepKey;
pub use storage::{MAX_MANIFEST_BYTES, ReadAt, mtime_ns};
pub use view::{Mode, View, ViewConfig};
