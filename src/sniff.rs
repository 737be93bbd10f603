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
//! # Token width
//!
//! [`width`] checks a raw input against the `--dtype` it is packed with, from a sample of at
//! most [`SAMPLE_BYTES`] (2 MiB): the whole records when they are that small, else
//! [`WINDOWS`] windows of [`WINDOW`] bytes at fixed offsets spread evenly from the first
//! record to the last (each starting 8-byte aligned relative to the first record), so the
//! check costs the same for any file size and gives the same answer every time. A value is
//! *small* when it is at most 7 or all ones (-1), and *beyond any vocabulary* above
//! [`BEYOND_VOCAB`] (2^19 = 524,288, twice the largest vocabulary in use, 262,144), or below
//! -65,536 for a signed type. Reading `--dtype` values in groups of `k` (`k * size` is 2, 4
//! or 8 bytes, the widest first):
//! - *looks wider*: in at least 25% of at least 256 groups the first value is not small,
//!   and the values after it are the high part of one wider token: all small in at least
//!   99.9% of the groups (u32 read as u16: every other u16 is 0 or 1, the high half of a token
//!   below 2^19), or the same as in the previous group in at least 99% while the first value
//!   changes in at least half (large positional values, whose high half grows slowly). Data
//!   of a small vocabulary stored at the declared width has no such alternation (its small
//!   values fall at every position), so it passes.
//! - *looks narrower* (`--dtype` of 4 or 8 bytes): at least half of at least 256 values are
//!   beyond any vocabulary, and their halves look like two tokens: the high half changes from
//!   one value to the next in at least half of them and its mean is at least a quarter of the
//!   low half's (u16 read as u32: the next token lands in the high half; large positional
//!   u32 values have a slowly growing high half and pass). The width named is the widest
//!   narrower one at which the values do not look narrower still.
//!
//! It cannot judge a file under 512 bytes of records, and a u8 `--dtype` only against wider
//! tokens below 2,048. A refusal names the width the file looks like; `--force` packs it as
//! declared.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

use crate::dtype::ScalarType;
use crate::npy;

/// Bytes of an llm.c shard header (256 little-endian int32 words).
pub(crate) const LLMC_HEADER: u64 = 1024;

/// llm.c token shards pack reads: (magic, version, token type).
pub(crate) const LLMC: [(u32, u32, ScalarType); 2] = [
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
    /// A numpy `.npy` array (npy.rs parses its header).
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
}

impl Kind {
    /// The name the manifest records for a shard referenced in place (`source_format`).
    pub(crate) fn source_format(&self) -> &'static str {
        match self {
            Kind::Raw => "raw",
            Kind::Npy => "npy",
            Kind::Llmc { .. } => "llmc",
            Kind::Jsonl => "jsonl",
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
        "write its token column as a 1-D .npy and pack that, e.g. in Python: table = {read}; \
         np.save('tokens.npy', np.concatenate(table['input_ids'].to_numpy(zero_copy_only=False)))"
    )
}

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
        todo: |p| {
            let dtype = megatron_dtype(p.head.get(17).copied())
                .filter(|t| t.is_token_type())
                .map_or(String::new(), |t| format!(" with --dtype {t}"));
            format!(
                "pack the matching PREFIX.bin{dtype} instead (its document boundaries are not \
                 read yet: the tokens are packed as one stream)"
            )
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
            "pack the matching .ds token file instead (its document boundaries are not read \
             yet: the tokens are packed as one stream); leave .ds.index, .ds.loss and \
             .ds.metadata out of the glob"
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

/// Megatron-LM's `DType` codes.
fn megatron_dtype(code: Option<u8>) -> Option<ScalarType> {
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
    if let Some(k) = KNOWN.iter().find(|k| (k.test)(p)) {
        return Err(refuse(k, false));
    }
    if p.starts(npy::MAGIC) {
        return Ok(Kind::Npy);
    }
    if p.named(".npy") {
        return Err(Refusal {
            what: "named .npy but has no numpy header (\\x93NUMPY)".into(),
            todo: "rename it if it is a raw token file".into(),
            heuristic: false,
        });
    }
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
pub(crate) fn sniff_file(
    path: &Path,
    file: &File,
    len: u64,
) -> io::Result<std::result::Result<Kind, Refusal>> {
    let head = read_at(file, 0, (PROBE as u64).min(len) as usize)?;
    let tail_len = (PROBE as u64).min(len);
    let tail = read_at(file, len - tail_len, tail_len as usize)?;
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
fn read_at(file: &File, offset: u64, n: usize) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; n];
    file.read_exact_at(&mut buf, offset)?;
    Ok(buf)
}

/// Sampled bytes at most: the whole records of a smaller input.
pub(crate) const SAMPLE_BYTES: u64 = 2 << 20;
/// Windows sampled from a larger input.
pub(crate) const WINDOWS: u64 = 16;
/// Bytes per window.
pub(crate) const WINDOW: u64 = SAMPLE_BYTES / WINDOWS;
/// Values above this are beyond any vocabulary (2^19).
pub(crate) const BEYOND_VOCAB: i128 = 1 << 19;
/// Fewest groups or values the width check judges.
const MIN_SAMPLES: u64 = 256;

/// The `(offset, length)` windows sampled from `bytes` bytes of records (offsets relative to
/// the first record): deterministic, 8-byte aligned, at most [`SAMPLE_BYTES`] in all.
pub(crate) fn sample_windows(bytes: u64) -> Vec<(u64, u64)> {
    if bytes <= SAMPLE_BYTES {
        return vec![(0, bytes)];
    }
    (0..WINDOWS)
        .map(|k| (((bytes - WINDOW) / (WINDOWS - 1) * k) & !7, WINDOW))
        .collect()
}

/// Why an input looks like tokens of another width.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct WidthGuess {
    /// The token type the data looks like.
    pub looks_like: ScalarType,
    /// What the sample showed, for the message.
    pub evidence: String,
}

/// The token type of `size` bytes with the signedness of `like` where one exists.
fn of_width(size: usize, like: ScalarType) -> ScalarType {
    let signed = matches!(like, ScalarType::I32 | ScalarType::I64);
    ScalarType::TOKEN_TYPES
        .into_iter()
        .filter(|t| t.size() == size)
        .min_by_key(|t| matches!(t, ScalarType::I32 | ScalarType::I64) != signed)
        .expect("a token type of 1, 2, 4 or 8 bytes")
}

/// Value `i` of `bytes` read as `t` (little-endian; sign-extended for signed types).
fn value(bytes: &[u8], i: usize, t: ScalarType) -> i128 {
    let s = t.size();
    let mut le = [0u8; 16];
    le[..s].copy_from_slice(&bytes[i * s..(i + 1) * s]);
    let v = i128::from_le_bytes(le);
    match t {
        ScalarType::I32 | ScalarType::I64 => {
            let shift = 128 - 8 * s as u32;
            (v << shift) >> shift
        }
        _ => v,
    }
}

fn small(v: i128, t: ScalarType) -> bool {
    let ones = (1i128 << (8 * t.size())) - 1;
    (-1..=7).contains(&v) || v == ones
}

fn beyond_vocab(v: i128) -> bool {
    !(-65_536..=BEYOND_VOCAB).contains(&v)
}

fn percent(n: u64, of: u64) -> String {
    format!("{:.1}%", n as f64 * 100.0 / of.max(1) as f64)
}

/// Checks sampled record bytes (whole windows, see [`sample_windows`]) against `declared`:
/// `Some` when they look like tokens of another width (the module docs give the rule).
pub(crate) fn width_of_samples(samples: &[Vec<u8>], declared: ScalarType) -> Option<WidthGuess> {
    let s = declared.size();
    // Wider: in groups of k values, the values after the first are the high part of one
    // wider token: small, or (positional-like data) nearly constant while the first varies.
    for w in [8usize, 4, 2].into_iter().filter(|&w| w > s) {
        let k = w / s;
        let (mut groups, mut high_small, mut low_big) = (0u64, 0u64, 0u64);
        let (mut pairs, mut high_same, mut low_same) = (0u64, 0u64, 0u64);
        for sample in samples {
            let mut prev: Option<&[u8]> = None;
            for g in sample.chunks_exact(w) {
                groups += 1;
                high_small += u64::from((1..k).all(|i| small(value(g, i, declared), declared)));
                low_big += u64::from(!small(value(g, 0, declared), declared));
                if let Some(p) = prev {
                    pairs += 1;
                    high_same += u64::from(p[s..] == g[s..]);
                    low_same += u64::from(p[..s] == g[..s]);
                }
                prev = Some(g);
            }
        }
        let enough = groups >= MIN_SAMPLES && low_big * 4 >= groups;
        let mostly_small = high_small * 1000 >= groups * 999;
        let near_constant = high_same * 100 >= pairs * 99 && low_same * 2 <= pairs;
        if enough && (mostly_small || near_constant) {
            let looks_like = of_width(w, declared);
            let (high, is) = if k == 2 {
                ("every second value".to_string(), "is")
            } else {
                (format!("{} of every {k} values", k - 1), "are")
            };
            let evidence = if mostly_small {
                format!(
                    "{high} {is} 0 (or small) in {} of {groups} sampled groups",
                    percent(high_small, groups)
                )
            } else {
                format!(
                    "{high} {is} the same from one group to the next in {} of {pairs} sampled \
                     groups while the others change",
                    percent(high_same, pairs)
                )
            };
            return Some(WidthGuess {
                looks_like,
                evidence: format!("{evidence}, as the high part of wider tokens"),
            });
        }
    }
    // Narrower: the widest narrower type at which the sample does not look narrower still.
    let (n, beyond) = narrower(samples, declared)?;
    let looks_like = [s / 2, s / 4]
        .into_iter()
        .filter(|&w| w >= 2)
        .map(|w| of_width(w, declared))
        .find(|&t| narrower(samples, t).is_none())
        .expect("2-byte tokens never look narrower");
    Some(WidthGuess {
        looks_like,
        evidence: format!(
            "{} of {n} sampled values are beyond any vocabulary (above {BEYOND_VOCAB}) and \
             their high halves look like tokens too",
            percent(beyond, n)
        ),
    })
}

/// Whether values of `t` (4 or 8 bytes) look like two narrower tokens each: at least half
/// are beyond any vocabulary, and the high half changes from one value to the next and is
/// not much smaller than the low half (unlike large positional values, whose high half grows
/// slowly). Returns (values, values beyond) when they do.
fn narrower(samples: &[Vec<u8>], t: ScalarType) -> Option<(u64, u64)> {
    let s = t.size();
    if s < 4 {
        return None;
    }
    let half = s / 2;
    let unsigned = |b: &[u8]| -> u128 {
        let mut le = [0u8; 16];
        le[..b.len()].copy_from_slice(b);
        u128::from_le_bytes(le)
    };
    let (mut n, mut beyond, mut changes) = (0u64, 0u64, 0u64);
    let (mut sum_lo, mut sum_hi) = (0u128, 0u128);
    for sample in samples {
        let mut prev_hi = None;
        for (i, v) in sample.chunks_exact(s).enumerate() {
            n += 1;
            beyond += u64::from(beyond_vocab(value(sample, i, t)));
            let (lo, hi) = (unsigned(&v[..half]), unsigned(&v[half..]));
            sum_lo += lo;
            sum_hi += hi;
            changes += u64::from(prev_hi.is_some_and(|p| p != hi));
            prev_hi = Some(hi);
        }
    }
    let alike = changes * 2 >= n && sum_hi * 4 >= sum_lo;
    (n >= MIN_SAMPLES && beyond * 2 >= n && alike).then_some((n, beyond))
}

/// Samples `bytes` bytes of records at `offset` of `file` and checks them against `declared`
/// ([`width_of_samples`]).
pub(crate) fn width(
    file: &File,
    offset: u64,
    bytes: u64,
    declared: ScalarType,
) -> io::Result<Option<WidthGuess>> {
    let mut samples = Vec::new();
    for (at, len) in sample_windows(bytes) {
        samples.push(read_at(file, offset + at, len as usize)?);
    }
    Ok(width_of_samples(&samples, declared))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn probe<'a>(name: &'a str, bytes: &'a [u8]) -> Probe<'a> {
        let cut = bytes.len().min(PROBE);
        Probe {
            name,
            head: &bytes[..cut],
            tail: &bytes[bytes.len() - cut..],
            len: bytes.len() as u64,
        }
    }

    fn refused(name: &str, bytes: &[u8]) -> Refusal {
        sniff(&probe(name, bytes)).expect_err(name)
    }

    /// `n` u16 tokens of a GPT-2-like vocabulary.
    fn u16_tokens(n: usize) -> Vec<u8> {
        (0..n as u64)
            .map(|i| ((i * 7919 + 13) % 50257) as u16)
            .flat_map(u16::to_le_bytes)
            .collect()
    }

    fn u32_tokens(n: usize, vocab: u64) -> Vec<u8> {
        (0..n as u64)
            .flat_map(|i| (((i * 7919 + 13) % vocab) as u32).to_le_bytes())
            .collect()
    }

    fn llmc_file(magic: i32, version: i32, count: i32, tokens: &[u8]) -> Vec<u8> {
        let mut header = [0i32; 256];
        header[..3].copy_from_slice(&[magic, version, count]);
        let mut out: Vec<u8> = header.iter().flat_map(|w| w.to_le_bytes()).collect();
        out.extend_from_slice(tokens);
        out
    }

    #[test]
    fn llmc_shards_of_both_versions() {
        let f = llmc_file(20240520, 1, 500, &u16_tokens(500));
        assert_eq!(
            sniff(&probe("a.bin", &f)),
            Ok(Kind::Llmc {
                magic: 20240520,
                version: 1,
                dtype: ScalarType::U16,
                tokens: 500
            })
        );
        let f = llmc_file(20240801, 7, 300, &u32_tokens(300, 128256));
        assert!(matches!(
            sniff(&probe("b.bin", &f)),
            Ok(Kind::Llmc {
                dtype: ScalarType::U32,
                tokens: 300,
                ..
            })
        ));
        let empty = llmc_file(20240520, 1, 0, &[]);
        assert!(matches!(
            sniff(&probe("e.bin", &empty)),
            Ok(Kind::Llmc { tokens: 0, .. })
        ));
        let r = refused("v.bin", &llmc_file(20240520, 2, 500, &u16_tokens(500)));
        assert!(
            r.what.contains("unknown version") && r.what.contains("version 2"),
            "{r:?}"
        );
        assert!(
            r.todo.contains("magic 20240801 version 7 (u32 tokens)"),
            "{r:?}"
        );
        let r = refused("n.bin", &llmc_file(20240520, 1, 501, &u16_tokens(500)));
        assert!(
            r.what.contains("says 501 tokens (1002 bytes)") && r.what.contains("holds 1000 bytes"),
            "{r:?}"
        );
        let r = refused("neg.bin", &llmc_file(20240801, 7, -4, &u32_tokens(4, 9)));
        assert!(r.what.contains("says -4 tokens"), "{r:?}");
        let r = refused("short.bin", &20240520u32.to_le_bytes());
        assert!(
            r.what.contains("shorter than its 1,024-byte header"),
            "{r:?}"
        );
        let r = refused("eval.bin", &llmc_file(20240522, 1, 10, &u16_tokens(100)));
        assert!(r.what.contains("llm.c eval file"), "{r:?}");
    }

    #[test]
    fn npy_and_jsonl() {
        let h = npy::header("'<u2'", &[3]).unwrap();
        let mut f = h.clone();
        f.extend_from_slice(&[1, 0, 2, 0, 3, 0]);
        assert_eq!(sniff(&probe("x.bin", &f)), Ok(Kind::Npy));
        let r = refused("x.npy", &u16_tokens(100));
        assert!(
            r.what.contains("named .npy but has no numpy header"),
            "{r:?}"
        );
        let doc = b"{\"tokens\": [1, 2, 3]}\n{\"tokens\": [4]}\n";
        assert_eq!(sniff(&probe("d.jsonl", doc)), Ok(Kind::Jsonl));
        assert_eq!(sniff(&probe("d.NDJSON", doc)), Ok(Kind::Jsonl));
        let r = refused("d.bin", doc);
        assert!(
            r.heuristic && r.what == "JSON Lines text, not token ids" && r.todo.contains(".jsonl")
        );
    }

    #[test]
    fn each_magic_is_refused_with_what_to_do() {
        let tokens = u16_tokens(64);
        let with = |head: &[u8], end: &[u8]| {
            let mut v = head.to_vec();
            v.extend_from_slice(&tokens);
            v.extend_from_slice(end);
            v
        };
        let mut megatron = b"MMIDIDX\0\0".to_vec();
        megatron.extend_from_slice(&1u64.to_le_bytes());
        megatron.push(8);
        megatron.extend_from_slice(&[0; 32]);
        let mut tar = vec![0u8; 1024];
        tar[257..263].copy_from_slice(b"ustar\0");
        // A local file header (30 bytes, the name length at 26) naming archive/data.pkl.
        let mut zip = b"PK\x03\x04\x14\0".to_vec();
        zip.resize(26, 0);
        zip.extend_from_slice(&[16, 0, 0, 0]);
        zip.extend_from_slice(b"archive/data.pkl");
        zip.extend_from_slice(&tokens);
        zip.extend_from_slice(b"PK\x05\x06\0\0\0\0\x01\0\x01\0\0\0\0\0\0\0\0\0\0\0");
        let cases: Vec<(&str, Vec<u8>, &str, &str)> = vec![
            ("t.parquet", with(b"PAR1", b"PAR1"), "parquet", "np.save"),
            (
                "t.arrow",
                with(b"ARROW1\0\0", b"ARROW1"),
                "Arrow IPC file",
                "ipc.open_file",
            ),
            (
                "t.idx",
                megatron,
                "Megatron-LM index (.idx) of u16",
                "PREFIX.bin with --dtype u16",
            ),
            (
                "a.ds.index",
                u16_tokens(16),
                "datatrove document index",
                ".ds token file",
            ),
            (
                "a.ds.loss",
                vec![1; 64],
                "datatrove loss mask",
                ".ds token file",
            ),
            (
                "a.ds.metadata",
                b"gpt2\n1000\n1.0 kT".to_vec(),
                "datatrove metadata",
                ".ds",
            ),
            (
                "t.gz",
                with(&[0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 2, 3], b""),
                "gzip",
                "gunzip",
            ),
            (
                "t.zst",
                with(&[0x28, 0xb5, 0x2f, 0xfd, 0x60], b""),
                "zstd",
                "zstd -d",
            ),
            ("t.bz2", with(b"BZh91AY&SY", b""), "bzip2", "bunzip2"),
            (
                "t.xz",
                with(&[0xfd, b'7', b'z', b'X', b'Z', 0, 0, 4], b""),
                "xz",
                "xz -dk",
            ),
            (
                "t.lz4",
                with(&[0x04, 0x22, 0x4d, 0x18, 0x64, 0x40], b""),
                "lz4",
                "lz4 -d",
            ),
            ("t.pt", zip.clone(), "PyTorch checkpoint", "torch.load"),
            ("t.tar", tar, "tar archive", "tar -xf"),
        ];
        for (name, bytes, what, todo) in cases {
            let r = refused(name, &bytes);
            assert!(!r.heuristic, "{name}");
            assert!(r.what.contains(what), "{name}: {r:?}");
            assert!(r.todo.contains(todo), "{name}: {r:?}");
        }
        let mut plain_zip = zip;
        plain_zip[30..46].copy_from_slice(b"archive/data.bin");
        assert_eq!(
            refused("t.zip", &plain_zip).what,
            "zip archive, not token ids"
        );
    }

    #[test]
    fn arrow_stream_as_pyarrow_writes_it() {
        // The first 48 bytes pyarrow 26 writes for a stream (a Schema message), then padding.
        let mut f = hex(
            "ff ff ff ff 08 01 00 00 10 00 00 00 00 00 0a 00 0e 00 06 00 05 00 08 00 0a 00 00 00 \
             00 01 04 00 10 00 00 00 00 00 0a 00 0c 00 00 00 04 00 08 00",
        );
        f.resize(8 + 0x108 + 64, 0);
        let r = refused("data-00000-of-00001.arrow", &f);
        assert!(r.what.contains("Arrow IPC stream"), "{r:?}");
        // A header type other than Schema, or random bytes after the marker, are not.
        let mut record_batch = f.clone();
        record_batch[29] = 3;
        assert_eq!(sniff(&probe("x.bin", &record_batch)), Ok(Kind::Raw));
        let mut noise = vec![0xff; 4];
        noise.extend_from_slice(&u16_tokens(200));
        assert_eq!(sniff(&probe("x.bin", &noise)), Ok(Kind::Raw));
    }

    fn hex(s: &str) -> Vec<u8> {
        let s: String = s.split_whitespace().collect();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn text_is_refused_by_heuristic_and_tokens_are_not_text() {
        let r = refused(
            "c.txt",
            b"First Citizen:\nBefore we proceed any further, hear me.\n",
        );
        assert!(
            r.heuristic && r.what == "plain text, not token ids",
            "{r:?}"
        );
        let r = refused("j.bin", b"  {\"input_ids\": [1, 2, 3, 4, 5, 6]}");
        assert!(r.heuristic && r.what == "JSON text, not token ids", "{r:?}");
        let r = refused("j.bin", "[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]\n".as_bytes());
        assert_eq!(r.what, "JSON text, not token ids");
        // UTF-8 cut at the end of the head of a longer file is still text.
        let mut long = format!("a{}", "é".repeat(PROBE));
        long.push('\n');
        assert!(
            refused("u.txt", long.as_bytes())
                .what
                .starts_with("plain text")
        );
        // Token data is not text: positional u8, u16 and u32 tokens, a short file.
        let u8s: Vec<u8> = (0..=255u8).collect();
        for bytes in [
            u8s,
            u16_tokens(4096),
            u32_tokens(4096, 128256),
            b"abcdefgh".to_vec(),
        ] {
            assert_eq!(sniff(&probe("t.bin", &bytes)), Ok(Kind::Raw));
        }
    }

    /// The width check on a whole buffer.
    fn guess(bytes: &[u8], declared: ScalarType) -> Option<ScalarType> {
        width_of_samples(&[bytes.to_vec()], declared).map(|g| g.looks_like)
    }

    #[test]
    fn width_of_wider_tokens_read_narrow() {
        use ScalarType::*;
        for vocab in [50257, 128256, 262144] {
            let u32s = u32_tokens(100_000, vocab);
            assert_eq!(guess(&u32s, U16), Some(U32), "vocab {vocab}");
            assert_eq!(guess(&u32s, U32), None);
            let u64s: Vec<u8> = u32s
                .chunks(4)
                .flat_map(|c| u64::from(u32::from_le_bytes(c.try_into().unwrap())).to_le_bytes())
                .collect();
            assert_eq!(guess(&u64s, U32), Some(U64));
            assert_eq!(guess(&u64s, I32), Some(I64));
            assert_eq!(guess(&u64s, U16), Some(U64));
            assert_eq!(guess(&u64s, U64), None);
        }
        // i64 with -100 (ignore index) among the tokens, read as i32.
        let i64s: Vec<u8> = (0..10_000i64)
            .flat_map(|i| (if i % 10 == 0 { -100 } else { i * 31 % 50257 }).to_le_bytes())
            .collect();
        assert_eq!(guess(&i64s, I32), Some(I64));
        assert_eq!(guess(&i64s, I64), None);
        // Small u16 tokens read as u8.
        let small: Vec<u8> = (0..10_000u16)
            .flat_map(|i| (i % 2000).to_le_bytes())
            .collect();
        assert_eq!(guess(&small, U8), Some(U16));
    }

    #[test]
    fn width_of_narrower_tokens_read_wide() {
        use ScalarType::*;
        let u16s = u16_tokens(100_000);
        assert_eq!(guess(&u16s, U32), Some(U16));
        assert_eq!(guess(&u16s, I32), Some(U16));
        assert_eq!(guess(&u16s, U64), Some(U16));
        assert_eq!(guess(&u16s, I64), Some(U16));
        let u32s = u32_tokens(100_000, 128256);
        assert_eq!(guess(&u32s, U64), Some(U32));
        assert_eq!(guess(&u32s, I64), Some(I32));
        let g = width_of_samples(&[u16s], U32).unwrap();
        assert!(
            g.evidence.contains("beyond any vocabulary (above 524288)"),
            "{g:?}"
        );
    }

    #[test]
    fn width_accepts_real_token_data_of_any_vocabulary() {
        use ScalarType::*;
        // Character-level u16 (vocabulary 65), byte-level u8, DNA (vocabulary 4), a
        // constant stream, GPT-2 u16, Llama-3 and Gemma u32, and positional data.
        let char_level: Vec<u8> = (0..50_000u64)
            .map(|i| ((i * 31 + i / 7) % 65) as u16)
            .flat_map(u16::to_le_bytes)
            .collect();
        let dna: Vec<u8> = (0..50_000u64)
            .map(|i| ((i * 2654435761) >> 7) as u16 % 4)
            .flat_map(u16::to_le_bytes)
            .collect();
        let bytes: Vec<u8> = (0..100_000u64).map(|i| (i * 131 % 251) as u8).collect();
        let zeros = vec![0u8; 100_000];
        let positional: Vec<u8> = (0..100_000u32)
            .flat_map(|i| (i as u16).to_le_bytes())
            .collect();
        let positional32: Vec<u8> = (0..100_000u32).flat_map(u32::to_le_bytes).collect();
        for (what, data, t) in [
            ("char-level", &char_level, U16),
            ("dna", &dna, U16),
            ("bytes", &bytes, U8),
            ("zeros u16", &zeros, U16),
            ("zeros u32", &zeros, U32),
            ("gpt-2", &u16_tokens(100_000), U16),
            ("llama-3", &u32_tokens(100_000, 128256), U32),
            ("llama-3 i32", &u32_tokens(100_000, 128256), I32),
            ("gemma", &u32_tokens(100_000, 262144), U32),
            ("positional u16", &positional, U16),
            ("positional u32", &positional32, U32),
        ] {
            assert_eq!(guess(data, t), None, "{what}");
        }
        // Large positional values (token i is i) at their own width, and read narrow.
        let pos32: Vec<u8> = (0..500_000u32)
            .map(|i| i * 20)
            .flat_map(u32::to_le_bytes)
            .collect();
        assert_eq!(
            guess(&pos32, U32),
            None,
            "positional u32 beyond the vocabulary bound"
        );
        assert_eq!(guess(&pos32, U64), Some(U32));
        let pos64: Vec<u8> = (0..200_000u64)
            .map(|i| i * 30_000)
            .flat_map(u64::to_le_bytes)
            .collect();
        assert_eq!(guess(&pos64, U64), None);
        assert_eq!(guess(&pos32, U16), Some(U32), "near-constant high halves");
        // Too few values to judge.
        assert_eq!(guess(&u32_tokens(100, 50257), U16), None);
    }

    #[test]
    fn sample_windows_are_fixed_aligned_and_bounded() {
        assert_eq!(sample_windows(1000), vec![(0, 1000)]);
        assert_eq!(sample_windows(SAMPLE_BYTES), vec![(0, SAMPLE_BYTES)]);
        for bytes in [SAMPLE_BYTES + 1, 1 << 30, 5 << 40, u64::MAX / 2] {
            let w = sample_windows(bytes);
            assert_eq!(w.len() as u64, WINDOWS);
            assert_eq!(w[0].0, 0);
            assert!(
                w.iter()
                    .all(|&(at, len)| at % 8 == 0 && len == WINDOW && at + len <= bytes)
            );
            assert!(
                w.windows(2).all(|p| p[0].0 + p[0].1 <= p[1].0),
                "disjoint, in order"
            );
            assert!(
                w[15].0 + WINDOW > bytes - 32,
                "the last window reaches the end"
            );
        }
    }
}
