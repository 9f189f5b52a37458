//! Models: typed configuration from GGUF metadata, zero-copy weights, the KV cache and the
//! forward pass for llama, qwen2, qwen3, qwen3moe, gemma2, gemma3, phi3 and smollm3.

pub mod arch;
pub mod attention;
pub mod batch;
pub mod config;
pub mod eval;
pub mod forward;
pub mod kv;
pub mod lora;
pub mod moe;
pub mod names;
pub mod ops;
mod par;
pub mod params;
#[cfg(test)]
mod test_util;
mod vmath;
pub mod weights;

use std::path::Path;

pub use arch::Arch;
pub use batch::Batch;
pub use config::ModelConfig;
pub use forward::Context;
use gguf::GgufFile;
pub use kv::{kv_bytes_per_token, SeqId};
pub use lora::{AdapterSet, Lora, LoraError};
pub use params::{ContextParams, KvRotate, KvType};
pub use weights::Weights;

/// A loaded model: the mapped file, its typed configuration and weight views into the mapping.
pub struct Model {
    pub file: GgufFile,
    pub config: ModelConfig,
    pub weights: Weights,
}

impl Model {
    pub fn load(path: impl AsRef<Path>) -> Result<Model, ModelError> {
        let file = GgufFile::open(path)?;
        Self::from_gguf(file)
    }

    pub fn from_gguf(file: GgufFile) -> Result<Model, ModelError> {
        let config = ModelConfig::from_gguf(&file)?;
        let weights = Weights::load(&file, &config)?;
        Ok(Model { file, config, weights })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Gguf(#[from] gguf::GgufError),
    #[error("unsupported architecture {0:?}: snug runs llama, qwen2, qwen3, qwen3moe, gemma2, gemma3, phi3 and smollm3")]
    UnsupportedArch(String),
    #[error("model metadata lacks {0}")]
    MissingKey(String),
    #[error("model metadata {key} has an invalid value {value}")]
    BadValue { key: String, value: String },
    #[error("model file lacks tensor {0}")]
    MissingTensor(String),
    #[error("tensor {name} has shape {found}, expected {expected}")]
    BadShape { name: String, expected: String, found: String },
    #[error("unsupported: {0}")]
    Unsupported(String),
    #[error("token id {token} is outside the vocabulary of {n_vocab}")]
    BadToken { token: u32, n_vocab: usize },
    #[error("sequence {seq} does not exist (this context holds {n_seq_max} sequences)")]
    BadSeq { seq: usize, n_seq_max: usize },
    #[error("position {pos} is past the context length {n_ctx}")]
    ContextFull { pos: usize, n_ctx: usize },
    /// Every block of the KV cache is held by a sequence.
    #[error("the KV cache is full: all {blocks} blocks of {block_bytes} bytes are in use")]
    KvFull { blocks: usize, block_bytes: usize },
    #[error("batch asks for {requested} logit rows but the context was created for {max}")]
    TooManyOutputs { requested: usize, max: usize },
    #[error("kernel: {0}")]
    Kernel(String),
    /// The expert cache could not serve an expert (a failed read, or the file cut short).
    #[error("experts: {0}")]
    Experts(String),
    #[error(transparent)]
    Lora(#[from] LoraError),
}
