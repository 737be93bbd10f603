//! One error type for the whole crate, and the one place where errors become errno values.
//!
//! Messages follow one rule: say what happened, name the file (and offset, step) involved,
//! and say what to do about it. The FUSE adapter logs each failed request once, at the level
//! returned by [`Error::level`], and replies with [`Error::errno`].

use std::fmt;
use std::io;
use std::path::PathBuf;

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
    /// The dataset on disk is not what its manifest says (bad manifest, missing or resized
    /// shard). `path` names the offending file.
    Dataset {
        /// The file at fault.
        path: PathBuf,
        /// What is wrong and how to fix it.
        message: String,
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
    pub fn invalid(message: impl Into<String>) -> Error {
        Error::InvalidInput(message.into())
    }

    /// Shorthand for [`Error::Dataset`].
    pub fn dataset(path: impl Into<PathBuf>, message: impl Into<String>) -> Error {
        Error::Dataset {
            path: path.into(),
            message: message.into(),
        }
    }

    /// Shorthand for [`Error::Io`] without an offset.
    pub fn io(path: impl Into<PathBuf>, source: io::Error) -> Error {
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
            Error::Io { source, .. } => match source.raw_os_error() {
                // Errors that would mislead a reader of a read-only tree become EIO.
                Some(code) if code != libc::ENOENT && code != libc::EROFS => code,
                _ => libc::EIO,
            },
        }
    }

    /// The file involved, if any.
    pub fn path(&self) -> Option<&std::path::Path> {
        match self {
            Error::Dataset { path, .. }
            | Error::ShortRead { path, .. }
            | Error::Io { path, .. } => Some(path),
            _ => None,
        }
    }

    /// What a log line about this error repeats per (`op`, errno, file): the key of the
    /// rate limit on repeated log lines (`logging.rs`).
    pub fn cause(&self, op: &str) -> String {
        match self.path() {
            Some(path) => format!("{op} errno {} {}", self.errno(), path.display()),
            None => format!("{op} errno {}", self.errno()),
        }
    }

    /// How loudly the FUSE adapter logs this error. Name probing (`ENOENT`) and write attempts
    /// are normal traffic from shells and tools; data errors are not.
    pub fn level(&self) -> log::Level {
        match self {
            Error::NotFound
            | Error::NotADirectory
            | Error::IsADirectory
            | Error::ReadOnly
            | Error::PermissionDenied
            | Error::InvalidInput(_) => log::Level::Debug,
            Error::Dataset { .. } | Error::ShortRead { .. } | Error::Io { .. } => log::Level::Error,
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
            Error::Dataset { path, message } => write!(f, "{}: {message}", path.display()),
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
            } => write!(f, "{}: {source}", path.display()),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io { source, .. } => Some(source),
            _ => None,
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
        let e = Error::dataset("/d/manifest.json", "bad version");
        assert_eq!(e.to_string(), "/d/manifest.json: bad version");
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
