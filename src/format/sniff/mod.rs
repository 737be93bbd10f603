//! What an input file is: the one place `pack` recognises formats, before it trusts a file's
//! bytes as tokens.
//!
//! [`sniff`] looks at a file's name, its first and last 64 KiB and its size, and answers:
//! - a token format pack reads ([`Kind`]): headerless records (`Raw`), a numpy `.npy`
//!   (`Npy`), an llm.c shard (`Llmc`: 256 little-endian int32 header words, `[0]` the magic,
//!   `[1]` the version, `[2]` the token count; magic 20240520 version 1 holds u16 tokens,
//!   magic 20240801 version 7 u32 tokens, after the 1,024 header bytes) or JSON Lines
//!   documents (`Jsonl`, by extension);
//! - or a [`Refusal`]: what the file is and what to do instead. Recognised by content (magic
//!   numbers, checked with enough structure that token data does not match by chance): parquet,
//!   Arrow IPC files and streams (Hugging Face `save_to_disk`), Megatron-LM `.idx`, llm.c eval
//!   files and llm.c shards of an unknown version or a wrong token count, gzip, zstd, bzip2,
//!   xz, lz4 frames, zip (PyTorch `.pt` too), tar; by name: datatrove's `.ds.index`,
//!   `.ds.loss` and `.ds.metadata`. By a heuristic (`--force` packs such a file anyway, for
//!   u8 byte-level tokens): JSON, JSON Lines under another extension, and plain text (the
//!   first 64 KiB, at least 16 bytes, is UTF-8 without control characters other than
//!   whitespace).
//!
//! The formats live in two tables, [`KNOWN`] (certain) and [`HEURISTIC`]; a new format is one
//! more row.
//!
//! The token width of a raw input (`width.rs`) is checked against `--dtype` from a fixed
//! sample.

use std::io;
use std::path::Path;

use super::dtype::ScalarType;
use super::npy;
use crate::storage::ReadAt;

/// Bytes of an llm.c shard header (256 little-endian int32 words).
pub const LLMC_HEADER: u64 = 1024;

/// llm.c token shards pack reads: (magic, version, token type).
pub const LLMC: [(u32, u32, ScalarType); 2] = [
    (20_240_520, 1, ScalarType::U16),
    (20_240_801, 7, ScalarType::U32),
];

/// Bytes read from the start and from the end of a file to recognise it.
pub(crate) const PROBE: usize = (64 << 10) + 64;

/// What pack reads from a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Headerless little-endian records: the whole file (nanoGPT `train.bin`, Megatron-LM
    /// `.bin`, datatrove `.ds`).
    Raw,
    /// A numpy `.npy` array (`format/npy.rs` parses its header).
    Npy,
    /// An llm.c token shard: `tokens` tokens of `dtype` after the [`LLMC_HEADER`] bytes.
    Llmc {
        /// The magic number (header word 0).
        magic: u32,
        /// The version (header word 1).
        version: u32,
        /// The token type the magic and version define.
        dtype: ScalarType,
        /// The token count (header word 2), checked against the file size.
        tokens: u64,
    },
    /// JSON Lines documents (`.jsonl`, `.ndjson`).
    Jsonl,
    /// A table of token lists (parquet, Arrow IPC file or stream: Hugging Face `datasets`),
    /// which a copy converts (`pack/formats/hf`).
    Table,
}

impl Kind {
    /// The name the manifest records for a shard referenced in place (`source_format`).
    pub(crate) fn source_format(&self) -> &'static str {
        match self {
            Kind::Raw => "raw",
            Kind::Npy => "npy",
            Kind::Llmc { .. } => "llmc",
            Kind::Jsonl => "jsonl",
            Kind::Table => "table",
        }
    }
}

/// A file that does not hold token records.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Refusal {
    /// What the file is (for a format in the tables: "..., not token ids").
    pub what: String,
    /// What to do instead.
    pub todo: String,
    /// Recognised by a heuristic rather than a magic number: `--force` packs it anyway.
    pub heuristic: bool,
}

/// What is known of a file when it is sniffed.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Probe<'a> {
    /// The file name, as given (not lowercased).
    pub name: &'a str,
    /// The first bytes (up to [`PROBE`]).
    pub head: &'a [u8],
    /// The last bytes (up to [`PROBE`]).
    pub tail: &'a [u8],
    /// The file size.
    pub len: u64,
}

impl Probe<'_> {
    fn starts(&self, magic: &[u8]) -> bool {
        self.head.starts_with(magic)
    }

    fn ends(&self, magic: &[u8]) -> bool {
        self.tail.ends_with(magic)
    }

    fn named(&self, suffix: &str) -> bool {
        self.name.to_ascii_lowercase().ends_with(suffix)
    }

    fn u32_at(&self, at: usize) -> Option<u32> {
        let b = self.head.get(at..at + 4)?;
        Some(u32::from_le_bytes(b.try_into().expect("4 bytes")))
    }
}

/// One recognisable format that is not token records.
pub(crate) struct Known {
    /// Whether the file is this format.
    pub test: fn(&Probe<'_>) -> bool,
    /// What it is, as the refusal names it.
    pub what: fn(&Probe<'_>) -> String,
    /// What to do instead.
    pub todo: fn(&Probe<'_>) -> String,
}

/// What to do with a table of token lists: `read` is the Python expression that loads it.
fn table_todo(read: &str) -> String {
    format!(
        "pack it without --in-place (pack converts its token column, one document per row), or \
         write the column as a 1-D .npy, e.g. in Python: table = {read}; \
         np.save('tokens.npy', np.concatenate(table['input_ids'].to_numpy(zero_copy_only=False)))"
    )
}

/// The first entries of [`KNOWN`]: tables of token lists, which a copy converts.
pub(crate) const TABLES: usize = 3;

/// Formats recognised with certainty (magic numbers with structure, or datatrove's names).
/// Checked first, in this order.
pub(crate) const KNOWN: &[Known] = &[
    Known {
        test: |p| p.len >= 12 && p.starts(b"PAR1") && (p.ends(b"PAR1") || p.ends(b"PARE")),
        what: |_| "parquet table".into(),
        todo: |_| table_todo("pyarrow.parquet.read_table(FILE, columns=['input_ids'])"),
    },
    Known {
        test: |p| p.starts(b"ARROW1\0\0"),
        what: |_| "Arrow IPC file".into(),
        todo: |_| table_todo("pyarrow.ipc.open_file(FILE).read_all()"),
    },
    Known {
        test: arrow_stream,
        what: |_| "Arrow IPC stream (as Hugging Face datasets save_to_disk writes)".into(),
        todo: |_| {
            table_todo(
                "pyarrow.ipc.open_stream(FILE).read_all() (or datasets.load_from_disk(DIR).data.table)",
            )
        },
    },
    Known {
        test: |p| p.starts(b"MMIDIDX\0\0"),
        what: |p| match megatron_dtype(p.head.get(17).copied()) {
            Some(t) => format!("Megatron-LM index (.idx) of {t} tokens"),
            None => "Megatron-LM index (.idx)".into(),
        },
        todo: |_| {
            "pack the matching PREFIX.bin instead (the .idx beside it gives its token type and \
             documents), or the directory"
                .into()
        },
    },
    Known {
        test: |p| p.u32_at(0) == Some(20_240_522) && p.u32_at(4) == Some(1),
        what: |_| "llm.c eval file (multiple-choice examples, magic 20240522)".into(),
        todo: |_| {
            "it holds evaluation examples, not a token stream: pack the train .bin shards".into()
        },
    },
    Known {
        test: |p| p.named(".ds.index"),
        what: |_| "datatrove document index (.ds.index: u64 document ends)".into(),
        todo: |_| {
            "pack the matching .ds token file instead (its .ds.index beside it gives the \
             documents), or the directory"
                .into()
        },
    },
    Known {
        test: |p| p.named(".ds.loss"),
        what: |_| "datatrove loss mask (.ds.loss: one byte per token)".into(),
        todo: |_| "pack the matching .ds token file instead; leave .ds.loss out of the glob".into(),
    },
    Known {
        test: |p| p.named(".ds.metadata"),
        what: |_| "datatrove metadata (.ds.metadata: tokenizer and token count, text)".into(),
        todo: |_| {
            "pack the matching .ds token file instead; leave .ds.metadata out of the glob".into()
        },
    },
    Known {
        test: |p| p.len >= 18 && p.starts(&[0x1f, 0x8b, 0x08]) && p.head[3] & 0xe0 == 0,
        what: |_| "gzip-compressed file".into(),
        todo: |_| "decompress it first (gunzip -k FILE) and pack the result".into(),
    },
    Known {
        test: |p| p.len >= 9 && p.starts(&[0x28, 0xb5, 0x2f, 0xfd]) && p.head[4] & 0x08 == 0,
        what: |_| "zstd-compressed file".into(),
        todo: |_| "decompress it first (zstd -d FILE) and pack the result".into(),
    },
    Known {
        test: |p| {
            p.starts(b"BZh")
                && p.head.get(3).is_some_and(|b| (b'1'..=b'9').contains(b))
                && p.head.get(4..10).is_some_and(|m| {
                    m == [0x31, 0x41, 0x59, 0x26, 0x53, 0x59]
                        || m == [0x17, 0x72, 0x45, 0x38, 0x50, 0x90]
                })
        },
        what: |_| "bzip2-compressed file".into(),
        todo: |_| "decompress it first (bunzip2 -k FILE) and pack the result".into(),
    },
    Known {
        test: |p| p.starts(&[0xfd, b'7', b'z', b'X', b'Z', 0x00]),
        what: |_| "xz-compressed file".into(),
        todo: |_| "decompress it first (xz -dk FILE) and pack the result".into(),
    },
    Known {
        test: |p| p.len >= 7 && p.starts(&[0x04, 0x22, 0x4d, 0x18]) && p.head[4] >> 6 == 1,
        what: |_| "lz4 frame (compressed)".into(),
        todo: |_| "decompress it first (lz4 -d FILE) and pack the result".into(),
    },
    Known {
        test: |p| {
            (p.starts(b"PK\x03\x04") && p.tail.windows(4).any(|w| w == b"PK\x05\x06"))
                || (p.len == 22 && p.starts(b"PK\x05\x06"))
        },
        what: |p| {
            if torch_zip(p) {
                "PyTorch checkpoint (torch.save zip archive)".into()
            } else {
                "zip archive".into()
            }
        },
        todo: |p| {
            if torch_zip(p) {
                "load it and save the token tensor as a 1-D .npy: np.save('tokens.npy', \
                 torch.load(FILE).numpy())"
                    .into()
            } else {
                "extract it first (unzip FILE) and pack the token files inside".into()
            }
        },
    },
    Known {
        test: |p| p.head.get(257..262) == Some(b"ustar"),
        what: |_| "tar archive".into(),
        todo: |_| "extract it first (tar -xf FILE) and pack the token files inside".into(),
    },
];

/// Formats recognised by a heuristic (text where token ids belong): checked after the token
/// formats; `--force` packs such a file anyway.
pub(crate) const HEURISTIC: &[Known] = &[
    Known {
        test: |p| {
            text_start(p).is_some_and(|t| t.starts_with('{'))
                && text_start(p).is_some_and(|t| {
                    t.lines().filter(|l| !l.trim().is_empty()).take(2).count() == 2
                        && t.lines()
                            .filter(|l| !l.trim().is_empty())
                            .all(|l| l.trim_start().starts_with('{'))
                })
        },
        what: |_| "JSON Lines text".into(),
        todo: |_| {
            "to pack its documents, name it .jsonl (each line {\"tokens\": [...], \"meta\": \
             ...}); text must be tokenized first"
                .into()
        },
    },
    Known {
        test: |p| text_start(p).is_some_and(|t| t.starts_with(['{', '['])),
        what: |_| "JSON text".into(),
        todo: |_| {
            "shufflefs packs binary token ids: write them as a 1-D .npy (np.save('tokens.npy', \
             np.array(ids, dtype='uint32'))) or as .jsonl documents ({\"tokens\": [...]} per \
             line)"
                .into()
        },
    },
    Known {
        test: |p| text_start(p).is_some(),
        what: |_| "plain text".into(),
        todo: |_| "tokenize it first: shufflefs packs token ids, not text".into(),
    },
];

/// Megatron-LM's `DType` codes: 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64,
/// 7 float32, 8 uint16 (the `.idx` parser, `pack/formats/megatron`, reads them here too).
pub(crate) fn megatron_dtype(code: Option<u8>) -> Option<ScalarType> {
    Some(match code? {
        1 => ScalarType::U8,
        2 => ScalarType::I8,
        3 => ScalarType::I16,
        4 => ScalarType::I32,
        5 => ScalarType::I64,
        6 => ScalarType::F64,
        7 => ScalarType::F32,
        8 => ScalarType::U16,
        _ => return None,
    })
}

/// A zip whose first entry is `.../data.pkl`, as `torch.save` writes.
fn torch_zip(p: &Probe<'_>) -> bool {
    let name_len = p
        .head
        .get(26..28)
        .map(|b| u16::from_le_bytes([b[0], b[1]]) as usize);
    name_len
        .and_then(|n| p.head.get(30..30 + n))
        .is_some_and(|name| name.ends_with(b"data.pkl"))
}

/// An Arrow IPC stream: the continuation marker 0xFFFFFFFF, the metadata length, and a
/// flatbuffer `Message` whose header is a `Schema` (type 1) of a known metadata version
/// (V1..V5 = 0..4), as pyarrow's `RecordBatchStreamWriter` starts every stream.
fn arrow_stream(p: &Probe<'_>) -> bool {
    let h = p.head;
    if !h.starts_with(&[0xff; 4]) {
        return false;
    }
    let Some(len) = p.u32_at(4) else { return false };
    if len < 16 || len % 8 != 0 || 8 + u64::from(len) > p.len {
        return false;
    }
    let msg = &h[8..h.len().min(8 + len as usize)];
    let u16_at = |at: usize| {
        msg.get(at..at + 2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
    };
    let i32_at = |at: usize| {
        msg.get(at..at + 4)
            .map(|b| i32::from_le_bytes(b.try_into().expect("4 bytes")))
    };
    let check = || -> Option<bool> {
        let table = usize::try_from(i32_at(0)?).ok()?;
        let vtable =
            usize::try_from(i64::try_from(table).ok()? - i64::from(i32_at(table)?)).ok()?;
        let vt_len = usize::from(u16_at(vtable)?);
        let field = |i: usize| -> Option<usize> {
            let at = 4 + 2 * i;
            if at + 2 > vt_len {
                return Some(0);
            }
            u16_at(vtable + at).map(usize::from)
        };
        let version = match field(0)? {
            0 => 0,
            off => u16_at(table + off)?,
        };
        let header_type = match field(1)? {
            0 => 0,
            off => *msg.get(table + off)?,
        };
        Some(version <= 4 && header_type == 1)
    };
    check().unwrap_or(false)
}

/// The start of the file as text, when the head looks like text: at least 16 bytes, valid
/// UTF-8 (a character cut by the end of the head is fine), no control characters other than
/// tab, newline, carriage return and form feed, no NUL.
fn text_start<'a>(p: &Probe<'a>) -> Option<&'a str> {
    let h = p.head;
    if h.len() < 16 {
        return None;
    }
    let text = match std::str::from_utf8(h) {
        Ok(t) => t,
        // Cut inside a character at the end of a head shorter than the file.
        Err(e) if e.error_len().is_none() && (h.len() as u64) < p.len => {
            std::str::from_utf8(&h[..e.valid_up_to()]).ok()?
        }
        Err(_) => return None,
    };
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    text.chars()
        .all(|c| !c.is_control() || matches!(c, '\t' | '\n' | '\r' | '\x0c'))
        .then(|| text.trim_start())
}

/// Recognises a file from its name, head, tail and size (see the module docs).
pub(crate) fn sniff(p: &Probe<'_>) -> std::result::Result<Kind, Refusal> {
    let refuse = |k: &Known, heuristic| Refusal {
        what: format!("{}, not token ids", (k.what)(p)),
        todo: (k.todo)(p),
        heuristic,
    };
    if let Some(i) = KNOWN.iter().position(|k| (k.test)(p)) {
        if i < TABLES {
            return Ok(Kind::Table);
        }
        return Err(refuse(&KNOWN[i], false));
    }
    if p.starts(npy::MAGIC) {
        return Ok(Kind::Npy);
    }
    // A `.npy` without numpy's header is a raw array: Dolma's MemmapWriter writes OLMo's
    // token files that way (headerless u16/u32, named part-N-NNNNN.npy).
    if let Some(kind) = llmc(p) {
        return kind;
    }
    if p.named(".jsonl") || p.named(".ndjson") {
        return Ok(Kind::Jsonl);
    }
    if let Some(k) = HEURISTIC.iter().find(|k| (k.test)(p)) {
        return Err(refuse(k, true));
    }
    Ok(Kind::Raw)
}

/// An llm.c shard (a known magic in header word 0), checked: a known version, and the token
/// count in word 2 equal to what the file holds after the header.
fn llmc(p: &Probe<'_>) -> Option<std::result::Result<Kind, Refusal>> {
    let magic = p.u32_at(0)?;
    LLMC.iter().find(|(m, _, _)| *m == magic)?;
    let known = LLMC
        .iter()
        .map(|(m, v, t)| format!("magic {m} version {v} ({t} tokens)"))
        .collect::<Vec<_>>()
        .join(", ");
    let Some(version) = p.u32_at(4) else {
        return Some(Err(Refusal {
            what: format!("llm.c shard (magic {magic}) shorter than its 1,024-byte header"),
            todo: "it is truncated: re-write it with llm.c's write_datafile".into(),
            heuristic: false,
        }));
    };
    let Some(&(_, _, dtype)) = LLMC.iter().find(|(m, v, _)| *m == magic && *v == version) else {
        return Some(Err(Refusal {
            what: format!("llm.c shard of an unknown version (magic {magic}, version {version})"),
            todo: format!("this shufflefs reads {known}"),
            heuristic: false,
        }));
    };
    let count = p.u32_at(8).map(|c| c as i32);
    let size = dtype.size() as u64;
    let after = p.len.saturating_sub(LLMC_HEADER);
    match count {
        Some(n) if n >= 0 && p.len >= LLMC_HEADER && n as u64 * size == after => {
            Some(Ok(Kind::Llmc {
                magic,
                version,
                dtype,
                tokens: n as u64,
            }))
        }
        _ => {
            let n = count.map_or("no".to_string(), |n| n.to_string());
            let want = count.map_or(String::new(), |n| {
                format!(" ({} bytes)", i64::from(n) * size as i64)
            });
            Some(Err(Refusal {
                what: format!(
                    "llm.c shard (magic {magic}, version {version}) whose header says {n} \
                     tokens{want} but which holds {after} bytes after its 1,024-byte header"
                ),
                todo: "it is truncated or damaged: re-write it with llm.c's write_datafile".into(),
                heuristic: false,
            }))
        }
    }
}

/// Reads the head and tail of `file` (size `len`) and sniffs it ([`sniff`]).
pub(crate) fn sniff_file<R: ReadAt + ?Sized>(
    path: &Path,
    file: &R,
    len: u64,
) -> io::Result<std::result::Result<Kind, Refusal>> {
    let probe = (PROBE as u64).min(len);
    let mut parts = read_ranges(file, &[(0, probe as usize), (len - probe, probe as usize)])?;
    let tail = parts.pop().expect("two ranges");
    let head = parts.pop().expect("two ranges");
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    Ok(sniff(&Probe {
        name: &name,
        head: &head,
        tail: &tail,
        len,
    }))
}

/// Reads exactly `n` bytes at `offset`; a file that ends early is an error (it changed).
pub(crate) fn read_at<R: ReadAt + ?Sized>(file: &R, offset: u64, n: usize) -> io::Result<Vec<u8>> {
    Ok(read_ranges(file, &[(offset, n)])?.pop().expect("one range"))
}

/// Reads exactly each `(offset, len)` range of `file`, a remote object's all at once.
pub(crate) fn read_ranges<R: ReadAt + ?Sized>(
    file: &R,
    ranges: &[(u64, usize)],
) -> io::Result<Vec<Vec<u8>>> {
    let mut out: Vec<Vec<u8>> = ranges.iter().map(|&(_, n)| vec![0u8; n]).collect();
    if let Some(object) = file.as_remote() {
        let mut reads: Vec<_> = out
            .iter_mut()
            .zip(ranges)
            .map(|(buf, &(offset, _))| (object, offset, &mut buf[..]))
            .collect();
        crate::storage::remote::read_many(&mut reads)?;
        return Ok(out);
    }
    for (buf, &(offset, _)) in out.iter_mut().zip(ranges) {
        let mut done = 0;
        while done < buf.len() {
            match file.read_at(&mut buf[done..], offset + done as u64) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(out)
}

mod width;

#[cfg(test)]
mod tests;

pub(crate) use width::width;
#[cfg(test)]
use width::*;
