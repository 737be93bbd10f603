//! The hashes of the format: [`ContentHasher`] (a fast, split-invariant 64-bit content hash,
//! not cryptographic), hashes as 16 hex digits, and the identities of shards referenced in
//! place: the sampled content identity of version 4 ([`sampled_identity`] over
//! [`sample_ranges`], with its [`in_place_guard`]) and the path-size-mtime identity of versions
//! 2-3 ([`in_place_hash`]).

use crate::shuffle::feistel::mix;

/// Ranges sampled per in-place shard by [`sample_ranges`].
pub(crate) const SAMPLES: u64 = 16;

/// Bytes per sampled range (a page).
pub(crate) const SAMPLE_BYTES: u64 = 4096;

/// The byte ranges `(offset, len)` of a shard of `bytes` bytes whose content identifies it in
/// place: the whole shard when it is at most [`SAMPLES`] * [`SAMPLE_BYTES`] (64 KiB), else
/// [`SAMPLES`] pages spread evenly from the first to the last byte (page-aligned but the last,
/// which ends at the end). Fixed by the size alone, so the same bytes always sample alike.
pub(crate) fn sample_ranges(bytes: u64) -> Vec<(u64, u64)> {
    if bytes <= SAMPLES * SAMPLE_BYTES {
        return vec![(0, bytes)];
    }
    let span = u128::from(bytes - SAMPLE_BYTES);
    (0..SAMPLES)
        .map(|k| {
            let at = if k + 1 == SAMPLES {
                bytes - SAMPLE_BYTES
            } else {
                let spread = (u128::from(k) * span / u128::from(SAMPLES - 1)) as u64;
                spread / SAMPLE_BYTES * SAMPLE_BYTES
            };
            (at, SAMPLE_BYTES)
        })
        .collect()
}

/// The content identity of an in-place shard (version 4): its size and the bytes of its
/// [`sample_ranges`], in order (`sampled`, concatenated). O(1) per shard; it cannot see a
/// change of the same size outside the sampled pages (docs/FORMAT.md, section 3).
pub(crate) fn sampled_identity(bytes: u64, sampled: &[u8]) -> String {
    let mut h = ContentHasher::new();
    h.update(b"shufflefs-in-place-v4\0");
    h.update(&bytes.to_le_bytes());
    h.update(sampled);
    format_hash(h.finish())
}

/// The guard of an in-place shard (version 4): binds its stored `path` and its mtime at pack
/// to its content identity `hash`. Not a secret: it makes a mount trust an unmodified file
/// without sampling it, and sample every file whose path, mtime or hash was edited.
pub(crate) fn in_place_guard(path: &str, bytes: u64, mtime_ns: u64, hash: &str) -> String {
    let mut h = ContentHasher::new();
    h.update(b"shufflefs-in-place-guard\0");
    h.update(path.as_bytes());
    h.update(&[0]);
    h.update(&bytes.to_le_bytes());
    h.update(&mtime_ns.to_le_bytes());
    h.update(&parse_hash(hash).unwrap_or(0).to_le_bytes());
    format_hash(h.finish())
}

/// The identity hash of a shard referenced in place by a version 2-3 manifest: its absolute
/// path, size and mtime.
pub fn in_place_hash(path: &str, bytes: u64, mtime_ns: u64) -> String {
    let mut h = ContentHasher::new();
    h.update(path.as_bytes());
    h.update(&[0]);
    h.update(&bytes.to_le_bytes());
    h.update(&mtime_ns.to_le_bytes());
    format_hash(h.finish())
}

/// Formats a hash as 16 lowercase hex digits.
pub(crate) fn format_hash(h: u64) -> String {
    format!("{h:016x}")
}

/// Parses 16 hex digits.
pub(crate) fn parse_hash(s: &str) -> Option<u64> {
    if s.len() == 16
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        u64::from_str_radix(s, 16).ok()
    } else {
        None
    }
}

/// A fast streaming 64-bit hash for content identity (not cryptographic): 8-byte words are
/// folded with a multiply-rotate step, then finished with the length and SplitMix64. Equal
/// byte streams give equal hashes however they are split into `update` calls.
#[derive(Clone, Debug)]
pub(crate) struct ContentHasher {
    state: u64,
    pending: [u8; 8],
    pending_len: usize,
    total: u64,
}

impl Default for ContentHasher {
    fn default() -> Self {
        Self::new()
    }
}

impl ContentHasher {
    const P: u64 = 0x9FB2_1C65_1E98_DF25;

    /// A fresh hasher.
    pub(crate) fn new() -> ContentHasher {
        ContentHasher {
            state: 0x243F_6A88_85A3_08D3,
            pending: [0; 8],
            pending_len: 0,
            total: 0,
        }
    }

    #[inline(always)]
    fn word(&mut self, w: u64) {
        self.state = (self.state ^ w).wrapping_mul(Self::P).rotate_left(29);
    }

    /// Feeds bytes.
    pub(crate) fn update(&mut self, mut bytes: &[u8]) {
        self.total += bytes.len() as u64;
        if self.pending_len > 0 {
            let take = (8 - self.pending_len).min(bytes.len());
            self.pending[self.pending_len..self.pending_len + take].copy_from_slice(&bytes[..take]);
            self.pending_len += take;
            bytes = &bytes[take..];
            if self.pending_len < 8 {
                return;
            }
            let w = u64::from_le_bytes(self.pending);
            self.word(w);
            self.pending_len = 0;
        }
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.word(u64::from_le_bytes(c.try_into().expect("8 bytes")));
        }
        let rest = chunks.remainder();
        self.pending[..rest.len()].copy_from_slice(rest);
        self.pending_len = rest.len();
    }

    /// The hash of everything fed so far.
    pub(crate) fn finish(&self) -> u64 {
        let mut s = self.clone();
        if s.pending_len > 0 {
            let mut last = [0u8; 8];
            last[..s.pending_len].copy_from_slice(&s.pending[..s.pending_len]);
            s.word(u64::from_le_bytes(last));
        }
        mix(s.state ^ s.total.wrapping_mul(Self::P))
    }
}
