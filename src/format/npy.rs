//! The `.npy` format: writing headers byte-identical to numpy's, and reading the headers of
//! input files.
//!
//! numpy's rules (numpy/lib/format.py, format version 1.0):
//! - magic `\x93NUMPY`, version bytes `1 0`, header length as little-endian u16;
//! - the header is the Python literal `{'descr': D, 'fortran_order': False, 'shape': S, }`,
//!   followed by spare spaces so the first axis can grow in place (21 digits minus the digits
//!   of `shape[0]`), then space padding and a final `\n` so that the whole preamble
//!   (magic + version + length + header) is a multiple of `ALIGN` bytes. numpy always adds
//!   at least one padding space before the newline (an aligned header gets 64 more).

use crate::error::{Error, Result};

/// The magic string that opens every `.npy` file.
pub(crate) const MAGIC: &[u8; 6] = b"\x93NUMPY";

/// "The total of len(magic string) + 2 + len(length) + HEADER_LEN must be evenly divisible by
/// 64 for alignment purposes" (numpy's format spec). numpy calls it `ARRAY_ALIGN`.
pub(crate) const ALIGN: usize = 64;

/// numpy's `GROWTH_AXIS_MAX_DIGITS`: room reserved so `shape[0]` can grow to 21 digits.
const GROWTH_AXIS_MAX_DIGITS: usize = 21;

/// Builds the complete `.npy` v1.0 preamble (everything before the data) for a C-order array.
/// `descr` is the Python literal of the dtype (`'<u4'` with quotes). Fails only when the header
/// would not fit the 16-bit length of format 1.0.
pub fn header(descr: &str, shape: &[u64]) -> Result<Vec<u8>> {
    let shape_repr = match shape {
        [] => "()".to_string(),
        [one] => format!("({one},)"),
        many => {
            let parts: Vec<String> = many.iter().map(u64::to_string).collect();
            format!("({})", parts.join(", "))
        }
    };
    let mut dict = format!("{{'descr': {descr}, 'fortran_order': False, 'shape': {shape_repr}, }}");
    if let Some(first) = shape.first() {
        let digits = first.to_string().len();
        dict.extend(std::iter::repeat_n(
            ' ',
            GROWTH_AXIS_MAX_DIGITS.saturating_sub(digits),
        ));
    }
    let prefix = MAGIC.len() + 2 + 2;
    let hlen = dict.len() + 1; // + '\n'
    let padlen = ALIGN - (prefix + hlen) % ALIGN;
    let total = hlen + padlen;
    let total16 = u16::try_from(total).map_err(|_| {
        Error::invalid(format!(
            "npy header of {total} bytes does not fit format 1.0"
        ))
    })?;
    let mut out = Vec::with_capacity(prefix + total);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&[1, 0]);
    out.extend_from_slice(&total16.to_le_bytes());
    out.extend_from_slice(dict.as_bytes());
    out.extend(std::iter::repeat_n(b' ', padlen));
    out.push(b'\n');
    debug_assert_eq!(out.len() % ALIGN, 0);
    Ok(out)
}

/// What an input `.npy` header says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Header {
    /// The dtype string (`<u4`); structured dtypes are returned as their raw literal.
    pub descr: String,
    /// Whether the data is in Fortran order.
    pub fortran_order: bool,
    /// The array shape.
    pub shape: Vec<u64>,
    /// Byte offset of the first data byte.
    pub data_offset: u64,
}

/// Parses a `.npy` header from the first bytes of a file (versions 1.0, 2.0 and 3.0). `bytes`
/// must hold at least the whole header; 64 KiB plus 12 bytes always suffices for v1.0.
pub(crate) fn parse_header(bytes: &[u8]) -> Result<Header> {
    let bad = |why: &str| Error::invalid(format!("not a valid .npy file: {why}"));
    if bytes.len() < 10 || &bytes[..6] != MAGIC {
        return Err(bad("missing \\x93NUMPY magic"));
    }
    let (len, start) = match bytes[6] {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        2 | 3 => {
            if bytes.len() < 12 {
                return Err(bad("truncated header"));
            }
            let len = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]);
            (len as usize, 12)
        }
        v => return Err(bad(&format!("unsupported format version {v}"))),
    };
    let text = bytes
        .get(start..start + len)
        .ok_or_else(|| bad("truncated header"))?;
    let text = std::str::from_utf8(text).map_err(|_| bad("header is not text"))?;
    let descr = dict_value(text, "descr").ok_or_else(|| bad("no 'descr' key"))?;
    let descr = if let Some(quoted) = descr.strip_prefix('\'') {
        quoted
            .strip_suffix('\'')
            .ok_or_else(|| bad("bad 'descr'"))?
            .to_string()
    } else {
        descr.to_string()
    };
    let fortran_order = match dict_value(text, "fortran_order") {
        Some("False") => false,
        Some("True") => true,
        _ => return Err(bad("bad 'fortran_order'")),
    };
    let shape_text = dict_value(text, "shape").ok_or_else(|| bad("no 'shape' key"))?;
    let inner = shape_text
        .strip_prefix('(')
        .and_then(|s| s.strip_suffix(')'))
        .ok_or_else(|| bad("bad 'shape'"))?;
    let mut shape = Vec::new();
    for part in inner.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let part = part.trim_end_matches('L');
        shape.push(part.parse::<u64>().map_err(|_| bad("bad 'shape'"))?);
    }
    Ok(Header {
        descr,
        fortran_order,
        shape,
        data_offset: (start + len) as u64,
    })
}

/// The raw literal following `'key':` in a Python dict literal, up to the matching comma or
/// closing brace at nesting depth zero.
fn dict_value<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    let pattern = format!("'{key}':");
    let start = text.find(&pattern)? + pattern.len();
    let rest = &text[start..];
    let mut depth = 0i32;
    let mut in_quote = false;
    for (i, c) in rest.char_indices() {
        match c {
            '\'' => in_quote = !in_quote,
            '(' | '[' | '{' if !in_quote => depth += 1,
            ')' | ']' if !in_quote => depth -= 1,
            '}' if !in_quote => {
                if depth == 0 {
                    return Some(rest[..i].trim());
                }
                depth -= 1;
            }
            ',' if !in_quote && depth == 0 => return Some(rest[..i].trim()),
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_matches_numpy_layout() {
        let h = header("'<u4'", &[32, 2048]).unwrap();
        assert_eq!(h.len(), 128);
        let text = std::str::from_utf8(&h[10..]).unwrap();
        assert!(
            text.starts_with("{'descr': '<u4', 'fortran_order': False, 'shape': (32, 2048), }")
        );
        assert!(text.ends_with(" \n"));
        assert_eq!(u16::from_le_bytes([h[8], h[9]]) as usize, h.len() - 10);
    }

    #[test]
    fn header_always_aligned_and_padded() {
        for rows in [0u64, 1, 9, 10, 99, 12345, u64::MAX] {
            for cols in [1u64, 7, 2049] {
                let h = header("'|u1'", &[rows, cols]).unwrap();
                assert_eq!(h.len() % ALIGN, 0);
                assert_eq!(*h.last().unwrap(), b'\n');
                assert_eq!(h[h.len() - 2], b' ', "numpy pads at least one space");
                let parsed = parse_header(&h).unwrap();
                assert_eq!(parsed.shape, vec![rows, cols]);
                assert_eq!(parsed.descr, "|u1");
                assert_eq!(parsed.data_offset as usize, h.len());
            }
        }
    }

    #[test]
    fn one_dimensional_shape() {
        let h = header("'<i8'", &[5]).unwrap();
        let text = std::str::from_utf8(&h[10..]).unwrap();
        assert!(text.contains("'shape': (5,), }"));
        assert_eq!(parse_header(&h).unwrap().shape, vec![5]);
    }

    #[test]
    fn parse_rejects_garbage_without_panicking() {
        let good = header("'<u2'", &[3]).unwrap();
        for cut in 0..good.len() {
            let _ = parse_header(&good[..cut]);
        }
        assert!(parse_header(b"hello world!").is_err());
        let mut v = good.clone();
        v[6] = 9;
        assert!(parse_header(&v).is_err());
    }

    #[test]
    fn parse_structured_descr_literal() {
        let text = "{'descr': [('token', '<u4'), ('concept', '<u2')], 'fortran_order': False, 'shape': (7,), }";
        let mut bytes = MAGIC.to_vec();
        bytes.extend_from_slice(&[1, 0]);
        bytes.extend_from_slice(&(text.len() as u16).to_le_bytes());
        bytes.extend_from_slice(text.as_bytes());
        let h = parse_header(&bytes).unwrap();
        assert_eq!(h.descr, "[('token', '<u4'), ('concept', '<u2')]");
        assert_eq!(h.shape, vec![7]);
    }
}
