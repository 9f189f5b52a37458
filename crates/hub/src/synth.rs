//! Random-weight models with real shapes (`snug synth`): how snug is benchmarked at 7–9B, where
//! no real model is at hand. Speed and memory of a forward pass do not depend on weight values.
//!
//! Weights are seeded N(0, 0.02), norms 1 + N(0, 0.02), quantized with the tensor-type mix
//! llama-quantize picks (Q4_K_M: Q6_K for output, attn_v/ffn_down in "more bits" layers). By
//! default each tensor tiles rows drawn from a small pool of rows quantized once per (type, row
//! length) — a seeded choice per row — so a 4.4 GB file is written at disk speed; `exact`
//! quantizes every row (minutes on 2 cores). Memory: one tensor buffer at a time (≤ ~0.5 GB).

use std::path::{Path, PathBuf};
use std::time::Instant;

use gguf::{Array, GgmlType, GgufError, GgufFile, GgufWriter, TensorSpec, Value};
use indicatif::{ProgressBar, ProgressStyle};
use quant::QuantError;
use rand_xoshiro::rand_core::{RngCore, SeedableRng};
use rand_xoshiro::Xoshiro256StarStar;

/// The two architectures synth writes; they differ only in data (biases, rope table, defaults).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    Llama,
    Qwen2,
}

impl Arch {
    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
        }
    }
}

/// A model shape: every hyper-parameter a real checkpoint of that name has, except the vocabulary
/// (taken from the tokenizer).
#[derive(Clone, Debug, PartialEq)]
pub struct Shape {
    pub name: &'static str,
    pub arch: Arch,
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_ff: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    /// q/k/v projections carry biases (qwen2).
    pub qkv_bias: bool,
    pub n_ctx_train: usize,
    pub rope_freq_base: f32,
    pub rms_eps: f32,
    /// Llama 3.1 rope scaling: `(factor, low_freq_factor, high_freq_factor, original n_ctx)`,
    /// written as the `rope_freqs.weight` table llama.cpp's converter makes.
    pub llama3_rope: Option<(f32, f32, f32, usize)>,
}

impl Shape {
    pub fn head_dim(&self) -> usize {
        self.n_embd / self.n_head
    }
}

/// A shape with the defaults of its family: qwen2 has qkv biases and rope base 1e6; llama 3.x has
/// rope base 5e5 and the llama3 rope-scaling table.
const fn family(
    arch: Arch,
    name: &'static str,
    n_layer: usize,
    n_embd: usize,
    n_ff: usize,
    n_head: usize,
    n_head_kv: usize,
    n_ctx_train: usize,
) -> Shape {
    let qwen = matches!(arch, Arch::Qwen2);
    Shape {
        name,
        arch,
        n_layer,
        n_embd,
        n_ff,
        n_head,
        n_head_kv,
        qkv_bias: qwen,
        n_ctx_train,
        rope_freq_base: if qwen { 1_000_000.0 } else { 500_000.0 },
        rms_eps: if qwen { 1e-6 } else { 1e-5 },
        llama3_rope: if qwen { None } else { Some((8.0, 1.0, 4.0, 8192)) },
    }
}

/// Known shapes. The `tiny-*` ones are for fast tests (row lengths are whole K-quant blocks).
pub const SHAPES: [Shape; 6] = [
    family(Arch::Qwen2, "qwen2.5-7b", 28, 3584, 18944, 28, 4, 32768),
    family(Arch::Llama, "llama-3.1-8b", 32, 4096, 14336, 32, 8, 131072),
    family(Arch::Qwen2, "qwen2.5-1.5b", 28, 1536, 8960, 12, 2, 32768),
    family(Arch::Qwen2, "qwen2.5-0.5b", 24, 896, 4864, 14, 2, 32768),
    family(Arch::Qwen2, "tiny-qwen2", 2, 256, 512, 4, 2, 2048),
    family(Arch::Llama, "tiny-llama", 2, 256, 512, 4, 2, 2048),
];

pub fn shape(name: &str) -> Option<&'static Shape> {
    SHAPES.iter().find(|s| s.name == name)
}

/// The tensor-type recipe (llama.cpp's `llama_ftype` names).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recipe {
    Q4KM,
    Q8_0,
    F16,
    F32,
}

impl Recipe {
    pub fn parse(s: &str) -> Option<Recipe> {
        Some(match s.to_ascii_lowercase().as_str() {
            "q4_k_m" => Recipe::Q4KM,
            "q8_0" => Recipe::Q8_0,
            "f16" => Recipe::F16,
            "f32" => Recipe::F32,
            _ => return None,
        })
    }

    /// `general.file_type`.
    fn file_type(self) -> u32 {
        match self {
            Recipe::F32 => 0,
            Recipe::F16 => 1,
            Recipe::Q8_0 => 7,
            Recipe::Q4KM => 15,
        }
    }

    /// The type llama-quantize gives a 2-D tensor (`llama_tensor_get_type` for dense llama/qwen2,
    /// one expert, not 70B). `i_layer` counts tensors of the same kind in file order, as
    /// llama.cpp's counters do.
    pub fn tensor_type(
        self,
        kind: Kind,
        i_layer: usize,
        n_layer: usize,
        row_len: usize,
    ) -> GgmlType {
        // llama.cpp: i < n/8 || i >= 7n/8 || (i - n/8) % 3 == 2
        let more_bits = |i: usize, n: usize| {
            i < n / 8 || i >= 7 * n / 8 || (i >= n / 8 && (i - n / 8) % 3 == 2)
        };
        let ty = match self {
            Recipe::F32 => return GgmlType::F32,
            Recipe::F16 => return GgmlType::F16,
            Recipe::Q8_0 => return GgmlType::Q8_0,
            Recipe::Q4KM => match kind {
                Kind::Output if row_len % 256 != 0 => GgmlType::Q8_0,
                Kind::Output => GgmlType::Q6K,
                Kind::AttnV | Kind::FfnDown if more_bits(i_layer, n_layer) => GgmlType::Q6K,
                _ => GgmlType::Q4K,
            },
        };
        // Rows that are not whole 256-value super-blocks fall back as llama.cpp does.
        match ty {
            GgmlType::Q4K if row_len % 256 != 0 => GgmlType::Q5_0,
            GgmlType::Q6K if row_len % 256 != 0 => GgmlType::Q8_0,
            t => t,
        }
    }
}

/// What a tensor is, for the type recipe and its random values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    TokenEmbd,
    Output,
    AttnQ,
    AttnK,
    AttnV,
    AttnOutput,
    FfnGate,
    FfnUp,
    FfnDown,
    /// 1-D: stays f32. Norm weights are 1 + N(0, 0.02).
    Norm,
    /// 1-D: stays f32, N(0, 0.02).
    Bias,
    /// 1-D f32 llama3 rope frequency factors (computed, not random).
    RopeFreqs,
}

/// One tensor of the plan.
#[derive(Clone, Debug)]
pub struct PlannedTensor {
    pub name: String,
    pub kind: Kind,
    pub dims: Vec<u64>,
    pub ggml_type: GgmlType,
}

/// The tensors of `shape` with `n_vocab` tokens, in llama.cpp converter order, typed by `recipe`.
pub fn plan(shape: &Shape, n_vocab: usize, recipe: Recipe) -> Vec<PlannedTensor> {
    let (n_embd, hd) = (shape.n_embd, shape.head_dim());
    let (q_dim, kv_dim) = (shape.n_head * hd, shape.n_head_kv * hd);
    let mut out = Vec::new();
    let mut counters = [0usize; 2]; // attn_v, ffn_down
    let mut push = |name: String, kind: Kind, dims: Vec<u64>| {
        let ggml_type = match kind {
            Kind::Norm | Kind::Bias | Kind::RopeFreqs => GgmlType::F32,
            _ => {
                let counter = match kind {
                    Kind::AttnV => Some(0),
                    Kind::FfnDown => Some(1),
                    _ => None,
                };
                let i = counter.map_or(0, |c| {
                    counters[c] += 1;
                    counters[c] - 1
                });
                recipe.tensor_type(kind, i, shape.n_layer, dims[0] as usize)
            }
        };
        out.push(PlannedTensor { name, kind, dims, ggml_type });
    };
    let (e, v) = (n_embd as u64, n_vocab as u64);
    push("token_embd.weight".into(), Kind::TokenEmbd, vec![e, v]);
    if shape.llama3_rope.is_some() {
        push("rope_freqs.weight".into(), Kind::RopeFreqs, vec![hd as u64 / 2]);
    }
    for l in 0..shape.n_layer {
        let b = |t: &str| format!("blk.{l}.{t}");
        push(b("attn_norm.weight"), Kind::Norm, vec![e]);
        for (t, kind, rows) in [
            ("attn_q", Kind::AttnQ, q_dim),
            ("attn_k", Kind::AttnK, kv_dim),
            ("attn_v", Kind::AttnV, kv_dim),
        ] {
            push(b(&format!("{t}.weight")), kind, vec![e, rows as u64]);
            if shape.qkv_bias {
                push(b(&format!("{t}.bias")), Kind::Bias, vec![rows as u64]);
            }
        }
        push(b("attn_output.weight"), Kind::AttnOutput, vec![q_dim as u64, e]);
        push(b("ffn_norm.weight"), Kind::Norm, vec![e]);
        push(b("ffn_gate.weight"), Kind::FfnGate, vec![e, shape.n_ff as u64]);
        push(b("ffn_up.weight"), Kind::FfnUp, vec![e, shape.n_ff as u64]);
        push(b("ffn_down.weight"), Kind::FfnDown, vec![shape.n_ff as u64, e]);
    }
    push("output_norm.weight".into(), Kind::Norm, vec![e]);
    push("output.weight".into(), Kind::Output, vec![e, v]);
    out
}

#[derive(Debug, thiserror::Error)]
pub enum SynthError {
    #[error("unknown shape {0:?} (known: {list})", list = SHAPES.iter().map(|s| s.name).collect::<Vec<_>>().join(", "))]
    UnknownShape(String),
    #[error("tokenizer source has no tokenizer.ggml.tokens array: pass a real model (e.g. --tokenizer-from qwen2.5-coder-0.5b)")]
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
        None => byte_level_tokenizer(),
    };
    let n_vocab = tok_kvs
        .iter()
        .find(|(k, _)| k == "tokenizer.ggml.tokens")
        .and_then(|(_, v)| v.as_array())
        .map(Array::len)
        .ok_or(SynthError::NoTokenizer)?;

    let s = &opts.shape;
    let tensors = plan(s, n_vocab, opts.recipe);
    let arch = s.arch.name();
    let mut meta: Vec<(String, Value)> = Vec::new();
    let mut kv = |k: &str, v: Value| meta.push((k.to_string(), v));
    kv("general.architecture", Value::String(arch.into()));
    kv("general.type", Value::String("model".into()));
    kv(
        "general.name",
        Value::String(format!("synthetic {} (random weights, seed {})", s.name, opts.seed)),
    );
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
    kv(&key("rope.dimension_count"), Value::U32(s.head_dim() as u32));
    kv(&key("attention.layer_norm_rms_epsilon"), Value::F32(s.rms_eps));
    if s.arch == Arch::Llama {
        kv(&key("vocab_size"), Value::U32(n_vocab as u32));
    }
    kv("snug.synth.shape", Value::String(s.name.into()));
    kv("snug.synth.seed", Value::U64(opts.seed));
    kv("snug.synth.exact", Value::Bool(opts.exact));
    meta.extend(tok_kvs);
    let partial = out.with_extension("gguf.partial");
    let io = |what, e: std::io::Error| SynthError::Io { what, path: partial.clone(), source: e };
    let file = std::fs::File::create(&partial).map_err(|e| io("cannot create", e))?;
    let sink = std::io::BufWriter::with_capacity(8 << 20, file);
    let mut fw = GgufWriter::new(sink);
    for (k, v) in meta {
        fw.add_kv(k, v);
    }
    let mut total: u64 = 0;
    for t in &tensors {
        let spec =
            TensorSpec { name: t.name.clone(), dims: t.dims.clone(), ggml_type: t.ggml_type };
        total += gguf::tensor_size(&t.name, &t.dims, t.ggml_type)?;
        fw.add_tensor(spec)?;
    }
    let result = write_data(opts, &tensors, fw, total, &partial);
    if let Err(e) = result {
        let _ = std::fs::remove_file(&partial);
        return Err(match e {
            SynthError::Gguf(GgufError::Write(io))
                if io.kind() == std::io::ErrorKind::StorageFull =>
            {
                SynthError::DiskFull { path: out.to_path_buf(), need: total }
            }
            e => e,
        });
    }
    std::fs::rename(&partial, out).map_err(|e| SynthError::Io {
        what: "cannot rename to",
        path: out.to_path_buf(),
        source: e,
    })?;
    let file_bytes = std::fs::metadata(out).map(|m| m.len()).unwrap_or(0);
    Ok(SynthReport {
        path: out.to_path_buf(),
        n_tensors: tensors.len(),
        n_params: tensors.iter().map(|t| t.dims.iter().product::<u64>()).sum(),
        file_bytes,
        seconds: started.elapsed().as_secs_f64(),
    })
}

fn write_data(
    opts: &SynthOptions,
    tensors: &[PlannedTensor],
    mut fw: GgufWriter<std::io::BufWriter<std::fs::File>>,
    total: u64,
    path: &Path,
) -> Result<(), SynthError> {
    fw.write_header()?;
    let bar = if opts.quiet {
        ProgressBar::hidden()
    } else {
        let b = ProgressBar::new(total);
        b.set_style(
            ProgressStyle::with_template(
                "{msg:28} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        b
    };
    let mut pools = Pools::default();
    let mut buf: Vec<u8> = Vec::new();
    for (idx, t) in tensors.iter().enumerate() {
        bar.set_message(t.name.clone());
        let (rows, cols) = (t.dims[1..].iter().product::<u64>() as usize, t.dims[0] as usize);
        let row_bytes = t.ggml_type.row_bytes(cols).unwrap_or(0);
        buf.clear();
        buf.resize(rows * row_bytes, 0);
        let seed = mix(opts.seed, idx as u64);
        match t.kind {
            Kind::Norm | Kind::Bias | Kind::RopeFreqs => {
                let vals = one_d_values(t.kind, cols, seed, &opts.shape);
                quant::quantize_row(GgmlType::F32, &vals, &mut buf)
                    .map_err(|e| SynthError::Quant { tensor: t.name.clone(), source: e })?;
            }
            _ if opts.exact => quantize_all(t, &mut buf, row_bytes, seed, opts.threads)?,
            _ => {
                let pool = pools.get(t, opts, row_bytes)?;
                tile(&mut buf, row_bytes, pool, seed, opts.threads);
            }
        }
        fw.write_tensor(&buf)?;
        bar.inc(buf.len() as u64);
    }
    let sink = fw.finish()?;
    let file = sink.into_inner().map_err(|e| SynthError::Io {
        what: "cannot write",
        path: path.to_path_buf(),
        source: e.into_error(),
    })?;
    file.sync_all().map_err(|e| SynthError::Io {
        what: "cannot sync",
        path: path.to_path_buf(),
        source: e,
    })?;
    bar.finish_and_clear();
    Ok(())
}

/// Quantized pools of random rows, one per (type, row length).
#[derive(Default)]
struct Pools(Vec<((GgmlType, usize), Vec<u8>)>);

impl Pools {
    fn get(
        &mut self,
        t: &PlannedTensor,
        opts: &SynthOptions,
        row_bytes: usize,
    ) -> Result<&[u8], SynthError> {
        let key = (t.ggml_type, t.dims[0] as usize);
        if let Some(i) = self.0.iter().position(|(k, _)| *k == key) {
            return Ok(&self.0[i].1);
        }
        let n = opts.pool_rows.max(1);
        let mut pool = vec![0u8; n * row_bytes];
        let spec = PlannedTensor { dims: vec![key.1 as u64, n as u64], ..t.clone() };
        let seed = mix(opts.seed ^ 0x9e37_79b9_7f4a_7c15, (key.0.id() as u64) << 32 | key.1 as u64);
        quantize_all(&spec, &mut pool, row_bytes, seed, opts.threads)?;
        self.0.push((key, pool));
        Ok(&self.0.last().map(|(_, p)| p.as_slice()).unwrap_or_default()[..])
    }
}

/// Fills `buf` row by row with rows of `pool`, each chosen by a seeded hash of its index.
fn tile(buf: &mut [u8], row_bytes: usize, pool: &[u8], seed: u64, threads: usize) {
    if row_bytes == 0 {
        return;
    }
    let n_pool = (pool.len() / row_bytes) as u64;
    let per = buf.len().div_ceil(threads.max(1) * row_bytes).max(1) * row_bytes;
    std::thread::scope(|s| {
        for (c, chunk) in buf.chunks_mut(per).enumerate() {
            s.spawn(move || {
                let first = c * per / row_bytes;
                for (r, dst) in chunk.chunks_exact_mut(row_bytes).enumerate() {
                    let k = (mix(seed, (first + r) as u64) % n_pool) as usize;
                    dst.copy_from_slice(&pool[k * row_bytes..(k + 1) * row_bytes]);
                }
            });
        }
    });
}

/// Generates and quantizes every row of `t` into `buf`; row `r`'s values depend only on
/// `(seed, r)`, so the result does not depend on the thread count.
fn quantize_all(
    t: &PlannedTensor,
    buf: &mut [u8],
    row_bytes: usize,
    seed: u64,
    threads: usize,
) -> Result<(), SynthError> {
    let cols = t.dims[0] as usize;
    if row_bytes == 0 {
        return Ok(());
    }
    let per = buf.len().div_ceil(threads.max(1) * row_bytes).max(1) * row_bytes;
    let results: Vec<Result<(), QuantError>> = std::thread::scope(|s| {
        let handles: Vec<_> = buf
            .chunks_mut(per)
            .enumerate()
            .map(|(c, chunk)| {
                s.spawn(move || {
                    let first = c * per / row_bytes;
                    let mut row = vec![0f32; cols];
                    for (r, dst) in chunk.chunks_exact_mut(row_bytes).enumerate() {
                        let mut rng = Rng::new(mix(seed, (first + r) as u64));
                        rng.fill_normal(&mut row, 0.0, 0.02);
                        quant::quantize_row(t.ggml_type, &row, dst)?;
                    }
                    Ok(())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or(Err(QuantError::CannotQuantize(t.ggml_type))))
            .collect()
    });
    results
        .into_iter()
        .collect::<Result<(), _>>()
        .map_err(|e| SynthError::Quant { tensor: t.name.clone(), source: e })
}

/// Values of a 1-D f32 tensor.
fn one_d_values(kind: Kind, n: usize, seed: u64, shape: &Shape) -> Vec<f32> {
    let mut v = vec![0f32; n];
    let mut rng = Rng::new(seed);
    match kind {
        Kind::Norm => rng.fill_normal(&mut v, 1.0, 0.02),
        Kind::RopeFreqs => v = llama3_rope_factors(shape, n),
        _ => rng.fill_normal(&mut v, 0.0, 0.02),
    }
    v
}

/// llama.cpp converter's `rope_freqs` for Llama 3.1 (`generate_extra_tensors` in
/// convert_hf_to_gguf.py): per frequency, 1 (high), `factor` (low) or a smooth blend.
fn llama3_rope_factors(shape: &Shape, n: usize) -> Vec<f32> {
    let Some((factor, low, high, old_ctx)) = shape.llama3_rope else {
        return vec![1.0; n];
    };
    let base = shape.rope_freq_base as f64;
    let dim = shape.head_dim() as f64;
    let (low_wavelen, high_wavelen) = (old_ctx as f64 / low as f64, old_ctx as f64 / high as f64);
    (0..n)
        .map(|i| {
            let freq = 1.0 / base.powf(2.0 * i as f64 / dim);
            let wavelen = 2.0 * std::f64::consts::PI / freq;
            if wavelen < high_wavelen {
                1.0
            } else if wavelen > low_wavelen {
                factor
            } else {
                let smooth = (old_ctx as f64 / wavelen - low as f64) / (high as f64 - low as f64);
                (1.0 / ((1.0 - smooth) / factor as f64 + smooth)) as f32
            }
        })
        .collect()
}

/// 256 byte tokens (GPT-2's byte-to-unicode spelling) + `<|endoftext|>`, no merges: a valid
/// byte-level BPE vocabulary for tests that have no real model at hand.
fn byte_level_tokenizer() -> Vec<(String, Value)> {
    let mut tokens: Vec<String> = (0..=255u8).map(gpt2_byte_char).map(String::from).collect();
    tokens.push("<|endoftext|>".into());
    let mut types = vec![1i32; 256];
    types.push(3); // control
    vec![
        ("tokenizer.ggml.model".into(), Value::String("gpt2".into())),
        ("tokenizer.ggml.pre".into(), Value::String("default".into())),
        ("tokenizer.ggml.tokens".into(), Value::Array(Array::String(tokens.into()))),
        ("tokenizer.ggml.token_type".into(), Value::Array(Array::I32(types))),
        ("tokenizer.ggml.merges".into(), Value::Array(Array::String(Default::default()))),
        ("tokenizer.ggml.bos_token_id".into(), Value::U32(256)),
        ("tokenizer.ggml.eos_token_id".into(), Value::U32(256)),
    ]
}

/// GPT-2's `bytes_to_unicode`: printable bytes map to themselves, the rest to U+0100 upwards.
fn gpt2_byte_char(b: u8) -> char {
    let printable = |b: u8| {
        (b'!'..=b'~').contains(&b) || (0xa1..=0xac).contains(&b) || (0xae..=0xff).contains(&b)
    };
    if printable(b) {
        return b as char;
    }
    let n = (0..b).filter(|&x| !printable(x)).count() as u32;
    char::from_u32(256 + n).unwrap_or('?')
}

/// splitmix64 of `a` combined with `b`: independent seeds per tensor and row.
fn mix(a: u64, b: u64) -> u64 {
    let mut z = a ^ b.wrapping_mul(0x9e37_79b9_7f4a_7c15).wrapping_add(0x632b_e59b_d9b4_e019);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Seeded normals: xoshiro256** (a fixed, documented algorithm, so a seed means the same weights
/// in every snug version) with Box–Muller.
struct Rng(Xoshiro256StarStar);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(Xoshiro256StarStar::seed_from_u64(seed))
    }

    /// Uniform in (0, 1].
    fn unit(&mut self) -> f64 {
        ((self.0.next_u64() >> 11) + 1) as f64 / (1u64 << 53) as f64
    }

    fn fill_normal(&mut self, out: &mut [f32], mean: f32, std: f32) {
        for pair in out.chunks_mut(2) {
            let (u1, u2) = (self.unit(), self.unit());
            let r = (-2.0 * u1.ln()).sqrt();
            let th = 2.0 * std::f64::consts::PI * u2;
            pair[0] = mean + std * (r * th.cos()) as f32;
            if let Some(x) = pair.get_mut(1) {
                *x = mean + std * (r * th.sin()) as f32;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn types_of(shape: &str, kind: Kind) -> Vec<GgmlType> {
        plan(shape_of(shape), 151936, Recipe::Q4KM)
            .into_iter()
            .filter(|t| t.kind == kind)
            .map(|t| t.ggml_type)
            .collect()
    }

    fn shape_of(name: &str) -> &'static Shape {
        shape(name).unwrap()
    }

    #[test]
    fn q4_k_m_mix_matches_the_real_qwen_1_5b_file() {
        // Layers with Q6_K attn_v / ffn_down in qwen2.5-coder-1.5b (tensor order 0..27).
        let v = types_of("qwen2.5-1.5b", Kind::AttnV);
        let six: Vec<usize> =
            v.iter().enumerate().filter(|(_, t)| **t == GgmlType::Q6K).map(|(i, _)| i).collect();
        assert_eq!(six, [0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 24, 25, 26, 27]);
        assert_eq!(types_of("qwen2.5-1.5b", Kind::FfnDown), v);
        assert_eq!(types_of("qwen2.5-7b", Kind::Output), [GgmlType::Q6K]);
        assert_eq!(types_of("qwen2.5-7b", Kind::TokenEmbd), [GgmlType::Q4K]);
        assert!(types_of("qwen2.5-7b", Kind::FfnGate).iter().all(|t| *t == GgmlType::Q4K));
    }

    #[test]
    fn rows_that_are_not_whole_super_blocks_fall_back_like_llama_cpp() {
        // qwen2.5-0.5b (896 wide): the real file has Q5_0 where Q4_K would be, Q8_0 for Q6_K.
        assert_eq!(types_of("qwen2.5-0.5b", Kind::TokenEmbd), [GgmlType::Q5_0]);
        assert_eq!(types_of("qwen2.5-0.5b", Kind::Output), [GgmlType::Q8_0]);
        let v = types_of("qwen2.5-0.5b", Kind::AttnV);
        assert_eq!(v.iter().filter(|t| **t == GgmlType::Q8_0).count(), 12);
        assert_eq!(v.iter().filter(|t| **t == GgmlType::Q5_0).count(), 12);
        // ffn_down rows are 4864 = 19 × 256 wide: real K-quants.
        let d = types_of("qwen2.5-0.5b", Kind::FfnDown);
        assert_eq!(d.iter().filter(|t| **t == GgmlType::Q6K).count(), 12);
    }

    #[test]
    fn plans_have_the_real_tensor_counts_and_sizes() {
        let q = plan(shape_of("qwen2.5-7b"), 151936, Recipe::Q4KM);
        assert_eq!(q.len(), 28 * 12 + 3);
        let l = plan(shape_of("llama-3.1-8b"), 128256, Recipe::Q4KM);
        assert_eq!(l.len(), 32 * 9 + 4);
        let params: u64 = l.iter().map(|t| t.dims.iter().product::<u64>()).sum();
        assert!((8.0e9..8.1e9).contains(&(params as f64)), "{params}");
        let bytes: u64 =
            q.iter().map(|t| gguf::tensor_size(&t.name, &t.dims, t.ggml_type).unwrap()).sum();
        // Qwen2.5-7B-Instruct-Q4_K_M.gguf is 4.68 GB.
        assert!((4.55e9..4.75e9).contains(&(bytes as f64)), "{bytes}");
    }

    #[test]
    fn llama3_rope_factors_match_the_converter() {
        let f = llama3_rope_factors(shape_of("llama-3.1-8b"), 64);
        assert_eq!(f[0], 1.0);
        assert_eq!(f[63], 8.0);
        assert!(f.iter().all(|x| (1.0..=8.0).contains(x)));
        assert!(f.windows(2).all(|w| w[0] <= w[1]));
    }

    #[test]
    fn the_made_up_vocabulary_spells_bytes_like_gpt2() {
        assert_eq!(gpt2_byte_char(b'A'), 'A');
        assert_eq!(gpt2_byte_char(b' '), 'Ġ');
        assert_eq!(gpt2_byte_char(b'\n'), 'Ċ');
        let toks: std::collections::HashSet<char> = (0..=255u8).map(gpt2_byte_char).collect();
        assert_eq!(toks.len(), 256);
    }

    #[test]
    fn normals_have_the_asked_mean_and_spread() {
        let mut v = vec![0f32; 100_001];
        Rng::new(7).fill_normal(&mut v, 0.0, 0.02);
        let mean = v.iter().map(|&x| x as f64).sum::<f64>() / v.len() as f64;
        let var = v.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / v.len() as f64;
        assert!(mean.abs() < 1e-3 && (var.sqrt() - 0.02).abs() < 5e-4, "{mean} {var}");
    }
}
