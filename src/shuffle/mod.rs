//! Which observations, in which order: pure functions of the configuration, no bytes.
//!
//! | file | question |
//! | --- | --- |
//! | `feistel.rs` | what is the keyed permutation of `[0, n)`? |
//! | `plan.rs` | which observations are in (epoch, rank, step), and where is observation `i`? The one place of the global-step formula |
//! | `mixture/` | how many rows of each source in a global step, which ones, in which slots? (served by `view/mixture.rs`) |
//! | `packing/` | which documents make packed row `g` of epoch `e` (BOS-aligned best fit, random access)? (`--mode packed`, served by `view/packed.rs`) |

pub(crate) mod feistel;
// Not all of it is served yet (held-out splits, global-batch changes): see view/mixture.rs.
#[allow(dead_code)]
pub(crate) mod mixture;
// `epoch_stats` and the per-epoch shares serve the tests and the figures (`packing/figures.rs`).
#[allow(dead_code)]
pub(crate) mod packing;
pub(crate) mod plan;
