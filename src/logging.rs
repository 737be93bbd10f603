//! Logging setup: `env_logger` with the level from `-v`/`-q` (`RUST_LOG` still wins), writing
//! to a sink that can be switched at run time. A background daemon starts on stderr (so mount
//! errors reach the terminal), then moves to `--log-file` or syslog once it detaches.

use std::ffi::CString;
use std::fs::OpenOptions;
use std::io::{self, Write};
use std::path::Path;
use std::sync::Mutex;

use env_logger::{Builder, Env, Target};

use crate::error::{Error, Result};

/// Where log lines go.
enum Sink {
    Stderr,
    File(std::fs::File),
    Syslog,
    Discard,
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
            Sink::Discard => {}
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

/// Sends further log lines to `path` (appending).
pub fn to_file(path: &Path) -> Result<()> {
    let f = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| Error::io(path, e))?;
    *SINK.lock().unwrap_or_else(|p| p.into_inner()) = Sink::File(f);
    Ok(())
}

/// Sends further log lines to syslog (the journal on systemd machines).
pub fn to_syslog() {
    // SAFETY: the identity string is 'static; openlog keeps the pointer.
    unsafe { libc::openlog(c"shufflefs".as_ptr(), libc::LOG_PID, libc::LOG_DAEMON) };
    *SINK.lock().unwrap_or_else(|p| p.into_inner()) = Sink::Syslog;
}

/// Whether log lines currently go to stderr.
pub fn is_stderr() -> bool {
    matches!(
        *SINK.lock().unwrap_or_else(|p| p.into_inner()),
        Sink::Stderr
    )
}

/// Drops further log lines.
pub fn discard() {
    *SINK.lock().unwrap_or_else(|p| p.into_inner()) = Sink::Discard;
}
