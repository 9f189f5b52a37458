//! The mixture-of-experts FFN block: a router picks `n_expert_used` experts per token, and the
//! chosen experts' SwiGLU outputs are summed with the router's weights.
//!
//! Design: tokens are grouped by expert across the micro-batch. For each expert some token
//! chose, its tokens' rows are gathered into one matrix and the expert's gate, up and down are
//! one matmul each over all of them, so an expert's weights (one contiguous block of the file
//! per matrix) are read once per micro-batch however many tokens use it. Cost: a decode step
//! reads `n_expert_used` experts; a prompt of `n` tokens reads at most `min(n · k, n_expert)`.
//! The gather and scatter copy `k` rows of `n_embd` per token, which is small next to the
//! matmuls. Scratch is sized once ([`MoeScratch`]); nothing is allocated per call.
//!
//! A shared expert (qwen2moe) is one more SwiGLU FFN over every token of the micro-batch,
//! computed after the router and before the routed experts (the order the layer's stages read
//! them), its output weighed per token by `sigmoid(gate_inp · x)` and added after the routed
//! experts' sum, as llama.cpp adds it. It is always read from the mapping: it is not an expert
//! the cache holds.
//!
//! The experts' bytes come from the mapping, or from an expert cache
//! ([`memory::residency::ExpertCache`]) when the residency keeps them apart: the block then
//! holds the chosen experts as they are computed (as many at once as the cache has slots) and
//! computes on the cache's copy, which the cache reads while the first experts are computed on.

use memory::residency::ExpertCache;

use crate::arch::{Activation, Gating};
use crate::config::MoeConfig;
use crate::ops;
use crate::weights::{LayerWeights, Mat, SharedExpert};
use crate::ModelError;

/// Buffers of the MoE block for a micro-batch of `ub` tokens. Shapes are `[rows][width]`.
pub struct MoeScratch {
    /// [ub][n_expert] router logits, then probabilities
    probs: Vec<f32>,
    /// [ub][n_expert_used] chosen experts and their weights, per token
    chosen: Vec<(u32, f32)>,
    /// [ub][n_embd] rows of the tokens routed to the current expert
    x_in: Vec<f32>,
    /// [ub][max(n_ff_exp, n_ff_shexp)] the expert's gate (then its activation) and up, and the
    /// shared expert's before them
    gate: Vec<f32>,
    up: Vec<f32>,
    /// [ub][n_embd] the expert's output rows
    y: Vec<f32>,
    /// [ub] token index of each gathered row, and its weight
    rows: Vec<(usize, f32)>,
    /// [ub][n_embd] the weighted sum of the experts' outputs
    acc: Vec<f32>,
    /// The experts some token chose, ascending
    used: Vec<u32>,
    /// [ub][n_embd] the shared expert's output rows, each weighed by its token's gate
    sh_out: Vec<f32>,
}

impl MoeScratch {
    /// Number of f32 values [`MoeScratch::new`] allocates (the planner's activation bytes).
    pub fn floats(m: &MoeConfig, ub: usize, n_embd: usize) -> usize {
        let ub = ub.max(1);
        let sh_out = if m.n_ff_shexp > 0 { n_embd } else { 0 };
        let ff = m.n_ff_exp.max(m.n_ff_shexp);
        ub.saturating_mul(m.n_expert + 2 * m.n_expert_used + 3 * n_embd + sh_out + 2 * ff + 2)
            .saturating_add(m.n_expert)
    }

    pub fn new(m: &MoeConfig, ub: usize, n_embd: usize) -> MoeScratch {
        let (ub, ff) = (ub.max(1), m.n_ff_exp.max(m.n_ff_shexp));
        MoeScratch {
            probs: vec![0.0; ub * m.n_expert],
            chosen: vec![(0, 0.0); ub * m.n_expert_used],
            x_in: vec![0.0; ub * n_embd],
            gate: vec![0.0; ub * ff],
            up: vec![0.0; ub * ff],
            y: vec![0.0; ub * n_embd],
            rows: Vec::with_capacity(ub),
            acc: vec![0.0; ub * n_embd],
            used: Vec::with_capacity(m.n_expert),
            sh_out: if m.n_ff_shexp > 0 { vec![0.0; ub * n_embd] } else { Vec::new() },
        }
    }
}

/// The router's choice for one token: the `k` largest of `probs` (ties: the lower expert id),
/// with weights renormalised to sum to 1 when `norm` says so, then scaled.
pub fn route(probs: &[f32], k: usize, norm: bool, scale: f32, out: &mut [(u32, f32)]) {
    let mut n = 0;
    for (e, &p) in probs.iter().enumerate() {
        if n < k || p > out[n - 1].1 {
            let at = out[..n].partition_point(|&(_, v)| v >= p);
            let end = (n + 1).min(k);
            out.copy_within(at..end - 1, at + 1);
            out[at] = (e as u32, p);
            n = end;
        }
    }
    let sum: f32 = out[..k].iter().map(|&(_, w)| w).sum();
    // llama.cpp clamps the sum to the smallest normal f16 before dividing.
    let div = if norm { sum.max(6.103_515_6e-5) } else { 1.0 };
    out[..k].iter_mut().for_each(|(_, w)| *w = *w / div * scale);
}

/// Where a layer's experts' bytes are: the file mapping, or an expert cache.
#[derive(Clone, Copy)]
pub struct ExpertSource<'a> {
    pub file: &'a [u8],
    pub cache: Option<&'a ExpertCache>,
    /// The layer, as the cache knows it.
    pub il: usize,
}

/// `xn[t] = Σ_e w[t][e] · expert_e(xn[t])`, in place, for the `n` tokens of `xn`
/// ([n][n_embd]), the experts and weights chosen by `lw`'s router (plus the shared expert, where
/// `lw` has one). `mm(base, w, x, m, y, all)` is the matmul (`y[m][w.rows] = x[m][w.cols] · wᵀ`,
/// `w`'s bytes at its offset in `base`); `all`: the rows are every token of the micro-batch in
/// order (the router, the shared expert), not the tokens one expert drew.
#[allow(clippy::too_many_arguments)] // the block's inputs, its buffers, its source and matmul
pub fn moe_ffn(
    m: &MoeConfig,
    lw: &LayerWeights,
    xn: &mut [f32],
    n: usize,
    n_embd: usize,
    s: &mut MoeScratch,
    src: ExpertSource,
    mut mm: impl FnMut(&[u8], &Mat, &[f32], usize, &mut [f32], bool) -> Result<(), ModelError>,
) -> Result<(), ModelError> {
    let (ne, k, fe, d) = (m.n_expert, m.n_expert_used, m.n_ff_exp, n_embd);
    let router = lw.router.as_ref().ok_or_else(|| {
        ModelError::Unsupported("a mixture-of-experts layer without a router".into())
    })?;
    mm(src.file, router, &xn[..n * d], n, &mut s.probs[..n * ne], true)?;
    for t in 0..n {
        let p = &mut s.probs[t * ne..(t + 1) * ne];
        match m.gating {
            Gating::Softmax => ops::softmax(p),
            Gating::Sigmoid => p.iter_mut().for_each(|v| *v = ops::sigmoid(*v)),
        }
        route(p, k, m.norm_weights, m.weights_scale, &mut s.chosen[t * k..(t + 1) * k]);
    }
    if let Some(sh) = &lw.shared {
        shared_expert(sh, m.n_ff_shexp, &xn[..n * d], n, d, s, src.file, &mut mm)?;
    }
    s.used.clear();
    s.used.extend((0..ne as u32).filter(|&e| s.chosen[..n * k].iter().any(|c| c.0 == e)));
    let out = &mut s.acc[..n * d];
    out.fill(0.0);
    // The cache holds at most its slots at once: the experts are taken that many at a time.
    let per = src.cache.map_or(s.used.len(), |c| c.slots()).max(1);
    for group in (0..s.used.len()).step_by(per) {
        let ids = &s.used[group..(group + per).min(s.used.len())];
        let held = match src.cache {
            Some(c) => Some(c.hold(src.il, ids).map_err(ModelError::Experts)?),
            None => None,
        };
        for &e in ids {
            s.rows.clear();
            for t in 0..n {
                if let Some(&(_, w)) = s.chosen[t * k..(t + 1) * k].iter().find(|c| c.0 == e) {
                    s.rows.push((t, w));
                }
            }
            let r = s.rows.len();
            let x_in = &mut s.x_in[..r * d];
            for (i, &(t, _)) in s.rows.iter().enumerate() {
                x_in[i * d..(i + 1) * d].copy_from_slice(&xn[t * d..(t + 1) * d]);
            }
            let mats = lw.expert(e as usize, ne);
            // From the cache: each block is exactly the matrix's bytes.
            let (base, [gate, up, down]) = match &held {
                Some(h) => {
                    (h.get(e).map_err(ModelError::Experts)?, mats.map(|m| Mat { offset: 0, ..m }))
                }
                None => ([src.file; 3], mats),
            };
            mm(base[0], &gate, x_in, r, &mut s.gate[..r * fe], false)?;
            mm(base[1], &up, x_in, r, &mut s.up[..r * fe], false)?;
            ops::glu(&mut s.gate[..r * fe], &s.up[..r * fe], Activation::Silu);
            mm(base[2], &down, &s.gate[..r * fe], r, &mut s.y[..r * d], false)?;
            for (i, &(t, w)) in s.rows.iter().enumerate() {
                let o = &mut out[t * d..(t + 1) * d];
                o.iter_mut().zip(&s.y[i * d..(i + 1) * d]).for_each(|(o, y)| *o += w * y);
            }
        }
    }
    if lw.shared.is_some() {
        ops::add_assign(out, &s.sh_out[..n * d]);
    }
    xn[..n * d].copy_from_slice(out);
    Ok(())
}

/// `s.sh_out[t] = sigmoid(sh.gate_inp · x[t]) · down(silu(gate(x[t])) · up(x[t]))` for the `n`
/// tokens of `x` ([n][d]); the shared expert is `fs` wide, its matrices in `file`.
#[allow(clippy::too_many_arguments)] // the expert, its input, its buffers, its bytes and matmul
fn shared_expert(
    sh: &SharedExpert,
    fs: usize,
    x: &[f32],
    n: usize,
    d: usize,
    s: &mut MoeScratch,
    file: &[u8],
    mm: &mut impl FnMut(&[u8], &Mat, &[f32], usize, &mut [f32], bool) -> Result<(), ModelError>,
) -> Result<(), ModelError> {
    mm(file, &sh.gate, x, n, &mut s.gate[..n * fs], true)?;
    mm(file, &sh.up, x, n, &mut s.up[..n * fs], true)?;
    ops::glu(&mut s.gate[..n * fs], &s.up[..n * fs], Activation::Silu);
    mm(file, &sh.down, &s.gate[..n * fs], n, &mut s.sh_out[..n * d], true)?;
    for (y, xt) in s.sh_out[..n * d].chunks_exact_mut(d).zip(x.chunks_exact(d)) {
        let w = ops::sigmoid(ops::dot(&sh.gate_inp, xt));
        y.iter_mut().for_each(|v| *v *= w);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_router_keeps_the_k_largest_and_renormalises() {
        let probs = [0.1, 0.4, 0.05, 0.3, 0.15];
        let mut out = [(0u32, 0.0f32); 2];
        route(&probs, 2, true, 1.0, &mut out);
        assert_eq!(out.map(|c| c.0), [1, 3]);
        assert!((out[0].1 - 0.4 / 0.7).abs() < 1e-6 && (out[1].1 - 0.3 / 0.7).abs() < 1e-6);
        let mut three = [(0u32, 0.0f32); 3];
        route(&probs, 3, false, 2.0, &mut three);
        assert_eq!(three, [(1, 0.8), (3, 0.6), (4, 0.3)]);
    }

    #[test]
    fn router_ties_go_to_the_lower_expert() {
        let mut out = [(0u32, 0.0f32); 2];
        route(&[0.25; 4], 2, true, 1.0, &mut out);
        assert_eq!(out, [(0, 0.5), (1, 0.5)]);
    }
}
