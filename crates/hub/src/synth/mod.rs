//! Random-weight models with real shapes (`snug synth`): how snug is benchmarked at 7–9B, where
//! no real model is at hand. Speed and memory of a forward pass do not depend on weight values.
//!
//! Architectures: llama (Llama 3.x, Mistral), qwen2, qwen2moe, qwen3, qwen3moe, gemma2, gemma3, phi3
//! (Phi-3, Phi-4-mini with LongRoPE) and smollm3, each written
//! with the keys and tensors llama.cpp's converter writes for it. A shape with a real
//! vocabulary size cuts or pads the tokenizer's to it (an SPM vocabulary such as gemma's stands in
//! for Mistral's and Phi-3's), so embedding and output cost what they do in the real file.
//!
//! Weights are seeded N(0, 0.02), norms 1 + N(0, 0.02), quantized with the tensor-type mix
//! llama-quantize picks (Q4_K_M: Q6_K for output, attn_v/ffn_down in "more bits" layers). By
//! default each tensor is tiled from a small pool of rows quantized once per (type, row length,
//! standard deviation): every quantization block of every row is a seeded choice among the
//! pool's blocks, so no two rows are alike and a 4.4 GB file is written at disk speed. The output
//! matrix alone is quantized row by row (its rows, sharing blocks, would tie the top logits:
//! ~10 s for a 152k × 4096 one); `exact` quantizes every row (minutes on 2 cores). Memory: one
//! tensor buffer at a time (≤ ~0.5 GB).
//!
//! `conditioned` scales the matrices as a trained model's initialisation does instead of the
//! flat 0.02: N(0, 1/fan-in) (each output about as large as the normalised input), the two
//! projections back into the residual stream (attention output, FFN down) a further
//! 1/√(2·layers), embeddings N(0, 1), and the output matrix giving logits of standard deviation
//! 4 (a real model's spread). With 0.02 a 4096-wide matrix multiplies a vector's size by 1.3 and
//! the residual stream is all layer output, so a deep file amplifies a rounding difference until
//! two engines, or one engine's two attention paths, pick different tokens (llama.cpp moves 14%
//! of qwen3-8b's top tokens against itself); conditioned, the layers together add as much as the
//! embedding and a rounding difference stays a rounding difference, so agreement at real shapes
//! means something.
//!
//! One idea per file: `shapes` (the shape table, [`SHAPES`]), `recipe` (which type each tensor
//! gets, [`Recipe`]), `tensors` (every tensor of a shape, [`plan`]), `values` (each tensor's
//! data), `vocab` (the made-up tokenizer), `rng` (the seeded generator) and `write` (the file);
//! this file ties them together and holds the options, report and errors.

mod recipe;
mod rng;
mod shapes;
mod tensors;
mod values;
mod vocab;
mod write;

use std::path::{Path, PathBuf};
use std::time::Instant;

use gguf::{Array, GgufError, GgufFile, Value};
use quant::QuantError;

pub use recipe::Recipe;
pub use shapes::{shape, Arch, Shape, SHAPES};
pub use tensors::{plan, Kind, PlannedTensor};

#[derive(Debug, thiserror::Error)]
pub enum SynthError {
    #[error("unknown shape {0:?} (known: {list})", list = SHAPES.iter().map(|s| s.name).collect::<Vec<_>>().join(", "))]
    UnknownShape(String),
    #[error("tokenizer source has no tokenizer.ggml.tokens array: take the tokenizer from a real model (e.g. qwen2.5-coder-0.5b)")]
    NoTokenizer,
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error("quantizing {tensor}: {source}")]
    Quant { tensor: String, source: QuantError },
    #[error(
        "disk full writing {path}: the file needs {need} bytes; free space or write elsewhere"
    )]
    DiskFull { path: PathBuf, need: u64 },
    #[error("{what} {path}: {source}")]
    Io { what: &'static str, path: PathBuf, source: std::io::Error },
}

/// How to synthesise.
#[derive(Clone, Debug)]
pub struct SynthOptions {
    pub shape: Shape,
    pub recipe: Recipe,
    pub seed: u64,
    /// Worker threads for quantization and row generation.
    pub threads: usize,
    /// Quantize every row (slow) instead of tiling a pool of quantized rows.
    pub exact: bool,
    /// Rows per (type, row length) pool in tiling mode.
    pub pool_rows: usize,
    pub quiet: bool,
    /// Standard deviation of the output projection's values (unless asked, 0.02 like every
    /// matrix, or with `conditioned` 4/√n_embd): larger values peak the next-token
    /// distribution, which near-uniform random logits lack, so top-1 agreement with another
    /// engine means something.
    pub output_std: Option<f32>,
    /// Scale matrices as a trained model's initialisation does (see the module docs).
    pub conditioned: bool,
}

impl SynthOptions {
    pub fn new(shape: &Shape) -> SynthOptions {
        SynthOptions {
            shape: shape.clone(),
            recipe: Recipe::Q4KM,
            seed: 0,
            threads: 2,
            exact: false,
            pool_rows: 64,
            quiet: true,
            output_std: None,
            conditioned: false,
        }
    }

    /// Whether `t` is the output projection (a tied embedding is one too): its values make the
    /// logits, so it is quantized row by row even when the rest is tiled, for tiled rows share
    /// blocks and would tie the top logits.
    pub(crate) fn makes_logits(&self, t: &PlannedTensor) -> bool {
        t.kind == Kind::Output || (t.kind == Kind::TokenEmbd && self.shape.tied_embd)
    }

    /// Standard deviation of the values of matrix `t` (of its kind, and row length: fan-in).
    pub(crate) fn std_of(&self, t: &PlannedTensor) -> f32 {
        let n_embd = self.shape.n_embd as f32;
        if self.makes_logits(t) {
            let logits_std = if self.conditioned { 4.0 / n_embd.sqrt() } else { 0.02 };
            return self.output_std.unwrap_or(logits_std);
        }
        if !self.conditioned {
            return 0.02;
        }
        let fan_in = t.dims[0] as f32;
        match t.kind {
            Kind::TokenEmbd => 1.0,
            Kind::AttnOutput | Kind::FfnDown | Kind::FfnDownExps | Kind::FfnDownShexp => {
                1.0 / (fan_in * 2.0 * self.shape.n_layer as f32).sqrt()
            }
            _ => 1.0 / fan_in.sqrt(),
        }
    }
}

/// What was written.
#[derive(Clone, Debug)]
pub struct SynthReport {
    pub path: PathBuf,
    pub n_tensors: usize,
    pub n_params: u64,
    pub file_bytes: u64,
    pub seconds: f64,
}

/// Writes a random-weight model to `out` (atomically: `out.partial` then rename). Tokenizer
/// metadata (every `tokenizer.*` key) is copied from `tokenizer`; without one, a 257-token
/// byte-level BPE vocabulary (256 bytes + `<|endoftext|>`) is made up.
pub fn synth(
    opts: &SynthOptions,
    tokenizer: Option<&GgufFile>,
    out: &Path,
) -> Result<SynthReport, SynthError> {
    let started = Instant::now();
    let tok_kvs = match tokenizer {
        Some(f) => {
            let kvs: Vec<(String, Value)> =
                f.metadata.iter().filter(|(k, _)| k.starts_with("tokenizer.")).cloned().collect();
            if !kvs.iter().any(|(k, _)| k == "tokenizer.ggml.tokens") {
                return Err(SynthError::NoTokenizer);
            }
            kvs
        }
        None => vocab::byte_level_tokenizer(),
    };
    let tok_kvs = match opts.shape.n_vocab {
        Some(n) => vocab::fit(tok_kvs, n),
        None => tok_kvs,
    };
    let n_vocab = tok_kvs
        .iter()
        .find(|(k, _)| k == "tokenizer.ggml.tokens")
        .and_then(|(_, v)| v.as_array())
        .map(Array::len)
        .ok_or(SynthError::NoTokenizer)?;

    let tensors = plan(&opts.shape, n_vocab, opts.recipe);
    let meta = metadata(opts, n_vocab, tok_kvs);
    write::write_file(opts, &tensors, meta, out)?;
    let file_bytes = std::fs::metadata(out).map(|m| m.len()).unwrap_or(0);
    Ok(SynthReport {
        path: out.to_path_buf(),
        n_tensors: tensors.len(),
        n_params: tensors.iter().map(|t| t.dims.iter().product::<u64>()).sum(),
        file_bytes,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// The header: `general.*`, the architecture's hyper-parameters, `snug.synth.*` (how it was
/// made) and the tokenizer's keys.
fn metadata(
    opts: &SynthOptions,
    n_vocab: usize,
    tok_kvs: Vec<(String, Value)>,
) -> Vec<(String, Value)> {
    let s = &opts.shape;
    let arch = s.arch.name();
    let mut meta: Vec<(String, Value)> = Vec::new();
    let mut kv = |k: &str, v: Value| meta.push((k.to_string(), v));
    kv("general.architecture", Value::String(arch.into()));
    kv("general.type", Value::String("model".into()));
    // Not the shape's name: llama.cpp keys tokenizer quirks on `general.name` (a "phi-3" name
    // asks for Phi-3's own tokens), and the vocabulary here is borrowed; the shape is below.
    kv("general.name", Value::String(format!("synthetic (random weights, seed {})", opts.seed)));
    kv("general.file_type", Value::U32(opts.recipe.file_type()));
    kv("general.quantization_version", Value::U32(2));
    let key = |k: &str| format!("{arch}.{k}");
    kv(&key("block_count"), Value::U32(s.n_layer as u32));
    kv(&key("context_length"), Value::U32(s.n_ctx_train as u32));
    kv(&key("embedding_length"), Value::U32(s.n_embd as u32));
    kv(&key("feed_forward_length"), Value::U32(s.n_ff as u32));
    kv(&key("attention.head_count"), Value::U32(s.n_head as u32));
    kv(&key("attention.head_count_kv"), Value::U32(s.n_head_kv as u32));
    kv(&key("rope.freq_base"), Value::F32(s.rope_freq_base));
    kv(&key("rope.dimension_count"), Value::U32(s.n_rot() as u32));
    kv(&key("attention.layer_norm_rms_epsilon"), Value::F32(s.rms_eps));
    if let Some(n) = s.key_length {
        kv(&key("attention.key_length"), Value::U32(n as u32));
        kv(&key("attention.value_length"), Value::U32(n as u32));
    }
    if let Some(w) = s.sliding_window {
        kv(&key("attention.sliding_window"), Value::U32(w as u32));
    }
    if let Some((attn, fin)) = s.softcaps {
        kv(&key("attn_logit_softcapping"), Value::F32(attn));
        kv(&key("final_logit_softcapping"), Value::F32(fin));
    }
    if let Some(factor) = s.rope_linear {
        kv(&key("rope.scaling.type"), Value::String("linear".into()));
        kv(&key("rope.scaling.factor"), Value::F32(factor));
    }
    if let (Some(orig), Some(factor)) = (s.longrope_orig_ctx, s.longrope_attn_factor()) {
        kv(&key("rope.scaling.original_context_length"), Value::U32(orig as u32));
        kv(&key("rope.scaling.attn_factor"), Value::F32(factor));
    }
    if let Some((n_expert, n_used, n_ff_exp)) = s.moe {
        kv(&key("expert_count"), Value::U32(n_expert as u32));
        kv(&key("expert_used_count"), Value::U32(n_used as u32));
        kv(&key("expert_feed_forward_length"), Value::U32(n_ff_exp as u32));
        if let Some(fs) = s.n_ff_shexp {
            kv(&key("expert_shared_feed_forward_length"), Value::U32(fs as u32));
        }
    }
    if matches!(s.arch, Arch::Llama | Arch::SmolLM3) {
        kv(&key("vocab_size"), Value::U32(n_vocab as u32));
    }
    kv("snug.synth.shape", Value::String(s.name.into()));
    kv("snug.synth.seed", Value::U64(opts.seed));
    kv("snug.synth.exact", Value::Bool(opts.exact));
    kv("snug.synth.conditioned", Value::Bool(opts.conditioned));
    meta.extend(tok_kvs);
    meta
}
