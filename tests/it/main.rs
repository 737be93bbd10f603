//! Integration tests, one binary (fewer links on a 2-core machine):
//! - `model`: the filesystem model without FUSE against an independent reference;
//! - `mounted`: real mounts in a TempDir, read through std::fs;
//! - `cli`: the `shufflefs` binary, its daemon, signals and stale mounts;
//! - `exhaustive`: whole epochs byte for byte against the shards, determinism across
//!   threads, cache and read order, random read ranges, and name fuzzing (issue #5);
//! - `inject`: faults injected behind the shard reads of a mount with a read deadline
//!   (EIO, short reads, early EOF, stalls): no wrong bytes, errors within the deadline;
//! - `options`: mount flags through the binary (fingerprint guard, ownership and modes,
//!   --on-top, --read-timeout, prefetch workers).

mod cli;
mod common;
mod exhaustive;
mod inject;
mod model;
mod mounted;
mod options;
mod records;
mod scale;
