//! The one dataset builder: packed datasets in temp dirs (positional tokens, random tokens,
//! JSON Lines documents), and what a test needs to see of them through `std::fs` alone (the
//! manifest, the shard files, the token stream).

use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use shufflefs::dtype::ScalarType;
use shufflefs::fs::ShuffleFs;
use shufflefs::pack::{PackOptions, pack, write_positional};
use shufflefs::view::{View, ViewConfig};
use tempfile::TempDir;

use super::Rng;

/// A packed dataset in `DIR/ds` (the temp dir also holds its inputs and anything a test adds).
pub struct Data {
    pub dir: TempDir,
}

impl Data {
    /// `tokens` u32 positional tokens (token `i` has value `i`) in shards of `shard_size`
    /// bytes.
    pub fn positional(tokens: u64, shard_size: u64) -> Data {
        Data::positional_of(tokens, shard_size, ScalarType::U32)
    }

    /// Positional tokens of `dtype` (values wrap at its width).
    pub fn positional_of(tokens: u64, shard_size: u64, dtype: ScalarType) -> Data {
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("tokens.bin");
        write_positional(&input, dtype, tokens).unwrap();
        Data::pack(dir, &[input], dtype, shard_size, false)
    }

    /// `tokens` random tokens of `dtype` from `seed` (a misplaced window cannot look right by
    /// accident), in shards of `shard_records` tokens; also returns the input bytes. In memory
    /// ([`scratch_dir`]): the reftests pack hundreds of these.
    pub fn random(
        tokens: u64,
        shard_records: u64,
        dtype: ScalarType,
        seed: u64,
    ) -> (Data, Vec<u8>) {
        let len = tokens as usize * dtype.size();
        let mut rng = Rng::new(seed);
        let mut input = Vec::with_capacity(len + 8);
        while input.len() < len {
            input.extend_from_slice(&rng.next().to_le_bytes());
        }
        input.truncate(len);
        let dir = scratch_dir();
        let raw = dir.path().join("tokens.bin");
        std::fs::write(&raw, &input).unwrap();
        // Uniform random values are not tokens of any vocabulary: the width check would call
        // them two narrower tokens each (`force`).
        let size = shard_records * dtype.size() as u64;
        (Data::pack(dir, &[raw], dtype, size, true), input)
    }

    /// JSON Lines `text` packed as `dtype` tokens in shards of `shard_size` bytes.
    pub fn jsonl(text: &str, dtype: ScalarType, shard_size: u64, max_entries: Option<u64>) -> Data {
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("docs.jsonl");
        std::fs::write(&input, text).unwrap();
        let options = PackOptions {
            dtype: Some(dtype),
            shard_size,
            max_entries_per_shard: max_entries,
            ..PackOptions::default()
        };
        pack(&dir.path().join("ds"), &[input], &options).unwrap();
        Data { dir }
    }

    pub fn pack(
        dir: TempDir,
        inputs: &[PathBuf],
        dtype: ScalarType,
        shard_size: u64,
        force: bool,
    ) -> Data {
        let options = PackOptions {
            dtype: Some(dtype),
            shard_size,
            force,
            ..PackOptions::default()
        };
        pack(&dir.path().join("ds"), inputs, &options).unwrap();
        Data { dir }
    }

    /// The dataset directory.
    pub fn path(&self) -> PathBuf {
        self.dir.path().join("ds")
    }

    pub fn view(&self, config: &ViewConfig) -> View {
        View::open(&self.path(), config).unwrap()
    }

    pub fn fs(&self, config: &ViewConfig) -> ShuffleFs {
        ShuffleFs::new(self.view(config)).unwrap()
    }
}

/// A temp dir in `/dev/shm` when there is one (pack fsyncs every file it writes, which on a
/// busy disk costs more than everything else a small reftest case does), else in the default
/// temp dir.
pub fn scratch_dir() -> TempDir {
    tempfile::tempdir_in("/dev/shm")
        .or_else(|_| tempfile::tempdir())
        .unwrap()
}

/// A stream-mode plan: window, stride, batch size, ranks, seed, epochs.
pub fn config(
    window: u64,
    stride: u64,
    batch: u64,
    ranks: u64,
    seed: u64,
    epochs: u64,
) -> ViewConfig {
    ViewConfig::stream(window, stride, batch, ranks, seed, epochs)
}

/// `DATASET/manifest.json`, parsed.
pub fn manifest(dataset: &Path) -> Value {
    super::json(&std::fs::read(dataset.join("manifest.json")).unwrap())
}

/// The shard files of a packed dataset, in stream order.
pub fn shard_paths(dataset: &Path) -> Vec<PathBuf> {
    manifest(dataset)["shards"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| dataset.join(s["path"].as_str().unwrap()))
        .collect()
}

/// The token stream as the shard files hold it, read with `std::fs` alone: each listed file
/// from its `offset`, `bytes` long, concatenated in manifest order.
pub fn stream(dataset: &Path) -> Vec<u8> {
    let m = manifest(dataset);
    let mut out = Vec::new();
    for s in m["shards"].as_array().unwrap() {
        let bytes = std::fs::read(dataset.join(s["path"].as_str().unwrap())).unwrap();
        let offset = s["offset"].as_u64().unwrap_or(0) as usize;
        let len = s["bytes"].as_u64().unwrap() as usize;
        out.extend_from_slice(&bytes[offset..offset + len]);
    }
    out
}

/// JSON Lines documents whose tokens are their stream positions (document `k` has `1 + 7k mod
/// 13` tokens; documents `k mod 3 != 0` carry metadata; odd ones of 3 tokens or more two spans
/// with their own), packed as u32, and the owner of each token computed from that definition.
pub struct Corpus {
    _data: Data,
    pub ds: PathBuf,
    /// Per token: (document, metadata as JSON).
    pub owners: Vec<(u64, Value)>,
    /// Per document: (first token, length, document metadata).
    pub docs: Vec<(u64, u64, Value)>,
}

impl Corpus {
    pub fn new(n_docs: u64, shard_bytes: u64) -> Corpus {
        Corpus::with_entries(n_docs, shard_bytes, None)
    }

    /// With at most `max_entries` metadata entries per shard.
    pub fn with_entries(n_docs: u64, shard_bytes: u64, max_entries: Option<u64>) -> Corpus {
        let (text, owners, docs) = corpus_jsonl(n_docs);
        let data = Data::jsonl(&text, ScalarType::U32, shard_bytes, max_entries);
        Corpus {
            ds: data.path(),
            _data: data,
            owners,
            docs,
        }
    }
}

/// The JSON Lines text of [`Corpus`], with its token owners and documents.
#[allow(clippy::type_complexity)]
pub fn corpus_jsonl(n_docs: u64) -> (String, Vec<(u64, Value)>, Vec<(u64, u64, Value)>) {
    let mut lines = String::new();
    let mut owners = Vec::new();
    let mut docs = Vec::new();
    let mut pos = 0u64;
    for k in 0..n_docs {
        let len = 1 + (k * 7) % 13;
        let tokens: Vec<u64> = (pos..pos + len).collect();
        let mut doc = json!({ "tokens": tokens });
        let doc_meta = if k % 3 == 0 {
            Value::Null
        } else {
            json!({"doc": k, "src": "web"})
        };
        if !doc_meta.is_null() {
            doc["meta"] = doc_meta.clone();
        }
        let mut owner: Vec<Value> = vec![doc_meta.clone(); len as usize];
        if k % 2 == 1 && len >= 3 {
            // Two spans: [0, 1) and [2, len), the token at 1 keeps the document's metadata.
            doc["spans"] = json!([
                {"start": 0, "end": 1, "meta": {"concept": k * 10}},
                {"start": 2, "end": len, "meta": [k, "x"]},
            ]);
            owner[0] = json!({"concept": k * 10});
            for o in owner.iter_mut().skip(2) {
                *o = json!([k, "x"]);
            }
        }
        docs.push((pos, len, doc_meta));
        owners.extend(owner.into_iter().map(|m| (k, m)));
        lines.push_str(&doc.to_string());
        lines.push('\n');
        pos += len;
    }
    (lines, owners, docs)
}
