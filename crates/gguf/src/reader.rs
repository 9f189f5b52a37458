//! GGUF v2/v3 reader over a read-only mmap.
//!
//! The header (metadata and tensor infos) is parsed once into owned values; tensor data is never
//! copied: [`GgufFile::tensor_data`] is a slice of the mapping. Every length, count and offset in
//! the header is checked against the bytes that remain before it is used, so a malformed file
//! yields a [`GgufError`], never a panic, a huge allocation or a read past the end.

use std::collections::HashMap;
use std::path::Path;

use quant::GgmlType;

use crate::value::{Array, StrArray, Value, ValueType};
use crate::GgufError;
use crate::Mapping;

pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml tensors have at most 4 dimensions.
pub const MAX_DIMS: usize = 4;
/// Nested arrays deeper than this are rejected (real files use depth 1; this bounds recursion).
const MAX_ARRAY_DEPTH: usize = 8;
/// Longest key or tensor name accepted (llama.cpp's GGML_MAX_NAME is 64; keys are short too).
const MAX_NAME_LEN: usize = 1 << 16;

/// One tensor as the header describes it.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    /// ggml order: `dims[0]` is the fastest-varying (row length).
    pub dims: Vec<u64>,
    pub ggml_type: GgmlType,
    /// Offset from the start of the data section.
    pub offset: u64,
    /// Bytes of data, derived from dims and type.
    pub size: u64,
}

impl TensorInfo {
    /// Number of elements. Exact for every tensor of a parsed file (the reader refuses a shape
    /// whose products do not fit, see [`tensor_size`]); saturates at `u64::MAX` for a
    /// hand-built `TensorInfo` whose dimensions overflow.
    pub fn n_elements(&self) -> u64 {
        checked_product(self.dims.iter().copied()).unwrap_or(u64::MAX)
    }

    /// Number of rows (product of `dims[1..]`) and row length (`dims[0]`). Exact for every
    /// tensor of a parsed file; saturates at `usize::MAX` for a hand-built one that overflows.
    pub fn rows_cols(&self) -> (usize, usize) {
        let to_usize = |x: u64| usize::try_from(x).unwrap_or(usize::MAX);
        let cols = self.dims.first().map_or(1, |&c| to_usize(c));
        let rows = checked_product(self.dims.iter().skip(1).copied()).map_or(usize::MAX, to_usize);
        (rows, cols)
    }
}

fn checked_product(it: impl Iterator<Item = u64>) -> Option<u64> {
    it.into_iter().try_fold(1u64, u64::checked_mul)
}

/// Where the bytes come from: a read-only mapping, or an owned buffer (tests, fuzzing). The
/// mapping is shared so that whoever works on it from other threads (the weight streamer) can
/// hold it alive on its own: [`GgufFile::mapping`] hands out the owner.
enum Backing {
    Mmap(Mapping),
    Owned(Vec<u8>),
}

impl Backing {
    fn bytes(&self) -> &[u8] {
        match self {
            Backing::Mmap(m) => m,
            Backing::Owned(v) => v,
        }
    }
}

/// A parsed GGUF file.
pub struct GgufFile {
    backing: Backing,
    pub version: u32,
    pub alignment: u64,
    /// Metadata in file order.
    pub metadata: Vec<(String, Value)>,
    index: HashMap<String, usize>,
    pub tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
    /// Absolute offset of the data section in the file; never past its end. (A file without
    /// tensors need not be padded to the alignment — vocabulary-only GGUFs are not — and its data
    /// section is then empty at the end of the file.)
    pub data_offset: u64,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("version", &self.version)
            .field("n_kv", &self.metadata.len())
            .field("n_tensors", &self.tensors.len())
            .field("data_offset", &self.data_offset)
            .finish()
    }
}

impl GgufFile {
    /// Maps `path` read-only and parses its header.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile, GgufError> {
        let path = path.as_ref();
        let file = std::fs::File::open(path)
            .map_err(|e| GgufError::Io { path: path.display().to_string(), source: e })?;
        Self::from_file(&file, &path.display().to_string())
    }

    /// Maps the already open `file` read-only and parses its header; `label` names it in
    /// errors. For a file whose handle was checked after opening it (nothing reopens a path
    /// that may have changed since).
    pub fn from_file(file: &std::fs::File, label: &str) -> Result<GgufFile, GgufError> {
        let map = Mapping::open(file)
            .map_err(|e| GgufError::Io { path: label.to_string(), source: e })?;
        // Ask for 2 MiB page-cache folios: where the filesystem supports large folios (ext4,
        // xfs on recent kernels) the weights are then mapped by huge pages — 512× fewer TLB
        // entries and page faults while decode streams the whole file each token. Only a hint;
        // a kernel that cannot do it ignores it.
        #[cfg(target_os = "linux")]
        let _ = map.mmap().advise(memmap2::Advice::HugePage);
        let f = Self::parse(Backing::Mmap(map))?;
        #[cfg(target_os = "linux")]
        f.small_pages_for_sparse_embedding();
        Ok(f)
    }

    /// An untied token embedding is read one row per token: with huge-page folios each row
    /// touched maps (and reads) up to 2 MiB around it, several times the rows' own bytes, which
    /// the memory plan does not expect. Its pages stay small; every other tensor is read whole
    /// each token and keeps the hint. And no read-around: a row's fault would read a whole
    /// readahead window into the page cache, unmapped but charged to a cgroup limit. (Figures:
    /// BENCHMARKS.md, "Figures moved from code comments".)
    #[cfg(target_os = "linux")]
    fn small_pages_for_sparse_embedding(&self) {
        let (Backing::Mmap(map), Some(t), true) = (
            &self.backing,
            self.tensor("token_embd.weight"),
            self.tensor("output.weight").is_some(),
        ) else {
            return;
        };
        const PAGE: u64 = 4096;
        let start = (self.data_offset + t.offset).div_ceil(PAGE) * PAGE;
        let end = (self.data_offset + t.offset + t.size) / PAGE * PAGE;
        if end > start {
            let m = map.mmap();
            let _ =
                m.advise_range(memmap2::Advice::NoHugePage, start as usize, (end - start) as usize);
            let _ = m.advise_range(memmap2::Advice::Random, start as usize, (end - start) as usize);
        }
    }

    /// Parses a GGUF image held in memory (tests and fuzzing).
    pub fn from_bytes(bytes: Vec<u8>) -> Result<GgufFile, GgufError> {
        Self::parse(Backing::Owned(bytes))
    }

    fn parse(backing: Backing) -> Result<GgufFile, GgufError> {
        let bytes = backing.bytes();
        let mut c = Cursor { buf: bytes, pos: 0 };
        let magic = c.take(4, "magic")?;
        if magic != GGUF_MAGIC {
            return Err(GgufError::BadMagic([magic[0], magic[1], magic[2], magic[3]]));
        }
        let version = c.u32("version")?;
        if version == 1 || version > 3 {
            // Byte-swapped (big-endian) files show up as a huge version number.
            return Err(GgufError::UnsupportedVersion(version));
        }
        if version == 0 {
            return Err(GgufError::UnsupportedVersion(version));
        }
        let n_tensors = c.u64("tensor count")?;
        let n_kv = c.u64("metadata count")?;
        // Each kv takes at least 8 (key len) + 4 (type) + 1 bytes; each tensor info at least
        // 8 + 4 + 4 + 8 bytes. Counts that cannot fit in the file are rejected up front.
        c.check_count(n_kv, 13, "metadata count")?;
        c.check_count(n_tensors, 24, "tensor count")?;

        let mut metadata = Vec::with_capacity(n_kv as usize);
        let mut index = HashMap::with_capacity(n_kv as usize);
        for _ in 0..n_kv {
            let key = c.string("metadata key")?;
            let ty_id = c.u32("metadata value type")?;
            let ty = ValueType::from_id(ty_id)
                .ok_or_else(|| GgufError::BadValueType { key: key.clone(), id: ty_id })?;
            let value = c.value(ty, &key, 0)?;
            if index.insert(key.clone(), metadata.len()).is_some() {
                return Err(GgufError::DuplicateKey(key));
            }
            metadata.push((key, value));
        }

        let alignment = match index.get("general.alignment").map(|&i| &metadata[i].1) {
            None => DEFAULT_ALIGNMENT,
            Some(v) => match v.as_u64() {
                Some(a) if a > 0 && a.is_power_of_two() && a <= 1 << 30 => a,
                _ => return Err(GgufError::BadAlignment(format!("{v:?}"))),
            },
        };

        let mut tensors = Vec::with_capacity(n_tensors as usize);
        let mut tensor_index = HashMap::with_capacity(n_tensors as usize);
        // Totals over all tensors (`snug inspect` adds them up): tensors may share data, so the
        // file size alone does not bound them.
        let (mut all_elements, mut all_bytes) = (0u64, 0u64);
        for _ in 0..n_tensors {
            let name = c.string("tensor name")?;
            let n_dims = c.u32("tensor dimension count")? as usize;
            if n_dims == 0 || n_dims > MAX_DIMS {
                return Err(GgufError::BadTensor {
                    name,
                    why: format!("{n_dims} dimensions (1 to {MAX_DIMS} allowed)"),
                });
            }
            let mut dims = Vec::with_capacity(n_dims);
            for _ in 0..n_dims {
                dims.push(c.u64("tensor dimension")?);
            }
            let ty_id = c.u32("tensor type")?;
            let ggml_type = GgmlType::from_id(ty_id)
                .ok_or_else(|| GgufError::UnknownTensorType { name: name.clone(), id: ty_id })?;
            let offset = c.u64("tensor offset")?;
            let size = tensor_size(&name, &dims, ggml_type)?;
            let n_elements = checked_product(dims.iter().copied()).unwrap_or(u64::MAX);
            match (all_elements.checked_add(n_elements), all_bytes.checked_add(size)) {
                (Some(e), Some(b)) => (all_elements, all_bytes) = (e, b),
                _ => {
                    return Err(GgufError::ShapeOverflow {
                        name,
                        dims,
                        what: "element or byte count added to the tensors before it",
                    })
                }
            }
            if offset % alignment != 0 {
                return Err(GgufError::BadTensor {
                    name,
                    why: format!("offset {offset} is not a multiple of the alignment {alignment}"),
                });
            }
            if tensor_index.insert(name.clone(), tensors.len()).is_some() {
                return Err(GgufError::DuplicateTensor(name));
            }
            tensors.push(TensorInfo { name, dims, ggml_type, offset, size });
        }

        let data_offset = align_up(c.pos as u64, alignment).ok_or_else(|| {
            GgufError::Truncated { what: "data section".into(), offset: c.pos as u64 }
        })?;
        let file_len = bytes.len() as u64;
        for t in &tensors {
            let end = data_offset.checked_add(t.offset).and_then(|s| s.checked_add(t.size));
            match end {
                Some(end) if end <= file_len => {}
                _ => {
                    return Err(GgufError::TensorOutOfBounds {
                        name: t.name.clone(),
                        offset: t.offset,
                        size: t.size,
                        data_len: file_len.saturating_sub(data_offset),
                    })
                }
            }
        }

        // Every tensor ends inside the file, so with tensors this changes nothing; without, an
        // unpadded end or a huge alignment (2^30 on a 123-byte file, a fuzz finding) would put
        // the data section past the end, and `file_len - data_offset` would wrap.
        let data_offset = data_offset.min(file_len);
        Ok(GgufFile {
            backing,
            version,
            alignment,
            metadata,
            index,
            tensors,
            tensor_index,
            data_offset,
        })
    }

    /// The whole file image.
    pub fn bytes(&self) -> &[u8] {
        self.backing.bytes()
    }

    /// Total file size in bytes.
    pub fn file_len(&self) -> u64 {
        self.bytes().len() as u64
    }

    /// The mapping, when the file was opened from disk. Clone it to keep the mapping alive
    /// independently of this file (a streamer's reader threads do).
    pub fn mapping(&self) -> Option<&Mapping> {
        match &self.backing {
            Backing::Mmap(m) => Some(m),
            Backing::Owned(_) => None,
        }
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.index.get(key).map(|&i| &self.metadata[i].1)
    }

    pub fn get_str(&self, key: &str) -> Option<&str> {
        self.get(key).and_then(Value::as_str)
    }

    pub fn get_u64(&self, key: &str) -> Option<u64> {
        self.get(key).and_then(Value::as_u64)
    }

    pub fn get_f64(&self, key: &str) -> Option<f64> {
        self.get(key).and_then(Value::as_f64)
    }

    pub fn get_bool(&self, key: &str) -> Option<bool> {
        self.get(key).and_then(Value::as_bool)
    }

    pub fn get_array(&self, key: &str) -> Option<&Array> {
        self.get(key).and_then(Value::as_array)
    }

    /// `general.architecture`, the prefix of the model's hyper-parameter keys.
    pub fn architecture(&self) -> Option<&str> {
        self.get_str("general.architecture")
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// The bytes of a tensor: a slice of the mapping, never a copy. For a tensor of this file
    /// that is always its whole data (bounds were checked at parse time); a `TensorInfo` from
    /// elsewhere whose bytes would lie outside this file gives an empty slice, not a panic.
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        let start = self.data_offset.checked_add(t.offset);
        let end = start.and_then(|s| s.checked_add(t.size));
        let range = |s: u64, e: u64| Some(usize::try_from(s).ok()?..usize::try_from(e).ok()?);
        match (start, end) {
            (Some(s), Some(e)) => range(s, e).and_then(|r| self.bytes().get(r)).unwrap_or(&[]),
            _ => &[],
        }
    }
}

/// Bytes of a tensor of `dims` × `ty`, refusing any shape snug could not compute with.
///
/// Not only the byte size must fit: every product of dimensions the rest of snug forms — the
/// element count, the row count (product of `dims[1..]`), the bytes of one row — must be
/// representable in u64 and in usize, or a later multiplication would overflow (a panic with
/// overflow checks, a silently wrapped shape without). A zero dimension makes the element count
/// 0 but leaves the row count as large as the other dimensions make it, so the check is on the
/// product of all dimensions with zeros counted as 1, which bounds every sub-product.
pub fn tensor_size(name: &str, dims: &[u64], ty: GgmlType) -> Result<u64, GgufError> {
    let overflow =
        |what| GgufError::ShapeOverflow { name: name.to_string(), dims: dims.to_vec(), what };
    let Some(&cols) = dims.first() else {
        return Err(GgufError::BadTensor { name: name.to_string(), why: "no dimensions".into() });
    };
    checked_product(dims.iter().map(|&d| d.max(1)))
        .filter(|&p| fits_usize(p))
        .ok_or_else(|| overflow("product of dimensions"))?;
    let bs = ty.block_size() as u64;
    if cols % bs != 0 {
        return Err(GgufError::BadTensor {
            name: name.to_string(),
            why: format!("row length {cols} is not a multiple of the {ty} block size {bs}"),
        });
    }
    let row_bytes = (cols / bs)
        .checked_mul(ty.type_size() as u64)
        .filter(|&b| fits_usize(b))
        .ok_or_else(|| overflow("row size in bytes"))?;
    // Cannot overflow: bounded by the product checked above.
    let rows = checked_product(dims.iter().skip(1).copied()).unwrap_or(u64::MAX);
    rows.checked_mul(row_bytes)
        .filter(|&s| s < (1u64 << 62) && fits_usize(s))
        .ok_or_else(|| overflow("size in bytes"))
}

fn fits_usize(x: u64) -> bool {
    usize::try_from(x).is_ok()
}

/// `x` rounded up to a multiple of `a`; `None` on overflow or for `a == 0`.
pub(crate) fn align_up(x: u64, a: u64) -> Option<u64> {
    x.checked_next_multiple_of(a)
}

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], GgufError> {
        if n > self.remaining() {
            return Err(GgufError::Truncated { what: what.to_string(), offset: self.pos as u64 });
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn check_count(&self, n: u64, min_each: usize, what: &str) -> Result<(), GgufError> {
        let need = n.checked_mul(min_each as u64);
        match need {
            Some(need) if need <= self.remaining() as u64 => Ok(()),
            _ => Err(GgufError::AbsurdCount {
                what: what.to_string(),
                count: n,
                offset: self.pos as u64,
            }),
        }
    }

    fn u8(&mut self, what: &str) -> Result<u8, GgufError> {
        Ok(self.take(1, what)?[0])
    }
    fn u16(&mut self, what: &str) -> Result<u16, GgufError> {
        Ok(u16::from_le_bytes(self.take(2, what)?.try_into().unwrap()))
    }
    fn u32(&mut self, what: &str) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.take(4, what)?.try_into().unwrap()))
    }
    fn u64(&mut self, what: &str) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.take(8, what)?.try_into().unwrap()))
    }

    fn string(&mut self, what: &str) -> Result<String, GgufError> {
        self.str(what).map(str::to_string)
    }

    /// A string of the image, borrowed.
    fn str(&mut self, what: &str) -> Result<&'a str, GgufError> {
        let at = self.pos as u64;
        let len = self.u64(what)?;
        if len > self.remaining() as u64 {
            return Err(GgufError::AbsurdCount {
                what: format!("{what} length"),
                count: len,
                offset: at,
            });
        }
        if what != "metadata string" && len as usize > MAX_NAME_LEN {
            return Err(GgufError::AbsurdCount {
                what: format!("{what} length"),
                count: len,
                offset: at,
            });
        }
        let raw = self.take(len as usize, what)?;
        std::str::from_utf8(raw)
            .map_err(|_| GgufError::BadUtf8 { what: what.to_string(), offset: at })
    }

    /// `n` strings into one [`StrArray`]: a first pass finds their text length, so the copy is
    /// one allocation of exactly that size.
    fn strings(&mut self, n: usize, key: &str) -> Result<StrArray, GgufError> {
        let start = self.pos;
        let mut text_bytes = 0usize;
        for _ in 0..n {
            text_bytes += self.str("metadata string")?.len();
        }
        if text_bytes > u32::MAX as usize {
            return Err(GgufError::BadValue {
                key: key.to_string(),
                why: format!("{text_bytes} bytes of strings (at most 4 GiB)"),
            });
        }
        self.pos = start;
        let mut v = StrArray::with_capacity(n, text_bytes);
        for _ in 0..n {
            let pushed = v.try_push(self.str("metadata string")?);
            debug_assert!(pushed.is_some(), "the first pass measured this text");
        }
        Ok(v)
    }

    fn value(&mut self, ty: ValueType, key: &str, depth: usize) -> Result<Value, GgufError> {
        Ok(match ty {
            ValueType::U8 => Value::U8(self.u8(key)?),
            ValueType::I8 => Value::I8(self.u8(key)? as i8),
            ValueType::U16 => Value::U16(self.u16(key)?),
            ValueType::I16 => Value::I16(self.u16(key)? as i16),
            ValueType::U32 => Value::U32(self.u32(key)?),
            ValueType::I32 => Value::I32(self.u32(key)? as i32),
            ValueType::F32 => Value::F32(f32::from_bits(self.u32(key)?)),
            ValueType::Bool => Value::Bool(self.bool(key)?),
            ValueType::String => Value::String(self.string("metadata string")?),
            ValueType::U64 => Value::U64(self.u64(key)?),
            ValueType::I64 => Value::I64(self.u64(key)? as i64),
            ValueType::F64 => Value::F64(f64::from_bits(self.u64(key)?)),
            ValueType::Array => Value::Array(self.array(key, depth)?),
        })
    }

    fn bool(&mut self, key: &str) -> Result<bool, GgufError> {
        match self.u8(key)? {
            0 => Ok(false),
            1 => Ok(true),
            b => Err(GgufError::BadValue { key: key.to_string(), why: format!("bool byte {b}") }),
        }
    }

    fn array(&mut self, key: &str, depth: usize) -> Result<Array, GgufError> {
        if depth >= MAX_ARRAY_DEPTH {
            return Err(GgufError::BadValue {
                key: key.to_string(),
                why: format!("arrays nested deeper than {MAX_ARRAY_DEPTH}"),
            });
        }
        let ty_id = self.u32(key)?;
        let ty = ValueType::from_id(ty_id)
            .ok_or_else(|| GgufError::BadValueType { key: key.to_string(), id: ty_id })?;
        let n = self.u64(key)?;
        self.check_count(n, ty.min_encoded_size(), &format!("array length of {key}"))?;
        let n = n as usize;
        macro_rules! fixed {
            ($variant:ident, $read:ident, $conv:expr) => {{
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push($conv(self.$read(key)?));
                }
                Array::$variant(v)
            }};
        }
        Ok(match ty {
            ValueType::U8 => Array::U8(self.take(n, key)?.to_vec()),
            ValueType::I8 => Array::I8(self.take(n, key)?.iter().map(|&b| b as i8).collect()),
            ValueType::U16 => fixed!(U16, u16, |x| x),
            ValueType::I16 => fixed!(I16, u16, |x: u16| x as i16),
            ValueType::U32 => fixed!(U32, u32, |x| x),
            ValueType::I32 => fixed!(I32, u32, |x: u32| x as i32),
            ValueType::F32 => fixed!(F32, u32, f32::from_bits),
            ValueType::U64 => fixed!(U64, u64, |x| x),
            ValueType::I64 => fixed!(I64, u64, |x: u64| x as i64),
            ValueType::F64 => fixed!(F64, u64, f64::from_bits),
            ValueType::Bool => {
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(self.bool(key)?);
                }
                Array::Bool(v)
            }
            ValueType::String => Array::String(self.strings(n, key)?),
            ValueType::Array => {
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(self.array(key, depth + 1)?);
                }
                Array::Array(v)
            }
        })
    }
}
