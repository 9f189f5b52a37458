//! Perplexity the way llama-perplexity computes it, so figures are comparable: the text is cut
//! into non-overlapping chunks of `n_ctx` tokens, each chunk starts from an empty cache (its
//! first token replaced by BOS when the model adds one), and only the second half of each chunk
//! is scored. Memory: one context of `n_ctx` positions and `n_outputs` logit rows.

use model::{Batch, Context, ModelError};
use serde::Serialize;

#[derive(Clone, Debug, Serialize)]
pub struct PerplexityResult {
    pub ppl: f64,
    /// Standard error of the perplexity (llama.cpp's "+/-" figure).
    pub ppl_stderr: f64,
    pub n_chunks: usize,
    pub n_ctx: usize,
    pub n_scored: usize,
    /// Perplexity after each chunk.
    pub per_chunk: Vec<f64>,
}

/// Why a text could not be scored.
#[derive(Debug, thiserror::Error)]
pub enum PerplexityError {
    /// Two chunks of the context are the least a score is computed over.
    #[error("perplexity needs at least 2 × ctx = {needed} tokens, the text has {have}")]
    TooShort { needed: usize, have: usize },
    #[error(transparent)]
    Model(#[from] ModelError),
}

/// Scores `tokens` in up to `max_chunks` chunks of `ctx.params.n_ctx` tokens on sequence 0.
pub fn perplexity(
    ctx: &mut Context,
    tokens: &[u32],
    bos: Option<u32>,
    max_chunks: Option<usize>,
) -> Result<PerplexityResult, PerplexityError> {
    let n_ctx = ctx.params.n_ctx;
    let available = tokens.len() / n_ctx;
    if available == 0 || tokens.len() < 2 * n_ctx {
        return Err(PerplexityError::TooShort { needed: 2 * n_ctx, have: tokens.len() });
    }
    let n_chunks = max_chunks.map_or(available, |m| m.min(available));
    let first = n_ctx / 2;
    let rows = ctx.params.n_outputs_max.max(1);
    let mut batch = Batch::default();
    let (mut nll, mut nll2, mut count) = (0.0f64, 0.0f64, 0usize);
    let mut per_chunk = Vec::with_capacity(n_chunks);
    for c in 0..n_chunks {
        let chunk = &tokens[c * n_ctx..(c + 1) * n_ctx];
        ctx.kv.seq_clear(0);
        let mut start = 0;
        while start < n_ctx {
            let end = (start + rows).min(n_ctx);
            batch.clear();
            for j in start..end {
                let tok = if j == 0 { bos.unwrap_or(chunk[0]) } else { chunk[j] };
                // Row j predicts token j + 1; rows first..n_ctx-2 are scored.
                batch.push(tok, j, 0, j >= first && j + 1 < n_ctx);
            }
            ctx.decode(&batch)?;
            let mut out = 0;
            for j in start..end {
                if j >= first && j + 1 < n_ctx {
                    let logits = ctx.logits(out);
                    out += 1;
                    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    let sum: f64 = logits.iter().map(|&l| ((l - max) as f64).exp()).sum();
                    let lp = (logits[chunk[j + 1] as usize] - max) as f64 - sum.ln();
                    nll -= lp;
                    nll2 += lp * lp;
                    count += 1;
                }
            }
            start = end;
        }
        per_chunk.push((nll / count as f64).exp());
    }
    let mean = nll / count as f64;
    let var = nll2 / count as f64 - mean * mean;
    let ppl = mean.exp();
    let ppl_stderr =
        if var > 0.0 && count > 1 { (var / (count - 1) as f64).sqrt() * ppl } else { 0.0 };
    Ok(PerplexityResult { ppl, ppl_stderr, n_chunks, n_ctx, n_scored: count, per_chunk })
}
