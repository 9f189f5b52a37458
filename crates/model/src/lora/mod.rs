//! LoRA adapters in llama.cpp's GGUF layout, and the per-sequence sets the forward pass applies.
//!
//! An adapter file says `general.type = "adapter"`, `general.architecture` (the base model's),
//! `adapter.type = "lora"` and `adapter.lora.alpha`, and holds pairs `blk.N.<matrix>.weight.lora_a`
//! (ggml shape `[n_in, r]`) and `.lora_b` (`[r, n_out]`) in f32, f16 or q8_0. The matrix's output
//! becomes `W·x + s · B·(A·x)` with `s = scale · alpha / r` (`scale` alone when alpha is 0), as in
//! llama.cpp's `build_lora_mm`; several adapters add up. Like llama.cpp, `*_norm.weight` tensors
//! are skipped, a lone `lora_a`/`lora_b`, a tensor the base model lacks, a shape that does not
//! match it or another suffix is refused; snug also refuses adapters on tensors outside the
//! layers' seven projections (the embedding and output matrices) and types other than the three.
//! Any refusal is a [`LoraError`] naming the tensor, and nothing is loaded.
//!
//! Loaded adapters are dequantized to f32 (`A` as `[r][n_in]`, `B` transposed to `[r][n_out]` so
//! both halves of the delta read rows): `4·r·(n_in + n_out)` bytes per matrix, [`Lora::bytes`],
//! which the memory planner counts. The compute is [`bgmv`]: each token gathers its own
//! sequence's adapters, so one batch mixes sequences on different adapters and on none, and a
//! sequence without adapters costs nothing.

pub mod bgmv;
pub mod store;

use std::path::Path;

use std::sync::Arc;
pub use store::{salt, AdapterInfo, AdapterLease, AdapterStore, StoreStats, Tier};

use gguf::{GgmlType, GgufFile, TensorInfo};

use crate::arch::Arch;
use crate::config::ModelConfig;
use crate::names;

/// GGUF metadata keys of an adapter file.
const KEY_TYPE: &str = "general.type";
const KEY_ADAPTER_TYPE: &str = "adapter.type";
const KEY_ALPHA: &str = "adapter.lora.alpha";
const SUFFIX_A: &str = ".lora_a";
const SUFFIX_B: &str = ".lora_b";

#[derive(Debug, thiserror::Error)]
pub enum LoraError {
    #[error(transparent)]
    Gguf(#[from] gguf::GgufError),
    #[error("not a LoRA adapter: general.type is {0:?}, expected \"adapter\" (a base model given as an adapter?)")]
    NotAdapter(String),
    #[error("adapter.type is {0:?}; snug applies \"lora\" adapters only")]
    NotLora(String),
    #[error("the adapter is for architecture {adapter:?} but the model is {model}: use the base model the adapter was trained on")]
    ArchMismatch { adapter: String, model: &'static str },
    #[error("adapter.lora.alpha has the non-numeric value {0}")]
    BadAlpha(String),
    #[error("adapter tensor {0:?} has neither a .lora_a nor a .lora_b suffix")]
    BadSuffix(String),
    #[error("adapter tensor {0:?} has no matching tensor in the base model (an adapter for another model?)")]
    UnknownTarget(String),
    #[error("adapter tensor {0:?} adapts a matrix snug does not apply adapters to (only the layers' attention and feed-forward projections)")]
    UnsupportedTarget(String),
    #[error("adapter tensor {name:?} has no partner {missing:?}: each adapted matrix needs both lora_a and lora_b")]
    MissingPair { name: String, missing: String },
    #[error(
        "adapter tensor {name:?} has ggml shape {found:?}, expected {expected} for this base model"
    )]
    BadShape { name: String, expected: String, found: Vec<u64> },
    #[error("adapter tensor {name:?} has type {ty}; adapters must be f32, f16 or q8_0")]
    BadType { name: String, ty: GgmlType },
    #[error("the adapter holds no lora_a/lora_b tensors")]
    Empty,
    #[error("adapter {adapter:?} was loaded for a model of another shape than {model:?}: load it for this model")]
    WrongBase { adapter: String, model: String },
    #[error("no adapter named {0:?} is registered")]
    Unknown(String),
    #[error("an adapter named {0:?} is registered already")]
    Duplicate(String),
    #[error("adapter {name:?}: {source}")]
    PoolFull { name: String, source: crate::kv::pool::PoolFull },
}

/// One adapted matrix: `y[first..first+count]` of the layer's group `group` gain
/// `ab_scale · Bᵀᵀ·(A·x)`, times the user's scale.
#[derive(Debug)]
pub(crate) struct LoraMat {
    /// Streaming group of the adapted matrix (`names::stage_group`): which matmul it follows.
    pub group: usize,
    /// The group outputs it adds to, in order (`[q, k, v]`, `[gate, up]`): a fused matrix
    /// (phi3's qkv, gate|up) spans several.
    pub first: usize,
    pub count: usize,
    pub rank: usize,
    pub n_in: usize,
    pub n_out: usize,
    /// `alpha / rank`, or 1 when alpha is 0.
    pub ab_scale: f32,
    /// [rank][n_in]
    pub a: Vec<f32>,
    /// [rank][n_out]: `lora_b` transposed.
    pub bt: Vec<f32>,
}

/// The base shape an adapter was validated against; a context only takes adapters of its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct BaseShape {
    arch: Arch,
    n_layer: usize,
    n_embd: usize,
    q_dim: usize,
    kv_dim: usize,
    n_ff: usize,
    fused_qkv: bool,
    fused_gate_up: bool,
}

impl BaseShape {
    fn of(c: &ModelConfig) -> BaseShape {
        BaseShape {
            arch: c.arch,
            n_layer: c.n_layer,
            n_embd: c.n_embd,
            q_dim: c.q_dim(),
            kv_dim: c.kv_dim(),
            n_ff: c.n_ff,
            fused_qkv: c.spec.fused_qkv,
            fused_gate_up: c.spec.fused_gate_up,
        }
    }

    /// Where a layer matrix's output goes and its `(n_in, n_out)`: `(group, first, count)`.
    fn target(&self, suffix: &str) -> Option<((usize, usize, usize), usize, usize)> {
        let (d, q, kv, ff) = (self.n_embd, self.q_dim, self.kv_dim, self.n_ff);
        Some(match suffix {
            names::ATTN_QKV if self.fused_qkv => ((0, 0, 3), d, q + 2 * kv),
            names::ATTN_Q if !self.fused_qkv => ((0, 0, 1), d, q),
            names::ATTN_K if !self.fused_qkv => ((0, 1, 1), d, kv),
            names::ATTN_V if !self.fused_qkv => ((0, 2, 1), d, kv),
            names::ATTN_OUTPUT => ((1, 0, 1), q, d),
            names::FFN_GATE if !self.fused_gate_up => ((2, 0, 1), d, ff),
            names::FFN_UP if self.fused_gate_up => ((2, 0, 2), d, 2 * ff),
            names::FFN_UP => ((2, 1, 1), d, ff),
            names::FFN_DOWN => ((3, 0, 1), ff, d),
            _ => return None,
        })
    }
}

/// A loaded adapter: per layer, its adapted matrices.
#[derive(Debug)]
pub struct Lora {
    /// The file's stem, for messages and listings.
    pub name: String,
    pub alpha: f32,
    base: BaseShape,
    /// [n_layer] → the layer's adapted matrices (at most seven).
    layers: Vec<Vec<LoraMat>>,
    bytes: usize,
    /// Last, so it runs after the rows are freed.
    _release: ReleaseOnDrop,
}

/// Hands the allocator's free pages back to the kernel when an adapter's rows are dropped
/// ([`memory::heap::release_free`]): a server loads adapters on its blocking pool's threads
/// while the KV cache grows on the scheduler's, and without this the rows of demoted adapters
/// stayed resident in those threads' arenas (150 MiB after 100 adapters cycled through 10 hot
/// slots, enough to put the peak over the plan; BENCHMARKS.md, issue 15). Once per adapter
/// dropped (a tier change), never per token.
#[derive(Debug, Default)]
struct ReleaseOnDrop;

impl Drop for ReleaseOnDrop {
    fn drop(&mut self) {
        memory::heap::release_free();
    }
}

impl Lora {
    /// Loads the adapter at `path` for a model of configuration `c`.
    pub fn load(path: impl AsRef<Path>, c: &ModelConfig) -> Result<Lora, LoraError> {
        let path = path.as_ref();
        let name = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        Lora::from_gguf(&GgufFile::open(path)?, c, name)
    }

    /// Validates every tensor of `f` against `c` before converting any.
    pub fn from_gguf(f: &GgufFile, c: &ModelConfig, name: String) -> Result<Lora, LoraError> {
        let checked = check(f, c)?;
        let alpha = checked.alpha;
        let mut layers: Vec<Vec<LoraMat>> = (0..c.n_layer).map(|_| Vec::new()).collect();
        let mut bytes = 0;
        for p in checked.pending {
            let a = dequantize(f, p.a)?;
            let b = dequantize(f, p.b)?;
            // lora_b is [n_out][rank] row-major; keep it as [rank][n_out].
            let mut bt = vec![0.0; b.len()];
            for (o, row) in b.chunks_exact(p.rank).enumerate() {
                for (j, &v) in row.iter().enumerate() {
                    bt[j * p.n_out + o] = v;
                }
            }
            bytes += matrix_bytes(p.rank, p.n_in, p.n_out);
            let (group, first, count) = p.target;
            layers[p.il].push(LoraMat {
                group,
                first,
                count,
                rank: p.rank,
                n_in: p.n_in,
                n_out: p.n_out,
                ab_scale: if alpha == 0.0 { 1.0 } else { alpha / p.rank as f32 },
                a,
                bt,
            });
        }
        Ok(Lora { name, alpha, base: checked.base, layers, bytes, _release: ReleaseOnDrop })
    }

    /// Heap bytes of the dequantized matrices.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Adapted matrices, over all layers.
    pub fn n_matrices(&self) -> usize {
        self.layers.iter().map(Vec::len).sum()
    }

    /// The largest rank among its matrices.
    pub fn max_rank(&self) -> usize {
        self.layers.iter().flatten().map(|m| m.rank).max().unwrap_or(0)
    }

    /// Whether it was loaded for a model of `c`'s shape.
    pub fn fits(&self, c: &ModelConfig) -> bool {
        self.base == BaseShape::of(c)
    }

    pub(crate) fn layer(&self, il: usize) -> &[LoraMat] {
        self.layers.get(il).map_or(&[], Vec::as_slice)
    }
}

/// What [`check`] found: the adapter's alpha and its matrices, each validated.
pub(crate) struct Checked<'a> {
    pub alpha: f32,
    base: BaseShape,
    pending: Vec<Pending<'a>>,
}

impl Checked<'_> {
    /// Bytes the loaded adapter takes ([`Lora::bytes`]), without loading it.
    pub fn bytes(&self) -> usize {
        self.pending.iter().map(|p| matrix_bytes(p.rank, p.n_in, p.n_out)).sum()
    }

    /// The largest rank among its matrices.
    pub fn max_rank(&self) -> usize {
        self.pending.iter().map(|p| p.rank).max().unwrap_or(0)
    }
}

/// One validated matrix of an adapter file, not converted yet.
struct Pending<'a> {
    il: usize,
    target: (usize, usize, usize),
    a: &'a TensorInfo,
    b: &'a TensorInfo,
    rank: usize,
    n_in: usize,
    n_out: usize,
}

/// Bytes of one adapted matrix once loaded: `A` and `Bᵀ` in f32. The one owner of this
/// formula ([`Lora::bytes`], the adapter store's pages, the planner).
pub fn matrix_bytes(rank: usize, n_in: usize, n_out: usize) -> usize {
    std::mem::size_of::<f32>() * rank * (n_in + n_out)
}

/// Checks the header and every tensor of `f` against `c`, reading no tensor data.
/// Bytes the adapter in `f` takes hot ([`Lora::bytes`]), from its header, after the checks
/// [`Lora::from_gguf`] makes (nothing is converted).
pub fn hot_bytes(f: &GgufFile, c: &ModelConfig) -> Result<usize, LoraError> {
    Ok(check(f, c)?.bytes())
}

/// The pool's adapter share that holds `n` adapters of at most `hot_bytes` each. The pool
/// charges an adapter whole pages of one KV block (`kv::block_bytes`), whose size depends on
/// the KV precision the plan picks afterwards: one page of the largest precision's block per
/// adapter covers the rounding for any of them (`⌈b/p⌉·p < b + p`).
pub fn share_bytes(c: &ModelConfig, n: usize, hot_bytes: usize) -> usize {
    use crate::params::KvType;
    let page = [KvType::F16, KvType::Q8, KvType::Q4]
        .into_iter()
        .map(|t| crate::kv::block_bytes(c, t, t))
        .max()
        .unwrap_or(0);
    n.saturating_mul(hot_bytes.saturating_add(page))
}

pub(crate) fn check<'a>(f: &'a GgufFile, c: &ModelConfig) -> Result<Checked<'a>, LoraError> {
    let ty = f.get_str(KEY_TYPE).unwrap_or("");
    if ty != "adapter" {
        return Err(LoraError::NotAdapter(ty.to_string()));
    }
    let arch = f.architecture().unwrap_or("");
    if Arch::from_name(arch) != Some(c.arch) {
        return Err(LoraError::ArchMismatch { adapter: arch.to_string(), model: c.arch.name() });
    }
    let aty = f.get_str(KEY_ADAPTER_TYPE).unwrap_or("");
    if aty != "lora" {
        return Err(LoraError::NotLora(aty.to_string()));
    }
    let alpha = match f.get(KEY_ALPHA) {
        None => 0.0,
        Some(v) => v.as_f64().ok_or_else(|| LoraError::BadAlpha(format!("{v:?}")))? as f32,
    };
    if !alpha.is_finite() {
        return Err(LoraError::BadAlpha(alpha.to_string()));
    }
    let base = BaseShape::of(c);

    // Pair up lora_a and lora_b and check everything before converting anything.
    let mut pending = Vec::new();
    for t in &f.tensors {
        let name = t.name.as_str();
        let Some(weight) = name.strip_suffix(SUFFIX_A) else {
            if let Some(w) = name.strip_suffix(SUFFIX_B) {
                let a_name = [w, SUFFIX_A].concat();
                if f.tensor(&a_name).is_some() {
                    continue; // met as its lora_a's partner
                }
                return Err(LoraError::MissingPair { name: name.to_string(), missing: a_name });
            }
            if name.ends_with("_norm.weight") {
                continue; // llama.cpp skips these too
            }
            return Err(LoraError::BadSuffix(name.to_string()));
        };
        let b_name = [weight, SUFFIX_B].concat();
        let b = f
            .tensor(&b_name)
            .ok_or_else(|| LoraError::MissingPair { name: name.to_string(), missing: b_name })?;
        let (il, suffix) = match names::split_layer(weight) {
            Some((il, s)) if il < c.n_layer => (il, s),
            Some(_) => return Err(LoraError::UnknownTarget(name.to_string())),
            None if weight == names::TOKEN_EMBD || weight == names::OUTPUT => {
                return Err(LoraError::UnsupportedTarget(name.to_string()))
            }
            None => return Err(LoraError::UnknownTarget(name.to_string())),
        };
        let Some((target, n_in, n_out)) = base.target(suffix) else {
            // A layer matrix snug knows (an expert, a shared expert, the router) but does not adapt.
            if names::stage_group(suffix).is_some() && c.moe.is_some() {
                return Err(LoraError::UnsupportedTarget(name.to_string()));
            }
            return Err(LoraError::UnknownTarget(name.to_string()));
        };
        for t in [t, b] {
            if !matches!(t.ggml_type, GgmlType::F32 | GgmlType::F16 | GgmlType::Q8_0) {
                return Err(LoraError::BadType { name: t.name.clone(), ty: t.ggml_type });
            }
        }
        let rank = b.dims.first().copied().unwrap_or(0);
        let bad = |t: &TensorInfo, expected: String| LoraError::BadShape {
            name: t.name.clone(),
            expected,
            found: t.dims.clone(),
        };
        if rank == 0 || b.dims != [rank, n_out as u64] {
            return Err(bad(b, format!("[r, {n_out}] with r > 0")));
        }
        if t.dims != [n_in as u64, rank] {
            return Err(bad(t, format!("[{n_in}, {rank}] (lora_b's rank {rank})")));
        }
        pending.push(Pending { il, target, a: t, b, rank: rank as usize, n_in, n_out });
    }
    if pending.is_empty() {
        return Err(LoraError::Empty);
    }
    Ok(Checked { alpha, base, pending })
}

/// Bytes of one adapted matrix in the warm tier: `A` and `Bᵀ` as int8 rows, each with an f32
/// scale.
pub fn matrix_bytes_int8(rank: usize, n_in: usize, n_out: usize) -> usize {
    rank * (n_in + n_out) + 2 * rank * std::mem::size_of::<f32>()
}

/// Rows of f32 as int8 with one f32 scale per row (`max |x| / 127`, round to nearest).
#[derive(Debug)]
struct Int8Rows {
    q: Vec<i8>,
    scales: Vec<f32>,
}

impl Int8Rows {
    fn quantize(x: &[f32], row: usize) -> Int8Rows {
        let mut q = vec![0i8; x.len()];
        let mut scales = Vec::with_capacity(x.len() / row.max(1));
        for (src, dst) in x.chunks_exact(row).zip(q.chunks_exact_mut(row)) {
            let max = src.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let s = max / 127.0;
            let inv = if s > 0.0 { 1.0 / s } else { 0.0 };
            for (d, &v) in dst.iter_mut().zip(src) {
                *d = (v * inv).round().clamp(-127.0, 127.0) as i8;
            }
            scales.push(s);
        }
        Int8Rows { q, scales }
    }

    fn dequantize(&self, row: usize) -> Vec<f32> {
        let mut out = vec![0.0f32; self.q.len()];
        for ((src, dst), &s) in
            self.q.chunks_exact(row).zip(out.chunks_exact_mut(row)).zip(&self.scales)
        {
            for (d, &v) in dst.iter_mut().zip(src) {
                *d = f32::from(v) * s;
            }
        }
        out
    }
}

/// An adapter in the warm tier: every matrix's rows in int8 ([`matrix_bytes_int8`] a matrix),
/// a quarter of its hot size; [`WarmLora::to_hot`] makes it usable again (dequantized to f32).
#[derive(Debug)]
pub struct WarmLora {
    name: String,
    alpha: f32,
    base: BaseShape,
    /// [n_layer] → (the matrix with empty `a`/`bt`, its int8 `A`, its int8 `Bᵀ`).
    layers: Vec<Vec<(LoraMat, Int8Rows, Int8Rows)>>,
    bytes: usize,
    /// Last, so it runs after the rows are freed.
    _release: ReleaseOnDrop,
}

impl WarmLora {
    /// Bytes of its int8 rows and scales.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The f32 adapter again (each weight within half an int8 step of the original).
    pub fn to_hot(&self) -> Lora {
        let layers = per_matrix(&self.layers, |(m, a, bt)| LoraMat {
            a: a.dequantize(m.n_in),
            bt: bt.dequantize(m.n_out),
            ..m.shape()
        });
        let bytes = layers.iter().flatten().map(|m| matrix_bytes(m.rank, m.n_in, m.n_out)).sum();
        let base = self.base;
        Lora {
            name: self.name.clone(),
            alpha: self.alpha,
            base,
            layers,
            bytes,
            _release: ReleaseOnDrop,
        }
    }
}

/// `f` of every matrix, layer by layer.
fn per_matrix<T, U>(layers: &[Vec<T>], mut f: impl FnMut(&T) -> U) -> Vec<Vec<U>> {
    layers.iter().map(|mats| mats.iter().map(&mut f).collect()).collect()
}

impl LoraMat {
    /// Everything but the weights.
    fn shape(&self) -> LoraMat {
        LoraMat { a: Vec::new(), bt: Vec::new(), ..*self }
    }
}

impl Lora {
    /// Its warm-tier copy: every row in int8 with an f32 scale.
    pub fn to_warm(&self) -> WarmLora {
        let layers = per_matrix(&self.layers, |m| {
            (m.shape(), Int8Rows::quantize(&m.a, m.n_in), Int8Rows::quantize(&m.bt, m.n_out))
        });
        let bytes =
            layers.iter().flatten().map(|(m, ..)| matrix_bytes_int8(m.rank, m.n_in, m.n_out)).sum();
        let (name, alpha, base) = (self.name.clone(), self.alpha, self.base);
        WarmLora { name, alpha, base, layers, bytes, _release: ReleaseOnDrop }
    }
}

fn dequantize(f: &GgufFile, t: &TensorInfo) -> Result<Vec<f32>, LoraError> {
    let mut out = vec![0.0f32; t.n_elements() as usize];
    quant::dequantize_row(t.ggml_type, f.tensor_data(t), &mut out)
        .map_err(|_| LoraError::BadType { name: t.name.clone(), ty: t.ggml_type })?;
    Ok(out)
}

/// Adapters applied to one sequence, each with its user scale; empty for the bare model.
pub type AdapterSet = Vec<(Arc<Lora>, f32)>;

/// One adapted matrix to write: `weight` is the base tensor's name (`blk.0.attn_q.weight`),
/// `a` is `[rank][n_in]` and `b` is `[n_out][rank]` (row-major, as the file stores them).
#[derive(Clone, Debug)]
pub struct AdapterTensor {
    pub weight: String,
    pub ty: GgmlType,
    pub rank: usize,
    pub a: Vec<f32>,
    pub b: Vec<f32>,
}

/// Writes an adapter in llama.cpp's layout (what [`Lora::from_gguf`] reads): the metadata of the
/// module docs and each matrix's `lora_a`/`lora_b` in its type (f32, f16 or q8_0). For tests,
/// fuzz seeds and parity runs against llama.cpp.
pub fn write_adapter<W: std::io::Write>(
    out: W,
    arch: &str,
    alpha: f32,
    tensors: &[AdapterTensor],
) -> Result<W, gguf::GgufError> {
    use gguf::{GgufWriter, TensorSpec, Value};
    let mut w = GgufWriter::new(out);
    w.add_kv(KEY_TYPE, Value::String("adapter".into()))
        .add_kv("general.architecture", Value::String(arch.into()))
        .add_kv(KEY_ADAPTER_TYPE, Value::String("lora".into()))
        .add_kv(KEY_ALPHA, Value::F32(alpha));
    let mut datas = Vec::new();
    for t in tensors {
        let (n_in, n_out) = (t.a.len() / t.rank.max(1), t.b.len() / t.rank.max(1));
        for (suffix, dims, vals) in
            [(SUFFIX_A, [n_in, t.rank], &t.a), (SUFFIX_B, [t.rank, n_out], &t.b)]
        {
            let name = [t.weight.as_str(), suffix].concat();
            let dims = dims.map(|d| d as u64).to_vec();
            let size = gguf::tensor_size(&name, &dims, t.ty)? as usize;
            let mut bytes = vec![0u8; size];
            quant::quantize_row(t.ty, vals, &mut bytes)
                .map_err(|e| gguf::GgufError::Writer(format!("{name}: {e}")))?;
            w.add_tensor(TensorSpec { name, dims, ggml_type: t.ty })?;
            datas.push(bytes);
        }
    }
    w.write_header()?;
    for d in &datas {
        w.write_tensor(d)?;
    }
    w.finish()
}
