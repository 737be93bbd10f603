//! Integration tests, one binary (fewer links on a 2-core machine).
//!
//! The harness, shared by every module:
//! - `common`: one dataset builder (`data`: positional, random and JSON Lines datasets), one
//!   reference model of the tree (`reference`: the one definition of correctness), one way to
//!   read the tree without a mount (`read`), one random number generator (`rng`: SplitMix64),
//!   one mount builder and binary runner (`mount`: `TestMount`, `MountDir`, `shufflefs`,
//!   `Daemon`).
//!
//! Property tests (random inputs, shrinking; a shrunk failure is kept as a `regression_*` test):
//! - `reftests`: random datasets, plans and operation sequences (lookups under any spelling,
//!   stat, reads at any offset and size, paged listings, prefetch, storage faults) against the
//!   reference, without a mount and through real mounts;
//! - `corruption`: random mutations of manifests, document files and shards (issue #5), each
//!   refused naming the file, harmless, or EIO on the damaged shard; never different bytes.
//!
//! Cases (each test a behaviour, with literal inputs):
//! - `model`: the filesystem model without FUSE: headers, names, listings and their bound,
//!   `info.json` and fingerprints, `S.json` ranges, open flags, cache and prefetch counters;
//! - `mounted`: real mounts in a TempDir, read through std::fs;
//! - `exhaustive`: whole epochs byte for byte through a mount against the reference, and
//!   identical bytes across threads, cache and read order (issue #5);
//! - `records`: structured records, JSON Lines documents and metadata, documents mode;
//! - `golden`: the bytes the tree serves, pinned (tests/fixtures/golden.json);
//! - `cli`: the `shufflefs` binary, its daemon, signals and stale mounts;
//! - `checksums`: block checksums, `shufflefs verify` and `--verify-reads`;
//! - `daemon`: the daemon's resources and edges (log file, descriptor pressure, rate-limited
//!   errors, memory, numeric flag bounds, unmount by another user and after prefill,
//!   /dev/fuse access), through the binary, with a second real user;
//! - `faults`: a concurrent soak, SIGKILLed daemons and shards mutated under a live mount;
//! - `inject`: faults injected behind the read path of a mount (EIO, short reads, stalls) with
//!   a read deadline: errors within deadline + 1 s, never wrong bytes, the mount responsive;
//! - `fds`: bounded open descriptors (`--max-open-shards`) and shards replaced under them;
//! - `inputs`: pack inputs as the real tools write them (llm.c, numpy, parquet, archives...):
//!   exact tokens or a refusal saying what the file is, the same for a copy and --in-place;
//! - `ops`: the mount(8) helper and the systemd units in deploy/;
//! - `options`: mount flags through the binary (fingerprint guard, ownership and modes,
//!   --on-top, --read-timeout, --prefetch-workers);
//! - `prefill`: the page-cache prefill (`--prefill`);
//! - `resume`: the fingerprint's scope (elastic resume, more epochs) and `plan` with a pasted
//!   mount command line;
//! - `scale`: in-place datasets and a 4 TiB sparse dataset;
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
mod formats;
mod golden;
mod inject;
mod inputs;
mod masks;
mod mixture;
mod model;
mod mounted;
mod ops;
mod options;
mod out_dtype;
mod packed;
mod parsers;
mod passthrough;
mod plans;
mod prefill;
mod provenance;
mod quarantine;
mod records;
mod reftests;
mod remote;
mod resume;
mod rewindow;
mod scale;
mod trust;
