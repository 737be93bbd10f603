//! Integration tests, one binary (fewer links on a 2-core machine):
//! - `model`: the filesystem model without FUSE against an independent reference;
//! - `mounted`: real mounts in a TempDir, read through std::fs;
//! - `cli`: the `shufflefs` binary, its daemon, signals and stale mounts;
//! - `faults`: a concurrent soak, SIGKILLed daemons and shards mutated under a live mount.

mod cli;
mod common;
mod faults;
mod model;
mod mounted;
mod records;
mod scale;
