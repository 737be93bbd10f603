//! Integration tests, one binary (fewer links on a 2-core machine):
//! - `model`: the filesystem model without FUSE against an independent reference;
//! - `mounted`: real mounts in a TempDir, read through std::fs;
//! - `cli`: the `shufflefs` binary, its daemon, signals and stale mounts;
//! - `checksums`: block checksums, `shufflefs verify` and `--verify-reads`;
//! - `daemon`: the daemon's resources and edges (log file, descriptor pressure, rate-limited
//!   errors, memory, numeric flag bounds, unmount by another user and after prefill,
//!   /dev/fuse access), through the binary, with a second real user;
//! - `corruption`: seeded manifest and index mutations, each refused naming the file or
//!   harmless, never different bytes (issue #5);
//! - `exhaustive`: whole epochs byte for byte against the shards, determinism across
//!   threads, cache and read order, random read ranges, and name fuzzing (issue #5);
//! - `faults`: a concurrent soak, SIGKILLed daemons and shards mutated under a live mount;
//! - `golden`: the bytes the tree serves, pinned (tests/fixtures/golden.json);
//! - `fds`: bounded open descriptors (`--max-open-shards`) and shards replaced under them;
//! - `inputs`: pack inputs as the real tools write them (llm.c, numpy, parquet, archives...):
//!   exact tokens or a refusal saying what the file is, the same for a copy and --in-place;
//! - `inject`: faults injected behind the read path (EIO, short reads, stalls) with a read
//!   deadline: errors within deadline + 1 s, never wrong bytes, the mount responsive;
//! - `ops`: the mount(8) helper and the systemd units in deploy/;
//! - `options`: mount flags through the binary (fingerprint guard, ownership and modes,
//!   --on-top, --read-timeout, --prefetch-workers);
//! - `prefill`: the page-cache prefill (`--prefill`);
//! - `resume`: the fingerprint's scope (elastic resume, more epochs) and `plan` with a pasted
//!   mount command line;
//! - `trust`: what a dataset directory can make a mount serve: the manifest opened like a
//!   shard, checksum files bound to their shards, in-place content identity, and the owner
//!   rule with a real second user (issue #10).

mod checksums;
mod cli;
mod common;
mod corruption;
mod daemon;
mod exhaustive;
mod faults;
mod fds;
mod golden;
mod inject;
mod inputs;
mod model;
mod mounted;
mod ops;
mod options;
mod prefill;
mod records;
mod reftests;
mod resume;
mod scale;
mod trust;
