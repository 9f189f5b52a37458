//! Scoring a prompt the way the llama.cpp reference dumps do: logits at every position (top-k
//! and the full-vocabulary log-sum-exp), then a greedy (or teacher-forced) continuation.
//! The output has the same JSON shape as `refdata/*.llamacpp.json`, so any run can be compared
//! with llama.cpp directly. End-of-generation tokens do not stop evaluation.

use crate::{Batch, Context, ModelError, SeqId};
use serde::Serialize;

/// The logits produced at one position: the distribution of the next token.
#[derive(Clone, Debug, Serialize)]
pub struct PositionRow {
    pub pos: usize,
    pub token: u32,
    pub is_prompt: bool,
    /// Best `top_k` (token, logit), highest first.
    pub top10: Vec<(u32, f32)>,
    /// log Σ exp(logit) over the whole vocabulary.
    pub lse: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct EvalResult {
    pub prompt_tokens: Vec<u32>,
    pub n_prompt: usize,
    pub gen_tokens: Vec<u32>,
    /// Argmax of the last row.
    pub next_token_after_gen: u32,
    pub positions: Vec<PositionRow>,
}

/// Top-`k` (token, logit) pairs, highest first (lowest id first on ties), and the log-sum-exp.
pub fn top_k_and_lse(logits: &[f32], k: usize) -> (Vec<(u32, f32)>, f64) {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&l| ((l - max) as f64).exp()).sum();
    let lse = max as f64 + sum.ln();
    let mut top: Vec<(u32, f32)> = Vec::with_capacity(k + 1);
    for (i, &l) in logits.iter().enumerate() {
        if top.len() < k || l > top[top.len() - 1].1 {
            let at = top.partition_point(|&(_, v)| v >= l);
            top.insert(at, (i as u32, l));
            top.truncate(k);
        }
    }
    (top, lse)
}

/// Runs `prompt` through sequence `seq` of `ctx` (which must be empty) with logits at every
/// position, then `n_predict` greedy tokens — or, with `force`, those tokens instead (teacher
/// forcing). `ctx` must allow at least one output row; prompts are scored in chunks of
/// `n_outputs_max` tokens.
pub fn evaluate(
    ctx: &mut Context,
    seq: SeqId,
    prompt: &[u32],
    n_predict: usize,
    top_k: usize,
    force: Option<&[u32]>,
) -> Result<EvalResult, ModelError> {
    evaluate_with(ctx, seq, prompt, n_predict, top_k, force, |_, _| {})
}

/// [`evaluate`], calling `on_row(row, logits)` with every position's full logits as well.
pub fn evaluate_with(
    ctx: &mut Context,
    seq: SeqId,
    prompt: &[u32],
    n_predict: usize,
    top_k: usize,
    force: Option<&[u32]>,
    mut on_row: impl FnMut(&PositionRow, &[f32]),
) -> Result<EvalResult, ModelError> {
    if prompt.is_empty() {
        return Err(ModelError::Unsupported("cannot evaluate an empty prompt".into()));
    }
    let n_gen = force.map_or(n_predict, |f| f.len());
    let total = prompt.len() + n_gen;
    if total > ctx.params.n_ctx {
        return Err(ModelError::ContextFull { pos: total - 1, n_ctx: ctx.params.n_ctx });
    }
    let chunk = ctx.params.n_outputs_max.max(1);
    let mut positions = Vec::with_capacity(total);
    let mut batch = Batch::default();
    for (c, toks) in prompt.chunks(chunk).enumerate() {
        batch.clear();
        for (i, &t) in toks.iter().enumerate() {
            batch.push(t, c * chunk + i, seq, true);
        }
        ctx.decode(&batch)?;
        for (i, &t) in toks.iter().enumerate() {
            let (top10, lse) = top_k_and_lse(ctx.logits(i), top_k);
            let row = PositionRow { pos: c * chunk + i, token: t, is_prompt: true, top10, lse };
            on_row(&row, ctx.logits(i));
            positions.push(row);
        }
    }
    let mut gen_tokens = Vec::with_capacity(n_gen);
    for g in 0..n_gen {
        let next = match force {
            Some(f) => f[g],
            None => positions.last().map(|r: &PositionRow| r.top10[0].0).unwrap_or(0),
        };
        gen_tokens.push(next);
        batch.clear();
        let pos = prompt.len() + g;
        batch.push(next, pos, seq, true);
        ctx.decode(&batch)?;
        let (top10, lse) = top_k_and_lse(ctx.logits(0), top_k);
        let row = PositionRow { pos, token: next, is_prompt: false, top10, lse };
        on_row(&row, ctx.logits(0));
        positions.push(row);
    }
    let next_token_after_gen = positions.last().map_or(0, |r| r.top10[0].0);
    Ok(EvalResult {
        prompt_tokens: prompt.to_vec(),
        n_prompt: prompt.len(),
        gen_tokens,
        next_token_after_gen,
        positions,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_k_orders_and_breaks_ties_by_lowest_id() {
        let (top, lse) = top_k_and_lse(&[1.0, 3.0, 3.0, -1.0, 2.0], 3);
        assert_eq!(top, vec![(1, 3.0), (2, 3.0), (4, 2.0)]);
        let expect = [1.0f64, 3.0, 3.0, -1.0, 2.0].iter().map(|v| v.exp()).sum::<f64>().ln();
        assert!((lse - expect).abs() < 1e-6);
    }
}
