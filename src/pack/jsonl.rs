//! JSON Lines documents (`{"tokens": [...], "meta": ..., "spans": [...]}`): parsed line by
//! line, checked (token range, span bounds, metadata), and handed to the writer as documents
//! and spans; any error names the file and line.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::Path;

use serde::Deserialize;
use serde_json::value::RawValue;

use super::writer::Writer;
use crate::error::{Error, Result};

use super::writer::Seg;

/// One JSON Lines document.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonDoc<'a> {
    tokens: Vec<serde_json::Number>,
    #[serde(default, borrow)]
    meta: Option<&'a RawValue>,
    #[serde(default, borrow)]
    spans: Vec<JsonSpan<'a>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonSpan<'a> {
    start: u64,
    end: u64,
    #[serde(default, borrow)]
    meta: Option<&'a RawValue>,
}

/// Reads a document of a line that names its tokens `field` (`--tokens-field`): the field's
/// list is the tokens, `meta` and `spans` are read as usual, every other field (`text`,
/// `attention_mask`, ...) is ignored.
fn doc_with_field<'a>(line: &'a str, field: &str) -> std::result::Result<JsonDoc<'a>, String> {
    let mut fields: std::collections::HashMap<String, &'a RawValue> =
        serde_json::from_str(line).map_err(|e| format!("not a valid document: {e}"))?;
    let tokens = fields
        .remove(field)
        .ok_or_else(|| format!("missing {field:?} (--tokens-field {field})"))?;
    let tokens = serde_json::from_str(tokens.get())
        .map_err(|e| format!("{field:?} is not a list of integers: {e}"))?;
    let meta = fields.remove("meta");
    let spans = match fields.remove("spans") {
        Some(raw) => {
            serde_json::from_str(raw.get()).map_err(|e| format!("\"spans\" is not valid: {e}"))?
        }
        None => Vec::new(),
    };
    Ok(JsonDoc {
        tokens,
        meta,
        spans,
    })
}

pub(super) fn write_jsonl(writer: &mut Writer, path: &Path, field: Option<&str>) -> Result<()> {
    let file = File::open(path).map_err(|e| Error::io(path, e))?;
    let mut reader = BufReader::with_capacity(1 << 20, file);
    let token = writer.record.token_type();
    let (lo, hi) = token.int_range().expect("integer token type");
    let size = token.size();
    let mut line = String::new();
    let mut records = Vec::new();
    let mut number = 0u64;
    loop {
        line.clear();
        let n = reader
            .read_line(&mut line)
            .map_err(|e| Error::invalid(format!("{}:{}: {e}", path.display(), number + 1)))?;
        if n == 0 {
            return Ok(());
        }
        number += 1;
        if let Some(bar) = &writer.progress {
            bar.inc(n as u64);
        }
        let at = |why: String| Error::invalid(format!("{}:{number}: {why}", path.display()));
        if line.trim().is_empty() {
            return Err(at("empty line: every line must be one JSON document".into()));
        }
        if !line.trim_start().starts_with('{') {
            return Err(at(
                "not a valid document: expected a JSON object {\"tokens\": [...], ...}".into(),
            ));
        }
        let doc: JsonDoc<'_> = match field {
            Some(field) => doc_with_field(&line, field).map_err(at)?,
            None => serde_json::from_str(&line).map_err(|e| {
                let why = e.to_string();
                if why.contains("missing field `tokens`") {
                    at(
                        "missing \"tokens\" (each line is {\"tokens\": [...], \"meta\": ...}; \
                        name another field with --tokens-field, e.g. input_ids)"
                            .into(),
                    )
                } else if why.contains("unknown field") {
                    at(format!(
                        "not a valid document: {why}; to read the tokens of a line with other \
                         fields, name them with --tokens-field (e.g. tokens or input_ids)"
                    ))
                } else {
                    at(format!("not a valid document: {why}"))
                }
            })?,
        };
        if doc.tokens.is_empty() {
            return Err(at(
                "\"tokens\" is empty: a document needs at least one token".into(),
            ));
        }
        records.clear();
        for (i, t) in doc.tokens.iter().enumerate() {
            let v = t
                .as_i128()
                .filter(|v| (lo..=hi).contains(v))
                .ok_or_else(|| {
                    at(format!(
                        "token {i} ({t}) is not a {token} value ({lo}..={hi})"
                    ))
                })?;
            records.extend_from_slice(&v.to_le_bytes()[..size]);
        }
        let len = doc.tokens.len() as u64;
        let mut prev_end = 0;
        for (i, s) in doc.spans.iter().enumerate() {
            if s.start >= s.end || s.end > len {
                return Err(at(format!(
                    "span {i} [{}, {}) is out of bounds: spans need start < end <= {len} \
                     (the number of tokens)",
                    s.start, s.end
                )));
            }
            if s.start < prev_end {
                return Err(at(format!(
                    "span {i} [{}, {}) overlaps or precedes the previous span: spans must be \
                     sorted and disjoint",
                    s.start, s.end
                )));
            }
            prev_end = s.end;
        }
        writer.begin_doc(doc.meta.map(RawValue::get))?;
        let mut pos = 0u64;
        for s in &doc.spans {
            if pos < s.start {
                writer.write_doc_records(
                    &records[(pos as usize) * size..(s.start as usize) * size],
                    Seg::Doc,
                )?;
            }
            let meta = s.meta.map_or("null", RawValue::get);
            writer.write_doc_records(
                &records[(s.start as usize) * size..(s.end as usize) * size],
                Seg::Span(meta),
            )?;
            pos = s.end;
        }
        if pos < len {
            writer.write_doc_records(&records[(pos as usize) * size..], Seg::Doc)?;
        }
        writer.end_doc()?;
    }
}
