//! Record types: what one element of the token stream is, and how numpy spells it.
//!
//! A dataset stores a flat stream of fixed-size little-endian records. Today a record is one
//! scalar (a token id); the type is a list of fields so that multi-field records (token plus
//! per-token concept or loss mask, numpy structured dtypes) extend it without a new type.

use std::fmt;

use crate::error::{Error, Result};

/// A little-endian scalar type of a record field.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ScalarType {
    /// unsigned 8-bit
    U8,
    /// unsigned 16-bit
    U16,
    /// unsigned 32-bit
    U32,
    /// unsigned 64-bit
    U64,
    /// signed 32-bit
    I32,
    /// signed 64-bit
    I64,
}

impl ScalarType {
    /// Every supported scalar type, in CLI order.
    pub const ALL: [ScalarType; 6] = [
        ScalarType::U8,
        ScalarType::U16,
        ScalarType::U32,
        ScalarType::U64,
        ScalarType::I32,
        ScalarType::I64,
    ];

    /// Size in bytes.
    pub fn size(self) -> usize {
        match self {
            ScalarType::U8 => 1,
            ScalarType::U16 => 2,
            ScalarType::U32 | ScalarType::I32 => 4,
            ScalarType::U64 | ScalarType::I64 => 8,
        }
    }

    /// The CLI name (`u32`).
    pub fn name(self) -> &'static str {
        match self {
            ScalarType::U8 => "u8",
            ScalarType::U16 => "u16",
            ScalarType::U32 => "u32",
            ScalarType::U64 => "u64",
            ScalarType::I32 => "i32",
            ScalarType::I64 => "i64",
        }
    }

    /// The numpy type string as numpy writes it in a `.npy` header (`<u4`, `|u1`).
    pub fn descr(self) -> &'static str {
        match self {
            ScalarType::U8 => "|u1",
            ScalarType::U16 => "<u2",
            ScalarType::U32 => "<u4",
            ScalarType::U64 => "<u8",
            ScalarType::I32 => "<i4",
            ScalarType::I64 => "<i8",
        }
    }

    /// Parses a CLI name (`u32`).
    pub fn from_name(name: &str) -> Result<ScalarType> {
        ScalarType::ALL
            .into_iter()
            .find(|t| t.name() == name)
            .ok_or_else(|| {
                Error::invalid(format!(
                    "unknown dtype {name:?}: use one of u8 u16 u32 u64 i32 i64"
                ))
            })
    }

    /// Parses a numpy type string from a `.npy` header. Accepts the little-endian and
    /// byte-order-free spellings numpy produces (`<u4`, `|u1`, `u1`, `=u4` on this machine).
    pub fn from_descr(descr: &str) -> Result<ScalarType> {
        let (order, code) = match descr.as_bytes().first() {
            Some(b'<' | b'|' | b'=') => (descr.as_bytes()[0], &descr[1..]),
            Some(b'>') => {
                return Err(Error::invalid(format!(
                    "big-endian dtype {descr:?} is not supported: convert with \
                     arr.astype(arr.dtype.newbyteorder('<'))"
                )));
            }
            _ => (b'|', descr),
        };
        let found = ScalarType::ALL
            .into_iter()
            .find(|t| &t.descr()[1..] == code)
            .ok_or_else(|| {
                Error::invalid(format!(
                    "unsupported dtype {descr:?}: use one of u8 u16 u32 u64 i32 i64 \
                     (numpy |u1 <u2 <u4 <u8 <i4 <i8)"
                ))
            })?;
        if order == b'|' && found.size() > 1 {
            return Err(Error::invalid(format!(
                "dtype {descr:?} has no byte order: expected {}",
                found.descr()
            )));
        }
        Ok(found)
    }
}

impl fmt::Display for ScalarType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The type of one record of the stream.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RecordType {
    scalar: ScalarType,
}

impl RecordType {
    /// A record of one scalar (a plain token stream).
    pub fn scalar(scalar: ScalarType) -> RecordType {
        RecordType { scalar }
    }

    /// Parses the `dtype` string stored in a manifest (a numpy descr such as `<u4`).
    pub fn from_manifest(descr: &str) -> Result<RecordType> {
        Ok(RecordType::scalar(ScalarType::from_descr(descr)?))
    }

    /// The string stored in the manifest and in `info.json` (numpy descr, `<u4`).
    pub fn manifest_descr(&self) -> String {
        self.scalar.descr().to_string()
    }

    /// The literal for the `descr` key of a `.npy` header, quoted as Python's `repr`.
    pub fn npy_descr(&self) -> String {
        format!("'{}'", self.scalar.descr())
    }

    /// Bytes per record.
    pub fn itemsize(&self) -> usize {
        self.scalar.size()
    }

    /// The scalar type of a single-field record.
    pub fn scalar_type(&self) -> ScalarType {
        self.scalar
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_descrs_round_trip() {
        for t in ScalarType::ALL {
            assert_eq!(ScalarType::from_name(t.name()).unwrap(), t);
            assert_eq!(ScalarType::from_descr(t.descr()).unwrap(), t);
            assert_eq!(t.descr().len(), 3);
        }
        assert_eq!(ScalarType::from_descr("u1").unwrap(), ScalarType::U8);
        assert_eq!(ScalarType::from_descr("=u4").unwrap(), ScalarType::U32);
    }

    #[test]
    fn rejects_unsupported() {
        assert!(ScalarType::from_name("f32").is_err());
        assert!(
            ScalarType::from_descr(">u4")
                .unwrap_err()
                .to_string()
                .contains("big-endian")
        );
        assert!(ScalarType::from_descr("<f4").is_err());
        assert!(ScalarType::from_descr("|u4").is_err());
        assert!(ScalarType::from_descr("").is_err());
    }

    #[test]
    fn record_type_descr() {
        let r = RecordType::scalar(ScalarType::U16);
        assert_eq!(r.npy_descr(), "'<u2'");
        assert_eq!(r.itemsize(), 2);
        assert_eq!(RecordType::from_manifest("<u2").unwrap(), r);
    }
}
