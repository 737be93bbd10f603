//! Checking pack's inputs before anything is written: what each file is (`format::sniff`),
//! its size, `.npy` header, dtype and shape, the llm.c token count, a raw file's sampled
//! content against `--dtype`'s width; the same checks for a copy and `--in-place`.

use std::fs::{self, File};
use std::path::{Path, PathBuf};

use super::PackOptions;
use super::documents::Native;
use super::formats::datatrove::{self, DatatroveFile, MergedTotal};
use super::formats::megatron::{self, MegatronIndex};
use crate::error::{Error, Result};
use crate::format::dtype::{RecordType, ScalarType};
use crate::format::npy;
use crate::format::sniff::{self, Kind};
use crate::storage::ReadAt;
use crate::storage::remote;

/// One checked input.
#[derive(Debug)]
pub(super) enum Input {
    /// Records at `[offset, offset + bytes)` of a raw, `.npy` or llm.c file, or of a token
    /// file whose own index (`native`) gives its type and documents.
    Records {
        path: PathBuf,
        offset: u64,
        bytes: u64,
        kind: Kind,
        native: Native,
    },
    /// A JSON Lines file of documents.
    Jsonl { path: PathBuf },
    /// A table of token lists (parquet, Arrow), one document per row.
    Table { path: PathBuf },
}

fn is_jsonl(path: &Path) -> bool {
    path.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("jsonl") || e.eq_ignore_ascii_case("ndjson"))
}

/// Checks every input (the same checks for a copy and `--in-place`); returns them with the
/// dataset's record type: `--dtype`, else the type the first `.npy` or llm.c input defines.
pub(super) fn check_inputs(
    inputs: &[PathBuf],
    options: &PackOptions,
) -> Result<(Vec<Input>, RecordType)> {
    if inputs.is_empty() {
        return Err(Error::invalid("no INPUT files given"));
    }
    let mut record = options.dtype.map(RecordType::scalar);
    // The first .npy or llm.c input may define the record type for the others.
    if record.is_none() {
        for p in inputs.iter().filter(|p| !is_jsonl(p)) {
            if let Ok(Input::Records { .. }) = check_input(p, &mut record, options)
                && record.is_some()
            {
                break;
            }
        }
    }
    let checked: Vec<Input> = inputs
        .iter()
        .map(|p| check_input(p, &mut record, options))
        .collect::<Result<_>>()?;
    let record = record.ok_or_else(|| Error::invalid("--dtype is required"))?;
    Ok((checked, record))
}

/// Checks one input: what it is (`format::sniff`; a file that holds no token records is refused
/// saying what it is and what to do), that its records fit `record`, the dataset's record
/// type once known (an `.npy` or llm.c input defines it when nothing did), and that a raw
/// input does not look like tokens of another width than `--dtype` (`--force` skips the
/// heuristic checks).
fn check_input(
    path: &Path,
    record: &mut Option<RecordType>,
    options: &PackOptions,
) -> Result<Input> {
    if remote::is_remote(path) {
        return super::remote_inputs::check(path, record, options);
    }
    let at = |msg: String| Error::invalid(format!("{}: {msg}", path.display()));
    // metadata before open: opening a FIFO would block.
    let meta = fs::metadata(path).map_err(|e| Error::io(path, e))?;
    if !meta.is_file() {
        return Err(at("not a regular file".into()));
    }
    if let Some(input) = check_indexed(path, record, options)? {
        return Ok(input);
    }
    let file = File::open(path).map_err(|e| Error::io(path, e))?;
    check_records(path, &file, meta.len(), record, options)
}

/// The checks of [`check_input`] once the file (`len` bytes, local or remote) is open and
/// is not a token file with its own index.
pub(super) fn check_records(
    path: &Path,
    file: &dyn ReadAt,
    len: u64,
    record: &mut Option<RecordType>,
    options: &PackOptions,
) -> Result<Input> {
    let at = |msg: String| Error::invalid(format!("{}: {msg}", path.display()));
    let kind = match sniff::sniff_file(path, file, len).map_err(|e| Error::io(path, e))? {
        Ok(kind) => kind,
        Err(r) if r.heuristic && options.force => Kind::Raw,
        Err(r) => {
            let force = if r.heuristic {
                "; if these bytes really are token ids, pass --force"
            } else {
                ""
            };
            return Err(at(format!("{}: {}{force}", r.what, r.todo)));
        }
    };
    match kind {
        Kind::Jsonl | Kind::Table => {
            let what = if kind == Kind::Jsonl {
                "JSON Lines documents"
            } else {
                "a table of token lists"
            };
            match record {
                Some(r) if r.scalar_type().is_none_or(|t| !t.is_token_type()) => {
                    return Err(at(format!(
                        "{what} need an integer token dtype, but the dataset's records are {}",
                        r.manifest_descr()
                    )));
                }
                Some(_) => {}
                None => return Err(at(format!("{what} need --dtype (the token type)"))),
            }
            let path = path.to_path_buf();
            Ok(if kind == Kind::Jsonl {
                Input::Jsonl { path }
            } else {
                Input::Table { path }
            })
        }
        Kind::Raw => {
            let Some(r) = record.as_ref() else {
                let npy = path
                    .extension()
                    .is_some_and(|e| e.eq_ignore_ascii_case("npy"));
                return Err(at(if npy {
                    "a headerless .npy (raw tokens, as Dolma writes OLMo's token files) needs \
                     --dtype (the token type, e.g. u32 for OLMo 2)"
                        .into()
                } else {
                    "raw input needs --dtype (the token type)".into()
                }));
            };
            let itemsize = r.itemsize() as u64;
            if !len.is_multiple_of(itemsize) {
                return Err(at(format!(
                    "{len} bytes is not a whole number of {} records ({itemsize} bytes each); \
                     is --dtype right?",
                    r.manifest_descr()
                )));
            }
            if let Some(t) = r.scalar_type()
                && !options.force
                && let Some(g) = sniff::width(file, 0, len, t).map_err(|e| Error::io(path, e))?
            {
                let like = g.looks_like;
                return Err(at(format!(
                    "read as {t}, {}: this looks like {like} tokens; pass --dtype {like}, or \
                     --force if {t} is right",
                    g.evidence
                )));
            }
            Ok(Input::Records {
                path: path.to_path_buf(),
                offset: 0,
                bytes: len,
                kind,
                native: Native::None,
            })
        }
        Kind::Llmc {
            magic,
            version,
            dtype,
            tokens,
        } => {
            let what = format!("llm.c shard of {dtype} tokens (magic {magic}, version {version})");
            if let Some(flag) = options.dtype
                && flag != dtype
            {
                return Err(at(format!(
                    "{what} but --dtype is {flag}: leave --dtype out (the header defines the \
                     token type)"
                )));
            }
            let found = RecordType::scalar(dtype);
            match record {
                None => *record = Some(found),
                Some(want) if *want != found => {
                    return Err(at(format!(
                        "{what} but the dataset's records are {} (defined by an earlier \
                         input): pack them into separate datasets",
                        want.manifest_descr()
                    )));
                }
                Some(_) => {}
            }
            Ok(Input::Records {
                path: path.to_path_buf(),
                offset: sniff::LLMC_HEADER,
                bytes: tokens * dtype.size() as u64,
                kind,
                native: Native::None,
            })
        }
        Kind::Npy => check_npy(path, file, len, record),
    }
}

/// Checks a `.npy` input: a 1-D array (Fortran order is refused for more dimensions) of a
/// record type pack supports, whose header promises exactly the bytes the file holds.
fn check_npy(
    path: &Path,
    file: &dyn ReadAt,
    len: u64,
    record: &mut Option<RecordType>,
) -> Result<Input> {
    let at = |msg: String| Error::invalid(format!("{}: {msg}", path.display()));
    let head =
        sniff::read_at(file, 0, len.min(65536 + 16) as usize).map_err(|e| Error::io(path, e))?;
    let header = npy::parse_header(&head).map_err(|e| at(e.to_string()))?;
    if header.descr.trim_start_matches(['|', '<', '>', '=']) == "O" {
        return Err(at(
            "array of Python objects (dtype object), not token ids: convert it with \
             np.save(FILE, np.asarray(arr, dtype='uint32'))"
                .into(),
        ));
    }
    let found = RecordType::from_descr(&header.descr).map_err(|e| {
        at(format!(
            "array dtype {} cannot be packed: {e}",
            header.descr
        ))
    })?;
    match record {
        None => *record = Some(found.clone()),
        Some(want) if *want != found => {
            let hint = match found.scalar_type() {
                Some(t) if t.is_token_type() => format!("pass --dtype {t} or convert"),
                _ => "convert".to_string(),
            };
            return Err(at(format!(
                "array dtype is {} ({}) but the dataset's records are {}: {hint} with \
                 arr.astype({:?})",
                found
                    .scalar_type()
                    .map_or_else(|| "structured".to_string(), |t| t.to_string()),
                header.descr,
                want.manifest_descr(),
                want.manifest_descr()
            )));
        }
        Some(_) => {}
    }
    if header.fortran_order && header.shape.len() > 1 {
        return Err(at(format!(
            "Fortran-order array of shape {:?}; pack takes 1-D arrays: save it as one with \
             np.save(FILE, np.ascontiguousarray(arr).reshape(-1))",
            header.shape
        )));
    }
    let [count] = header.shape[..] else {
        return Err(at(format!(
            "array has shape {:?}; pack takes 1-D arrays (flatten it with arr.reshape(-1))",
            header.shape
        )));
    };
    let itemsize = found.itemsize() as u64;
    let data_bytes = count
        .checked_mul(itemsize)
        .ok_or_else(|| at(format!("shape {count} overflows")))?;
    if header.data_offset.checked_add(data_bytes) != Some(len) {
        return Err(at(format!(
            "header promises {count} elements ({data_bytes} bytes after a {}-byte header) but \
             the file is {len} bytes: truncated or not a plain array",
            header.data_offset
        )));
    }
    Ok(Input::Records {
        path: path.to_path_buf(),
        offset: header.data_offset,
        bytes: data_bytes,
        kind: Kind::Npy,
        native: Native::None,
    })
}

/// A token file with its own index beside it: Megatron-LM `PREFIX.bin` with `PREFIX.idx`,
/// datatrove `X.ds` with `X.ds.index`. The index is checked in full (O(entries), once, at
/// pack) and gives the token type (the `.ds.metadata` for datatrove, else `--dtype`) and
/// the documents. `None` for any other file.
fn check_indexed(
    path: &Path,
    record: &mut Option<RecordType>,
    options: &PackOptions,
) -> Result<Option<Input>> {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let (native, dtype, bytes, what) =
        if name.ends_with(".bin") && megatron::idx_path(path).is_file() {
            let (index, idx) = MegatronIndex::open_files(path)?;
            index.verify(&idx)?;
            let dtype = index.dtype();
            let bytes = index.tokens() * dtype.size() as u64;
            let what = format!("Megatron-LM dataset of {dtype} tokens (its .idx)");
            let unit = options.megatron_unit;
            (Native::Megatron(index, idx, unit), dtype, bytes, what)
        } else if name.ends_with(".ds") && datatrove::companions(path).0.is_file() {
            let want = record.as_ref().and_then(RecordType::scalar_type);
            let (file, index) = DatatroveFile::open_files(path, options.dtype.or(want))?;
            file.verify(&index)?;
            let dtype = file.dtype();
            let bytes = file.tokens() * dtype.size() as u64;
            let what = format!("datatrove file of {dtype} tokens");
            (Native::Datatrove(file, index), dtype, bytes, what)
        } else {
            return Ok(None);
        };
    indexed(path, record, options, (native, dtype, bytes, &what)).map(Some)
}

/// The input of a token file with its own index (`native`), of `bytes` bytes of `dtype`
/// tokens (`what` it is, for messages).
pub(super) fn indexed(
    path: &Path,
    record: &mut Option<RecordType>,
    options: &PackOptions,
    (native, dtype, bytes, what): (Native, ScalarType, u64, &str),
) -> Result<Input> {
    agree(path, record, options.dtype, dtype, what)?;
    Ok(Input::Records {
        path: path.to_path_buf(),
        offset: 0,
        bytes,
        kind: Kind::Raw,
        native,
    })
}

/// The token type `found` that an input defines agrees with `--dtype` (`flag`) and with the
/// dataset's record type so far (set from it when nothing defined one yet).
fn agree(
    path: &Path,
    record: &mut Option<RecordType>,
    flag: Option<ScalarType>,
    found: ScalarType,
    what: &str,
) -> Result<()> {
    let at = |msg: String| Error::invalid(format!("{}: {msg}", path.display()));
    if let Some(flag) = flag
        && flag != found
    {
        return Err(at(format!(
            "{what} but --dtype is {flag}: leave --dtype out (the file defines the token type)"
        )));
    }
    let found = RecordType::scalar(found);
    match record {
        None => *record = Some(found),
        Some(want) if *want != found => {
            return Err(at(format!(
                "{what} but the dataset's records are {} (defined by an earlier input): pack \
                 them into separate datasets",
                want.manifest_descr()
            )));
        }
        Some(_) => {}
    }
    Ok(())
}

/// The input files `inputs` stand for, in order: a directory stands for its files in name
/// order (a Hugging Face `save_to_disk` directory for its shards in `state.json` order), a
/// path whose last component has `*` or `?` and does not exist for its matches in name
/// order. Companion files (`.idx` beside its `.bin`, `.ds.index`/`.ds.metadata`/`.ds.loss`
/// beside their `.ds`, a datatrove merger's total metadata beside its parts) go with their
/// token file when it is named too; named alone, a companion is refused by name.
pub(super) fn expand_inputs(inputs: &[PathBuf]) -> Result<Vec<PathBuf>> {
    let mut out: Vec<PathBuf> = Vec::new();
    for p in inputs {
        if remote::is_remote(p) {
            out.extend(super::remote_inputs::expand(p)?);
        } else if p.is_dir() {
            if p.join("state.json").is_file() || p.join("dataset_dict.json").is_file() {
                out.extend(super::formats::hf::disk_files(p)?);
                continue;
            }
            let mut files = list_dir(p, |_| true)?;
            files.retain(|f| !f.is_dir());
            if files.is_empty() {
                return Err(Error::invalid(format!(
                    "{}: an empty directory",
                    p.display()
                )));
            }
            out.extend(files);
        } else if !p.exists() && is_glob(p) {
            let pattern = p
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or("")
                .to_string();
            let dir = match p.parent() {
                Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
                _ => PathBuf::from("."),
            };
            let files = list_dir(&dir, |name| wildcard(&pattern, name))?;
            if files.is_empty() {
                return Err(Error::invalid(format!("{}: no file matches", p.display())));
            }
            out.extend(files);
        } else {
            out.push(p.clone());
        }
    }
    // Companions go with their token file.
    let named: std::collections::HashSet<PathBuf> = out.iter().cloned().collect();
    let mut result: Vec<PathBuf> = Vec::with_capacity(out.len());
    for p in out {
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let token_file = if name.ends_with(".idx") {
            let bin = megatron::bin_path(&p);
            (bin.is_file() || remote::is_remote(&bin)).then_some(bin)
        } else if remote::is_remote(&p) {
            // Remote datatrove files are refused by name (remote_inputs.rs).
            None
        } else if let Some(ds) = [".ds.index", ".ds.metadata", ".ds.loss"]
            .iter()
            .find_map(|suffix| name.strip_suffix(suffix))
        {
            let ds = p.with_file_name(format!("{ds}.ds"));
            if ds.is_file() {
                Some(ds)
            } else if let Some(total) = MergedTotal::find(&p)? {
                // A merger's total metadata beside its named parts: checked against them.
                if !total.parts.is_empty() && total.parts.iter().all(|part| named.contains(part)) {
                    let tokens = total
                        .parts
                        .iter()
                        .map(|part| DatatroveFile::open_files(part, None).map(|f| f.0.tokens()))
                        .collect::<Result<Vec<u64>>>()?;
                    total.check(&tokens)?;
                    continue;
                }
                None
            } else {
                None
            }
        } else {
            None
        };
        // A companion named without its token file stays, and is refused by name.
        if !token_file.is_some_and(|t| named.contains(&t)) {
            result.push(p);
        }
    }
    Ok(result)
}

pub(super) fn is_glob(p: &Path) -> bool {
    p.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.contains(['*', '?']))
}

/// The entries of `dir` whose names pass `keep`, sorted by name.
fn list_dir(dir: &Path, keep: impl Fn(&str) -> bool) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))? {
        let entry = entry.map_err(|e| Error::io(dir, e))?;
        let name = entry.file_name();
        if let Some(n) = name.to_str()
            && !n.starts_with('.')
            && keep(n)
        {
            files.push(entry.path());
        }
    }
    files.sort();
    Ok(files)
}

/// Whether `name` matches `pattern` (`*` any run of characters, `?` one character).
pub(super) fn wildcard(pattern: &str, name: &str) -> bool {
    let (p, n): (Vec<char>, Vec<char>) = (pattern.chars().collect(), name.chars().collect());
    // Iterative match with backtracking to the last `*`: O(len(p) * len(n)) at worst.
    let (mut i, mut j, mut star, mut mark) = (0usize, 0usize, None, 0usize);
    while j < n.len() {
        if i < p.len() && (p[i] == '?' || p[i] == n[j]) {
            i += 1;
            j += 1;
        } else if i < p.len() && p[i] == '*' {
            star = Some(i);
            mark = j;
            i += 1;
        } else if let Some(s) = star {
            i = s + 1;
            mark += 1;
            j = mark;
        } else {
            return false;
        }
    }
    p[i..].iter().all(|&c| c == '*')
}

#[cfg(test)]
mod tests {
    use super::wildcard;

    #[test]
    fn wildcards_match_like_a_shell() {
        assert!(wildcard("*.bin", "a.bin"));
        assert!(wildcard("part-*-0000?.npy", "part-3-00001.npy"));
        assert!(!wildcard("*.bin", "a.idx"));
        assert!(wildcard("*", "x"));
        assert!(!wildcard("a?c", "ac"));
        assert!(wildcard("*_train_*.bin", "fineweb_train_000001.bin"));
    }
}
