//! `shufflefs pack`: concatenate input token files into shards plus a manifest.
//!
//! Inputs are checked completely before anything is written (existence, regular file, size a
//! multiple of the record size, `.npy` header, dtype and shape; a file is `.npy` when it starts
//! with numpy's magic, whatever its name), so a bad input fails fast with its file named.
//! Shards are written under a temporary name, fsynced and renamed to names unique to this pack
//! run; the directory is fsynced, then the manifest is written last the same way. Until the
//! manifest's rename the directory holds no new dataset, so a crashed or failed pack never
//! leaves something that mounts, a failed pack removes what it wrote, and `--force` replaces
//! an existing dataset atomically (its old shards are deleted only after the switch).

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use log::debug;

use crate::dtype::{RecordType, ScalarType};
use crate::error::{Error, Result};
use crate::format::{
    self, ContentHasher, FORMAT_NAME, MANIFEST, Manifest, ShardEntry, VERSION, shard_name,
};
use crate::npy;

/// Default shard size bound: 1 GiB.
pub const DEFAULT_SHARD_SIZE: u64 = 1 << 30;

/// Copy buffer size: large enough to stream at disk speed, small enough to stay cheap.
const CHUNK: usize = 8 << 20;

/// Options of `shufflefs pack`.
#[derive(Clone, Debug)]
pub struct PackOptions {
    /// The record type of every input.
    pub dtype: ScalarType,
    /// Upper bound of a shard's size in bytes (rounded down to whole records).
    pub shard_size: u64,
    /// Replace an existing dataset in the directory.
    pub force: bool,
}

/// One checked input: where its records start and how many bytes they span.
#[derive(Debug)]
struct Input {
    path: PathBuf,
    data_offset: u64,
    data_bytes: u64,
}

/// Parses a byte size: a number with an optional binary suffix (`K`/`KiB`, `M`/`MiB`,
/// `G`/`GiB`, `T`/`TiB`, case-insensitive) or `B`.
pub fn parse_size(text: &str) -> Result<u64> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, suffix) = t.split_at(split);
    let shift = match suffix.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kib" | "kb" => 10,
        "m" | "mib" | "mb" => 20,
        "g" | "gib" | "gb" => 30,
        "t" | "tib" | "tb" => 40,
        _ => return Err(bad_size(text)),
    };
    let n: u64 = digits.parse().map_err(|_| bad_size(text))?;
    n.checked_mul(1u64 << shift).ok_or_else(|| bad_size(text))
}

fn bad_size(text: &str) -> Error {
    Error::invalid(format!(
        "invalid size {text:?}: use bytes with an optional suffix, e.g. 1GiB, 512MiB, 4096"
    ))
}

/// Checks one input and returns where its records are.
fn check_input(path: &Path, dtype: ScalarType) -> Result<Input> {
    // metadata before open: opening a FIFO would block.
    let meta = fs::metadata(path).map_err(|e| Error::io(path, e))?;
    if !meta.is_file() {
        return Err(Error::invalid(format!(
            "{}: not a regular file",
            path.display()
        )));
    }
    let mut file = File::open(path).map_err(|e| Error::io(path, e))?;
    let len = meta.len();
    let itemsize = dtype.size() as u64;
    let mut magic = [0u8; 6];
    let has_magic = len >= 6
        && file.read_exact(&mut magic).is_ok()
        && &magic == npy::MAGIC
        && file.rewind().is_ok();
    let named_npy = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("npy"));
    if named_npy && !has_magic {
        return Err(Error::invalid(format!(
            "{}: named .npy but has no numpy header (\\x93NUMPY); rename it if it is a raw \
             token file",
            path.display()
        )));
    }
    if !has_magic {
        if len % itemsize != 0 {
            return Err(Error::invalid(format!(
                "{}: {len} bytes is not a whole number of {dtype} tokens ({itemsize} bytes \
                 each); is --dtype right?",
                path.display()
            )));
        }
        return Ok(Input {
            path: path.to_path_buf(),
            data_offset: 0,
            data_bytes: len,
        });
    }
    let mut head = Vec::with_capacity(4096);
    (&mut file)
        .take(65536 + 16)
        .read_to_end(&mut head)
        .map_err(|e| Error::io(path, e))?;
    let header =
        npy::parse_header(&head).map_err(|e| Error::invalid(format!("{}: {e}", path.display())))?;
    let found = ScalarType::from_descr(&header.descr).map_err(|e| {
        Error::invalid(format!(
            "{}: array dtype {:?} cannot be packed as --dtype {dtype}: {e}",
            path.display(),
            header.descr
        ))
    })?;
    if found != dtype {
        return Err(Error::invalid(format!(
            "{}: array dtype is {} ({}) but --dtype is {dtype}: pass --dtype {} or convert \
             with arr.astype('{}')",
            path.display(),
            found,
            header.descr,
            found,
            dtype.descr()
        )));
    }
    let [count] = header.shape[..] else {
        return Err(Error::invalid(format!(
            "{}: array has shape {:?}; pack takes 1-D token arrays (flatten it with \
             arr.reshape(-1))",
            path.display(),
            header.shape
        )));
    };
    let data_bytes = count
        .checked_mul(itemsize)
        .ok_or_else(|| Error::invalid(format!("{}: shape {count} overflows", path.display())))?;
    if header.data_offset.checked_add(data_bytes) != Some(len) {
        return Err(Error::invalid(format!(
            "{}: header promises {count} elements ({data_bytes} bytes after a {}-byte \
             header) but the file is {len} bytes: truncated or not a plain array",
            path.display(),
            header.data_offset
        )));
    }
    Ok(Input {
        path: path.to_path_buf(),
        data_offset: header.data_offset,
        data_bytes,
    })
}

/// A shard being written: temporary file plus running hash.
struct ShardWriter {
    tmp: PathBuf,
    file: File,
    hasher: ContentHasher,
    bytes: u64,
}

/// Everything a pack has put on disk so far, removed again if the pack fails.
#[derive(Default)]
struct Written {
    files: Vec<PathBuf>,
}

impl Written {
    fn cleanup(&self) {
        for f in &self.files {
            let _ = fs::remove_file(f);
        }
    }
}

/// Packs `inputs` into `dir`. Returns the manifest written.
pub fn pack(dir: &Path, inputs: &[PathBuf], options: &PackOptions) -> Result<Manifest> {
    let itemsize = options.dtype.size() as u64;
    if inputs.is_empty() {
        return Err(Error::invalid("no INPUT files given"));
    }
    let shard_records = options.shard_size / itemsize;
    if shard_records == 0 {
        return Err(Error::invalid(format!(
            "--shard-size {} is smaller than one {} token",
            options.shard_size, options.dtype
        )));
    }
    let checked: Vec<Input> = inputs
        .iter()
        .map(|p| check_input(p, options.dtype))
        .collect::<Result<_>>()?;
    let total_bytes = checked
        .iter()
        .try_fold(0u64, |acc, i| acc.checked_add(i.data_bytes))
        .ok_or_else(|| Error::invalid("the inputs together exceed 2^64 bytes"))?;
    if total_bytes == 0 {
        return Err(Error::invalid("the inputs hold no tokens"));
    }
    fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let manifest_path = dir.join(MANIFEST);
    let old = if manifest_path.exists() {
        if !options.force {
            return Err(Error::invalid(format!(
                "{} already holds a dataset ({MANIFEST} exists): choose another directory or \
                 pass --force to replace it",
                dir.display()
            )));
        }
        fs::read(&manifest_path)
            .ok()
            .and_then(|b| Manifest::parse(&b, &manifest_path).ok())
    } else {
        None
    };
    let pack_id = new_pack_id();
    let mut written = Written::default();
    let result = write_shards(
        dir,
        &pack_id,
        &checked,
        shard_records * itemsize,
        options,
        &mut written,
    )
    .and_then(|shards| write_manifest(dir, shards, options.dtype, &mut written));
    match &result {
        Ok(new) => {
            // The new manifest is in place: shards only the old one referenced are garbage.
            if let Some(old) = old {
                for s in old
                    .shards
                    .iter()
                    .filter(|s| !new.shards.iter().any(|n| n.path == s.path))
                {
                    let _ = fs::remove_file(dir.join(&s.path));
                }
            }
        }
        Err(_) => written.cleanup(),
    }
    result
}

/// An id unique to one pack run (time and process id, mixed), 8 hex digits.
fn new_pack_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let id = crate::feistel::mix(nanos ^ (u64::from(std::process::id()) << 40));
    format!("{:08x}", id >> 32)
}

fn write_shards(
    dir: &Path,
    pack_id: &str,
    inputs: &[Input],
    shard_bytes: u64,
    options: &PackOptions,
    written: &mut Written,
) -> Result<Vec<ShardEntry>> {
    let itemsize = options.dtype.size() as u64;
    let mut shards = Vec::new();
    let mut current: Option<ShardWriter> = None;
    let mut buf = vec![0u8; CHUNK];
    for input in inputs {
        let mut file = File::open(&input.path).map_err(|e| Error::io(&input.path, e))?;
        file.seek(SeekFrom::Start(input.data_offset))
            .map_err(|e| Error::io(&input.path, e))?;
        let mut left = input.data_bytes;
        while left > 0 {
            let shard = match current.as_mut() {
                Some(s) => s,
                None => {
                    let name = shard_name(pack_id, shards.len());
                    let tmp = dir.join(format!("{name}.tmp"));
                    let f = OpenOptions::new()
                        .write(true)
                        .create(true)
                        .truncate(true)
                        .open(&tmp)
                        .map_err(|e| Error::io(&tmp, e))?;
                    written.files.push(tmp.clone());
                    current.insert(ShardWriter {
                        tmp,
                        file: f,
                        hasher: ContentHasher::new(),
                        bytes: 0,
                    })
                }
            };
            let room = shard_bytes - shard.bytes;
            let want = left.min(room).min(CHUNK as u64) as usize;
            file.read_exact(&mut buf[..want]).map_err(|e| {
                Error::io(
                    &input.path,
                    io::Error::new(e.kind(), format!("input changed while packing: {e}")),
                )
            })?;
            shard
                .file
                .write_all(&buf[..want])
                .map_err(|e| Error::io(&shard.tmp, e))?;
            shard.hasher.update(&buf[..want]);
            shard.bytes += want as u64;
            left -= want as u64;
            if shard.bytes == shard_bytes {
                let done = current.take().expect("current shard");
                shards.push(finish_shard(
                    dir,
                    pack_id,
                    shards.len(),
                    done,
                    itemsize,
                    written,
                )?);
            }
        }
    }
    if let Some(done) = current.take() {
        shards.push(finish_shard(
            dir,
            pack_id,
            shards.len(),
            done,
            itemsize,
            written,
        )?);
    }
    // The shard renames must be durable before a manifest can reference them.
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::io(dir, e))?;
    Ok(shards)
}

fn finish_shard(
    dir: &Path,
    pack_id: &str,
    index: usize,
    shard: ShardWriter,
    itemsize: u64,
    written: &mut Written,
) -> Result<ShardEntry> {
    shard
        .file
        .sync_all()
        .map_err(|e| Error::io(&shard.tmp, e))?;
    let name = shard_name(pack_id, index);
    let path = dir.join(&name);
    fs::rename(&shard.tmp, &path).map_err(|e| Error::io(&path, e))?;
    written.files.push(path.clone());
    debug!("wrote {} ({} bytes)", path.display(), shard.bytes);
    Ok(ShardEntry {
        path: name,
        records: shard.bytes / itemsize,
        bytes: shard.bytes,
        hash: format::format_hash(shard.hasher.finish()),
    })
}

fn write_manifest(
    dir: &Path,
    shards: Vec<ShardEntry>,
    dtype: ScalarType,
    written: &mut Written,
) -> Result<Manifest> {
    let record = RecordType::scalar(dtype);
    let manifest = Manifest {
        format: FORMAT_NAME.into(),
        version: VERSION,
        dtype: record.manifest_descr(),
        itemsize: record.itemsize() as u64,
        records: shards.iter().map(|s| s.records).sum(),
        content_hash: format::content_hash(&shards),
        shards,
        created_by: format!("shufflefs {}", env!("CARGO_PKG_VERSION")),
    };
    let tmp = dir.join(format!("{MANIFEST}.tmp"));
    let path = dir.join(MANIFEST);
    written.files.push(tmp.clone());
    let write = || -> io::Result<()> {
        let mut f = File::create(&tmp)?;
        f.write_all(&manifest.to_bytes())?;
        f.sync_all()?;
        fs::rename(&tmp, &path)
    };
    write().map_err(|e| Error::io(&path, e))?;
    // The dataset exists from the rename on; a failure to make it durable is worth a warning
    // but must not delete the shards it references.
    if let Err(e) = File::open(dir).and_then(|d| d.sync_all()) {
        log::warn!(
            "{}: fsync after writing the manifest failed: {e}",
            dir.display()
        );
    }
    Ok(manifest)
}

/// Writes `tokens` positional tokens of `dtype` to `path` (token `i` has value `i` modulo the
/// type's range): a dataset where every window names its own position. Used by the demo,
/// tests and benchmarks.
pub fn write_positional(path: &Path, dtype: ScalarType, tokens: u64) -> Result<()> {
    let mut f = File::create(path).map_err(|e| Error::io(path, e))?;
    let size = dtype.size();
    let per_chunk = (CHUNK / size) as u64;
    let mut buf = Vec::with_capacity(CHUNK);
    let mut i = 0u64;
    while i < tokens {
        buf.clear();
        let end = (i + per_chunk).min(tokens);
        for t in i..end {
            buf.extend_from_slice(&t.to_le_bytes()[..size]);
        }
        f.write_all(&buf).map_err(|e| Error::io(path, e))?;
        i = end;
    }
    f.sync_all().map_err(|e| Error::io(path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("1GiB").unwrap(), 1 << 30);
        assert_eq!(parse_size("512MiB").unwrap(), 512 << 20);
        assert_eq!(parse_size("3k").unwrap(), 3072);
        assert_eq!(parse_size("2 TiB").unwrap(), 2 << 40);
        for bad in ["", "GiB", "1.5GiB", "-1", "1XB", "99999999999999999999"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
        assert!(parse_size("16777216TiB").is_err(), "overflow");
    }
}
