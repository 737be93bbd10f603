//! The bytes of the `.npy` files: `S.npy` (a step's rows, shuffled) and `observation/I.npy`
//! (one observation, unshuffled).
//!
//! A read fills exactly the requested range: the header bytes it covers, then for each row
//! piece one read of the stream (stream mode: the window; documents mode: the document's
//! records, then padding records). The observations of the rows a range touches are computed
//! together (`StepObservations::fill`, a batched permutation).

use super::{Mode, View};
use crate::dataset::Document;
use crate::error::{Error, Result};
use crate::format::npy;
use crate::shuffle::plan::StepKey;

impl View {
    /// Fills `buf` with the bytes of `S.npy` for `key` starting at `offset`, and returns how
    /// many bytes that is: `min(buf.len(), len - offset)`, 0 at or past the end. Only the
    /// shard bytes of the rows the range covers are read, one pread per row piece.
    pub fn read_step_npy(&self, key: StepKey, offset: u64, buf: &mut [u8]) -> Result<usize> {
        if self.remote {
            // The rows' documents in a few round trips, then every range of the step at once
            // (gather.rs).
            return crate::storage::remote::ahead::ahead(
                || self.warm_documents(key),
                || super::gather::deferred(buf, |buf| self.read_step_npy_now(key, offset, buf)),
            );
        }
        self.read_step_npy_now(key, offset, buf)
    }

    /// Looks up the document of every row of step `key` in documents mode (results ignored:
    /// the reads are what matters, see `storage/remote/ahead.rs`).
    pub(super) fn warm_documents(&self, key: StepKey) {
        if self.packed.is_some() {
            return;
        }
        let batch = self.step_batch(key);
        if let Some(mixed) = &self.mixed {
            for r in mixed.rows(key, self.plan.ranks(), 0, batch) {
                let source = &mixed.sources[r.source].1;
                if source.mode == Mode::Documents {
                    let _ = source.dataset.document(r.observation);
                }
            }
            return;
        }
        if self.mode != Mode::Documents {
            return;
        }
        let mut rows = vec![0u64; batch as usize];
        self.plan.observations(key).fill(0, &mut rows);
        for obs in rows {
            let _ = self.dataset.document(obs);
        }
    }

    /// [`View::read_step_npy`], each range read when it is reached.
    fn read_step_npy_now(&self, key: StepKey, offset: u64, buf: &mut [u8]) -> Result<usize> {
        if let Some(packed) = &self.packed {
            return self.read_packed_npy(packed, key, offset, buf);
        }
        if let Some(mixed) = &self.mixed {
            return self.read_mixture_npy(mixed, key, offset, buf);
        }
        // The observations of the rows this range touches, computed together (batched
        // permutation), then looked up row by row.
        let header_len = self.npy_header.len() as u64;
        let row_bytes = self.window * self.out_itemsize;
        let data_start = offset.saturating_sub(header_len);
        let data_end = (offset + buf.len() as u64).saturating_sub(header_len);
        let first = (data_start / row_bytes).min(self.plan.batch_size());
        let end = data_end.div_ceil(row_bytes).min(self.plan.batch_size());
        let mut rows = vec![0u64; end.saturating_sub(first) as usize];
        self.plan.observations(key).fill(first, &mut rows);
        self.read_rows_npy(
            &self.npy_header,
            self.window,
            key.epoch,
            offset,
            buf,
            |row| {
                rows.get(row.wrapping_sub(first) as usize)
                    .copied()
                    .ok_or_else(|| Error::invalid(format!("row {row} outside the rows computed")))
            },
        )
    }

    /// The whole `S.npy` for `key`.
    pub fn render_step_npy(&self, key: StepKey) -> Result<Vec<u8>> {
        let mut out = vec![0u8; self.step_npy_len_at(key) as usize];
        self.render_step_npy_into(key, &mut out)?;
        Ok(out)
    }

    /// The whole `S.npy` for `key` into `out`, which must be exactly its size.
    pub(crate) fn render_step_npy_into(&self, key: StepKey, out: &mut [u8]) -> Result<()> {
        if out.len() as u64 != self.step_npy_len_at(key) {
            return Err(Error::invalid(format!(
                "a step file is {} bytes, not {}",
                self.step_npy_len_at(key),
                out.len()
            )));
        }
        let n = self.read_step_npy(key, 0, out)?;
        if n != out.len() {
            return Err(Error::invalid(format!(
                "step {key:?} assembled only {n} bytes"
            )));
        }
        Ok(())
    }

    /// Reads a `.npy` made of `header` and rows of `row_records` records, row `r` being
    /// observation `observation(r)` of epoch `epoch`.
    fn read_rows_npy(
        &self,
        header: &[u8],
        row_records: u64,
        epoch: u64,
        offset: u64,
        buf: &mut [u8],
        observation: impl Fn(u64) -> Result<u64>,
    ) -> Result<usize> {
        let row_bytes = row_records * self.out_itemsize;
        let mut current: Option<(u64, Document)> = None;
        fill_npy(
            header,
            self.plan.batch_size(),
            row_bytes,
            offset,
            buf,
            |row, within, out| {
                let obs = observation(row)?;
                match self.mode {
                    Mode::Stream | Mode::Packed => {
                        let first = self.windows.first_record_in(epoch, obs);
                        self.read_records(first, within, out)
                    }
                    Mode::Documents => {
                        if current.as_ref().is_none_or(|(r, _)| *r != row) {
                            current = Some((row, self.dataset.document(obs)?));
                        }
                        let doc = &current.as_ref().expect("set above").1;
                        self.fill_doc_row(doc, row_records, within, out)
                    }
                }
            },
        )
    }

    /// Bytes `[within, within + out.len())` of a padded document row.
    pub(super) fn fill_doc_row(
        &self,
        doc: &Document,
        row_records: u64,
        within: u64,
        out: &mut [u8],
    ) -> Result<()> {
        let data_bytes = doc.len.min(row_records) * self.out_itemsize;
        let end = within + out.len() as u64;
        let copy_end = end.min(data_bytes);
        let mut k = 0usize;
        if within < copy_end {
            k = (copy_end - within) as usize;
            self.read_records(doc.start, within, &mut out[..k])?;
        }
        for (i, b) in out[k..].iter_mut().enumerate() {
            let pos = within + (k + i) as u64;
            *b = self.pad_record[(pos % self.out_itemsize) as usize];
        }
        Ok(())
    }

    /// Reads `S.npy` of packed mode: row `j` is the packed row at position
    /// `step * G + j * ranks + rank` of the epoch (`packed.rs`).
    fn read_packed_npy(
        &self,
        packed: &super::packed::Packed,
        key: StepKey,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<usize> {
        let row_bytes = self.window * self.out_itemsize;
        fill_npy(
            &self.npy_header,
            self.plan.batch_size(),
            row_bytes,
            offset,
            buf,
            |row, within, out| {
                let (block, r) =
                    packed.row(&self.dataset, key.epoch, self.plan.position(key, row))?;
                super::packed::fill_row(
                    &self.dataset,
                    &block,
                    block.rows.row(r),
                    &self.bos_record,
                    within,
                    out,
                    |start, within, out| self.read_records(start, within, out),
                )
            },
        )
    }

    /// Reads `S.npy` of a mixture: row `j` is slot `j * ranks + rank` of the global step, an
    /// observation of one source (`mixture.rs`).
    pub(super) fn read_mixture_npy(
        &self,
        mixed: &super::mixture::Mixed,
        key: StepKey,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<usize> {
        let batch = self.step_batch(key);
        let header = self.step_header(batch)?;
        let row_bytes = self.window * self.out_itemsize;
        // The rows the range touches, placed together.
        let Some(touched) = rows_touched(header.len() as u64, batch, row_bytes, offset, buf.len())
        else {
            return fill_npy(&header, batch, row_bytes, offset, buf, |_, _, _| Ok(()));
        };
        let first = touched.start;
        let rows = mixed.rows(key, self.plan.ranks(), first, touched.end - first);
        fill_npy(
            &header,
            batch,
            row_bytes,
            offset,
            buf,
            |row, within, out| {
                let r = rows[(row - first) as usize];
                let source = &mixed.sources[r.source].1;
                source.fill_observation_row(r.observation, within, out)
            },
        )
    }

    /// Size of `observation/I.npy`.
    pub fn observation_npy_len(&self, observation: u64) -> Result<u64> {
        let (header, records) = self.observation_shape(observation)?;
        observation_bytes(&header, records, self.out_itemsize)
    }

    fn observation_shape(&self, observation: u64) -> Result<(Vec<u8>, u64)> {
        let records = match self.mode {
            Mode::Stream => self.window,
            Mode::Documents => self.dataset.document(observation)?.len,
            // Packed rows exist per epoch only: no `observation/` files.
            Mode::Packed => return Err(Error::NotFound),
        };
        let header = npy::header(&self.served_descr(), &[records])?;
        Ok((header, records))
    }

    /// Reads `observation/I.npy`: the observation unshuffled (a window, or a whole document),
    /// shape `(records,)`.
    pub fn read_observation_npy(
        &self,
        observation: u64,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<usize> {
        let (header, records) = self.observation_shape(observation)?;
        let header_len = header.len() as u64;
        let len = observation_bytes(&header, records, self.out_itemsize)?;
        if offset >= len {
            return Ok(0);
        }
        let n = (buf.len() as u64).min(len - offset) as usize;
        let buf = &mut buf[..n];
        let mut filled = 0;
        if offset < header_len {
            filled = ((header_len - offset) as usize).min(n);
            buf[..filled].copy_from_slice(&header[offset as usize..offset as usize + filled]);
        }
        if filled < n {
            let within = offset + filled as u64 - header_len;
            let start = match self.mode {
                Mode::Stream => self.windows.first_record(observation),
                Mode::Documents => self.dataset.document(observation)?.start,
                Mode::Packed => return Err(Error::NotFound),
            };
            self.read_records(start, within, &mut buf[filled..])?;
        }
        Ok(n)
    }

    /// Fills `out` with the served bytes `[within, within + out.len())` of the records from
    /// stream record `first` on: the dataset's bytes read straight into `out`, or, with
    /// `--out-dtype`, the whole records the range touches read and converted.
    pub(super) fn read_records(&self, first: u64, within: u64, out: &mut [u8]) -> Result<()> {
        let Some(convert) = self.out else {
            let at = first * self.itemsize + within;
            if super::gather::note(&self.dataset, at, out, None) {
                return Ok(());
            }
            return self.dataset.read_stream(at, out);
        };
        let size = self.out_itemsize;
        let (e0, e1) = (within / size, (within + out.len() as u64).div_ceil(size));
        let n = (e1 - e0) as usize;
        let skip = (within - e0 * size) as usize;
        let at = (first + e0) * self.itemsize;
        let noted = (convert, first + e0, skip, n * self.itemsize as usize);
        if super::gather::note(&self.dataset, at, out, Some(noted)) {
            return Ok(());
        }
        let mut src = vec![0u8; n * self.itemsize as usize];
        self.dataset
            .read_stream((first + e0) * self.itemsize, &mut src)?;
        let mut dst = vec![0u8; n * size as usize];
        convert.convert(&src, &mut dst, first + e0)?;
        out.copy_from_slice(&dst[skip..skip + out.len()]);
        Ok(())
    }
}

/// Fills `buf` with the bytes from `offset` of a `.npy` made of `header` and `rows` rows of
/// `row_bytes` bytes, and returns how many that is (`min(buf.len(), len - offset)`, 0 at or
/// past the end). `row(r, within, out)` writes bytes `[within, within + out.len())` of row `r`;
/// it is called for the rows the range touches, in order, each once.
pub(super) fn fill_npy(
    header: &[u8],
    rows: u64,
    row_bytes: u64,
    offset: u64,
    buf: &mut [u8],
    mut row: impl FnMut(u64, u64, &mut [u8]) -> Result<()>,
) -> Result<usize> {
    let header_len = header.len() as u64;
    let len = header_len + rows * row_bytes;
    if offset >= len {
        return Ok(0);
    }
    let n = (buf.len() as u64).min(len - offset) as usize;
    let buf = &mut buf[..n];
    let mut filled = 0usize;
    if offset < header_len {
        let take = ((header_len - offset) as usize).min(n);
        buf[..take].copy_from_slice(&header[offset as usize..offset as usize + take]);
        filled = take;
    }
    // The data region, in bytes from the first row (empty when the range ends in the header).
    let mut pos = (offset + filled as u64).saturating_sub(header_len);
    let end = (offset + n as u64).saturating_sub(header_len);
    while pos < end {
        let r = pos / row_bytes;
        let within = pos % row_bytes;
        let take = (row_bytes - within).min(end - pos) as usize;
        row(r, within, &mut buf[filled..filled + take])?;
        filled += take;
        pos += take as u64;
    }
    Ok(n)
}

/// The rows `[first, end)` that bytes `[offset, offset + size)` of a `.npy` of `header_len`
/// header bytes and `rows` rows of `row_bytes` bytes touch (`None`: none).
pub(super) fn rows_touched(
    header_len: u64,
    rows: u64,
    row_bytes: u64,
    offset: u64,
    size: usize,
) -> Option<std::ops::Range<u64>> {
    let start = offset.max(header_len) - header_len;
    let end = offset
        .saturating_add(size as u64)
        .min(header_len + rows * row_bytes)
        .saturating_sub(header_len);
    (start < end).then(|| start / row_bytes..end.div_ceil(row_bytes))
}

/// The size of an observation file: its header and `records` records of `itemsize` bytes (a
/// document too long to be one file, which only a conversion to a wider type can make, is an
/// error, not a wrapped size).
fn observation_bytes(header: &[u8], records: u64, itemsize: u64) -> Result<u64> {
    records
        .checked_mul(itemsize)
        .and_then(|b| b.checked_add(header.len() as u64))
        .ok_or_else(|| {
            Error::invalid(format!(
                "an observation of {records} records is too large for one file"
            ))
        })
}
