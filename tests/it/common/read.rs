//! Reading the tree without a mount (the only calls of `ShuffleFs::lookup` by path and of
//! `ShuffleFs::read` outside the reftest harness), and comparing bytes.

use std::ffi::OsStr;

use shufflefs::fs::{ROOT_INO, ShuffleFs};

/// The inode of `path` (relative, `/`-separated; "" is the root).
pub fn walk(fs: &ShuffleFs, path: &str) -> shufflefs::Result<u64> {
    let mut ino = ROOT_INO;
    for part in path.split('/').filter(|p| !p.is_empty()) {
        ino = fs.lookup(ino, OsStr::new(part))?.ino;
    }
    Ok(ino)
}

/// Bytes `[offset, offset + size)` of file `ino` (fewer at the end of the file).
pub fn read_at(fs: &ShuffleFs, ino: u64, offset: u64, size: u32) -> shufflefs::Result<Vec<u8>> {
    let mut out = Vec::new();
    fs.read(ino, offset, size, &mut out)?;
    Ok(out)
}

/// The one read-whole-path helper: the bytes of the file at `path`, as a mount serves them
/// (lookup of each component, getattr, one read past the end). The bytes must be exactly as
/// many as getattr said.
pub fn read_path(fs: &ShuffleFs, path: &str) -> shufflefs::Result<Vec<u8>> {
    let ino = walk(fs, path)?;
    let len = fs.getattr(ino)?.size;
    let out = read_at(fs, ino, 0, u32::try_from(len + 1).unwrap())?;
    assert_eq!(out.len() as u64, len, "{path}: getattr's size is exact");
    Ok(out)
}

/// [`read_path`], which must succeed.
pub fn read_all(fs: &ShuffleFs, path: &str) -> Vec<u8> {
    read_path(fs, path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// [`read_all`], parsed as JSON.
pub fn json_at(fs: &ShuffleFs, path: &str) -> serde_json::Value {
    json(&read_all(fs, path))
}

/// `bytes` parsed as JSON (a failure shows the start of the text).
pub fn json(bytes: &[u8]) -> serde_json::Value {
    serde_json::from_slice(bytes).unwrap_or_else(|e| {
        panic!(
            "invalid JSON ({e}): {}",
            String::from_utf8_lossy(&bytes[..bytes.len().min(300)])
        )
    })
}

/// A JSON array of numbers.
pub fn u64s(v: &serde_json::Value) -> Vec<u64> {
    v.as_array()
        .unwrap_or_else(|| panic!("not an array: {v}"))
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect()
}

/// The errno of an I/O error.
pub fn errno(e: &std::io::Error) -> i32 {
    e.raw_os_error()
        .unwrap_or_else(|| panic!("no errno in {e:?}"))
}

/// Bytes that differ (a length difference counts as that many).
pub fn mismatches(got: &[u8], want: &[u8]) -> u64 {
    (got.iter().zip(want).filter(|(a, b)| a != b).count() + got.len().abs_diff(want.len())) as u64
}

/// Why `got` is not `want`, if it is not: short, long, zero-filled or different bytes.
pub fn describe(got: &[u8], want: &[u8]) -> Option<String> {
    if got == want {
        return None;
    }
    let first = got.iter().zip(want).position(|(a, b)| a != b);
    Some(if got.len() < want.len() && first.is_none() {
        format!("short: {} of {} bytes", got.len(), want.len())
    } else if got.len() != want.len() {
        format!("{} bytes instead of {}", got.len(), want.len())
    } else {
        let at = first.expect("differs");
        let zeros = got[at..].iter().take(64).all(|&b| b == 0);
        format!(
            "different bytes from offset {at}{}",
            if zeros { " (zero-filled)" } else { "" }
        )
    })
}

/// Length and FNV-1a hash of `bytes`, as `LEN:HASH` (the golden set's digest).
pub fn digest(bytes: &[u8]) -> String {
    let h = bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    format!("{}:{h:016x}", bytes.len())
}
