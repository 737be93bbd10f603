//! The shared test harness: one dataset builder ([`data`]), one reference model of the tree
//! ([`reference`]), one way to read the tree without a mount ([`read`]), one random number
//! generator ([`rng`]), and one mount builder with the binary runner ([`mount`]). Test modules
//! `use crate::common::*`.

pub mod data;
pub mod mount;
pub mod proxy;
pub mod read;
pub mod reference;
pub mod remote;
pub mod rng;

pub use data::*;
pub use mount::*;
pub use read::*;
pub use reference::{
    Content, Entry, Reference, assert_exact_partition, expected_rows, json_observations, npy_header,
};
pub use remote::*;
pub use rng::*;

/// A proptest configuration: `cases` cases (or `PROPTEST_CASES` when set, for a longer
/// search), no failure persistence (a shrunk failure is pasted back as a named `regression_*`
/// test instead, as mountpoint-s3's reftests do), and a bounded shrink.
pub fn proptest_config(cases: u32) -> proptest::test_runner::Config {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(cases);
    proptest::test_runner::Config {
        cases,
        failure_persistence: None,
        max_shrink_iters: 2048,
        ..proptest::test_runner::Config::default()
    }
}
