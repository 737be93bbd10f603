//! Per-block checksums of shard files.
//!
//! A shard's checksum file holds one little-endian u64 per [`BLOCK`]-byte block of the shard
//! (the last block may be shorter): the [`ContentHasher`] hash of that block's bytes. The
//! manifest names the file and records its own content hash (docs/FORMAT.md, section 3), so the
//! checksums are part of the dataset's identity and its fingerprint.
//!
//! Used by `shufflefs verify` (every block of every shard) and by `--verify-reads` (the blocks
//! a read touches, before any byte of them is served). This module is pure: it hashes bytes
//! and encodes the file; `dataset/shard.rs` does the I/O.

use crate::format::ContentHasher;

/// Bytes per checksummed block: small enough that `--verify-reads` reads a few blocks per
/// window, large enough that the checksum file is 1/8192 of the shard.
pub(crate) const BLOCK: u64 = 64 * 1024;

/// Bytes per checksummed block of a document file: the reads of document files are small
/// (a few records per row), so their blocks are a page.
pub(crate) const DOC_BLOCK: u64 = 4096;

/// Number of blocks of a shard of `bytes` bytes.
pub(crate) fn blocks(bytes: u64) -> u64 {
    bytes.div_ceil(BLOCK)
}

/// Size of the checksum file of a shard of `bytes` bytes.
pub(crate) fn file_len(bytes: u64) -> u64 {
    blocks(bytes) * 8
}

/// The checksum of one block.
pub(crate) fn block_sum(bytes: &[u8]) -> u64 {
    let mut h = ContentHasher::new();
    h.update(bytes);
    h.finish()
}

/// Block checksums of a byte stream fed in pieces of any size.
#[derive(Clone, Debug)]
pub(crate) struct BlockSums {
    hasher: ContentHasher,
    block: u64,
    in_block: u64,
    sums: Vec<u64>,
}

impl Default for BlockSums {
    fn default() -> Self {
        BlockSums::with_block(BLOCK)
    }
}

impl BlockSums {
    /// Nothing fed yet.
    pub(crate) fn new() -> BlockSums {
        BlockSums::default()
    }

    /// Nothing fed yet; blocks of `block` bytes.
    pub(crate) fn with_block(block: u64) -> BlockSums {
        BlockSums {
            hasher: ContentHasher::new(),
            block,
            in_block: 0,
            sums: Vec::new(),
        }
    }

    /// Feeds the next bytes of the stream.
    pub(crate) fn update(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            let take = ((self.block - self.in_block) as usize).min(bytes.len());
            self.hasher.update(&bytes[..take]);
            self.in_block += take as u64;
            bytes = &bytes[take..];
            if self.in_block == self.block {
                self.sums.push(self.hasher.finish());
                self.hasher = ContentHasher::new();
                self.in_block = 0;
            }
        }
    }

    /// The checksums of every block, the last partial one included.
    pub(crate) fn finish(&self) -> Vec<u64> {
        let mut s = self.clone();
        s.finish_owned()
    }

    fn finish_owned(&mut self) -> Vec<u64> {
        if self.in_block > 0 {
            self.sums.push(self.hasher.finish());
        }
        std::mem::take(&mut self.sums)
    }
}

/// The checksum file's bytes.
pub(crate) fn encode(sums: &[u64]) -> Vec<u8> {
    sums.iter().flat_map(|s| s.to_le_bytes()).collect()
}

/// The content hash recorded in the manifest for a checksum file's bytes.
pub(crate) fn file_hash(encoded: &[u8]) -> u64 {
    let mut h = ContentHasher::new();
    h.update(encoded);
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_sums_are_split_invariant_and_cover_the_tail() {
        let data: Vec<u8> = (0..(3 * BLOCK + 100))
            .map(|i| (i * 7 % 251) as u8)
            .collect();
        let whole = {
            let mut b = BlockSums::new();
            b.update(&data);
            b.finish()
        };
        assert_eq!(whole.len(), 4);
        assert_eq!(whole.len() as u64, blocks(data.len() as u64));
        for (i, chunk) in data.chunks(BLOCK as usize).enumerate() {
            assert_eq!(whole[i], block_sum(chunk));
        }
        for piece in [1usize, 7, 4096, 65_535, 65_537, 200_000] {
            let mut b = BlockSums::new();
            for c in data.chunks(piece) {
                b.update(c);
            }
            assert_eq!(b.finish(), whole, "pieces of {piece}");
        }
        assert!(BlockSums::new().finish().is_empty());
        assert_eq!(file_len(0), 0);
        assert_eq!(file_len(BLOCK), 8);
        assert_eq!(file_len(BLOCK + 1), 16);
        assert_eq!(encode(&[1, 2]).len(), 16);
    }

    #[test]
    fn a_changed_byte_changes_its_block_only() {
        let mut data = vec![5u8; 2 * BLOCK as usize];
        let before = {
            let mut b = BlockSums::new();
            b.update(&data);
            b.finish()
        };
        data[BLOCK as usize + 17] ^= 1;
        let mut b = BlockSums::new();
        b.update(&data);
        let after = b.finish();
        assert_eq!(before[0], after[0]);
        assert_ne!(before[1], after[1]);
    }
}
