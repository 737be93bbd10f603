//! Record types: what one element of the token stream is, and how numpy spells it.
//!
//! A dataset stores a flat stream of fixed-size little-endian records. A record is one scalar
//! (a token id) or a numpy structured dtype of named scalar fields (token plus per-token
//! concept or loss mask, ...), the first field being the token.

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
    /// signed 8-bit
    I8,
    /// signed 16-bit
    I16,
    /// signed 32-bit
    I32,
    /// signed 64-bit
    I64,
    /// IEEE half
    F16,
    /// IEEE single
    F32,
    /// IEEE double
    F64,
    /// numpy bool (one byte)
    Bool,
}

impl ScalarType {
    /// The types a token stream (`--dtype`) can have.
    pub(crate) const TOKEN_TYPES: [ScalarType; 6] = [
        ScalarType::U8,
        ScalarType::U16,
        ScalarType::U32,
        ScalarType::U64,
        ScalarType::I32,
        ScalarType::I64,
    ];

    /// Every type a record field can have.
    pub(crate) const ALL: [ScalarType; 12] = [
        ScalarType::U8,
        ScalarType::U16,
        ScalarType::U32,
        ScalarType::U64,
        ScalarType::I8,
        ScalarType::I16,
        ScalarType::I32,
        ScalarType::I64,
        ScalarType::F16,
        ScalarType::F32,
        ScalarType::F64,
        ScalarType::Bool,
    ];

    /// Size in bytes.
    pub fn size(self) -> usize {
        match self {
            ScalarType::U8 | ScalarType::I8 | ScalarType::Bool => 1,
            ScalarType::U16 | ScalarType::I16 | ScalarType::F16 => 2,
            ScalarType::U32 | ScalarType::I32 | ScalarType::F32 => 4,
            ScalarType::U64 | ScalarType::I64 | ScalarType::F64 => 8,
        }
    }

    /// The CLI name (`u32`).
    pub(crate) fn name(self) -> &'static str {
        match self {
            ScalarType::U8 => "u8",
            ScalarType::U16 => "u16",
            ScalarType::U32 => "u32",
            ScalarType::U64 => "u64",
            ScalarType::I8 => "i8",
            ScalarType::I16 => "i16",
            ScalarType::I32 => "i32",
            ScalarType::I64 => "i64",
            ScalarType::F16 => "f16",
            ScalarType::F32 => "f32",
            ScalarType::F64 => "f64",
            ScalarType::Bool => "bool",
        }
    }

    /// The numpy type string as numpy writes it in a `.npy` header (`<u4`, `|u1`).
    pub(crate) fn descr(self) -> &'static str {
        match self {
            ScalarType::U8 => "|u1",
            ScalarType::U16 => "<u2",
            ScalarType::U32 => "<u4",
            ScalarType::U64 => "<u8",
            ScalarType::I8 => "|i1",
            ScalarType::I16 => "<i2",
            ScalarType::I32 => "<i4",
            ScalarType::I64 => "<i8",
            ScalarType::F16 => "<f2",
            ScalarType::F32 => "<f4",
            ScalarType::F64 => "<f8",
            ScalarType::Bool => "|b1",
        }
    }

    /// Whether tokens of this type are integers (the types `--dtype` takes).
    pub(crate) fn is_token_type(self) -> bool {
        ScalarType::TOKEN_TYPES.contains(&self)
    }

    /// The inclusive range of values an integer token type holds.
    pub(crate) fn int_range(self) -> Option<(i128, i128)> {
        Some(match self {
            ScalarType::U8 => (0, u8::MAX.into()),
            ScalarType::U16 => (0, u16::MAX.into()),
            ScalarType::U32 => (0, u32::MAX.into()),
            ScalarType::U64 => (0, u64::MAX.into()),
            ScalarType::I8 => (i8::MIN.into(), i8::MAX.into()),
            ScalarType::I16 => (i16::MIN.into(), i16::MAX.into()),
            ScalarType::I32 => (i32::MIN.into(), i32::MAX.into()),
            ScalarType::I64 => (i64::MIN.into(), i64::MAX.into()),
            _ => return None,
        })
    }

    /// Parses a token type as `--dtype` takes it: the CLI name (`u16`), numpy's name (`uint16`,
    /// `np.uint16`, `numpy.uint16`) or a little-endian numpy type string (`<u2`, `=u2`, `u2`,
    /// `|u1`). A big-endian type (`>u2`) is refused with how to convert.
    pub fn from_name(name: &str) -> Result<ScalarType> {
        const USE: &str = "use one of u8 u16 u32 u64 i32 i64 (numpy spellings such as uint16 \
                           or <u2 work too)";
        let bare = name.trim();
        let bare = bare
            .strip_prefix("np.")
            .or_else(|| bare.strip_prefix("numpy."))
            .unwrap_or(bare);
        let numpy_name = |t: ScalarType| match t {
            ScalarType::U8 => "uint8",
            ScalarType::U16 => "uint16",
            ScalarType::U32 => "uint32",
            ScalarType::U64 => "uint64",
            ScalarType::I8 => "int8",
            ScalarType::I16 => "int16",
            ScalarType::I32 => "int32",
            ScalarType::I64 => "int64",
            ScalarType::F16 => "float16",
            ScalarType::F32 => "float32",
            ScalarType::F64 => "float64",
            ScalarType::Bool => "bool",
        };
        if let Some(rest) = bare.strip_prefix('>') {
            return Err(Error::invalid(format!(
                "--dtype {name:?} is big-endian: shufflefs reads little-endian tokens; convert \
                 with arr.astype('<{rest}') (or pass the little-endian type if the bytes \
                 already are)"
            )));
        }
        if bare == "i8" {
            // numpy's i8 is int64; shufflefs's names count bits (u8 is uint8).
            return Err(Error::invalid(format!(
                "--dtype \"i8\" is ambiguous: for 8-byte signed tokens (numpy's i8) write i64, \
                 int64 or <i8; {USE}"
            )));
        }
        let code = bare.strip_prefix(['<', '=', '|']).unwrap_or(bare);
        let found = ScalarType::ALL
            .into_iter()
            .find(|&t| t.name() == bare || numpy_name(t) == bare || &t.descr()[1..] == code);
        match found {
            Some(t) if t.is_token_type() => Ok(t),
            Some(t) => Err(Error::invalid(format!(
                "--dtype {name:?} ({}) is not a token type: {USE}",
                t.name()
            ))),
            None => Err(Error::invalid(format!("unknown dtype {name:?}: {USE}"))),
        }
    }

    /// Parses a numpy type string from a `.npy` header. Accepts the little-endian and
    /// byte-order-free spellings numpy produces (`<u4`, `|u1`, `u1`, `=u4` on this machine).
    pub(crate) fn from_descr(descr: &str) -> Result<ScalarType> {
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
                     (numpy |u1 <u2 <u4 <u8 <i4 <i8), or for fields of structured records also \
                     i8 i16 f16 f32 f64 bool"
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

/// One named field of a structured record.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Field {
    /// Field name (empty for a plain scalar record).
    pub name: String,
    /// Field type.
    pub scalar: ScalarType,
}

/// The type of one record of the stream: one scalar (a token id) or a numpy structured
/// dtype of named scalar fields, packed without padding, first field the token.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RecordType {
    fields: Vec<Field>,
    structured: bool,
}

impl RecordType {
    /// A record of one scalar (a plain token stream).
    pub(crate) fn scalar(scalar: ScalarType) -> RecordType {
        RecordType {
            fields: vec![Field {
                name: String::new(),
                scalar,
            }],
            structured: false,
        }
    }

    /// A structured record of the given fields.
    pub(crate) fn structured(fields: Vec<Field>) -> Result<RecordType> {
        if fields.is_empty() {
            return Err(Error::invalid(
                "a structured dtype needs at least one field",
            ));
        }
        for (i, f) in fields.iter().enumerate() {
            if f.name.is_empty() || f.name.contains(['\'', '\\', '\n']) {
                return Err(Error::invalid(format!(
                    "structured dtype field {i} has an unsupported name {:?}",
                    f.name
                )));
            }
            if fields[..i].iter().any(|g| g.name == f.name) {
                return Err(Error::invalid(format!("duplicate field name {:?}", f.name)));
            }
        }
        Ok(RecordType {
            fields,
            structured: true,
        })
    }

    /// Parses a numpy descr as found in a `.npy` header or a manifest: a scalar (`<u4`, with
    /// or without quotes) or a list of `('name', '<type>')` pairs.
    pub(crate) fn from_descr(descr: &str) -> Result<RecordType> {
        let d = descr.trim();
        if !d.starts_with('[') {
            let unquoted = d.trim_matches('\'');
            return Ok(RecordType::scalar(ScalarType::from_descr(unquoted)?));
        }
        let bad = |why: &str| {
            Error::invalid(format!(
                "unsupported structured dtype {descr}: {why} (supported: a flat list of \
                 ('name', '<type>') fields without padding, sub-arrays or nesting)"
            ))
        };
        let inner = d
            .strip_prefix('[')
            .and_then(|x| x.strip_suffix(']'))
            .ok_or_else(|| bad("not a list"))?;
        let mut fields = Vec::new();
        let mut rest = inner.trim();
        while !rest.is_empty() {
            let body_end = rest.find(')').ok_or_else(|| bad("unclosed tuple"))?;
            let tuple = rest
                .strip_prefix('(')
                .ok_or_else(|| bad("expected a tuple"))?;
            let body = &tuple[..body_end - 1];
            let parts: Vec<&str> = body.split(',').map(str::trim).collect();
            let [name, ty] = parts[..] else {
                return Err(bad("a field is not a (name, type) pair"));
            };
            let name = name
                .strip_prefix('\'')
                .and_then(|n| n.strip_suffix('\''))
                .ok_or_else(|| bad("field name is not quoted"))?;
            let ty = ty
                .strip_prefix('\'')
                .and_then(|t| t.strip_suffix('\''))
                .ok_or_else(|| bad("field type is not a quoted type string"))?;
            if name.is_empty() {
                return Err(bad(
                    "padding fields are not supported; repack with align=False",
                ));
            }
            fields.push(Field {
                name: name.to_string(),
                scalar: ScalarType::from_descr(ty)?,
            });
            rest = rest[body_end + 1..].trim_start();
            rest = rest.strip_prefix(',').unwrap_or(rest).trim_start();
        }
        RecordType::structured(fields)
    }

    /// Parses the `dtype` string stored in a manifest.
    pub(crate) fn from_manifest(descr: &str) -> Result<RecordType> {
        RecordType::from_descr(descr)
    }

    /// The string stored in the manifest and in `info.json`: `<u4` for a scalar record, the
    /// numpy list literal for a structured one.
    pub(crate) fn manifest_descr(&self) -> String {
        if self.structured {
            self.list_literal()
        } else {
            self.fields[0].scalar.descr().to_string()
        }
    }

    /// The literal for the `descr` key of a `.npy` header, as numpy writes it (Python repr).
    pub(crate) fn npy_descr(&self) -> String {
        if self.structured {
            self.list_literal()
        } else {
            format!("'{}'", self.fields[0].scalar.descr())
        }
    }

    fn list_literal(&self) -> String {
        let parts: Vec<String> = self
            .fields
            .iter()
            .map(|f| format!("('{}', '{}')", f.name, f.scalar.descr()))
            .collect();
        format!("[{}]", parts.join(", "))
    }

    /// Bytes per record.
    pub fn itemsize(&self) -> usize {
        self.fields.iter().map(|f| f.scalar.size()).sum()
    }

    /// Whether this is a structured (multi-field) record.
    pub(crate) fn is_structured(&self) -> bool {
        self.structured
    }

    /// The fields, in record order.
    pub(crate) fn fields(&self) -> &[Field] {
        &self.fields
    }

    /// The type of the first field: the token of a structured record.
    pub(crate) fn token_type(&self) -> ScalarType {
        self.fields[0].scalar
    }

    /// The scalar type of a single-field record, if that is what this is.
    pub(crate) fn scalar_type(&self) -> Option<ScalarType> {
        (!self.structured).then_some(self.fields[0].scalar)
    }

    /// One record holding `value` in its first field and zeros elsewhere (padding).
    pub(crate) fn pad_record(&self, value: i128) -> Vec<u8> {
        let mut out = vec![0u8; self.itemsize()];
        let size = self.token_type().size();
        out[..size].copy_from_slice(&value.to_le_bytes()[..size]);
        out
    }

    /// The integer value of the first field of `record` (for document separators).
    pub(crate) fn token_value(&self, record: &[u8]) -> i128 {
        let t = self.token_type();
        let mut le = [0u8; 16];
        le[..t.size()].copy_from_slice(&record[..t.size()]);
        let unsigned = i128::from_le_bytes(le);
        match t {
            ScalarType::I8 | ScalarType::I16 | ScalarType::I32 | ScalarType::I64 => {
                let shift = 128 - 8 * t.size() as u32;
                (unsigned << shift) >> shift
            }
            _ => unsigned,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_descrs_round_trip() {
        for t in ScalarType::TOKEN_TYPES {
            assert_eq!(ScalarType::from_name(t.name()).unwrap(), t);
        }
        for t in ScalarType::ALL {
            assert_eq!(ScalarType::from_descr(t.descr()).unwrap(), t);
            assert_eq!(t.descr().len(), 3);
        }
        assert_eq!(ScalarType::from_descr("u1").unwrap(), ScalarType::U8);
        // --dtype takes numpy's spellings of the token types too.
        for (spelling, t) in [
            ("uint16", ScalarType::U16),
            ("np.uint16", ScalarType::U16),
            ("numpy.uint32", ScalarType::U32),
            ("<u2", ScalarType::U16),
            ("u2", ScalarType::U16),
            ("=u4", ScalarType::U32),
            ("|u1", ScalarType::U8),
            ("u1", ScalarType::U8),
            ("uint8", ScalarType::U8),
            ("<u8", ScalarType::U64),
            ("uint64", ScalarType::U64),
            ("int32", ScalarType::I32),
            ("<i4", ScalarType::I32),
            ("<i8", ScalarType::I64),
            ("np.int64", ScalarType::I64),
        ] {
            assert_eq!(ScalarType::from_name(spelling).unwrap(), t, "{spelling}");
        }
        // Bare u8 keeps shufflefs's meaning (uint8); bare i8 (numpy: int64) is refused.
        assert_eq!(ScalarType::from_name("u8").unwrap(), ScalarType::U8);
        let msg = ScalarType::from_name("i8").unwrap_err().to_string();
        assert!(msg.contains("ambiguous") && msg.contains("i64"), "{msg}");
        let msg = ScalarType::from_name(">u2").unwrap_err().to_string();
        assert!(
            msg.contains("big-endian") && msg.contains("astype('<u2')"),
            "{msg}"
        );
        assert_eq!(ScalarType::from_descr("=u4").unwrap(), ScalarType::U32);
    }

    #[test]
    fn rejects_unsupported() {
        assert!(ScalarType::from_name("f32").is_err(), "not a token type");
        assert!(
            ScalarType::from_name("float32").is_err(),
            "not a token type"
        );
        assert!(ScalarType::from_name("int16").is_err(), "not a token type");
        assert!(ScalarType::from_name("<u3").is_err());
        assert_eq!(ScalarType::from_descr("<f4").unwrap(), ScalarType::F32);
        assert!(
            ScalarType::from_descr(">u4")
                .unwrap_err()
                .to_string()
                .contains("big-endian")
        );
        assert!(ScalarType::from_descr("<c8").is_err());
        assert!(ScalarType::from_descr("|u4").is_err());
        assert!(ScalarType::from_descr("").is_err());
    }

    #[test]
    fn structured_descr_round_trip() {
        let lit = "[('token', '<u4'), ('concept', '<u2'), ('mask', '|b1')]";
        let r = RecordType::from_descr(lit).unwrap();
        assert!(r.is_structured());
        assert_eq!(r.itemsize(), 7);
        assert_eq!(r.npy_descr(), lit);
        assert_eq!(r.manifest_descr(), lit);
        assert_eq!(RecordType::from_manifest(&r.manifest_descr()).unwrap(), r);
        assert_eq!(r.fields()[1].name, "concept");
        for bad in [
            "[('', '|V2')]",
            "[('a', '<u4', (2,))]",
            "[('a', '<u4'), ('a', '<u2')]",
            "[('a', [('b', '<u4')])]",
            "[('a' '<u4')]",
            "[",
        ] {
            assert!(RecordType::from_descr(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn token_values_and_padding() {
        let r = RecordType::from_descr("[('token', '<i2'), ('c', '<u2')]").unwrap();
        assert_eq!(r.token_value(&[0xff, 0xff, 9, 9]), -1);
        assert_eq!(r.pad_record(-2), vec![0xfe, 0xff, 0, 0]);
        let u = RecordType::scalar(ScalarType::U16);
        assert_eq!(u.token_value(&[0xff, 0xff]), 65535);
    }

    #[test]
    fn record_type_descr() {
        let r = RecordType::scalar(ScalarType::U16);
        assert_eq!(r.npy_descr(), "'<u2'");
        assert_eq!(r.itemsize(), 2);
        assert_eq!(RecordType::from_manifest("<u2").unwrap(), r);
    }
}
