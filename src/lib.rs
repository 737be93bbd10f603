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

pub mod access;
pub mod cache;
pub mod checksum;
pub mod cli;
pub mod cmd;
pub mod dataset;
pub mod deadline;
pub mod dtype;
pub mod error;
pub mod fdpool;
pub mod feistel;
pub mod format;
pub mod fs;
pub mod fuse;
pub mod logging;
pub mod mixture;
pub mod mount;
pub mod npy;
pub mod pack;
pub mod plan;
pub mod prefetch;
pub mod sniff;
pub mod verify;
pub mod view;
pub mod window;

pub use error::{Error, Result};
