//! `shufflefs verify`: reads every byte of a dataset and checks it against the manifest.
//!
//! For each shard: the whole-file content hash (copied shards), or for an in-place shard its
//! content identity (size and sampled pages, format version 4; a version 2-3 in-place `hash`
//! hashes path, size and mtime, so only its checksums can be checked), every block checksum and
//! the checksum file's own hash (which binds it to its shard), and for document files their
//! combined hash and the entry index (offsets increasing by at least 16, the last one equal to
//! the metadata size). With `write_checksums`, shards without checksums get a checksum file
//! and the manifest is rewritten (atomically, by rename) to reference them, but only when
//! nothing failed; a version 2-3 manifest is rewritten as version 4 (in-place shards then get
//! their content identity and, inside the dataset directory, relative paths).

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::dataset::{Dataset, DocFiles, Shard};
use crate::error::{Error, Result};
use crate::format::checksum::{self, BlockSums};
use crate::format::docfiles::DocFile;
use crate::format::{self, ContentHasher, MANIFEST, ShardChecksums, ShardEntry};

/// Bytes read per call while verifying.
const CHUNK: usize = 8 << 20;

/// One problem found.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct Problem {
    /// The file at fault.
    pub path: PathBuf,
    /// What is wrong.
    pub message: String,
}

/// What `verify` found and did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub(crate) struct Report {
    /// Shards checked.
    pub shards: u64,
    /// Bytes read (shards, checksum and document files).
    pub bytes_read: u64,
    /// Blocks checked against a checksum file.
    pub blocks_checked: u64,
    /// Everything that failed.
    pub problems: Vec<Problem>,
    /// Checksum files written (`--write-checksums`).
    pub checksums_written: u64,
}

/// Options of [`verify`].
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct VerifyOptions {
    /// Add checksum files to shards without them, and rewrite the manifest.
    pub write_checksums: bool,
}

/// Reads the whole of `file` in chunks, feeding `f`.
fn scan(file: &Shard, report: &mut Report, mut f: impl FnMut(&[u8])) -> Result<()> {
    let mut buf = vec![0u8; CHUNK.min(file.len() as usize).max(1)];
    let mut at = 0u64;
    while at < file.len() {
        let n = ((file.len() - at) as usize).min(buf.len());
        file.read_exact(&mut buf[..n], at)?;
        f(&buf[..n]);
        at += n as u64;
        report.bytes_read += n as u64;
    }
    Ok(())
}

/// Verifies the dataset in `dir` (see the module docs). `progress` is called after each shard
/// with (shards done, shards total).
pub(crate) fn verify(
    dir: &Path,
    options: VerifyOptions,
    mut progress: impl FnMut(u64, u64),
) -> Result<Report> {
    let dataset = Dataset::open(dir)?;
    let manifest = dataset.manifest().clone();
    let mut report = Report::default();
    let mut new_sums: Vec<Option<Vec<u64>>> = vec![None; manifest.shards.len()];
    let total = manifest.shards.len() as u64;
    for (i, (entry, shard)) in manifest.shards.iter().zip(dataset.shards()).enumerate() {
        report.shards += 1;
        // A shard that cannot be read whole has nothing more to check.
        if let Some(sums) = check_content(entry, shard, manifest.version, &mut report) {
            match (shard.sums(), &entry.checksums) {
                (Some(file), Some(c)) => check_block_sums(shard, file, c, &sums, &mut report),
                _ => new_sums[i] = Some(sums),
            }
            if let Some(d) = shard.docs() {
                check_documents(entry, d, &mut report);
            }
        }
        progress(i as u64 + 1, total);
    }
    if options.write_checksums && report.problems.is_empty() {
        report.checksums_written = write_checksums(&dataset, &new_sums)?;
    }
    Ok(report)
}

/// Reads shard `shard` whole and checks its identity against `entry`: the content hash, or
/// for an in-place shard of format version 4 its sampled identity. Returns its block
/// checksums, or `None` when it cannot be read.
fn check_content(
    entry: &ShardEntry,
    shard: &Shard,
    version: u32,
    report: &mut Report,
) -> Option<Vec<u64>> {
    let mut whole = ContentHasher::new();
    let mut blocks = BlockSums::new();
    let mut scanned = Report::default();
    let result = scan(shard, &mut scanned, |b| {
        whole.update(b);
        blocks.update(b);
    });
    report.bytes_read += scanned.bytes_read;
    if let Err(e) = result {
        report
            .problems
            .push(report_problem(shard.path(), e.to_string()));
        return None;
    }
    if entry.in_place_mtime_ns.is_some() && version >= 4 {
        match shard.sampled_identity() {
            Ok(id) if id != entry.hash => report.problems.push(report_problem(
                shard.path(),
                format!(
                    "content identity {id} (size and {} sampled pages) but the manifest \
                     records {}: the file referenced in place changed; restore it or \
                     re-run `shufflefs pack --in-place`",
                    format::SAMPLES,
                    entry.hash
                ),
            )),
            Ok(_) => {}
            Err(e) => report
                .problems
                .push(report_problem(shard.path(), e.to_string())),
        }
    } else if entry.in_place_mtime_ns.is_none() && format::format_hash(whole.finish()) != entry.hash
    {
        report.problems.push(report_problem(
            shard.path(),
            format!(
                "content hash {} but the manifest records {}: the shard changed after \
                 packing; restore it or re-run `shufflefs pack`",
                format::format_hash(whole.finish()),
                entry.hash
            ),
        ));
    }
    Some(blocks.finish())
}

/// Checks the shard's checksum file `file` (described by `c`): its own hash, and the block
/// checksums `sums` of the shard's bytes against those it records.
fn check_block_sums(
    shard: &Shard,
    file: &Shard,
    c: &ShardChecksums,
    sums: &[u64],
    report: &mut Report,
) {
    let mut recorded = Vec::with_capacity(file.len() as usize);
    let mut scanned = Report::default();
    match scan(file, &mut scanned, |b| recorded.extend_from_slice(b)) {
        Err(e) => report
            .problems
            .push(report_problem(file.path(), e.to_string())),
        Ok(()) => {
            let sums_intact = format::format_hash(checksum::file_hash(&recorded)) == c.hash;
            if !sums_intact {
                report.problems.push(report_problem(
                    file.path(),
                    format!(
                        "checksum file hash does not match the manifest's {}: \
                         the file changed after packing; restore it or re-run \
                         `shufflefs pack`",
                        c.hash
                    ),
                ));
            }
            let bad: Vec<u64> = recorded
                .chunks_exact(8)
                .zip(sums)
                .enumerate()
                .filter(|(_, (r, s))| u64::from_le_bytes((*r).try_into().expect("8 bytes")) != **s)
                .map(|(k, _)| k as u64)
                .collect();
            report.blocks_checked += sums.len() as u64;
            // With a damaged checksum file, the blocks prove nothing about the
            // shard (its content hash, checked above, does).
            if sums_intact && !bad.is_empty() {
                let shown: Vec<String> = bad
                    .iter()
                    .take(8)
                    .map(|k| {
                        let at = k * checksum::BLOCK;
                        format!("{at}..{}", (at + checksum::BLOCK).min(shard.len()))
                    })
                    .collect();
                report.problems.push(report_problem(
                    shard.path(),
                    format!(
                        "{} of {} blocks fail their checksum (bytes {}{}): restore \
                         the shard or re-run `shufflefs pack`",
                        bad.len(),
                        sums.len(),
                        shown.join(", "),
                        if bad.len() > 8 { ", ..." } else { "" }
                    ),
                ));
            }
        }
    }
    report.bytes_read += scanned.bytes_read;
}

/// Checks the document files of a shard: their hash, their block checksums, and the entry
/// offsets of the index.
fn check_documents(entry: &ShardEntry, d: &DocFiles, report: &mut Report) {
    let mut hashes = Vec::new();
    let mut index = Vec::new();
    let mut doc_blocks = Vec::new();
    for (which, file) in d.present() {
        let mut h = ContentHasher::new();
        let mut blocks = BlockSums::with_block(checksum::DOC_BLOCK);
        let mut scanned = Report::default();
        let r = scan(file, &mut scanned, |b| {
            h.update(b);
            blocks.update(b);
            if which == DocFile::Index {
                index.extend_from_slice(b);
            }
        });
        report.bytes_read += scanned.bytes_read;
        if let Err(e) = r {
            report
                .problems
                .push(report_problem(file.path(), e.to_string()));
        }
        hashes.push(h.finish());
        doc_blocks.extend(blocks.finish());
    }
    if let (Some(sums), Some(c)) = (
        d.sums.as_ref(),
        entry.docs.as_ref().and_then(|x| x.checksums.as_ref()),
    ) {
        let mut recorded = Vec::new();
        let mut scanned = Report::default();
        match scan(&sums.file, &mut scanned, |b| recorded.extend_from_slice(b)) {
            Err(e) => report
                .problems
                .push(report_problem(sums.file.path(), e.to_string())),
            Ok(()) => {
                report.blocks_checked += doc_blocks.len() as u64;
                if format::format_hash(checksum::file_hash(&recorded)) != c.hash
                    || recorded != checksum::encode(&doc_blocks)
                {
                    report.problems.push(report_problem(
                        sums.file.path(),
                        "the document files' block checksums do not match the files \
                         or the manifest: a document file or its checksum file changed \
                         after packing; re-run `shufflefs pack`"
                            .to_string(),
                    ));
                }
            }
        }
        report.bytes_read += scanned.bytes_read;
    }
    let mut h = ContentHasher::new();
    for x in &hashes {
        h.update(&x.to_le_bytes());
    }
    let want = entry
        .docs
        .as_ref()
        .map(|d| d.hash.clone())
        .unwrap_or_default();
    if format::format_hash(h.finish()) != want {
        report.problems.push(report_problem(
            d.file(DocFile::Docs).path(),
            format!(
                "the document files of this shard (.ids .idx .meta .docs) do not hash \
                 to the manifest's {want}: one changed after packing; re-run \
                 `shufflefs pack`"
            ),
        ));
    }
    if d.is_compact() {
        return;
    }
    let offsets: Vec<u64> = index
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
        .collect();
    let monotonic = offsets.windows(2).all(|w| w[1] >= w[0].saturating_add(16));
    if offsets.first() != Some(&0)
        || offsets.last() != Some(&d.file(DocFile::Meta).len())
        || !monotonic
    {
        report.problems.push(report_problem(
            d.file(DocFile::Index).path(),
            "entry offsets do not start at 0, increase by at least 16 and end at the \
             size of the .meta file: the document files are corrupt; re-run `shufflefs \
             pack`"
                .to_string(),
        ));
    }
}

fn report_problem(path: &Path, message: String) -> Problem {
    Problem {
        path: path.to_path_buf(),
        message,
    }
}

/// Writes a checksum file for every shard with `Some` sums and rewrites the manifest.
fn write_checksums(dataset: &Dataset, sums: &[Option<Vec<u64>>]) -> Result<u64> {
    let (dir, manifest) = (dataset.dir(), dataset.manifest());
    let mut updated = manifest.clone();
    let mut written = 0;
    for (i, (entry, sums)) in updated.shards.iter_mut().zip(sums).enumerate() {
        let Some(sums) = sums else { continue };
        let encoded = checksum::encode(sums);
        let hash = format::format_hash(checksum::file_hash(&encoded));
        // Named after the shard's position and content, so no other file is overwritten.
        let name = format!("checksums-{i:05}-{}.sums", &entry.hash[..8]);
        let path = dir.join(&name);
        let tmp = dir.join(format!("{name}.tmp"));
        let write = || -> std::io::Result<()> {
            let mut f = File::create(&tmp)?;
            f.write_all(&encoded)?;
            f.sync_all()?;
            fs::rename(&tmp, &path)
        };
        write().map_err(|e| {
            let _ = fs::remove_file(&tmp);
            Error::io(&path, e)
        })?;
        entry.checksums = Some(ShardChecksums {
            file: name,
            block: checksum::BLOCK,
            hash,
        });
        written += 1;
    }
    if written == 0 {
        return Ok(0);
    }
    if updated.version < 4 {
        // Version 4 identifies in-place shards by content and stores the paths of those
        // inside the dataset directory relative to it.
        for (entry, shard) in updated.shards.iter_mut().zip(dataset.shards()) {
            let Some(mtime) = entry.in_place_mtime_ns else {
                continue;
            };
            entry.hash = shard.sampled_identity()?;
            if let Some(rel) = Path::new(&entry.path)
                .strip_prefix(dir)
                .ok()
                .and_then(Path::to_str)
                .filter(|rel| !rel.is_empty() && *rel != MANIFEST)
            {
                entry.path = rel.to_string();
            }
            entry.in_place_guard = Some(format::in_place_guard(
                &entry.path,
                entry.bytes,
                mtime,
                &entry.hash,
            ));
        }
    }
    updated.version = format::version_for(&updated.shards);
    updated.content_hash = updated.expected_content_hash();
    let path = dir.join(MANIFEST);
    let tmp = dir.join(format!("{MANIFEST}.tmp"));
    let write = || -> std::io::Result<()> {
        let mut f = File::create(&tmp)?;
        f.write_all(&updated.to_bytes())?;
        f.sync_all()?;
        fs::rename(&tmp, &path)?;
        File::open(dir)?.sync_all()
    };
    write().map_err(|e| {
        let _ = fs::remove_file(&tmp);
        Error::io(&path, e)
    })?;
    Ok(written)
}
