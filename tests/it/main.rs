//! Integration tests, one binary (fewer links on a 2-core machine):
//! - `model`: the filesystem model without FUSE against an independent reference;
//! - `mounted`: real mounts in a TempDir, read through std::fs;
//! - `cli`: the `shufflefs` binary, its daemon, signals and stale mounts;
//! - `corruption`: seeded manifest and index mutations, each refused naming the file or
//!   harmless, never different bytes (issue #5).

mod cli;
mod common;
mod corruption;
mod model;
mod mounted;
mod records;
mod scale;
