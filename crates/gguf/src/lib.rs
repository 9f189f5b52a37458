//! GGUF: the model file format. A zero-copy reader over a read-only mmap ([`GgufFile`]) and a
//! streaming writer ([`GgufWriter`]). See `docs/ARCHITECTURE.md` for where this sits.
//!
//! ggml type ids and block sizes live in the `quant` crate ([`quant::GgmlType`]); this crate
//! only knows how they are laid out in a file.

mod mapping;
mod reader;
mod value;
mod writer;

pub use mapping::Mapping;
pub use quant::GgmlType;
pub use reader::{tensor_size, GgufFile, TensorInfo, DEFAULT_ALIGNMENT, GGUF_MAGIC, MAX_DIMS};
pub use value::{Array, StrArray, StrSpan, Value, ValueType};
pub use writer::{GgufWriter, TensorSpec};

/// Everything that can be wrong with a GGUF file. Messages name the offending key, tensor or
/// offset so a user can tell a truncated download from a file written by a buggy tool.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("cannot read {path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("not a GGUF file: magic bytes are {0:02x?}, expected \"GGUF\"")]
    BadMagic([u8; 4]),
    #[error("GGUF version {0} is not supported (snug reads versions 2 and 3; a huge number means a big-endian file)")]
    UnsupportedVersion(u32),
    #[error("file is truncated: {what} at byte {offset} runs past the end of the file (incomplete download?)")]
    Truncated { what: String, offset: u64 },
    #[error("{what} {count} at byte {offset} cannot fit in the file")]
    AbsurdCount { what: String, count: u64, offset: u64 },
    #[error("{what} at byte {offset} is not valid UTF-8")]
    BadUtf8 { what: String, offset: u64 },
    #[error("metadata key {key:?} has unknown value type {id}")]
    BadValueType { key: String, id: u32 },
    #[error("metadata key {key:?}: {why}")]
    BadValue { key: String, why: String },
    #[error("metadata key {0:?} appears twice")]
    DuplicateKey(String),
    #[error("general.alignment must be a power of two, got {0}")]
    BadAlignment(String),
    #[error("tensor {name:?} has unknown ggml type id {id}")]
    UnknownTensorType { name: String, id: u32 },
    #[error("tensor {name:?}: {why}")]
    BadTensor { name: String, why: String },
    #[error("tensor {name:?} has shape {dims:?}: its {what} does not fit in 64 bits or this machine's address space, so no product of its dimensions can be trusted (a corrupt file or a broken converter: re-download or re-convert it)")]
    ShapeOverflow { name: String, dims: Vec<u64>, what: &'static str },
    #[error("tensor {0:?} appears twice")]
    DuplicateTensor(String),
    #[error("tensor {name:?} (offset {offset}, {size} bytes) lies outside the {data_len}-byte data section (truncated file?)")]
    TensorOutOfBounds { name: String, offset: u64, size: u64, data_len: u64 },
    #[error("write failed: {0}")]
    Write(#[from] std::io::Error),
    #[error("writer: {0}")]
    Writer(String),
}
