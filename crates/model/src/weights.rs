//! Weight lookup and shape validation. Matrices stay in the mapping in their GGUF block format:
//! a [`Mat`] is only a type, a byte range and a shape (zero-copy; the range is also what layer
//! streaming madvises). Norm weights and biases — a few KB per layer — are dequantized to owned
//! f32 vectors at load.

use gguf::{GgmlType, GgufFile, TensorInfo};
use memory::residency::{ExpertRanges, LayerStages};
use memory::stages::{self, GROUPS};

use crate::config::ModelConfig;
use crate::names;
use crate::ModelError;

/// A weight matrix in the mapping: `rows` rows of `cols` values in `ty`'s block format.
/// (GGUF `ne` order: `cols` = ne[0], the contiguous dimension.)
#[derive(Clone, Copy, Debug)]
pub struct Mat {
    pub ty: GgmlType,
    /// Absolute byte offset in the file.
    pub offset: usize,
    pub len: usize,
    pub rows: usize,
    pub cols: usize,
}

impl Mat {
    /// Bytes of row `r`.
    pub fn row_bytes(&self) -> usize {
        self.len / self.rows
    }

    pub fn data<'a>(&self, file: &'a [u8]) -> &'a [u8] {
        &file[self.offset..self.offset + self.len]
    }

    /// Rows `r0..r1` as one matrix (used to split fused qkv and gate|up matrices).
    pub fn rows_slice(&self, r0: usize, r1: usize) -> Mat {
        let rb = self.row_bytes();
        Mat {
            ty: self.ty,
            offset: self.offset + r0 * rb,
            len: (r1 - r0) * rb,
            rows: r1 - r0,
            cols: self.cols,
        }
    }
}

pub struct LayerWeights {
    /// [n_embd]
    pub attn_norm: Vec<f32>,
    /// [q_dim] × n_embd
    pub wq: Mat,
    /// [kv_dim] × n_embd
    pub wk: Mat,
    pub wv: Mat,
    pub bq: Option<Vec<f32>>,
    pub bk: Option<Vec<f32>>,
    pub bv: Option<Vec<f32>>,
    /// [head_dim] each, shared by all heads
    pub q_norm: Option<Vec<f32>>,
    pub k_norm: Option<Vec<f32>>,
    /// [n_embd] × q_dim
    pub wo: Mat,
    pub post_attn_norm: Option<Vec<f32>>,
    pub ffn_norm: Vec<f32>,
    /// [n_ff] × n_embd; for a mixture of experts, all experts stacked: [n_expert × n_ff_exp] ×
    /// n_embd, expert `e` the rows `e·n_ff_exp..` ([`LayerWeights::expert`]).
    pub gate: Mat,
    pub up: Mat,
    /// [n_embd] × n_ff; experts stacked: [n_expert × n_embd] × n_ff_exp.
    pub down: Mat,
    pub post_ffn_norm: Option<Vec<f32>>,
    /// [n_expert] × n_embd: the mixture-of-experts router (`ffn_gate_inp`); `None` for a dense FFN.
    pub router: Option<Mat>,
    /// The mixture of experts' shared expert, where the architecture has one.
    pub shared: Option<SharedExpert>,
}

/// A shared expert (qwen2moe): a SwiGLU FFN every token takes beside its routed experts, its
/// output weighed per token by `sigmoid(gate_inp · x)`.
#[derive(Clone, Debug)]
pub struct SharedExpert {
    /// [n_ff_shexp] × n_embd
    pub gate: Mat,
    pub up: Mat,
    /// [n_embd] × n_ff_shexp
    pub down: Mat,
    /// [n_embd]
    pub gate_inp: Vec<f32>,
}

pub struct Weights {
    /// [n_vocab] × n_embd
    pub tok_embd: Mat,
    pub output_norm: Vec<f32>,
    /// [n_vocab] × n_embd; the embedding matrix itself when tied.
    pub output: Mat,
    pub output_bias: Option<Vec<f32>>,
    /// Per-dimension RoPE divisors [n_rot / 2] (Llama 3 scaling), if the file has them.
    pub rope_freqs: Option<Vec<f32>>,
    /// LongRoPE divisors [n_rot / 2] past / within the original context (Phi-3/4), if present.
    pub rope_factors_long: Option<Vec<f32>>,
    pub rope_factors_short: Option<Vec<f32>>,
    pub layers: Vec<LayerWeights>,
    /// Blocks of rows each matrix group is cut into for streaming (`memory::stages`), the same
    /// for every layer.
    pub stage_blocks: [usize; GROUPS],
}

impl LayerWeights {
    /// The matrices group `g`'s stages read, in the order the forward pass reads them: the
    /// [`group`](Self::group)'s, with a shared expert's gate and up (group 2, after the router)
    /// and down (group 3) before the routed experts. The first `n` are not experts (`n`, the
    /// second value, counts them): what stays when an expert cache serves the experts.
    pub fn stage_mats(&self, g: usize) -> (Vec<Mat>, usize) {
        let (mats, n) = self.group(g);
        let mut v = mats[..n].to_vec();
        if self.router.is_none() || g < 2 {
            return (v, n);
        }
        // A mixture of experts' FFN: the router (group 2), the shared expert, then the experts.
        let at = usize::from(g == 2);
        let own = match &self.shared {
            Some(sh) if g == 2 => vec![sh.gate, sh.up],
            Some(sh) => vec![sh.down],
            None => Vec::new(),
        };
        let kept = at + own.len();
        v.splice(at..at, own);
        (v, kept)
    }

    /// The matrices of group `g` (`memory::stages`: q/k/v, attention output, gate/up, down), in
    /// the order the forward pass multiplies by them, and how many there are (a shared expert's
    /// are in [`stage_mats`](Self::stage_mats)).
    pub fn group(&self, g: usize) -> ([Mat; 3], usize) {
        match g {
            0 => ([self.wq, self.wk, self.wv], 3),
            1 => ([self.wo; 3], 1),
            2 => match self.router {
                Some(r) => ([r, self.gate, self.up], 3),
                None => ([self.gate, self.up, self.up], 2),
            },
            _ => ([self.down; 3], 1),
        }
    }

    /// Expert `e`'s gate, up and down matrices (views into the stacked tensors): one
    /// contiguous block of the file each.
    pub fn expert(&self, e: usize, n_expert: usize) -> [Mat; 3] {
        let slice = |m: &Mat| {
            let per = m.rows / n_expert;
            m.rows_slice(e * per, (e + 1) * per)
        };
        [slice(&self.gate), slice(&self.up), slice(&self.down)]
    }
}

struct Loader<'a> {
    f: &'a GgufFile,
}

impl Loader<'_> {
    fn info(&self, name: &str) -> Result<&TensorInfo, ModelError> {
        self.f.tensor(name).ok_or_else(|| ModelError::MissingTensor(name.to_string()))
    }

    fn mat(&self, name: &str, rows: usize, cols: usize) -> Result<Mat, ModelError> {
        self.mat_dims(name, &[cols as u64, rows as u64])
    }

    /// A stack of `n` matrices of `rows` × `cols` (GGUF `[cols, rows, n]`), as one matrix of
    /// `n · rows` rows.
    fn mat3(&self, name: &str, n: usize, rows: usize, cols: usize) -> Result<Mat, ModelError> {
        self.mat_dims(name, &[cols as u64, rows as u64, n as u64])
    }

    /// Tensor `name`, which must have GGUF dimensions `dims` (`[cols, rows, ...]`), as a matrix of
    /// `dims[0]` columns.
    fn mat_dims(&self, name: &str, dims: &[u64]) -> Result<Mat, ModelError> {
        let t = self.info(name)?;
        if t.dims.as_slice() != dims {
            return Err(ModelError::BadShape {
                name: name.to_string(),
                expected: format!("{dims:?}"),
                found: format!("{:?}", t.dims),
            });
        }
        if !quant::kernels::supports(t.ggml_type) {
            return Err(ModelError::Unsupported(format!(
                "tensor {name} has type {}, which snug cannot compute with yet",
                t.ggml_type
            )));
        }
        Ok(Mat {
            ty: t.ggml_type,
            offset: (self.f.data_offset + t.offset) as usize,
            len: t.size as usize,
            rows: dims[1..].iter().product::<u64>() as usize,
            cols: dims[0] as usize,
        })
    }

    fn vec(&self, name: &str, len: usize) -> Result<Vec<f32>, ModelError> {
        let t = self.info(name)?;
        if t.n_elements() != len as u64 {
            return Err(ModelError::BadShape {
                name: name.to_string(),
                expected: format!("[{len}]"),
                found: format!("{:?}", t.dims),
            });
        }
        let mut out = vec![0.0f32; len];
        quant::dequantize_row(t.ggml_type, self.f.tensor_data(t), &mut out)
            .map_err(|e| ModelError::Unsupported(format!("tensor {name}: {e}")))?;
        Ok(out)
    }

    fn opt_vec(&self, name: &str, len: usize) -> Result<Option<Vec<f32>>, ModelError> {
        if self.f.tensor(name).is_some() {
            self.vec(name, len).map(Some)
        } else {
            Ok(None)
        }
    }

    fn req_if(&self, cond: bool, name: &str, len: usize) -> Result<Option<Vec<f32>>, ModelError> {
        if cond {
            self.vec(name, len).map(Some)
        } else {
            Ok(None)
        }
    }
}

impl Weights {
    pub fn load(f: &GgufFile, c: &ModelConfig) -> Result<Weights, ModelError> {
        let l = Loader { f };
        let (d, q, kv, ff) = (c.n_embd, c.q_dim(), c.kv_dim(), c.n_ff);
        let tok_embd = l.mat(names::TOKEN_EMBD, c.n_vocab, d)?;
        let output = if f.tensor(names::OUTPUT).is_some() {
            l.mat(names::OUTPUT, c.n_vocab, d)?
        } else {
            tok_embd
        };
        let rope_freqs = l.opt_vec("rope_freqs.weight", c.n_rot / 2)?;
        let rope_factors_long = l.opt_vec(names::ROPE_FACTORS_LONG, c.n_rot / 2)?;
        let rope_factors_short = l.opt_vec(names::ROPE_FACTORS_SHORT, c.n_rot / 2)?;
        let mut layers = Vec::with_capacity(c.n_layer);
        for il in 0..c.n_layer {
            let n = |s: &str| names::layer_tensor(il, s);
            let (wq, wk, wv) = if c.spec.fused_qkv {
                let qkv = l.mat(&n(names::ATTN_QKV), q + 2 * kv, d)?;
                (
                    qkv.rows_slice(0, q),
                    qkv.rows_slice(q, q + kv),
                    qkv.rows_slice(q + kv, q + 2 * kv),
                )
            } else {
                (
                    l.mat(&n(names::ATTN_Q), q, d)?,
                    l.mat(&n(names::ATTN_K), kv, d)?,
                    l.mat(&n(names::ATTN_V), kv, d)?,
                )
            };
            let shared = match c.moe.filter(|m| m.n_ff_shexp > 0) {
                Some(m) => Some(SharedExpert {
                    gate: l.mat(&n(names::FFN_GATE_SHEXP), m.n_ff_shexp, d)?,
                    up: l.mat(&n(names::FFN_UP_SHEXP), m.n_ff_shexp, d)?,
                    down: l.mat(&n(names::FFN_DOWN_SHEXP), d, m.n_ff_shexp)?,
                    gate_inp: l.vec(&n(names::FFN_GATE_INP_SHEXP), d)?,
                }),
                None => None,
            };
            let (gate, up, down, router) = if let Some(m) = c.moe {
                let (ne, fe) = (m.n_expert, m.n_ff_exp);
                (
                    l.mat3(&n(names::FFN_GATE_EXPS), ne, fe, d)?,
                    l.mat3(&n(names::FFN_UP_EXPS), ne, fe, d)?,
                    l.mat3(&n(names::FFN_DOWN_EXPS), ne, d, fe)?,
                    Some(l.mat(&n(names::FFN_GATE_INP), ne, d)?),
                )
            } else if c.spec.fused_gate_up {
                let gu = l.mat(&n(names::FFN_UP), 2 * ff, d)?;
                let down = l.mat(&n(names::FFN_DOWN), d, ff)?;
                (gu.rows_slice(0, ff), gu.rows_slice(ff, 2 * ff), down, None)
            } else {
                let (g, u) = (l.mat(&n(names::FFN_GATE), ff, d)?, l.mat(&n(names::FFN_UP), ff, d)?);
                (g, u, l.mat(&n(names::FFN_DOWN), d, ff)?, None)
            };
            if f.tensor(&n("attn_qkv.bias")).is_some() || f.tensor(&n("ffn_up.bias")).is_some() {
                return Err(ModelError::Unsupported(format!(
                    "layer {il} has fused-projection biases"
                )));
            }
            layers.push(LayerWeights {
                attn_norm: l.vec(&n("attn_norm.weight"), d)?,
                wq,
                wk,
                wv,
                bq: l.opt_vec(&n("attn_q.bias"), q)?,
                bk: l.opt_vec(&n("attn_k.bias"), kv)?,
                bv: l.opt_vec(&n("attn_v.bias"), kv)?,
                q_norm: l.req_if(c.spec.qk_norm, &n("attn_q_norm.weight"), c.head_dim)?,
                k_norm: l.req_if(c.spec.qk_norm, &n("attn_k_norm.weight"), c.head_dim)?,
                wo: l.mat(&n(names::ATTN_OUTPUT), d, q)?,
                post_attn_norm: l.req_if(c.spec.post_norms, &n("post_attention_norm.weight"), d)?,
                ffn_norm: l.vec(&n("ffn_norm.weight"), d)?,
                gate,
                up,
                down,
                post_ffn_norm: l.req_if(c.spec.post_norms, &n("post_ffw_norm.weight"), d)?,
                router,
                shared,
            });
        }
        let max_group: [u64; GROUPS] = std::array::from_fn(|g| {
            layers
                .iter()
                .map(|l| l.stage_mats(g).0.iter().map(|m| m.len as u64).sum::<u64>())
                .max()
                .unwrap_or(0)
        });
        Ok(Weights {
            stage_blocks: max_group.map(stages::blocks),
            tok_embd,
            output_norm: l.vec("output_norm.weight", d)?,
            output,
            output_bias: l.opt_vec("output.bias", c.n_vocab)?,
            rope_freqs,
            rope_factors_long,
            rope_factors_short,
            layers,
        })
    }

    /// Where each layer's experts are in the file (`[layer][expert]`: gate, up, down), for an
    /// expert cache; empty unless every layer is a mixture of experts.
    pub fn expert_ranges(&self, n_expert: usize) -> Vec<Vec<ExpertRanges>> {
        // The cache numbers experts by layer: every layer must have them.
        if n_expert == 0 || self.layers.iter().any(|l| l.router.is_none()) {
            return Vec::new();
        }
        self.layers
            .iter()
            .map(|l| {
                (0..n_expert).map(|e| l.expert(e, n_expert).map(|m| (m.offset, m.len))).collect()
            })
            .collect()
    }

    /// Layer `il`'s matrices per stage, in the order the forward pass reads them: each group
    /// (`memory::stages`) cut into [`Weights::stage_blocks`] blocks of rows, as byte ranges of
    /// the file: what layer streaming reads ahead and drops. `experts_apart`: a mixture of
    /// experts' experts are left out (an expert cache serves them).
    pub fn layer_stages(&self, il: usize, experts_apart: bool) -> LayerStages {
        let l = &self.layers[il];
        let mut out = Vec::new();
        for (g, &nb) in self.stage_blocks.iter().enumerate() {
            let (mats, apart) = l.stage_mats(g);
            let n = if experts_apart { apart } else { mats.len() };
            for b in 0..nb {
                out.push(
                    mats[..n]
                        .iter()
                        .map(|m| {
                            let (r0, r1) = stages::block_rows(m.rows, nb, b);
                            let blk = m.rows_slice(r0, r1);
                            (blk.offset, blk.offset + blk.len)
                        })
                        .collect(),
                );
            }
        }
        out
    }
}
