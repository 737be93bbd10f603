//! The token formats `pack` reads with their own structure: each parser reads its format as
//! the format's own reader does (tests/it/parsers.rs compares them on files the real writers
//! wrote) and hands `pack` tokens and document boundaries. Plain token files (raw, `.npy`,
//! llm.c) need no parser: `format/sniff/` recognises them and `pack/inputs.rs` takes them.
//!
//! | file | format |
//! | --- | --- |
//! | `megatron.rs` | Megatron-LM `PREFIX.bin` + `PREFIX.idx` (`MMIDIDX`): sequences and documents |
//! | `datatrove.rs` | datatrove / nanotron `X.ds` + `X.ds.index` (+ `.ds.metadata`, `.ds.loss`) |
//! | `doc_scan.rs` | documents from an EOS/BOS id (nanoGPT, OLMo/Dolma, llm.c) in one pass |
//! | `hf.rs` | Hugging Face tables: Arrow IPC (`save_to_disk`), Arrow files, parquet |
//! | `index_io.rs` | positioned little-endian reads for the index parsers |

pub mod datatrove;
pub mod doc_scan;
pub mod hf;
pub(crate) mod index_io;
pub mod megatron;
