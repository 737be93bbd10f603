//! `info.json` and the fingerprints: the mount's parameters and identity.
//!
//! The *fingerprint* is a hash of the data and the global plan: everything that determines
//! the bytes and the order of every global step (the `global_batch` rows of one step, all
//! ranks together, in position order), and nothing else. It covers the formats and the
//! algorithm, the dataset identity, the geometry of an observation (mode, window, stride, pad
//! id), the seed and the global batch; it does not cover how the global batch is split over
//! ranks (`batch_size`, `ranks`) nor how many epochs are exposed (epoch `e` is the same
//! whatever `epochs`), so an elastic resume or a longer run keeps it. The *layout fingerprint*
//! adds the rank layout: equal exactly when every file of the tree is the same.
//!
//! Everything that changes a global step's bytes or order must enter [`fingerprint`], and
//! only there (a schedule of mixtures, for one, will add its entries up to the step served).

use serde::Serialize;

use super::Mode;
use crate::dataset::Dataset;
use crate::format::dtype::{RecordType, ScalarType};
use crate::format::{self, ContentHasher, Manifest};
use crate::shuffle::feistel;
use crate::shuffle::plan::Plan;
use crate::tree::listing_sizes;

/// `info.json`: the mount's parameters and identity.
#[derive(Clone, Debug, Serialize)]
pub struct Info {
    /// "stream" or "documents".
    pub mode: &'static str,
    /// Records (tokens) in the dataset.
    pub n_tokens: u64,
    /// Observations shuffled per epoch.
    pub n_observations: u64,
    /// Documents in the dataset (null without document structure).
    pub n_documents: Option<u64>,
    /// Whether documents or spans carry metadata. (`S.json` has `rows` whenever the dataset
    /// has documents.)
    pub metadata: bool,
    /// Records per observation (row length).
    pub window: u64,
    /// Records between observation starts (stream mode).
    pub stride: u64,
    /// Rows per step file.
    pub batch_size: u64,
    /// Ranks.
    pub ranks: u64,
    /// Shuffle seed.
    pub seed: u64,
    /// Epochs exposed.
    pub epochs: u64,
    /// Steps per epoch (the same for every rank).
    pub steps_per_epoch: u64,
    /// `batch_size * ranks`.
    pub global_batch: u64,
    /// Observations dropped at the end of each epoch.
    pub dropped_per_epoch: u64,
    /// numpy descr of the records as served: `<u4`, `<i8` with `--out-dtype i64`, or a
    /// structured list literal.
    pub dtype: String,
    /// The dataset's own descr, present only when `--out-dtype` serves another.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dataset_dtype: Option<String>,
    /// The fields of a structured record as `[name, descr]` pairs (for
    /// `np.dtype([tuple(f) for f in fields])`); null for a plain token stream.
    pub fields: Option<Vec<[String; 2]>>,
    /// Bytes per record as served.
    pub itemsize: u64,
    /// First-field value of padding records (documents mode).
    pub pad_id: Option<i128>,
    /// Shape of every step `.npy`.
    pub step_shape: [u64; 2],
    /// Size in bytes of every step `.npy`.
    pub step_file_bytes: u64,
    /// Size of the `.npy` header: the data of every step file starts at this offset.
    pub npy_header_bytes: u64,
    /// Number of shards.
    pub shards: usize,
    /// The dataset's content identity (from the manifest).
    pub content_hash: String,
    /// Dataset format version.
    pub format_version: u32,
    /// Permutation algorithm name.
    pub algorithm: &'static str,
    /// Hash of the data and the global plan (see the module docs). Store it with a checkpoint
    /// and refuse to resume when it differs (`--expect-fingerprint`).
    pub fingerprint: String,
    /// Hash of `fingerprint` and the rank layout (`batch_size`, `ranks`, `epochs`): equal
    /// exactly when every file of the tree has the same bytes.
    pub layout_fingerprint: String,
    /// Most names a directory listing shows (`--max-listing`; 0: no bound).
    pub max_listing: u64,
    /// The directories whose listing that bound cuts short, with their true number of names
    /// (every name stays reachable by its path).
    pub truncated_listings: Vec<TruncatedListing>,
    /// `--rewindow`: each epoch's windows start at a phase drawn from (seed, epoch).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub rewindow: bool,
    /// `--quarantine`: observations never served.
    #[serde(skip_serializing_if = "is_zero")]
    pub quarantined: u64,
    /// A mixture (`--config`): its sources, weights and schedule.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mixture: Option<super::MixtureInfo>,
    /// Packed mode: the packing's parameters and figures.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub packing: Option<super::PackingInfo>,
    /// The dataset directory (informational, not part of the fingerprint).
    pub dataset: String,
    /// The shufflefs version serving the mount (informational).
    pub shufflefs_version: &'static str,
}

/// A directory whose listing shows fewer names than it holds (`info.json`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TruncatedListing {
    /// The directory, as a path pattern (`epoch/E/rank/R/step`: every such directory).
    pub dir: &'static str,
    /// Names it holds.
    pub names: u64,
    /// Names its listing shows: the first ones in listing order.
    pub listed: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// What `info.json` reports besides the dataset and the plan.
pub(super) struct Geometry {
    pub(super) mode: Mode,
    pub(super) window: u64,
    pub(super) stride: u64,
    pub(super) pad_id: Option<i128>,
    pub(super) step_file_bytes: u64,
    pub(super) npy_header_bytes: u64,
    pub(super) max_listing: u64,
    /// `--out-dtype`, when it differs from the dataset's type.
    pub(super) out_dtype: Option<ScalarType>,
    /// Packed mode: `info.json`'s `packing` and the fingerprint's line.
    pub(super) packing: Option<(super::PackingInfo, String)>,
    /// `--rewindow`.
    pub(super) rewindow: bool,
    /// The tree's shape (for the listings a bound cuts short).
    pub(super) shape: crate::tree::Shape,
}

impl Info {
    /// The `info.json` of `dataset` seen through `plan`, fingerprints included.
    pub(super) fn new(dataset: &Dataset, plan: &Plan, g: Geometry) -> Info {
        let manifest = dataset.manifest();
        let record: &RecordType = dataset.record_type();
        let fields = record.is_structured().then(|| {
            record
                .fields()
                .iter()
                .map(|f| [f.name.clone(), f.scalar.descr().to_string()])
                .collect()
        });
        let mut info = Info {
            mode: g.mode.name(),
            n_tokens: dataset.n_records(),
            n_observations: plan.n_observations(),
            n_documents: dataset.n_documents(),
            metadata: manifest.metadata,
            window: g.window,
            stride: g.stride,
            batch_size: plan.batch_size(),
            ranks: plan.ranks(),
            seed: plan.seed(),
            epochs: plan.epochs(),
            steps_per_epoch: plan.steps_per_epoch(),
            global_batch: plan.global_batch(),
            dropped_per_epoch: plan.dropped_per_epoch(),
            dtype: g
                .out_dtype
                .map_or_else(|| manifest.dtype.clone(), |t| t.descr().to_string()),
            dataset_dtype: g.out_dtype.map(|_| manifest.dtype.clone()),
            fields,
            itemsize: g.out_dtype.map_or(record.itemsize(), |t| t.size()) as u64,
            pad_id: g.pad_id,
            step_shape: [plan.batch_size(), g.window],
            step_file_bytes: g.step_file_bytes,
            npy_header_bytes: g.npy_header_bytes,
            shards: manifest.shards.len(),
            content_hash: manifest.content_hash.clone(),
            format_version: manifest.version,
            algorithm: feistel::ALGORITHM,
            fingerprint: String::new(),
            layout_fingerprint: String::new(),
            max_listing: g.max_listing,
            truncated_listings: truncated(&g.shape, g.max_listing),
            rewindow: g.rewindow,
            quarantined: plan.quarantined().len() as u64,
            mixture: None,
            packing: g.packing.as_ref().map(|p| p.0.clone()),
            dataset: dataset.dir().display().to_string(),
            shufflefs_version: env!("CARGO_PKG_VERSION"),
        };
        let mut extra = g.packing.as_ref().map(|p| p.1.clone()).unwrap_or_default();
        if !plan.quarantined().is_empty() {
            // Only present with a quarantine, so other fingerprints are unchanged.
            let mut h = ContentHasher::new();
            for o in plan.quarantined() {
                h.update(&o.to_le_bytes());
            }
            extra.push_str(&format!(
                "quarantine={},{}\n",
                plan.quarantined().len(),
                format::format_hash(h.finish())
            ));
        }
        info.fingerprint = fingerprint(
            &info,
            manifest,
            Some(extra.as_str()).filter(|e| !e.is_empty()),
        );
        info.layout_fingerprint = layout_fingerprint(&info);
        info
    }

    /// The bytes of `info.json`: pretty JSON and a newline.
    pub(super) fn to_json(&self) -> Vec<u8> {
        let mut out = serde_json::to_vec_pretty(self).expect("info serializes");
        out.push(b'\n');
        out
    }
}

/// The directories whose listing `max_listing` cuts short.
pub(super) fn truncated(shape: &crate::tree::Shape, max_listing: u64) -> Vec<TruncatedListing> {
    listing_sizes(shape)
        .into_iter()
        .filter(|&(_, names)| max_listing > 0 && names > max_listing)
        .map(|(dir, names)| TruncatedListing {
            dir,
            names,
            listed: max_listing,
        })
        .collect()
}

/// The fingerprint (see the module docs).
fn fingerprint(info: &Info, manifest: &Manifest, packing: Option<&str>) -> String {
    // An explicit canonical text, one `key=value` line each in a fixed order, so the value
    // depends on nothing but these inputs.
    let mut canonical = format!(
        "format={}\nformat_version={}\nalgorithm={}\nnpy=1.0\nmode={}\ndtype={}\n\
         n_tokens={}\nwindow={}\nstride={}\nglobal_batch={}\nseed={}\ncontent_hash={}\n",
        format::FORMAT_NAME,
        manifest.version,
        feistel::ALGORITHM,
        info.mode,
        info.dtype,
        info.n_tokens,
        info.window,
        info.stride,
        info.global_batch,
        info.seed,
        manifest.content_hash,
    );
    if let Some(pad) = info.pad_id {
        canonical.push_str(&format!("pad_id={pad}\n"));
    }
    if let Some(n) = info.n_documents {
        canonical.push_str(&format!("documents={n}\nmetadata={}\n", info.metadata));
    }
    if let Some(line) = packing {
        canonical.push_str(line);
    }
    if info.rewindow {
        canonical.push_str("rewindow=1\n");
    }
    for s in &manifest.shards {
        canonical.push_str(&format!("shard={},{}\n", s.bytes, s.hash));
        if let Some(d) = &s.docs {
            canonical.push_str(&format!("shard_docs={},{}\n", d.documents, d.hash));
        }
    }
    hash_text(&canonical)
}

/// The layout fingerprint: the fingerprint plus the rank layout, so equal exactly when every
/// file of the tree (each rank's `S.npy` and `S.json`, and which epochs exist) is the same.
pub(super) fn layout_fingerprint(info: &Info) -> String {
    hash_text(&format!(
        "fingerprint={}\nbatch_size={}\nranks={}\nepochs={}\n",
        info.fingerprint, info.batch_size, info.ranks, info.epochs
    ))
}

/// [`ContentHasher`] of `text`, as 16 hex digits.
pub(super) fn hash_text(text: &str) -> String {
    let mut h = ContentHasher::new();
    h.update(text.as_bytes());
    format::format_hash(h.finish())
}
