//! One error type for the whole crate, and the one place where errors become errno values.
//!
//! Messages follow one rule: say what happened, name the file (and offset, step) involved,
//! and say what to do about it. The FUSE adapter logs each failed request once, at the level
//! returned by [`Error::level`], and replies with [`Error::errno`] (exhaustive: a new variant
//! must choose its errno).
//!
//! What can be wrong with a dataset file is a [`CorruptKind`], one variant per kind of fault,
//! each with its message and its advice: the manifest (unparsable, of another version,
//! inconsistent), a listed file (missing, a link, not regular, on a pseudo filesystem, not
//! readable by the dataset's owner, resized, changed in place), a checksum that fails or a
//! checksum file of another shard, and corrupt document files. Every kind is `EIO` to a
//! reader and logged at error level.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

/// The end of every manifest validation message except the version's: what to do.
pub(crate) const EDITED: &str =
    "; the manifest is damaged or was edited: restore it or re-run `shufflefs pack`";

/// Result alias used throughout shufflefs.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in shufflefs.
#[derive(Debug)]
pub enum Error {
    /// A path component does not name an entry (bad spelling, number out of range).
    NotFound,
    /// A file was used where a directory is required.
    NotADirectory,
    /// A directory was used where a file is required.
    IsADirectory,
    /// Any attempt to modify the read-only tree.
    ReadOnly,
    /// An access the permission bits forbid (executing a file).
    PermissionDenied,
    /// Invalid user input: a CLI argument, an input file, a mount configuration.
    InvalidInput(String),
    /// The dataset on disk is not what its manifest says (a bad manifest; a missing, resized,
    /// changed or unreadable file). `path` names the offending file, `kind` what is wrong.
    Dataset {
        /// The file at fault.
        path: PathBuf,
        /// What is wrong (its message says what to do).
        kind: CorruptKind,
    },
    /// A shard returned fewer bytes than the manifest promises: it was truncated or replaced
    /// after the dataset was packed or mounted.
    ShortRead {
        /// The shard file.
        path: PathBuf,
        /// Byte offset inside the shard where the read started.
        offset: u64,
        /// Bytes wanted.
        wanted: usize,
        /// Bytes the shard delivered.
        got: usize,
    },
    /// A token value the served type cannot hold (`--out-dtype`): the read fails rather than
    /// serve a wrapped number.
    OutOfRange {
        /// The token value.
        value: i128,
        /// Its index in the dataset's record stream.
        record: u64,
        /// The served type (`--out-dtype`).
        out: &'static str,
    },
    /// A position of `S.pos.npy` (a token's offset in a document longer than 2^31 tokens)
    /// that its int32 type cannot hold: the read fails rather than serve a wrapped number.
    PositionOutOfRange {
        /// The position.
        value: u64,
    },
    /// An I/O error on a named file.
    Io {
        /// The file involved.
        path: PathBuf,
        /// Byte offset of the failed operation, when it was a positioned read.
        offset: Option<u64>,
        /// The underlying error.
        source: io::Error,
    },
}

impl Error {
    /// Shorthand for [`Error::InvalidInput`].
    pub(crate) fn invalid(message: impl Into<String>) -> Error {
        Error::InvalidInput(message.into())
    }

    /// Shorthand for [`Error::Dataset`].
    pub(crate) fn dataset(path: impl Into<PathBuf>, kind: CorruptKind) -> Error {
        Error::Dataset {
            path: path.into(),
            kind,
        }
    }

    /// An input file of `pack` that is not what it claims to be (a damaged or mismatched index,
    /// a table without a token column): `message` says what was found and what to do.
    pub(crate) fn input(path: impl Into<PathBuf>, message: impl Into<String>) -> Error {
        Error::dataset(path, CorruptKind::Input(message.into()))
    }

    /// Shorthand for [`Error::Io`] without an offset.
    pub(crate) fn io(path: impl Into<PathBuf>, source: io::Error) -> Error {
        Error::Io {
            path: path.into(),
            offset: None,
            source,
        }
    }

    /// The errno a FUSE reply carries for this error. Exhaustive on purpose: a new variant
    /// must choose its errno here.
    pub fn errno(&self) -> i32 {
        match self {
            Error::NotFound => libc::ENOENT,
            Error::NotADirectory => libc::ENOTDIR,
            Error::IsADirectory => libc::EISDIR,
            Error::ReadOnly => libc::EROFS,
            Error::PermissionDenied => libc::EACCES,
            Error::InvalidInput(_) => libc::EINVAL,
            Error::Dataset { .. } => libc::EIO,
            Error::ShortRead { .. } => libc::EIO,
            Error::OutOfRange { .. } | Error::PositionOutOfRange { .. } => libc::EOVERFLOW,
            Error::Io { source, .. } => match source.raw_os_error() {
                // Errors that would mislead a reader of a read-only tree become EIO.
                Some(code) if code != libc::ENOENT && code != libc::EROFS => code,
                _ => libc::EIO,
            },
        }
    }

    /// The file involved, if any.
    pub(crate) fn path(&self) -> Option<&Path> {
        match self {
            Error::Dataset { path, .. }
            | Error::ShortRead { path, .. }
            | Error::Io { path, .. } => Some(path),
            Error::NotFound
            | Error::NotADirectory
            | Error::IsADirectory
            | Error::ReadOnly
            | Error::PermissionDenied
            | Error::InvalidInput(_)
            | Error::OutOfRange { .. }
            | Error::PositionOutOfRange { .. } => None,
        }
    }

    /// What a log line about this error repeats per (`op`, errno, file): the key of the
    /// rate limit on repeated log lines (`logging.rs`).
    pub(crate) fn cause(&self, op: &str) -> String {
        match self.path() {
            Some(path) => format!("{op} errno {} {}", self.errno(), path.display()),
            None => format!("{op} errno {}", self.errno()),
        }
    }

    /// How loudly the FUSE adapter logs this error. Name probing (`ENOENT`) and write attempts
    /// are normal traffic from shells and tools; data errors are not.
    pub(crate) fn level(&self) -> log::Level {
        match self {
            Error::NotFound
            | Error::NotADirectory
            | Error::IsADirectory
            | Error::ReadOnly
            | Error::PermissionDenied
            | Error::InvalidInput(_) => log::Level::Debug,
            Error::Dataset { .. }
            | Error::ShortRead { .. }
            | Error::Io { .. }
            | Error::OutOfRange { .. }
            | Error::PositionOutOfRange { .. } => log::Level::Error,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::NotFound => write!(f, "no such file or directory"),
            Error::NotADirectory => write!(f, "not a directory"),
            Error::IsADirectory => write!(f, "is a directory"),
            Error::ReadOnly => write!(f, "shufflefs is read-only"),
            Error::PermissionDenied => write!(f, "permission denied"),
            Error::InvalidInput(message) => write!(f, "{message}"),
            Error::OutOfRange { value, record, out } => write!(
                f,
                "token {value} (record {record} of the dataset) does not fit --out-dtype {out}: \
                 mount with --out-dtype i64, or without --out-dtype"
            ),
            Error::PositionOutOfRange { value } => write!(
                f,
                "position {value} in a document does not fit S.pos.npy's int32: mount with \
                 --out-dtype i64 (positions as int64)"
            ),
            Error::Dataset { path, kind } => write!(f, "{}: {kind}", path.display()),
            Error::ShortRead {
                path,
                offset,
                wanted,
                got,
            } => write!(
                f,
                "{}: short read at offset {offset}: wanted {wanted} bytes, got {got}; \
                 the file changed after it was packed (re-pack or restore it)",
                path.display()
            ),
            Error::Io {
                path,
                offset: Some(offset),
                source,
            } => write!(f, "{}: read at offset {offset}: {source}", path.display()),
            Error::Io {
                path,
                offset: None,
                source,
            } => {
                // A remote error names its object already.
                let (path, source) = (path.display().to_string(), source.to_string());
                match source
                    .strip_prefix(&path)
                    .and_then(|s| s.strip_prefix(": "))
                {
                    Some(rest) => write!(f, "{path}: {rest}"),
                    None => write!(f, "{path}: {source}"),
                }
            }
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io { source, .. } => Some(source),
            Error::Dataset { kind, .. } => kind.source(),
            _ => None,
        }
    }
}

/// What is wrong with a file of a dataset ([`Error::Dataset`]). Each kind's message says what
/// happened and what to do; the file is named by the error.
#[derive(Debug)]
#[non_exhaustive]
pub enum CorruptKind {
    /// `manifest.json` is missing: the directory holds no dataset.
    NoManifest,
    /// `manifest.json` is a symbolic link.
    ManifestSymlink,
    /// `manifest.json` is a FIFO, device or directory.
    ManifestNotRegular,
    /// `manifest.json` is larger than any manifest `pack` writes.
    ManifestTooBig {
        /// Its size.
        size: u64,
        /// The most a manifest may have.
        max: u64,
    },
    /// `manifest.json` does not parse as a manifest (the parser's message).
    ManifestSyntax(String),
    /// `manifest.json` has a version this build does not read.
    ManifestVersion {
        /// Its version.
        version: u32,
        /// The versions this build reads.
        reads: std::ops::RangeInclusive<u32>,
    },
    /// `manifest.json` fails validation: which field, and why.
    Manifest(String),
    /// A listed file does not exist.
    Missing,
    /// A listed file is a symbolic link (never followed).
    Symlink,
    /// A listed file could not be opened because the process has too many files open.
    TooManyFiles(io::Error),
    /// A listed file could not be opened for another reason.
    Unopenable(io::Error),
    /// A principal of the dataset (its owner, ...) may not read the file (`access.rs`).
    OwnerCannotRead {
        /// Who, and why they count.
        who: String,
        /// The open's error as that principal.
        source: io::Error,
    },
    /// A non-root `--allow-other` mount of a dataset others control, and the file is not
    /// readable by every user.
    NotShared {
        /// Who else controls what the dataset names.
        who: String,
    },
    /// A listed file is not a regular file (`what`: "shard", "document file").
    NotRegular {
        /// What the manifest lists it as.
        what: &'static str,
    },
    /// A listed file is on a kernel pseudo filesystem (its name: "proc", "sysfs", ...).
    PseudoFilesystem(&'static str),
    /// A shard has another size than the manifest records.
    ShardSize {
        /// The file's size.
        actual: u64,
        /// Header bytes before its records (`ShardEntry::offset`).
        offset: u64,
        /// Bytes of records.
        bytes: u64,
    },
    /// A checksum or document file has another size than the manifest implies.
    FileSize {
        /// The file's size.
        actual: u64,
        /// The size the manifest implies.
        expected: u64,
    },
    /// An in-place shard of a version 2-3 manifest has another mtime than at pack.
    InPlaceModified,
    /// An in-place shard's sampled content is not the identity the manifest records.
    InPlaceContent {
        /// The identity the manifest records.
        hash: String,
        /// How many pages the identity samples.
        samples: u64,
    },
    /// Bytes of a file fail their block checksum.
    ChecksumMismatch {
        /// First byte of the block.
        start: u64,
        /// One past its last byte.
        end: u64,
        /// The block's number.
        block: u64,
    },
    /// A checksum file does not hash to what the manifest records for it: another shard's,
    /// or changed.
    ForeignChecksums {
        /// The hash the manifest records (as the manifest spells it).
        want: String,
        /// The file whose checksums these are.
        of: PathBuf,
    },
    /// `--verify-reads` on a shard without a checksum file.
    NoChecksums,
    /// The document files are inconsistent (what was found).
    Documents(String),
    /// An input of `pack` is not what it claims to be (what was found, what to do).
    Input(String),
    /// A read past the end of the stream (a bug of the caller).
    PastEnd {
        /// Bytes asked for.
        len: usize,
        /// Where the read started.
        offset: u64,
        /// Bytes in the stream.
        stream: u64,
    },
}

impl CorruptKind {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            CorruptKind::TooManyFiles(e)
            | CorruptKind::Unopenable(e)
            | CorruptKind::OwnerCannotRead { source: e, .. } => Some(e),
            _ => None,
        }
    }
}

impl fmt::Display for CorruptKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CorruptKind::NoManifest => write!(
                f,
                "no manifest: this directory holds no packed dataset (run `shufflefs pack` \
                 first; an interrupted pack leaves no manifest)"
            ),
            CorruptKind::ManifestSymlink => write!(
                f,
                "the manifest is a symbolic link, which shufflefs refuses to follow; replace \
                 it with the file itself (or mount the directory it is in)"
            ),
            CorruptKind::ManifestNotRegular => write!(
                f,
                "the manifest is not a regular file (a FIFO, device or directory): restore the \
                 manifest.json `shufflefs pack` wrote, or re-run `shufflefs pack`"
            ),
            CorruptKind::ManifestTooBig { size, max } => write!(
                f,
                "the manifest is {size} bytes, more than the {max} bytes a \
                 manifest may have: this is not a manifest `shufflefs pack` wrote; restore it \
                 or re-run `shufflefs pack`"
            ),
            CorruptKind::ManifestSyntax(e) => write!(
                f,
                "not a valid shufflefs manifest ({e}); re-run `shufflefs pack`"
            ),
            CorruptKind::ManifestVersion { version, reads } => write!(
                f,
                "manifest version {version} but this shufflefs reads versions {} to {}: re-run `shufflefs pack` with this version, or use the shufflefs \
                 that wrote it",
                reads.start(),
                reads.end()
            ),
            CorruptKind::Manifest(what) => write!(f, "{what}{EDITED}"),
            CorruptKind::Missing => write!(
                f,
                "file listed in the manifest is missing; restore it or re-run `shufflefs pack`"
            ),
            CorruptKind::Symlink => write!(
                f,
                "shard is a symbolic link, which shufflefs refuses to follow; replace it with \
                 the file itself"
            ),
            CorruptKind::TooManyFiles(e) => write!(
                f,
                "cannot open shard: {e}; the dataset has more files than this process may \
                 open: mount with a lower --max-open-shards, raise the open-file limit (ulimit \
                 -n), or re-pack with a larger --shard-size"
            ),
            CorruptKind::Unopenable(e) => write!(
                f,
                "cannot open shard: {e}; restore the file or re-run `shufflefs pack`"
            ),
            CorruptKind::OwnerCannotRead { who, source } => write!(
                f,
                "{who}, cannot read this file ({source}): a mount never serves bytes the \
                 dataset's owner could not read; make the file readable by them, or pack and \
                 mount the dataset as the file's owner (docs/OPERATIONS.md, \"Who may name \
                 which files\")"
            ),
            CorruptKind::NotShared { who } => write!(
                f,
                "not every user may read this file, and others can choose what this dataset \
                 names ({who}): a mount with --allow-other by a user other than root serves \
                 only files every user may read; make it readable by all (o+r, and o+x on its \
                 directories), mount without --allow-other, or mount as root, which opens \
                 each file with the dataset owner's permissions (docs/OPERATIONS.md, \"Who \
                 may name which files\")"
            ),
            CorruptKind::NotRegular { what } => write!(
                f,
                "{what} is not a regular file; replace it with the file `shufflefs pack` \
                 wrote, or re-run `shufflefs pack`"
            ),
            CorruptKind::PseudoFilesystem(fs) => write!(
                f,
                "this file is on a {fs} filesystem, a kernel interface and not dataset \
                 storage: a manifest may only name files of real filesystems; restore the \
                 manifest or re-run `shufflefs pack`"
            ),
            CorruptKind::ShardSize {
                actual,
                offset,
                bytes,
            } => {
                let header = match offset {
                    0 => String::new(),
                    n => format!(" ({n} header bytes and {bytes} of records)"),
                };
                write!(
                    f,
                    "shard is {actual} bytes but the manifest records {}{header}: it was \
                     truncated or modified after packing; restore it or re-run `shufflefs \
                     pack`",
                    offset + bytes
                )
            }
            CorruptKind::FileSize { actual, expected } => write!(
                f,
                "file is {actual} bytes but the manifest implies {expected}: it was modified \
                 after packing; re-run `shufflefs pack`"
            ),
            CorruptKind::InPlaceModified => write!(
                f,
                "this file is referenced in place and was modified after `pack --in-place`: \
                 re-run it to reference the new content"
            ),
            CorruptKind::InPlaceContent { hash, samples } => write!(
                f,
                "this file is referenced in place and its content is not what `pack \
                 --in-place` referenced (its size and {samples} sampled pages hash to another \
                 identity than {hash}): it was modified, or is another file; restore it or \
                 re-run `shufflefs pack --in-place`"
            ),
            CorruptKind::ChecksumMismatch { start, end, block } => write!(
                f,
                "bytes {start}..{end} fail their checksum (block {block}): the file changed \
                 after packing; restore it or re-run `shufflefs pack` (`shufflefs verify` \
                 checks every file)"
            ),
            CorruptKind::ForeignChecksums { want, of } => write!(
                f,
                "this checksum file does not hash to {want}, the hash the manifest records for the \
                 checksums of {}: it is another shard's (files swapped, or copied from another \
                 dataset) or it changed after packing; restore the dataset's files or re-run \
                 `shufflefs pack` (`shufflefs verify` checks every file)",
                of.display()
            ),
            CorruptKind::NoChecksums => write!(
                f,
                "--verify-reads needs block checksums, and this shard has none (an in-place \
                 dataset or one packed before format version 3): add them with `shufflefs \
                 verify --write-checksums DATASET_DIR`"
            ),
            CorruptKind::Input(what) => f.write_str(what),
            CorruptKind::Documents(what) => write!(
                f,
                "{what}: the document files are corrupt; re-run `shufflefs pack`"
            ),
            CorruptKind::PastEnd {
                len,
                offset,
                stream,
            } => write!(
                f,
                "read of {len} bytes at stream offset {offset} is past the end ({stream})"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_mapping() {
        assert_eq!(Error::NotFound.errno(), libc::ENOENT);
        assert_eq!(Error::ReadOnly.errno(), libc::EROFS);
        assert_eq!(Error::NotADirectory.errno(), libc::ENOTDIR);
        assert_eq!(Error::IsADirectory.errno(), libc::EISDIR);
        let short = Error::ShortRead {
            path: "s".into(),
            offset: 1,
            wanted: 2,
            got: 0,
        };
        assert_eq!(short.errno(), libc::EIO);
        let gone = Error::io("s", io::Error::from_raw_os_error(libc::ENOENT));
        assert_eq!(
            gone.errno(),
            libc::EIO,
            "a vanished shard must not look like a bad name"
        );
        let perm = Error::io("s", io::Error::from_raw_os_error(libc::EACCES));
        assert_eq!(perm.errno(), libc::EACCES);
        let other = Error::io("s", io::Error::other("x"));
        assert_eq!(other.errno(), libc::EIO);
    }

    #[test]
    fn messages_name_the_file() {
        let e = Error::dataset(
            "/d/manifest.json",
            CorruptKind::Manifest("bad version".into()),
        );
        assert!(
            e.to_string()
                .starts_with("/d/manifest.json: bad version; the manifest is")
        );
        let e = Error::ShortRead {
            path: "/d/shard-00001.bin".into(),
            offset: 40,
            wanted: 8,
            got: 3,
        };
        assert!(
            e.to_string()
                .starts_with("/d/shard-00001.bin: short read at offset 40")
        );
    }
}
