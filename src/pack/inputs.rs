//! Checking pack's inputs before anything is written: what each file is (`format::sniff`),
//! its size, `.npy` header, dtype and shape, the llm.c token count, a raw file's sampled
//! content against `--dtype`'s width; the same checks for a copy and `--in-place`.

use std::fs::{self, File};
use std::io::Read;
use std::path::{Path, PathBuf};

use super::PackOptions;
use crate::error::{Error, Result};
use crate::format::dtype::RecordType;
use crate::format::npy;
use crate::format::sniff::{self, Kind};

/// One checked input.
#[derive(Debug)]
pub(super) enum Input {
    /// Records at `[offset, offset + bytes)` of a raw, `.npy` or llm.c file.
    Records {
        path: PathBuf,
        offset: u64,
        bytes: u64,
        kind: Kind,
    },
    /// A JSON Lines file of documents.
    Jsonl { path: PathBuf },
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
    let at = |msg: String| Error::invalid(format!("{}: {msg}", path.display()));
    // metadata before open: opening a FIFO would block.
    let meta = fs::metadata(path).map_err(|e| Error::io(path, e))?;
    if !meta.is_file() {
        return Err(at("not a regular file".into()));
    }
    let mut file = File::open(path).map_err(|e| Error::io(path, e))?;
    let len = meta.len();
    let kind = match sniff::sniff_file(path, &file, len).map_err(|e| Error::io(path, e))? {
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
        Kind::Jsonl => {
            match record {
                Some(r) if r.scalar_type().is_none_or(|t| !t.is_token_type()) => {
                    return Err(at(format!(
                        "JSON Lines documents need an integer token dtype, but the dataset's \
                         records are {}",
                        r.manifest_descr()
                    )));
                }
                Some(_) => {}
                None => return Err(at("JSON Lines input needs --dtype (the token type)".into())),
            }
            Ok(Input::Jsonl {
                path: path.to_path_buf(),
            })
        }
        Kind::Raw => {
            let Some(r) = record.as_ref() else {
                return Err(at("raw input needs --dtype (the token type)".into()));
            };
            let itemsize = r.itemsize() as u64;
            if len % itemsize != 0 {
                return Err(at(format!(
                    "{len} bytes is not a whole number of {} records ({itemsize} bytes each); \
                     is --dtype right?",
                    r.manifest_descr()
                )));
            }
            if let Some(t) = r.scalar_type()
                && !options.force
                && let Some(g) = sniff::width(&file, 0, len, t).map_err(|e| Error::io(path, e))?
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
            })
        }
        Kind::Npy => check_npy(path, &mut file, len, record),
    }
}

/// Checks a `.npy` input: a 1-D array (Fortran order is refused for more dimensions) of a
/// record type pack supports, whose header promises exactly the bytes the file holds.
fn check_npy(
    path: &Path,
    file: &mut File,
    len: u64,
    record: &mut Option<RecordType>,
) -> Result<Input> {
    let at = |msg: String| Error::invalid(format!("{}: {msg}", path.display()));
    let mut head = Vec::with_capacity(4096);
    file.take(65536 + 16)
        .read_to_end(&mut head)
        .map_err(|e| Error::io(path, e))?;
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
    })
}
