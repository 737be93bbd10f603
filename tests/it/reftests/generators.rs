//! Proptest strategies: datasets and plans ([`TreeCase`]), operations on the tree ([`Op`]),
//! the spelling of names ([`Name`]), read ranges ([`Offset`], [`Size`]) and faults of the
//! storage behind the read path ([`Fault`]).
//!
//! Values are recipes resolved against the [`Reference`] at run time (a [`Sel`] picks among
//! whatever the tree has), so one operation list fits any case, and every value shrinks
//! towards the first choice: a shrunk failure reads as a short list of small choices.

use proptest::prelude::*;
use shufflefs::dtype::ScalarType;
use shufflefs::view::ViewConfig;

use crate::common::{Entry, Reference};

/// A choice among however many things there are: `Sel(k)` is thing `k mod len`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sel(pub u32);

impl Sel {
    pub fn of(self, len: u64) -> u64 {
        u64::from(self.0) % len.max(1)
    }

    pub fn pick<T: Copy>(self, xs: &[T]) -> T {
        xs[self.of(xs.len() as u64) as usize]
    }
}

fn sel() -> impl Strategy<Value = Sel> {
    any::<u32>().prop_map(Sel)
}

// ---------------------------------------------------------------------------------------------
// Datasets and plans

/// A dataset of random tokens and a stream-mode plan over it, mounted or not.
#[derive(Clone, Debug)]
pub struct TreeCase {
    pub dtype: ScalarType,
    pub tokens: u64,
    pub shard_records: u64,
    /// Seeds the tokens.
    pub data_seed: u64,
    pub window: u64,
    pub stride: u64,
    pub batch: u64,
    pub ranks: u64,
    pub seed: u64,
    pub epochs: u64,
    /// `--max-listing` (0: no bound).
    pub max_listing: u64,
    /// The step cache, as (step files it holds, prefetch depth).
    pub cache: Option<(u64, u64)>,
    /// FUSE threads (mounted cases).
    pub threads: usize,
}

impl TreeCase {
    pub fn config(&self) -> ViewConfig {
        ViewConfig {
            max_listing: self.max_listing,
            ..ViewConfig::stream(
                self.window,
                self.stride,
                self.batch,
                self.ranks,
                self.seed,
                self.epochs,
            )
        }
    }
}

/// Small datasets (up to ~10k tokens in up to ~40 shards) and plans whose windows cross shard
/// boundaries, overlap, leave gaps, and sometimes do not fill one global batch (refused).
pub fn tree_case() -> impl Strategy<Value = TreeCase> {
    let dtype = prop_oneof![
        Just(ScalarType::U8),
        Just(ScalarType::U16),
        Just(ScalarType::U32),
        Just(ScalarType::U64),
    ];
    let geometry = (1u64..=40, 1u64..=48, 0u64..=160, 0u64..=47);
    let plan = (1u64..=4, 1u64..=4, any::<u64>(), 1u64..=3);
    let listing = prop_oneof![4 => Just(0u64), 1 => 1u64..=12, 1 => Just(10_000)];
    let cache = prop_oneof![3 => Just(None), 1 => (1u64..=6, 0u64..=4).prop_map(Some)];
    (
        dtype,
        geometry,
        plan,
        listing,
        cache,
        1usize..=4,
        any::<u64>(),
        2u64..=40,
    )
        .prop_map(
            |(
                dtype,
                (window, stride, windows, extra),
                (batch, ranks, seed, epochs),
                max_listing,
                cache,
                threads,
                data_seed,
                shards,
            )| {
                // `windows + 1` windows, then a tail shorter than a stride.
                let tokens = window + stride * windows + extra % stride;
                TreeCase {
                    dtype,
                    tokens,
                    shard_records: tokens.div_ceil(shards).max(1),
                    data_seed,
                    window,
                    stride,
                    batch,
                    ranks,
                    seed,
                    epochs,
                    max_listing,
                    cache,
                    threads,
                }
            },
        )
}

// ---------------------------------------------------------------------------------------------
// Entries of the tree

/// A file of the tree, its numbers picked among those that exist.
#[derive(Clone, Copy, Debug)]
pub enum File {
    Info,
    Stats,
    StepNpy(Sel, Sel, Sel),
    StepJson(Sel, Sel, Sel),
    ObservationNpy(Sel),
    ObservationJson(Sel),
    LookupJson(Sel, Sel),
}

impl File {
    pub fn entry(self, r: &Reference) -> Entry {
        match self {
            File::Info => Entry::Info,
            File::Stats => Entry::Stats,
            File::StepNpy(e, k, s) => Entry::StepNpy(e.of(r.epochs), k.of(r.ranks), s.of(r.steps)),
            File::StepJson(e, k, s) => {
                Entry::StepJson(e.of(r.epochs), k.of(r.ranks), s.of(r.steps))
            }
            File::ObservationNpy(o) => Entry::ObservationNpy(o.of(r.n)),
            File::ObservationJson(o) => Entry::ObservationJson(o.of(r.n)),
            File::LookupJson(e, o) => Entry::LookupJson(e.of(r.epochs), o.of(r.n)),
        }
    }
}

pub fn file() -> impl Strategy<Value = File> {
    prop_oneof![
        1 => Just(File::Info),
        1 => Just(File::Stats),
        6 => (sel(), sel(), sel()).prop_map(|(e, r, s)| File::StepNpy(e, r, s)),
        4 => (sel(), sel(), sel()).prop_map(|(e, r, s)| File::StepJson(e, r, s)),
        2 => sel().prop_map(File::ObservationNpy),
        2 => sel().prop_map(File::ObservationJson),
        2 => (sel(), sel()).prop_map(|(e, o)| File::LookupJson(e, o)),
    ]
}

/// A directory of the tree.
#[derive(Clone, Copy, Debug)]
pub enum Dir {
    Root,
    Epochs,
    Epoch(Sel),
    Ranks(Sel),
    Rank(Sel, Sel),
    Steps(Sel, Sel),
    Observations,
    Lookup,
    LookupEpochs,
    LookupEpoch(Sel),
    LookupObservations(Sel),
}

impl Dir {
    pub fn entry(self, r: &Reference) -> Entry {
        match self {
            Dir::Root => Entry::Root,
            Dir::Epochs => Entry::Epochs,
            Dir::Epoch(e) => Entry::Epoch(e.of(r.epochs)),
            Dir::Ranks(e) => Entry::Ranks(e.of(r.epochs)),
            Dir::Rank(e, k) => Entry::Rank(e.of(r.epochs), k.of(r.ranks)),
            Dir::Steps(e, k) => Entry::Steps(e.of(r.epochs), k.of(r.ranks)),
            Dir::Observations => Entry::Observations,
            Dir::Lookup => Entry::Lookup,
            Dir::LookupEpochs => Entry::LookupEpochs,
            Dir::LookupEpoch(e) => Entry::LookupEpoch(e.of(r.epochs)),
            Dir::LookupObservations(e) => Entry::LookupObservations(e.of(r.epochs)),
        }
    }
}

pub fn dir() -> impl Strategy<Value = Dir> {
    prop_oneof![
        2 => Just(Dir::Root),
        1 => Just(Dir::Epochs),
        1 => sel().prop_map(Dir::Epoch),
        1 => sel().prop_map(Dir::Ranks),
        1 => (sel(), sel()).prop_map(|(e, r)| Dir::Rank(e, r)),
        4 => (sel(), sel()).prop_map(|(e, r)| Dir::Steps(e, r)),
        3 => Just(Dir::Observations),
        1 => Just(Dir::Lookup),
        1 => Just(Dir::LookupEpochs),
        1 => sel().prop_map(Dir::LookupEpoch),
        2 => sel().prop_map(Dir::LookupObservations),
    ]
}

// ---------------------------------------------------------------------------------------------
// Names

/// The names a directory holds, by its grammar (built from the reference's counts, not from
/// the code under test).
#[derive(Clone, Copy, Debug)]
pub enum Vocab {
    /// Fixed names.
    Fixed(&'static [&'static str]),
    /// Canonical decimals below the bound.
    Index(u64),
    /// Canonical decimals below the bound, each with every one of the suffixes.
    Files(u64, &'static [&'static str]),
}

pub const ROOT_NAMES: &[&str] = &["info.json", "stats.json", "epoch", "observation", "lookup"];
const ALL_FIXED: &[&str] = &[
    "info.json",
    "stats.json",
    "epoch",
    "observation",
    "lookup",
    "rank",
    "step",
];

impl Vocab {
    pub fn of(dir: Entry, r: &Reference) -> Vocab {
        match dir {
            Entry::Root => Vocab::Fixed(ROOT_NAMES),
            Entry::Epochs | Entry::LookupEpochs => Vocab::Index(r.epochs),
            Entry::Epoch(_) => Vocab::Fixed(&["rank"]),
            Entry::Ranks(_) => Vocab::Index(r.ranks),
            Entry::Rank(..) => Vocab::Fixed(&["step"]),
            Entry::Steps(..) => Vocab::Files(r.steps, &[".npy", ".json"]),
            Entry::Observations => Vocab::Files(r.n, &[".npy", ".json"]),
            Entry::Lookup => Vocab::Fixed(&["epoch"]),
            Entry::LookupEpoch(_) => Vocab::Fixed(&["observation"]),
            Entry::LookupObservations(_) => Vocab::Files(r.n, &[".json"]),
            _ => Vocab::Fixed(&[]),
        }
    }

    /// The bound of the level's numbers (fixed levels: numbers below 10 are as good as any).
    fn bound(self) -> u64 {
        match self {
            Vocab::Fixed(_) => 10,
            Vocab::Index(b) | Vocab::Files(b, _) => b.max(1),
        }
    }

    fn suffixes(self) -> &'static [&'static str] {
        match self {
            Vocab::Files(_, s) => s,
            _ => &[""],
        }
    }

    /// A canonical in-range name (fixed levels: one of their names).
    fn canonical(self, k: Sel) -> String {
        match self {
            Vocab::Fixed([]) => "x".to_string(),
            Vocab::Fixed(names) => k.pick(names).to_string(),
            Vocab::Index(b) => k.of(b).to_string(),
            Vocab::Files(b, s) => {
                let i = k.of(b * s.len() as u64);
                format!("{}{}", i / s.len() as u64, s[(i % s.len() as u64) as usize])
            }
        }
    }

    /// A number of the level (in range) and one of its suffixes.
    fn stem(self, k: Sel) -> (String, &'static str) {
        let s = self.suffixes();
        let i = k.of(self.bound() * s.len() as u64);
        (
            (i / s.len() as u64).to_string(),
            s[(i % s.len() as u64) as usize],
        )
    }
}

/// Whitespace, invisible and look-alike characters.
const SPACES: &[&str] = &[
    " ", "\t", "\n", "\r", "\x0b", "\x0c", "\u{a0}", "\u{2003}", "\u{3000}", "\u{200b}",
    "\u{feff}", "\u{85}",
];
/// Code points of the digit zero in scripts whose digits `char::is_numeric` accepts.
const UNICODE_ZEROS: &[u32] = &[
    0x660, 0x6F0, 0x7C0, 0x966, 0x9E6, 0xA66, 0xE50, 0xFF10, 0x1D7CE, 0x1D7D8, 0x1D7EC, 0x1D7F6,
    0x2080, 0x1040,
];
const SIGNS: &[&str] = &["+", "-", "++", "+-", "\u{2212}", "\u{ff0b}", "-0", "+0"];
pub const SUFFIX_VARIANTS: &[&str] = &[
    ".NPY",
    ".Npy",
    ".nPy",
    ".npY",
    ".JSON",
    ".Json",
    ".jSON",
    ".npy.npy",
    ".json.json",
    ".npy.json",
    ".json.npy",
    ".npy.",
    ".json.",
    ".",
    "",
    ".np",
    ".npz",
    ".jsonl",
    ".js",
    ".txt",
    " .npy",
    ".npy ",
    "..npy",
    "..json",
    ".npy~",
    ".npy.swp",
    "_npy",
    "npy",
    "json",
    ".\u{ff4e}py",
    "\u{ff0e}npy",
    ".n\u{200b}py",
    ".npy\u{0}",
    ".json/",
    ".npy\n",
];
pub const DOTS: &[&str] = &[
    ".",
    "..",
    "...",
    "....",
    ". ",
    " .",
    ".\t",
    "./",
    "../",
    ".\u{2024}",
    "\u{ff0e}",
    "\u{2024}",
    "\u{2025}",
    ".npy",
    ".json",
    "..npy",
    "...npy",
    "..json",
    "0.",
    "0..npy",
    ".0",
    ".0.npy",
    "0.0",
    "0..",
    "5.",
    ".5",
    "5..",
    "..5",
    "./5",
    "5/.",
];
pub const HUGE: &[&str] = &[
    "18446744073709551615",
    "18446744073709551616",
    "18446744073709551614",
    "99999999999999999999",
    "100000000000000000000",
    "340282366920938463463374607431768211456",
    "4294967296",
    "9223372036854775808",
];
const LONG: &[usize] = &[21, 64, 255, 256, 1000, 1024, 1025, 4000];

/// A decimal at or past a level's bound.
#[derive(Clone, Copy, Debug)]
pub enum Beyond {
    Bound,
    Above(u16),
    NearMax(u8),
    Any(u64),
}

/// How a looked-up name is spelled, relative to the names of the directory it is looked up in.
#[derive(Clone, Debug)]
pub enum Name {
    /// A name the directory holds, spelled canonically.
    Canonical(Sel),
    /// A decimal out of range (in a directory of fixed names: another level's name, or a
    /// number).
    OutOfRange(Beyond, Sel),
    /// Leading zeros (1 to 25) before a number of the level.
    LeadingZeros(u8, Sel),
    /// A sign before a number of the level.
    Sign(Sel, Sel),
    /// Whitespace inserted into a canonical name (at a character boundary).
    Space(Sel, Sel, Sel),
    /// Digits of a number written in another script (mask bit `i`: digit `i` replaced).
    UnicodeDigits(Sel, u32, Sel),
    /// A variant of the suffix of a number, or of a fixed name.
    Suffix(Sel, Sel),
    /// Numbers of 20 digits or more.
    Huge(Sel, Sel),
    /// Any bytes.
    Bytes(Vec<u8>),
    /// Edits of a canonical name: (what, where, byte).
    Edit(Sel, Vec<(u8, Sel, u8)>),
    /// A dot-like name, with or without a suffix.
    Dots(Sel, bool),
    /// A long name (21 to 4,000 bytes).
    Long(Sel, u8, Sel),
    /// Exactly these bytes (regressions).
    Literal(Vec<u8>),
}

impl Name {
    /// The bytes of the name in a directory holding `vocab`.
    pub fn spell(&self, vocab: Vocab) -> Vec<u8> {
        let digit = |zero: Sel, d: u32| char::from_u32(zero.pick(UNICODE_ZEROS) + d).unwrap();
        let name = match self {
            Name::Canonical(k) => vocab.canonical(*k),
            Name::OutOfRange(beyond, k) => match vocab {
                Vocab::Fixed(_) => match k.of(3) {
                    0 => k.pick(ALL_FIXED).to_string(),
                    1 => k.of(1000).to_string(),
                    _ => format!("{}{}", k.of(1000), k.pick(&[".npy", ".json"])),
                },
                _ => {
                    let b = vocab.bound();
                    let n = match *beyond {
                        Beyond::Bound => b,
                        Beyond::Above(d) => b + 1 + u64::from(d) % 1000,
                        Beyond::NearMax(d) => u64::MAX - u64::from(d % 3),
                        Beyond::Any(x) => b + x % (u64::MAX - b),
                    };
                    format!("{n}{}", vocab.stem(*k).1)
                }
            },
            Name::LeadingZeros(zeros, k) => {
                let (num, sfx) = vocab.stem(*k);
                format!("{}{num}{sfx}", "0".repeat(usize::from(1 + zeros % 25)))
            }
            Name::Sign(sign, k) => {
                let (num, sfx) = vocab.stem(*k);
                format!("{}{num}{sfx}", sign.pick(SIGNS))
            }
            Name::Space(k, at, space) => {
                let base = vocab.canonical(*k);
                let at = at.of(base.len() as u64 + 1) as usize;
                let at = if base.is_char_boundary(at) { at } else { 0 };
                format!("{}{}{}", &base[..at], space.pick(SPACES), &base[at..])
            }
            Name::UnicodeDigits(k, mask, zero) => {
                let (num, sfx) = vocab.stem(*k);
                let mut out: String = num
                    .chars()
                    .enumerate()
                    .map(|(i, c)| {
                        if mask >> (i % 32) & 1 == 1 {
                            digit(*zero, c.to_digit(10).unwrap())
                        } else {
                            c
                        }
                    })
                    .collect();
                if out == num {
                    out =
                        digit(*zero, num.chars().next().unwrap().to_digit(10).unwrap()).to_string();
                }
                format!("{out}{sfx}")
            }
            Name::Suffix(k, variant) => match vocab {
                Vocab::Fixed(names) if !names.is_empty() => {
                    let base = k.pick(names);
                    match variant.of(4) {
                        0 => base.to_uppercase(),
                        1 => format!("{base}{}", variant.pick(SUFFIX_VARIANTS)),
                        2 => base[..variant.of(base.len() as u64) as usize].to_string(),
                        _ => format!(
                            "{}{base}",
                            variant.pick(&[".", "_", "0", "5", " ", "\u{200b}"])
                        ),
                    }
                }
                _ => format!("{}{}", vocab.stem(*k).0, variant.pick(SUFFIX_VARIANTS)),
            },
            Name::Huge(kind, k) => {
                let sfx = vocab.stem(*k).1;
                let digits = match kind.of(3) {
                    0 => kind.pick(HUGE).to_string(),
                    1 => (0..20 + kind.of(11))
                        .map(|i| char::from(b'1' + ((u64::from(kind.0) >> (i % 16)) % 9) as u8))
                        .collect(),
                    _ => "9".repeat(21 + kind.of(280) as usize),
                };
                format!("{digits}{sfx}")
            }
            Name::Bytes(bytes) => return bytes.clone(),
            Name::Edit(k, edits) => {
                let mut b = vocab.canonical(*k).into_bytes();
                for &(op, at, byte) in edits {
                    let at = at.of(b.len() as u64 + 1) as usize;
                    let byte = if op & 8 == 0 {
                        b"0123456789.+- _njpysoNJPYSO"[usize::from(byte) % 27]
                    } else {
                        byte
                    };
                    match op % 5 {
                        0 if at < b.len() => b[at] = byte,
                        1 => b.insert(at, byte),
                        2 if at < b.len() && b.len() > 1 => {
                            b.remove(at);
                        }
                        3 if at + 1 < b.len() => b.swap(at, at + 1),
                        _ if at < b.len() => b.insert(at, b[at]),
                        _ => b.push(byte),
                    }
                }
                return b;
            }
            Name::Dots(k, with_suffix) => {
                let sfx = if *with_suffix { vocab.stem(*k).1 } else { "" };
                format!("{}{sfx}", k.pick(DOTS))
            }
            Name::Long(len, body, k) => {
                let len = len.pick(LONG);
                let (num, sfx) = vocab.stem(*k);
                let body = match body % 4 {
                    0 => "1".repeat(len),
                    1 => format!("{}{num}", "0".repeat(len)),
                    2 => format!("{num}{}", " ".repeat(len)),
                    _ => "a".repeat(len),
                };
                format!("{body}{sfx}")
            }
            Name::Literal(bytes) => return bytes.clone(),
        };
        name.into_bytes()
    }
}

pub fn name() -> impl Strategy<Value = Name> {
    let beyond = prop_oneof![
        Just(Beyond::Bound),
        any::<u16>().prop_map(Beyond::Above),
        any::<u8>().prop_map(Beyond::NearMax),
        any::<u64>().prop_map(Beyond::Any),
    ];
    let bytes = prop_oneof![
        9 => prop::collection::vec(any::<u8>(), 1..=12),
        1 => prop::collection::vec(any::<u8>(), 1..=255),
    ];
    let edits = prop::collection::vec((any::<u8>(), sel(), any::<u8>()), 1..=3);
    prop_oneof![
        20 => sel().prop_map(Name::Canonical),
        8 => (beyond, sel()).prop_map(|(b, k)| Name::OutOfRange(b, k)),
        6 => (any::<u8>(), sel()).prop_map(|(z, k)| Name::LeadingZeros(z, k)),
        6 => (sel(), sel()).prop_map(|(s, k)| Name::Sign(s, k)),
        6 => (sel(), sel(), sel()).prop_map(|(k, at, s)| Name::Space(k, at, s)),
        6 => (sel(), any::<u32>(), sel()).prop_map(|(k, m, z)| Name::UnicodeDigits(k, m, z)),
        10 => (sel(), sel()).prop_map(|(k, v)| Name::Suffix(k, v)),
        6 => (sel(), sel()).prop_map(|(h, k)| Name::Huge(h, k)),
        10 => bytes.prop_map(Name::Bytes),
        14 => (sel(), edits).prop_map(|(k, e)| Name::Edit(k, e)),
        5 => (sel(), any::<bool>()).prop_map(|(k, s)| Name::Dots(k, s)),
        3 => (sel(), any::<u8>(), sel()).prop_map(|(l, b, k)| Name::Long(l, b, k)),
    ]
}

/// Whether a name can be one component of a path through the kernel (which resolves `.` and
/// `..` itself and never passes `/` or NUL).
pub fn one_component(name: &[u8]) -> bool {
    !name.is_empty() && name != b"." && name != b".." && !name.contains(&b'/') && !name.contains(&0)
}

// ---------------------------------------------------------------------------------------------
// Read ranges

/// Where a read starts, relative to the file's length.
#[derive(Clone, Copy, Debug)]
pub enum Offset {
    Zero,
    End,
    /// 1 to 8 bytes before the end.
    BeforeEnd(u8),
    /// Past the end, by up to 300,000 bytes.
    PastEnd(u32),
    /// Far past any file (2^32 .. 2^62).
    Far(Sel),
    /// A page boundary inside the file.
    Page(Sel),
    /// Anywhere from 0 to the end.
    Within(Sel),
    /// Exactly here (regressions).
    At(u64),
}

impl Offset {
    pub fn at(self, len: u64) -> u64 {
        match self {
            Offset::Zero => 0,
            Offset::End => len,
            Offset::BeforeEnd(k) => len.saturating_sub(1 + u64::from(k % 8)),
            Offset::PastEnd(k) => len + 1 + u64::from(k % 300_000),
            Offset::Far(k) => k.pick(&[1 << 32, 1 << 40, 1 << 50, 1 << 62]),
            Offset::Page(k) => k.of(len / 4096 + 1) * 4096,
            Offset::Within(k) => k.of(len + 1),
            Offset::At(x) => x,
        }
    }
}

/// How much a read asks for.
#[derive(Clone, Copy, Debug)]
pub enum Size {
    Zero,
    /// 1 to 16 bytes.
    Tiny(u8),
    /// 1 to 4,096 bytes.
    Page(u16),
    /// 0 to the file's length.
    Within(Sel),
    /// Up to the end of the file.
    ToEnd,
    /// Past the end of the file by 1 to 5,000 bytes.
    PastEnd(u16),
    /// The file's length plus up to 300,000 bytes (several FUSE requests).
    Large(u32),
    /// Exactly this (regressions).
    Exactly(u32),
}

impl Size {
    pub fn of(self, len: u64, offset: u64) -> usize {
        let rest = len.saturating_sub(offset.min(len));
        (match self {
            Size::Zero => 0,
            Size::Tiny(k) => 1 + u64::from(k % 16),
            Size::Page(k) => 1 + u64::from(k % 4096),
            Size::Within(k) => k.of(len + 1),
            Size::ToEnd => rest,
            Size::PastEnd(k) => rest + 1 + u64::from(k % 5000),
            Size::Large(k) => len + u64::from(k % 300_001),
            Size::Exactly(n) => u64::from(n),
        }) as usize
    }
}

pub fn offset() -> impl Strategy<Value = Offset> {
    prop_oneof![
        1 => Just(Offset::Zero),
        1 => Just(Offset::End),
        1 => any::<u8>().prop_map(Offset::BeforeEnd),
        1 => any::<u32>().prop_map(Offset::PastEnd),
        1 => sel().prop_map(Offset::Far),
        1 => sel().prop_map(Offset::Page),
        4 => sel().prop_map(Offset::Within),
    ]
}

pub fn size() -> impl Strategy<Value = Size> {
    prop_oneof![
        1 => Just(Size::Zero),
        1 => any::<u8>().prop_map(Size::Tiny),
        1 => any::<u16>().prop_map(Size::Page),
        1 => sel().prop_map(Size::Within),
        1 => Just(Size::ToEnd),
        1 => any::<u16>().prop_map(Size::PastEnd),
        1 => any::<u32>().prop_map(Size::Large),
    ]
}

/// How a mounted file is read (without a mount: one `ShuffleFs::read`).
#[derive(Clone, Copy, Debug)]
pub enum Method {
    /// `pread`.
    Pread,
    /// `lseek` then `read`.
    SeekRead,
    /// `mmap` from the page holding the offset (numpy's `mmap_mode='r'`).
    Mmap,
}

pub fn method() -> impl Strategy<Value = Method> {
    prop_oneof![
        Just(Method::Pread),
        Just(Method::SeekRead),
        Just(Method::Mmap)
    ]
}

// ---------------------------------------------------------------------------------------------
// Operations

/// One operation on the tree.
#[derive(Clone, Debug)]
pub enum Op {
    /// Look a name up in a directory.
    Lookup(Dir, Name),
    /// Look a name up in a file (ENOTDIR).
    LookupInFile(File, Name),
    /// Attributes of a file.
    Stat(File),
    /// Attributes of a directory.
    StatDir(Dir),
    /// Read a range of a file.
    Read(File, Offset, Size, Method),
    /// List a directory in pages of 1 to 8 entries, from an offset of the listing (without a
    /// mount; a mount lists it whole).
    Readdir(Dir, u8, Sel),
    /// Run the prefetches the reads queued (a cache without workers, no mount).
    Prefetch,
}

pub fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        20 => (dir(), name()).prop_map(|(d, n)| Op::Lookup(d, n)),
        2 => (file(), name()).prop_map(|(f, n)| Op::LookupInFile(f, n)),
        8 => file().prop_map(Op::Stat),
        4 => dir().prop_map(Op::StatDir),
        40 => (file(), offset(), size(), method()).prop_map(|(f, o, s, m)| Op::Read(f, o, s, m)),
        8 => (dir(), any::<u8>(), sel()).prop_map(|(d, p, s)| Op::Readdir(d, p, s)),
        4 => Just(Op::Prefetch),
    ]
}

pub fn ops(max: usize) -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec(op(), 1..=max)
}

// ---------------------------------------------------------------------------------------------
// Faults

/// What one read of a shard or document file does (the storage seam,
/// `Dataset::wrap_sources`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Reads the file.
    Pass,
    /// Fails with EIO (and scribbles over the buffer).
    Eio,
    /// Delivers fewer bytes than asked (1 to len - 1, chosen by the value).
    Short(u32),
    /// Reports the end of the file at once.
    Eof,
}

pub fn fault() -> impl Strategy<Value = Fault> {
    prop_oneof![
        2 => Just(Fault::Pass),
        2 => Just(Fault::Eio),
        2 => any::<u32>().prop_map(Fault::Short),
        1 => Just(Fault::Eof),
    ]
}

/// A read under faults: the faults the next shard reads meet, then the read.
#[derive(Clone, Debug)]
pub struct FaultyRead {
    pub faults: Vec<Fault>,
    pub file: File,
    pub offset: Offset,
    pub size: Size,
    /// Run the queued prefetches first (they meet the faults too).
    pub prefetch: bool,
}

pub fn faulty_read() -> impl Strategy<Value = FaultyRead> {
    (
        prop::collection::vec(fault(), 0..=4),
        file(),
        offset(),
        size(),
        any::<bool>(),
    )
        .prop_map(|(faults, file, offset, size, prefetch)| FaultyRead {
            faults,
            file,
            offset,
            size,
            prefetch,
        })
}
