//! Logging setup: `env_logger` with the level from `-v`/`-q` (`RUST_LOG` still wins), writing
//! to a sink that can be switched at run time. A background daemon starts on stderr (so mount
//! errors reach the terminal), then moves to `--log-file` or syslog once it detaches.
//!
//! Lines that can repeat once per request (a failed read, an expired deadline) go through
//! `log_limited!`: per cause (what failed, the errno, the file) at most [`BURST`] lines per
//! `PERIOD`, then one line counting what was suppressed (written when the period ends, by
//! `flush_suppressed`, or at unmount). A broken shard read by every rank costs a few lines a
//! minute, not megabytes.
//!
//! `--log-file` is opened once, before the daemon forks, with `O_NOFOLLOW` and checked: a
//! regular file owned by the daemon's user with one link, so a symbolic or hard link planted
//! by another user cannot make the daemon append to a file it did not mean to.

use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::num::NonZeroUsize;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::sync::{LazyLock, Mutex};
use std::time::{Duration, Instant};

use env_logger::{Builder, Env, Target};
use lru::LruCache;

use crate::error::{Error, Result};

/// Where log lines go.
enum Sink {
    Stderr,
    File(std::fs::File),
    Syslog,
}

static SINK: Mutex<Sink> = Mutex::new(Sink::Stderr);

struct SwitchWriter;

impl Write for SwitchWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let mut sink = SINK.lock().unwrap_or_else(|p| p.into_inner());
        match &mut *sink {
            Sink::Stderr => {
                // A vanished terminal must not take the daemon down: ignore write errors.
                let _ = io::stderr().write_all(buf);
            }
            Sink::File(f) => {
                let _ = f.write_all(buf);
            }
            Sink::Syslog => {
                let text = String::from_utf8_lossy(buf);
                let line = text.trim_end().replace('\0', " ");
                let priority = syslog_priority(&line);
                if let Ok(c) = CString::new(line) {
                    // SAFETY: "%s" with one NUL-terminated string argument is a valid format
                    // call; `c` lives across the call.
                    unsafe { libc::syslog(priority, c"%s".as_ptr(), c.as_ptr()) };
                }
            }
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The syslog priority of a formatted line (`[time LEVEL target] message`).
fn syslog_priority(line: &str) -> libc::c_int {
    let head = line.get(..40).unwrap_or(line);
    if head.contains(" ERROR ") {
        libc::LOG_ERR
    } else if head.contains(" WARN ") {
        libc::LOG_WARNING
    } else if head.contains(" INFO ") {
        libc::LOG_INFO
    } else {
        libc::LOG_DEBUG
    }
}

/// Initializes logging. `verbosity` counts `-v` minus `-q`: 0 is `info` for shufflefs and
/// `warn` for dependencies.
pub fn init(verbosity: i8) {
    let level = match verbosity {
        i8::MIN..=-2 => "error",
        -1 => "warn",
        0 => "warn,shufflefs=info",
        1 => "info,shufflefs=debug",
        2 => "debug,shufflefs=trace",
        _ => "trace",
    };
    let _ = Builder::from_env(Env::default().default_filter_or(level))
        .format_timestamp_millis()
        .target(Target::Pipe(Box::new(SwitchWriter)))
        .try_init();
}

/// Opens `path` (absolute) for appending log lines, creating it (mode 0640) if missing. Refuses
/// a symbolic link (`O_NOFOLLOW`), anything but a regular file (`O_NONBLOCK`: a FIFO does not
/// block the open), a file owned by another user than the daemon's, and a file with more than
/// one hard link: each could make a daemon running as root append to a file its user did not
/// choose.
pub(crate) fn open_log_file(path: &Path) -> Result<File> {
    let refuse = |why: String| {
        Error::invalid(format!(
            "--log-file {}: {why}; name a file the daemon's user owns (or a new one in a \
             directory only that user can write to)",
            path.display()
        ))
    };
    let file = OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o640)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => refuse(
                "is a symbolic link, which the daemon does not follow (it could point at any \
                 file)"
                    .into(),
            ),
            // A FIFO without a reader (O_NONBLOCK: the open does not wait for one).
            Some(libc::ENXIO) => refuse("is not a regular file".into()),
            _ => Error::io(path, e),
        })?;
    let meta = file.metadata().map_err(|e| Error::io(path, e))?;
    if !meta.is_file() {
        return Err(refuse("is not a regular file".into()));
    }
    let me = nix::unistd::geteuid().as_raw();
    if meta.uid() != me {
        return Err(refuse(format!(
            "is owned by uid {} ({}), not by the daemon's user (uid {me}, {}); the daemon only \
             appends to its own files",
            meta.uid(),
            user_name(meta.uid()),
            user_name(me)
        )));
    }
    if meta.nlink() > 1 {
        return Err(refuse(format!(
            "has {} hard links (another name could be a file the daemon must not write)",
            meta.nlink()
        )));
    }
    // Appending never blocks on a regular file; clear O_NONBLOCK anyway.
    let _ = nix::fcntl::fcntl(
        &file,
        nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_APPEND),
    );
    Ok(file)
}

/// A user's name for messages (`uid N` when it has none).
pub(crate) fn user_name(uid: u32) -> String {
    match nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid)) {
        Ok(Some(user)) => user.name,
        _ => format!("uid {uid}"),
    }
}

/// Sends further log lines to `file` (opened by [`open_log_file`]).
pub(crate) fn to_file(file: File) {
    *SINK.lock().unwrap_or_else(|p| p.into_inner()) = Sink::File(file);
}

/// Sends further log lines to syslog (the journal on systemd machines).
pub(crate) fn to_syslog() {
    // SAFETY: the identity string is 'static; openlog keeps the pointer.
    // LOG_NDELAY: connect now, while a descriptor is surely free.
    unsafe {
        libc::openlog(
            c"shufflefs".as_ptr(),
            libc::LOG_PID | libc::LOG_NDELAY,
            libc::LOG_DAEMON,
        )
    };
    *SINK.lock().unwrap_or_else(|p| p.into_inner()) = Sink::Syslog;
}

/// Whether log lines currently go to stderr.
pub(crate) fn is_stderr() -> bool {
    matches!(
        *SINK.lock().unwrap_or_else(|p| p.into_inner()),
        Sink::Stderr
    )
}

/// Lines of one cause shown per `PERIOD` before the rest are counted.
pub const BURST: u32 = 5;
/// The period of [`BURST`].
pub(crate) const PERIOD: Duration = Duration::from_secs(60);
/// Causes remembered at once (least recently seen forgotten first, with their count written).
const MAX_CAUSES: NonZeroUsize = NonZeroUsize::new(4096).expect("non-zero");

/// What [`RateLimiter::admit`] decided.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Admit {
    /// Write the line; first, when `Some`, the count of lines suppressed in the period that
    /// just ended.
    Show(Option<u64>),
    /// Count the line instead of writing it.
    Suppress,
}

/// One cause's period.
#[derive(Debug)]
struct Cause {
    start: Instant,
    shown: u32,
    suppressed: u64,
    level: log::Level,
    target: &'static str,
}

/// Per-cause counting of repeated lines. Takes the time as an argument: tests need no clock.
#[derive(Debug)]
pub(crate) struct RateLimiter {
    causes: LruCache<String, Cause>,
}

/// A summary to write: `(level, target, cause, suppressed lines)`.
pub(crate) type Summary = (log::Level, &'static str, String, u64);

impl Default for RateLimiter {
    fn default() -> Self {
        RateLimiter {
            causes: LruCache::new(MAX_CAUSES),
        }
    }
}

impl RateLimiter {
    /// Decides about one line of `cause` at `now`. A summary of a forgotten cause (more than
    /// [`MAX_CAUSES`] causes at once) is pushed to `evicted`.
    pub(crate) fn admit(
        &mut self,
        cause: &str,
        level: log::Level,
        target: &'static str,
        now: Instant,
        evicted: &mut Vec<Summary>,
    ) -> Admit {
        if let Some(c) = self.causes.get_mut(cause) {
            if now.saturating_duration_since(c.start) >= PERIOD {
                let before = std::mem::take(&mut c.suppressed);
                c.start = now;
                c.shown = 1;
                return Admit::Show((before > 0).then_some(before));
            }
            if c.shown < BURST {
                c.shown += 1;
                return Admit::Show(None);
            }
            c.suppressed += 1;
            return Admit::Suppress;
        }
        let fresh = Cause {
            start: now,
            shown: 1,
            suppressed: 0,
            level,
            target,
        };
        if let Some((old, c)) = self.causes.push(cause.to_string(), fresh)
            && old != cause
            && c.suppressed > 0
        {
            evicted.push((c.level, c.target, old, c.suppressed));
        }
        Admit::Show(None)
    }

    /// The summaries of periods that ended by `now` (all of them with `all`), each cause then
    /// starting afresh.
    pub(crate) fn due(&mut self, now: Instant, all: bool) -> Vec<Summary> {
        let mut out = Vec::new();
        for (cause, c) in self.causes.iter_mut() {
            if c.suppressed > 0 && (all || now.saturating_duration_since(c.start) >= PERIOD) {
                out.push((c.level, c.target, cause.clone(), c.suppressed));
                c.suppressed = 0;
                c.shown = 0;
                c.start = now;
            }
        }
        out
    }
}

static LIMITER: LazyLock<Mutex<RateLimiter>> = LazyLock::new(Default::default);

fn write_summaries(summaries: Vec<Summary>) {
    for (level, target, cause, n) in summaries {
        log::log!(
            target: target,
            level,
            "{n} more line(s) of this cause suppressed (at most {BURST} per {}s are written): \
             {cause}",
            PERIOD.as_secs()
        );
    }
}

/// Writes `message` at `level` unless [`BURST`] lines of `cause` were written in this
/// [`PERIOD`] already (then it is counted). Use through [`log_limited!`].
pub(crate) fn limited(
    level: log::Level,
    target: &'static str,
    cause: &str,
    message: std::fmt::Arguments,
) {
    if !log::log_enabled!(target: target, level) {
        return;
    }
    let mut evicted = Vec::new();
    let admit = LIMITER.lock().unwrap_or_else(|p| p.into_inner()).admit(
        cause,
        level,
        target,
        Instant::now(),
        &mut evicted,
    );
    write_summaries(evicted);
    match admit {
        Admit::Show(before) => {
            if let Some(n) = before {
                write_summaries(vec![(level, target, cause.to_string(), n)]);
            }
            log::log!(target: target, level, "{message}");
        }
        Admit::Suppress => {}
    }
}

/// Writes the count of lines suppressed in periods that have ended (all counts with `all`,
/// at unmount). The daemon calls it about once a second.
pub(crate) fn flush_suppressed(all: bool) {
    let due = LIMITER
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .due(Instant::now(), all);
    write_summaries(due);
}

/// `log!` with a rate limit per cause: `log_limited!(Level::Error, cause, "fmt", args..)`;
/// `cause` (anything `Display`) names what failed, e.g. the operation, errno and file.
macro_rules! log_limited {
    ($level:expr, $cause:expr, $($arg:tt)+) => {
        $crate::logging::limited(
            $level,
            module_path!(),
            &$cause.to_string(),
            format_args!($($arg)+),
        )
    };
}
pub(crate) use log_limited;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeated_lines_are_counted_per_cause_and_summarised_once_per_period() {
        let mut r = RateLimiter::default();
        let t0 = Instant::now();
        let mut ev = Vec::new();
        let lvl = log::Level::Error;
        let shown = |r: &mut RateLimiter, cause: &str, at: Instant, n: u64| {
            let mut ev = Vec::new();
            let shown = (0..n)
                .filter(|_| r.admit(cause, lvl, "t", at, &mut ev) != Admit::Suppress)
                .count() as u64;
            assert!(ev.is_empty());
            shown
        };
        // 790 failures of one cause and 10 of another within one period.
        assert_eq!(shown(&mut r, "read EIO a.bin", t0, 790), u64::from(BURST));
        assert_eq!(shown(&mut r, "read EIO b.bin", t0, 10), u64::from(BURST));
        assert!(r.due(t0 + PERIOD / 2, false).is_empty(), "period not over");
        let due = r.due(t0 + PERIOD, false);
        let mut counts: Vec<(String, u64)> = due.into_iter().map(|d| (d.2, d.3)).collect();
        counts.sort();
        assert_eq!(
            counts,
            vec![("read EIO a.bin".into(), 785), ("read EIO b.bin".into(), 5)]
        );
        assert!(r.due(t0 + PERIOD, true).is_empty(), "counted once");
        // A new period shows BURST lines again; a line after the period carries the count.
        let t1 = t0 + PERIOD;
        assert_eq!(shown(&mut r, "read EIO a.bin", t1, 7), u64::from(BURST));
        assert_eq!(
            r.admit("read EIO a.bin", lvl, "t", t1 + PERIOD, &mut ev),
            Admit::Show(Some(2))
        );
        // At unmount every count is written, ended or not.
        shown(&mut r, "read EIO a.bin", t1 + PERIOD, 9);
        assert_eq!(r.due(t1 + PERIOD, true)[0].3, 5);
        assert!(ev.is_empty());
    }

    #[test]
    fn forgotten_causes_keep_their_count() {
        let mut r = RateLimiter::default();
        let t0 = Instant::now();
        let mut ev = Vec::new();
        for _ in 0..BURST + 3 {
            r.admit("first", log::Level::Warn, "t", t0, &mut ev);
        }
        for i in 0..MAX_CAUSES.get() {
            r.admit(&format!("other {i}"), log::Level::Warn, "t", t0, &mut ev);
        }
        assert_eq!(ev.len(), 1);
        assert_eq!((ev[0].2.as_str(), ev[0].3), ("first", 3));
    }

    #[test]
    fn log_file_refuses_links_other_users_files_and_non_files() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("root-only");
        std::fs::write(&target, b"secret\n").unwrap();
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o600)).unwrap();
        let link = dir.path().join("x.log");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let e = open_log_file(&link).unwrap_err().to_string();
        assert!(e.contains("is a symbolic link"), "{e}");
        assert_eq!(std::fs::read(&target).unwrap(), b"secret\n");
        let hard = dir.path().join("hard.log");
        std::fs::hard_link(&target, &hard).unwrap();
        let e = open_log_file(&hard).unwrap_err().to_string();
        assert!(e.contains("2 hard links"), "{e}");
        let fifo = dir.path().join("fifo.log");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let e = open_log_file(&fifo).unwrap_err().to_string();
        assert!(e.contains("not a regular file"), "{e}");
        // A new file is created, an own file appended to.
        let good = dir.path().join("good.log");
        let mut f = open_log_file(&good).unwrap();
        f.write_all(b"a\n").unwrap();
        let mut f = open_log_file(&good).unwrap();
        f.write_all(b"b\n").unwrap();
        assert_eq!(std::fs::read(&good).unwrap(), b"a\nb\n");
    }
}
