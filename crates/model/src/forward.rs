//! The forward pass: one function for every architecture, driven by [`ModelConfig`]'s data.
//!
//! A [`Batch`] holds tokens from any number of sequences (each token carries its sequence and
//! position), so prefill chunks and many sequences' decode steps share every weight read.
//! Batches longer than `n_ubatch` run in slices of that size; all scratch comes from buffers
//! sized once in [`Context::new`], so a decode step allocates nothing.

use std::ops::Range;
use std::sync::Arc;

use quant::kernels::MatRef;
use quant::threads::ThreadPool;

use crate::attention::{attention, scratch_floats};
use crate::batch::Batch;
use crate::config::{ModelConfig, MoeConfig};
use crate::kv::{KvCache, SeqId};
use crate::lora::{bgmv, AdapterSet, Lora, LoraError};
use crate::moe::{self, MoeScratch};
use crate::ops::{self, RopeTable};
use crate::params::ContextParams;
use crate::weights::{LayerWeights, Mat, Weights};
use crate::{Model, ModelError};

/// Activation buffers, sized for `n_ubatch` tokens. Shapes in comments are `[tokens][width]`.
struct Scratch {
    /// [ub][n_embd] residual stream
    x: Vec<f32>,
    /// [ub][n_embd] normed input / FFN output
    xn: Vec<f32>,
    /// [ub][q_dim]
    q: Vec<f32>,
    /// [ub][kv_dim]
    k: Vec<f32>,
    v: Vec<f32>,
    /// [ub][q_dim] attention output
    att: Vec<f32>,
    /// [ub][n_ff]
    gate: Vec<f32>,
    up: Vec<f32>,
    /// [n_out_ub][n_embd] rows whose logits are wanted
    xo: Vec<f32>,
    /// quantized activations for matmul
    qbuf: Vec<u8>,
    rope: RopeTable,
    /// attention scratch: per thread a key and a value block tile and the rows' online-softmax
    /// state, plus split-K partials (`attention::scratch_floats`)
    attn_tmp: Vec<f32>,
    /// the mixture-of-experts block's buffers (`None` for a dense model)
    moe: Option<MoeScratch>,
}

pub struct Context {
    model: Arc<Model>,
    pub params: ContextParams,
    pool: ThreadPool,
    pub kv: KvCache,
    s: Scratch,
    /// [n_outputs_max][n_vocab]
    logits: Vec<f32>,
    n_logits: usize,
    /// [n_hidden][n_embd] final hidden states (after the output norm) of the last batch's
    /// tokens that asked for them; grown on the first batch that needs more (embeddings only),
    /// never for generation.
    hidden: Vec<f32>,
    n_hidden: usize,
    /// Called around every stage of every layer (weight streaming); set once, after creation.
    observer: std::sync::OnceLock<Arc<dyn memory::residency::LayerObserver>>,
    /// [n_seq_max] each sequence's LoRA adapters and scales; empty for the bare model.
    adapters: Vec<AdapterSet>,
}

/// Element counts of a context's buffers: the one formula [`Context::new`] allocates by and the
/// memory planner adds up ([`ScratchSizes::activation_bytes`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScratchSizes {
    /// `[ub][n_embd]`: the residual stream, and again the normed input / FFN output.
    pub embd: usize,
    /// `[ub][q_dim]`: queries, and again the attention output.
    pub q: usize,
    /// `[ub][kv_dim]`: keys, and again values.
    pub kv: usize,
    /// `[ub][n_ff]`: gate, and again up (0 for a mixture of experts, whose FFN has its own).
    pub ff: usize,
    /// The mixture-of-experts block's floats ([`MoeScratch::floats`]; 0 for a dense model).
    pub moe: usize,
    /// `[min(ub, n_outputs_max)][n_embd]`: rows whose logits are wanted.
    pub xo: usize,
    /// Bytes of quantized activations for matmul (reserved; touched as far as a batch needs).
    pub qbuf_bytes: usize,
    /// Attention scratch ([`scratch_floats`]).
    pub attn: usize,
    /// `[n_outputs_max][n_vocab]`.
    pub logits: usize,
}

impl ScratchSizes {
    /// Sizes saturate rather than wrap: a context too large to address is refused by the
    /// planner (its prediction exceeds any budget) before anything is allocated.
    pub fn new(c: &ModelConfig, p: &ContextParams) -> ScratchSizes {
        let ub = p.n_ubatch.max(1);
        ScratchSizes {
            embd: ub.saturating_mul(c.n_embd),
            q: ub.saturating_mul(c.q_dim()),
            kv: ub.saturating_mul(c.kv_dim()),
            ff: if c.moe.is_some() { 0 } else { ub.saturating_mul(c.n_ff) },
            moe: c.moe.map_or(0, |m| MoeScratch::floats(&m, ub, c.n_embd)),
            xo: ub.min(p.n_outputs_max.max(1)).saturating_mul(c.n_embd),
            qbuf_bytes: ub.saturating_mul(c.ff_dim().max(c.n_embd)).saturating_mul(2),
            attn: scratch_floats(c, p.n_threads.max(1)),
            logits: p.n_outputs_max.max(1).saturating_mul(c.n_vocab),
        }
    }

    /// Bytes of the activation buffers and attention scratch (logits apart).
    pub fn activation_bytes(&self) -> usize {
        [self.embd, self.q, self.kv, self.ff]
            .iter()
            .fold(self.xo.saturating_add(self.attn).saturating_add(self.moe), |a, &b| {
                a.saturating_add(b.saturating_mul(2))
            })
            .saturating_mul(std::mem::size_of::<f32>())
            .saturating_add(self.qbuf_bytes)
    }

    pub fn logits_bytes(&self) -> usize {
        self.logits.saturating_mul(std::mem::size_of::<f32>())
    }
}

/// Writes one value a page of `buf`, so its pages are resident from the start. The rows of
/// logits beyond the first are written only as a step has outputs for them (drafted tokens,
/// batched prompts), so a run that never drafted would stay resident under the plan, which
/// counts them all; committed at creation, the context's resident size is the planned one
/// whatever the run does. Cost: one write a page, once (a 262k vocabulary's 17 rows: 4.5k
/// pages).
fn commit(buf: &mut [f32]) {
    const PAGE: usize = 4096 / std::mem::size_of::<f32>();
    for i in (0..buf.len()).step_by(PAGE) {
        // SAFETY: `i` is inside `buf`; a volatile write is not elided for the calloc'd zeros.
        unsafe { std::ptr::write_volatile(buf.as_mut_ptr().add(i), 0.0) };
    }
}

impl Context {
    pub fn new(model: Arc<Model>, params: ContextParams) -> Context {
        let c = &model.config;
        let nth = params.n_threads.max(1);
        let z = ScratchSizes::new(c, &params);
        let s = Scratch {
            x: vec![0.0; z.embd],
            xn: vec![0.0; z.embd],
            q: vec![0.0; z.q],
            k: vec![0.0; z.kv],
            v: vec![0.0; z.kv],
            att: vec![0.0; z.q],
            gate: vec![0.0; z.ff],
            up: vec![0.0; z.ff],
            xo: vec![0.0; z.xo],
            qbuf: Vec::with_capacity(z.qbuf_bytes),
            rope: RopeTable::new(c.n_rot, c.rope_attn_factor),
            attn_tmp: vec![0.0; z.attn],
            moe: c.moe.map(|m| MoeScratch::new(&m, params.n_ubatch, c.n_embd)),
        };
        let kv = KvCache::new(c, &params);
        let mut logits = vec![0.0; z.logits];
        commit(&mut logits);
        Context {
            pool: ThreadPool::new(nth),
            kv,
            s,
            logits,
            n_logits: 0,
            hidden: Vec::new(),
            n_hidden: 0,
            model,
            adapters: (0..params.n_seq_max.max(1)).map(|_| Vec::new()).collect(),
            params,
            observer: Default::default(),
        }
    }

    /// Applies `set` (adapters with their scales, which add up) to sequence `seq`'s tokens from
    /// the next [`Context::decode`] on; an empty set returns it to the bare model. Other
    /// sequences keep theirs, so one batch mixes adapters. Refused, changing nothing, for a
    /// sequence this context lacks or an adapter loaded for another model.
    pub fn set_adapters(&mut self, seq: SeqId, set: &[(Arc<Lora>, f32)]) -> Result<(), ModelError> {
        let n_seq_max = self.adapters.len();
        let slot = self.adapters.get_mut(seq).ok_or(ModelError::BadSeq { seq, n_seq_max })?;
        let c = &self.model.config;
        if let Some((l, _)) = set.iter().find(|(l, _)| !l.fits(c)) {
            return Err(
                LoraError::WrongBase { adapter: l.name.clone(), model: c.name.clone() }.into()
            );
        }
        *slot = set.to_vec();
        Ok(())
    }

    /// Sequence `seq`'s adapters (empty for the bare model or a sequence this context lacks).
    pub fn adapters(&self, seq: SeqId) -> &[(Arc<Lora>, f32)] {
        self.adapters.get(seq).map_or(&[], Vec::as_slice)
    }

    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    pub fn config(&self) -> &ModelConfig {
        &self.model.config
    }

    pub fn pool(&self) -> &ThreadPool {
        &self.pool
    }

    /// Installs the hook the forward pass calls before and after each layer (e.g. a
    /// `memory::residency::Streamer`). Only the first call takes effect; returns whether it did.
    pub fn set_layer_observer(&self, obs: Arc<dyn memory::residency::LayerObserver>) -> bool {
        self.observer.set(obs).is_ok()
    }

    /// Logits of the `i`-th output row of the last [`Context::decode`] call.
    pub fn logits(&self, i: usize) -> &[f32] {
        let n = self.model.config.n_vocab;
        assert!(
            i < self.n_logits,
            "logit row {i} requested, the last batch produced {}",
            self.n_logits
        );
        &self.logits[i * n..(i + 1) * n]
    }

    pub fn n_logits(&self) -> usize {
        self.n_logits
    }

    /// The final hidden state (after the output norm, the input of the output matrix) of the
    /// `i`-th token of the last [`Context::decode`] call that asked for it
    /// ([`Batch::push_hidden`]): what pooled embeddings are made of.
    pub fn hidden(&self, i: usize) -> &[f32] {
        let d = self.model.config.n_embd;
        assert!(
            i < self.n_hidden,
            "hidden row {i} requested, the last batch produced {}",
            self.n_hidden
        );
        &self.hidden[i * d..(i + 1) * d]
    }

    pub fn n_hidden(&self) -> usize {
        self.n_hidden
    }

    /// Runs `batch`, storing its keys/values and the logits of the tokens that ask for them.
    /// The whole batch is checked first: on error nothing has changed.
    pub fn decode(&mut self, batch: &Batch) -> Result<(), ModelError> {
        let c = &self.model.config;
        let n_out = batch.n_outputs();
        if n_out > self.params.n_outputs_max {
            return Err(ModelError::TooManyOutputs {
                requested: n_out,
                max: self.params.n_outputs_max,
            });
        }
        for i in 0..batch.len() {
            if batch.tokens[i] as usize >= c.n_vocab {
                return Err(ModelError::BadToken { token: batch.tokens[i], n_vocab: c.n_vocab });
            }
            self.kv.check(batch.seq[i], batch.pos[i])?;
        }
        self.n_logits = 0;
        self.n_hidden = 0;
        let want = batch.n_hidden().saturating_mul(c.n_embd);
        if self.hidden.len() < want {
            self.hidden.resize(want, 0.0);
        }
        let ub = self.params.n_ubatch.max(1);
        let mut start = 0;
        while start < batch.len() {
            let end = (start + ub).min(batch.len());
            self.run_ubatch(batch, start, end)?;
            start = end;
        }
        Ok(())
    }

    fn run_ubatch(&mut self, batch: &Batch, b0: usize, b1: usize) -> Result<(), ModelError> {
        let model = Arc::clone(&self.model);
        let (c, w) = (&model.config, &model.weights);
        let file = model.file.bytes();
        let n = b1 - b0;
        let d = c.n_embd;
        let s = &mut self.s;
        let pool = &self.pool;

        // Embeddings.
        let row_bytes = w.tok_embd.row_bytes();
        for t in 0..n {
            let tok = batch.tokens[b0 + t] as usize;
            let src = &w.tok_embd.data(file)[tok * row_bytes..(tok + 1) * row_bytes];
            let dst = &mut s.x[t * d..(t + 1) * d];
            quant::dequantize_row(w.tok_embd.ty, src, dst)
                .map_err(|e| ModelError::Kernel(e.to_string()))?;
            if c.embd_scale != 1.0 {
                dst.iter_mut().for_each(|v| *v *= c.embd_scale);
            }
        }

        // Every token of the micro-batch may take the prefill panels: they give the row
        // kernels' bits (`quant::kernels::matmul_multi_panels`), so which tokens share a
        // micro-batch changes the speed only.
        let all = 0..n;
        let panels = std::slice::from_ref(&all);
        let observer = self.observer.get().cloned();
        let rope_factors = rope_factors(c, w, self.params.n_ctx);
        for (il, lw) in w.layers.iter().enumerate() {
            // Each matrix group's matmul, reported to the observer stage by stage.
            let gm = GroupMm {
                pool,
                file,
                obs: observer.as_deref(),
                il,
                blocks: &w.stage_blocks,
                lora: (&self.adapters, &batch.seq[b0..b1]),
                panels,
            };
            let io = Rows { n, d };
            io.norm(&mut s.xn, &s.x, &lw.attn_norm, c.rms_eps);
            let at = AttnAt { il, batch, b0, rope_factors };
            attention_block(&gm, c, lw, &at, &mut self.kv, s)?;
            io.residual(&mut s.x, &mut s.xn, lw.post_attn_norm.as_deref(), c.rms_eps);
            io.norm(&mut s.xn, &s.x, &lw.ffn_norm, c.rms_eps);
            match (&c.moe, &mut s.moe) {
                (Some(m), Some(ms)) => {
                    moe_block(&gm, m, lw, &mut s.xn[..n * d], n, d, ms, &mut s.qbuf)?
                }
                _ => ffn_block(&gm, c, lw, n, s)?,
            }
            io.residual(&mut s.x, &mut s.xn, lw.post_ffn_norm.as_deref(), c.rms_eps);
        }

        // Hidden states asked for (embeddings).
        for t in 0..n {
            if batch.hidden.get(b0 + t).copied().unwrap_or(false) {
                let h = self.n_hidden;
                ops::rms_norm_into(
                    &mut self.hidden[h * d..(h + 1) * d],
                    &s.x[t * d..(t + 1) * d],
                    &w.output_norm,
                    c.rms_eps,
                );
                self.n_hidden += 1;
            }
        }

        // Output rows.
        let mut n_out = 0;
        for t in 0..n {
            if batch.logits[b0 + t] {
                ops::rms_norm_into(
                    &mut s.xo[n_out * d..(n_out + 1) * d],
                    &s.x[t * d..(t + 1) * d],
                    &w.output_norm,
                    c.rms_eps,
                );
                n_out += 1;
            }
        }
        if n_out > 0 {
            let nv = c.n_vocab;
            let out = &mut self.logits[self.n_logits * nv..(self.n_logits + n_out) * nv];
            mm(pool, file, &w.output, &s.xo[..n_out * d], n_out, out, &mut s.qbuf, &[])?;
            for row in out.chunks_mut(nv) {
                if let Some(b) = &w.output_bias {
                    ops::add_assign(row, b);
                }
                if let Some(cap) = c.final_softcap {
                    ops::softcap(row, cap);
                }
            }
            self.n_logits += n_out;
        }
        Ok(())
    }
}

/// The RoPE frequency divisors every layer uses: Llama 3's `rope_freqs`, or Phi's LongRoPE
/// factors, long ones when a sequence may run past the original training context (as
/// llama.cpp chooses them, by the context size, not the position).
fn rope_factors<'w>(c: &ModelConfig, w: &'w Weights, n_ctx: usize) -> Option<&'w [f32]> {
    w.rope_freqs.as_deref().or(if n_ctx > c.n_ctx_orig {
        w.rope_factors_long.as_deref()
    } else {
        w.rope_factors_short.as_deref()
    })
}

/// `n` rows of `d` values: the shape the norm and residual blocks work on.
#[derive(Clone, Copy)]
struct Rows {
    n: usize,
    d: usize,
}

impl Rows {
    /// Norm block: `out[t] = rms_norm(x[t]) · w`.
    fn norm(self, out: &mut [f32], x: &[f32], w: &[f32], eps: f32) {
        let d = self.d;
        for t in 0..self.n {
            ops::rms_norm_into(&mut out[t * d..(t + 1) * d], &x[t * d..(t + 1) * d], w, eps);
        }
    }

    /// Residual block: `x[t] += post_norm(o[t])` (the norm only where the model has one).
    fn residual(self, x: &mut [f32], o: &mut [f32], post_norm: Option<&[f32]>, eps: f32) {
        let d = self.d;
        for t in 0..self.n {
            let o = &mut o[t * d..(t + 1) * d];
            if let Some(pn) = post_norm {
                ops::rms_norm(o, pn, eps);
            }
            ops::add_assign(&mut x[t * d..(t + 1) * d], o);
        }
    }
}

/// Where an attention block runs: the layer, the batch slice and the RoPE factors.
struct AttnAt<'a> {
    il: usize,
    batch: &'a Batch,
    b0: usize,
    rope_factors: Option<&'a [f32]>,
}

/// Attention block: `s.xn` (normed input) → q/k/v (+ biases, per-head q/k norms, RoPE unless
/// the layer is NoPE) → keys and values into the cache → attention → output projection, left in
/// `s.xn`.
fn attention_block(
    gm: &GroupMm,
    c: &ModelConfig,
    lw: &LayerWeights,
    at: &AttnAt,
    kv: &mut KvCache,
    s: &mut Scratch,
) -> Result<(), ModelError> {
    let (il, batch, b0) = (at.il, at.batch, at.b0);
    let n = gm.lora.1.len();
    let (d, qd, kvd, hd) = (c.n_embd, c.q_dim(), c.kv_dim(), c.head_dim);
    let la = c.layers[il];
    gm.run(
        lw,
        0,
        &s.xn[..n * d],
        n,
        &mut [&mut s.q[..n * qd], &mut s.k[..n * kvd], &mut s.v[..n * kvd]],
        &mut s.qbuf,
    )?;
    for t in 0..n {
        let (q, k, v) = (
            &mut s.q[t * qd..(t + 1) * qd],
            &mut s.k[t * kvd..(t + 1) * kvd],
            &mut s.v[t * kvd..(t + 1) * kvd],
        );
        if let Some(b) = &lw.bq {
            ops::add_assign(q, b);
        }
        if let Some(b) = &lw.bk {
            ops::add_assign(k, b);
        }
        if let Some(b) = &lw.bv {
            ops::add_assign(v, b);
        }
        if let (Some(qn), Some(kn)) = (&lw.q_norm, &lw.k_norm) {
            q.chunks_mut(hd).for_each(|h| ops::rms_norm(h, qn, c.rms_eps));
            k.chunks_mut(hd).for_each(|h| ops::rms_norm(h, kn, c.rms_eps));
        }
        if la.rope {
            s.rope.fill(batch.pos[b0 + t], la.rope_base, la.rope_freq_scale, at.rope_factors);
            q.chunks_mut(hd).for_each(|h| s.rope.apply(h, c.spec.rope_style));
            k.chunks_mut(hd).for_each(|h| s.rope.apply(h, c.spec.rope_style));
        }
        if let Some(block) = kv.rot_k() {
            // Stored keys are rotated: scores need the query rotated alike.
            crate::kv::rotate::rotate(q, block);
            crate::kv::rotate::rotate(k, block);
        }
        kv.write(batch.seq[b0 + t], il, batch.pos[b0 + t], k, v)?;
    }
    attention(gm.pool, c, kv, il, batch, b0, n, &s.q, &mut s.att[..n * qd], &mut s.attn_tmp);
    for t in b0..b0 + n {
        kv.evict(batch.seq[t], il, batch.pos[t]);
    }
    gm.run(lw, 1, &s.att[..n * qd], n, &mut [&mut s.xn[..n * d]], &mut s.qbuf)
}

/// Dense FFN block: `s.xn = down(act(gate(s.xn)) · up(s.xn))`.
fn ffn_block(
    gm: &GroupMm,
    c: &ModelConfig,
    lw: &LayerWeights,
    n: usize,
    s: &mut Scratch,
) -> Result<(), ModelError> {
    let (d, ff) = (c.n_embd, c.n_ff);
    gm.run(
        lw,
        2,
        &s.xn[..n * d],
        n,
        &mut [&mut s.gate[..n * ff], &mut s.up[..n * ff]],
        &mut s.qbuf,
    )?;
    ops::glu(&mut s.gate[..n * ff], &s.up[..n * ff], c.spec.activation);
    gm.run(lw, 3, &s.gate[..n * ff], n, &mut [&mut s.xn[..n * d]], &mut s.qbuf)
}

#[allow(clippy::too_many_arguments)] // the block's weights, rows and buffers
/// Mixture-of-experts FFN block (`moe::moe_ffn`), in place in `xn`. The observer sees the FFN
/// groups' stages begin before the router and end after the last expert; the experts come from
/// its expert cache when it has one (the stages then leave them out), else from the mapping (a
/// streamed layer's stages then hold all its experts). LoRA adapters do not reach experts.
fn moe_block(
    gm: &GroupMm,
    m: &MoeConfig,
    lw: &LayerWeights,
    xn: &mut [f32],
    n: usize,
    d: usize,
    ms: &mut MoeScratch,
    qbuf: &mut Vec<u8>,
) -> Result<(), ModelError> {
    let first: usize = gm.blocks[..2].iter().sum();
    let count: usize = gm.blocks[2..].iter().sum();
    if let Some(o) = gm.obs {
        o.before_stage(gm.il, first);
    }
    let src =
        moe::ExpertSource { file: gm.file, cache: gm.obs.and_then(|o| o.experts()), il: gm.il };
    moe::moe_ffn(
        m,
        lw,
        xn,
        n,
        d,
        ms,
        src,
        // Experts take the row kernels: which tokens meet at an expert depends on the batch.
        // The router and a shared expert see the whole micro-batch, as a dense FFN does.
        |base, w, x, rows, y, all| {
            mm(gm.pool, base, w, x, rows, y, qbuf, if all { gm.panels } else { &[] })
        },
    )?;
    if let Some(o) = gm.obs {
        (first..first + count).for_each(|st| o.after_stage(gm.il, st));
    }
    Ok(())
}

/// Multiplies by one layer's matrix groups (`memory::stages`), telling the observer around each
/// stage (a block of the group's rows).
struct GroupMm<'a> {
    pool: &'a ThreadPool,
    file: &'a [u8],
    obs: Option<&'a dyn memory::residency::LayerObserver>,
    il: usize,
    /// Blocks per group.
    blocks: &'a [usize; memory::stages::GROUPS],
    /// Adapter sets by sequence, and the sequence of each token: each group's outputs gain
    /// their tokens' LoRA deltas after the base matmul (`lora::bgmv`).
    lora: (&'a [AdapterSet], &'a [SeqId]),
    /// The tokens that may take the prefill panels (the whole micro-batch).
    panels: &'a [Range<usize>],
}

impl GroupMm<'_> {
    /// `ys[i] = x · group g's i-th matrix` for `m` tokens, plus each token's LoRA deltas.
    fn run(
        &self,
        lw: &LayerWeights,
        g: usize,
        x: &[f32],
        m: usize,
        ys: &mut [&mut [f32]],
        qbuf: &mut Vec<u8>,
    ) -> Result<(), ModelError> {
        self.run_base(lw, g, x, m, ys, qbuf)?;
        let (sets, seqs) = self.lora;
        bgmv::apply(self.pool, sets, seqs, self.il, g, x, ys);
        Ok(())
    }

    /// The base matmul of [`GroupMm::run`]. A streamed layer computing one token goes block by
    /// block: each block's rows are read, used and dropped before the next, so streaming holds
    /// one block of the group, not all of it. Otherwise the group is one matmul, and its stages
    /// are reported done together.
    fn run_base(
        &self,
        lw: &LayerWeights,
        g: usize,
        x: &[f32],
        m: usize,
        ys: &mut [&mut [f32]],
        qbuf: &mut Vec<u8>,
    ) -> Result<(), ModelError> {
        let (mats, n) = lw.group(g);
        let nb = self.blocks[g];
        let first: usize = self.blocks[..g].iter().sum();
        let Some(o) = self.obs else {
            return mm_shared_input(
                self.pool,
                self.file,
                &[&mats[0], &mats[1], &mats[2]][..n],
                x,
                m,
                ys,
                qbuf,
                self.panels,
            );
        };
        if m == 1 && nb > 1 && o.streams(self.il) {
            for b in 0..nb {
                o.before_stage(self.il, first + b);
                let mut blk = mats;
                let mut parts: [&mut [f32]; 3] = [&mut [], &mut [], &mut []];
                for ((w, part), y) in blk.iter_mut().zip(parts.iter_mut()).zip(ys.iter_mut()) {
                    let (r0, r1) = memory::stages::block_rows(w.rows, nb, b);
                    *w = w.rows_slice(r0, r1);
                    *part = &mut y[r0..r1];
                }
                mm_shared_input(
                    self.pool,
                    self.file,
                    &[&blk[0], &blk[1], &blk[2]][..n],
                    x,
                    1,
                    &mut parts[..n],
                    qbuf,
                    &[],
                )?;
                o.after_stage(self.il, first + b);
            }
            return Ok(());
        }
        o.before_stage(self.il, first);
        mm_shared_input(
            self.pool,
            self.file,
            &[&mats[0], &mats[1], &mats[2]][..n],
            x,
            m,
            ys,
            qbuf,
            self.panels,
        )?;
        for b in 0..nb {
            o.after_stage(self.il, first + b);
        }
        Ok(())
    }
}

/// Several matrices applied to the same input: when they share an activation format, the input
/// is quantized once and the pool is handed the work once (`matmul_multi`); otherwise one call each.
#[allow(clippy::too_many_arguments)]
fn mm_shared_input(
    pool: &ThreadPool,
    file: &[u8],
    ws: &[&Mat],
    x: &[f32],
    m: usize,
    ys: &mut [&mut [f32]],
    qbuf: &mut Vec<u8>,
    panels: &[Range<usize>],
) -> Result<(), ModelError> {
    if let ([w], [y]) = (ws, &mut *ys) {
        return mm(pool, file, w, x, m, y, qbuf, panels);
    }
    let vdt = quant::kernels::vec_dot_type(ws[0].ty);
    if ws.iter().all(|w| quant::kernels::vec_dot_type(w.ty) == vdt) {
        let mut refs =
            [MatRef { ty: ws[0].ty, data: &[], rows: 0, cols: 0 }; quant::kernels::MAX_MULTI];
        for (r, w) in refs.iter_mut().zip(ws) {
            *r = MatRef { ty: w.ty, data: w.data(file), rows: w.rows, cols: w.cols };
        }
        return quant::kernels::matmul_multi_panels(
            pool,
            &refs[..ws.len()],
            x,
            m,
            ys,
            qbuf,
            panels,
        )
        .map_err(|e| ModelError::Kernel(e.to_string()));
    }
    for (w, y) in ws.iter().zip(ys.iter_mut()) {
        mm(pool, file, w, x, m, y, qbuf, panels)?;
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn mm(
    pool: &ThreadPool,
    file: &[u8],
    w: &Mat,
    x: &[f32],
    m: usize,
    y: &mut [f32],
    qbuf: &mut Vec<u8>,
    panels: &[Range<usize>],
) -> Result<(), ModelError> {
    let mr = MatRef { ty: w.ty, data: w.data(file), rows: w.rows, cols: w.cols };
    quant::kernels::matmul_multi_panels(pool, &[mr], x, m, &mut [y], qbuf, panels)
        .map_err(|e| ModelError::Kernel(e.to_string()))
}
