//! Perplexity the way llama-perplexity computes it, so figures are comparable: the text is cut
//! into non-overlapping chunks of `n_ctx` tokens, each chunk starts from an empty cache (its
//! first token replaced by BOS when the model adds one), and only the second half of each chunk
//! is scored (`kl_base` runs the same chunks against the log-probabilities llama.cpp saved for
//! them). Memory: one context of `n_ctx` positions and `n_outputs` logit rows.

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
    let mut nll = Nll::default();
    let mut per_chunk = Vec::with_capacity(n_chunks);
    for_each_scored_row(ctx, &tokens[..n_chunks * n_ctx], bos, |chunk, j, logits| {
        nll.add(log_prob(logits, chunk[j + 1]));
        if j + 2 == n_ctx {
            per_chunk.push(nll.ppl());
        }
        Ok::<_, PerplexityError>(())
    })?;
    Ok(PerplexityResult {
        ppl: nll.ppl(),
        ppl_stderr: nll.ppl_stderr(),
        n_chunks,
        n_ctx,
        n_scored: nll.count,
        per_chunk,
    })
}

/// Runs `tokens` (whole chunks of `ctx.params.n_ctx`) as llama-perplexity does and calls
/// `on_row(chunk, j, logits)` for every scored row `j` of every chunk in order: `j` runs over
/// `n_ctx / 2 ..= n_ctx - 2`, and `logits` predict `chunk[j + 1]`.
pub(crate) fn for_each_scored_row<E: From<ModelError>>(
    ctx: &mut Context,
    tokens: &[u32],
    bos: Option<u32>,
    mut on_row: impl FnMut(&[u32], usize, &[f32]) -> Result<(), E>,
) -> Result<(), E> {
    let n_ctx = ctx.params.n_ctx;
    let first = n_ctx / 2;
    let rows = ctx.params.n_outputs_max.max(1);
    let scored = |j: usize| j >= first && j + 1 < n_ctx;
    let mut batch = Batch::default();
    for chunk in tokens.chunks_exact(n_ctx) {
        ctx.kv.seq_clear(0);
        let mut start = 0;
        while start < n_ctx {
            let end = (start + rows).min(n_ctx);
            batch.clear();
            for j in start..end {
                let tok = if j == 0 { bos.unwrap_or(chunk[0]) } else { chunk[j] };
                batch.push(tok, j, 0, scored(j));
            }
            ctx.decode(&batch)?;
            for (out, j) in (start..end).filter(|&j| scored(j)).enumerate() {
                on_row(chunk, j, ctx.logits(out))?;
            }
            start = end;
        }
    }
    Ok(())
}

/// ln softmax(logits)[token], summed in f64.
fn log_prob(logits: &[f32], token: u32) -> f64 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&l| ((l - max) as f64).exp()).sum();
    (logits[token as usize] - max) as f64 - sum.ln()
}

/// Running sums of negative log-likelihoods: perplexity and its standard error.
#[derive(Default)]
pub(crate) struct Nll {
    sum: f64,
    sum2: f64,
    pub(crate) count: usize,
}

impl Nll {
    pub(crate) fn add(&mut self, log_prob: f64) {
        self.sum -= log_prob;
        self.sum2 += log_prob * log_prob;
        self.count += 1;
    }

    pub(crate) fn ppl(&self) -> f64 {
        (self.sum / self.count as f64).exp()
    }

    pub(crate) fn ppl_stderr(&self) -> f64 {
        let mean = self.sum / self.count as f64;
        let var = self.sum2 / self.count as f64 - mean * mean;
        if var > 0.0 && self.count > 1 {
            (var / (self.count - 1) as f64).sqrt() * self.ppl()
        } else {
            0.0
        }
    }
}
