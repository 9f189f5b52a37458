//! Embeddings: one vector per input text, pooled from the model's final hidden states (after the
//! output norm, the input of the output matrix; [`Context::hidden`]), as llama.cpp pools them.
//!
//! - Pooling: the file's `{arch}.pooling_type` when it says mean, cls or last; else (decoder
//!   models, whose files do not say, and for which llama.cpp pools nothing unless told)
//!   [`DECODER_POOLING`], mean: every token's state counts, where `last` would rest on one
//!   token a model not trained for embeddings never learned to summarise into. `--pooling`
//!   overrides both.
//! - [`Pooler`] folds the hidden rows of one input as they come, chunk by chunk (mean: a running
//!   sum; cls: the first; last: the last), so pooling needs one `n_embd` vector per input
//!   whatever its length; [`wanted`] says which tokens' states a pooling needs, so `last` and
//!   `cls` ask the forward pass for one row.
//! - [`finish`]: Matryoshka truncation to `dimensions`, then L2 normalisation (llama.cpp's
//!   `embd_normalize = 2`, Ollama's `/api/embed`).
//!
//! Cost: the forward pass of the input's tokens (a prompt's prefill; no logits are computed
//! for them) plus `n_embd` adds per token for mean pooling.

use model::config::Pooling;
use model::{Batch, Context, ModelConfig, ModelError, SeqId};

/// The pooling of a model whose file names none (decoders).
pub const DECODER_POOLING: Pooling = Pooling::Mean;

/// The pooling embeddings of a model with `config` use: `asked` (a `--pooling` flag), else the
/// file's when it pools into one vector, else [`DECODER_POOLING`].
pub fn pooling_for(config: &ModelConfig, asked: Option<Pooling>) -> Pooling {
    match asked.or(config.pooling) {
        Some(p @ (Pooling::Mean | Pooling::Cls | Pooling::Last)) => p,
        _ => DECODER_POOLING,
    }
}

/// A `--pooling` value: `mean`, `cls` or `last`.
pub fn parse_pooling(s: &str) -> Result<Pooling, String> {
    match s {
        "mean" => Ok(Pooling::Mean),
        "cls" => Ok(Pooling::Cls),
        "last" => Ok(Pooling::Last),
        other => Err(format!("pooling {other:?} is not one of mean, cls, last")),
    }
}

/// Whether token `i` of an input of `n` tokens has a state `pooling` needs.
pub fn wanted(pooling: Pooling, i: usize, n: usize) -> bool {
    match pooling {
        Pooling::Cls => i == 0,
        Pooling::Last => i + 1 == n,
        _ => true,
    }
}

/// One input's hidden rows folded into one vector as they arrive.
#[derive(Clone, Debug)]
pub struct Pooler {
    pooling: Pooling,
    /// [n_embd]: the running sum (mean), or the kept row (cls, last).
    acc: Vec<f32>,
    n: usize,
}

impl Pooler {
    pub fn new(pooling: Pooling, n_embd: usize) -> Pooler {
        Pooler { pooling, acc: vec![0.0; n_embd], n: 0 }
    }

    pub fn pooling(&self) -> Pooling {
        self.pooling
    }

    /// Folds in the next wanted row (in token order).
    pub fn accept(&mut self, row: &[f32]) {
        match self.pooling {
            Pooling::Cls if self.n > 0 => {}
            Pooling::Cls | Pooling::Last => self.acc.copy_from_slice(row),
            _ => self.acc.iter_mut().zip(row).for_each(|(a, &r)| *a += r),
        }
        self.n += 1;
    }

    /// Rows folded in so far.
    pub fn rows(&self) -> usize {
        self.n
    }

    /// The pooled vector (not normalised); the pooler starts over.
    pub fn take(&mut self) -> Vec<f32> {
        let mut v = vec![0.0; self.acc.len()];
        std::mem::swap(&mut v, &mut self.acc);
        if !matches!(self.pooling, Pooling::Cls | Pooling::Last) && self.n > 0 {
            let inv = 1.0 / self.n as f32;
            v.iter_mut().for_each(|x| *x *= inv);
        }
        self.n = 0;
        v
    }
}

/// Scales `v` to unit L2 norm (a zero vector stays zero), in f64 as llama.cpp's
/// `common_embd_normalize` sums.
pub fn normalize(v: &mut [f32]) {
    let sum: f64 = v.iter().map(|&x| f64::from(x) * f64::from(x)).sum();
    let norm = if sum > 0.0 { (1.0 / sum.sqrt()) as f32 } else { 0.0 };
    v.iter_mut().for_each(|x| *x *= norm);
}

/// A pooled vector as an answer gives it: its first `dims` values (Matryoshka truncation; `None`:
/// all), L2-normalised when `l2`.
pub fn finish(mut v: Vec<f32>, dims: Option<usize>, l2: bool) -> Vec<f32> {
    if let Some(d) = dims {
        v.truncate(d);
    }
    if l2 {
        normalize(&mut v);
    }
    v
}

/// The pooled (not normalised) embedding of `tokens` computed in `ctx`'s sequence `seq`, which
/// is cleared before and after; in chunks of the context's micro-batch. For callers that own a
/// context (`snug embed`); the server runs inputs through its scheduler instead.
pub fn embed_tokens(
    ctx: &mut Context,
    seq: SeqId,
    tokens: &[u32],
    pooling: Pooling,
) -> Result<Vec<f32>, ModelError> {
    let mut pooler = Pooler::new(pooling, ctx.config().n_embd);
    let chunk = ctx.params.n_ubatch.max(1);
    let mut batch = Batch::default();
    ctx.kv.seq_clear(seq);
    let n = tokens.len();
    let mut run = || -> Result<(), ModelError> {
        for (c, part) in tokens.chunks(chunk).enumerate() {
            batch.clear();
            for (j, &t) in part.iter().enumerate() {
                let pos = c * chunk + j;
                if wanted(pooling, pos, n) {
                    batch.push_hidden(t, pos, seq);
                } else {
                    batch.push(t, pos, seq, false);
                }
            }
            ctx.decode(&batch)?;
            for r in 0..ctx.n_hidden() {
                pooler.accept(ctx.hidden(r));
            }
        }
        Ok(())
    };
    let out = run();
    ctx.kv.seq_clear(seq);
    out.map(|()| pooler.take())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mean_pooling_averages_and_cls_and_last_keep_one_row() {
        let rows = [[1.0, 2.0], [3.0, 4.0], [5.0, 9.0]];
        let pool = |p| {
            let mut q = Pooler::new(p, 2);
            for (i, r) in rows.iter().enumerate() {
                if wanted(p, i, rows.len()) {
                    q.accept(r);
                }
            }
            q.take()
        };
        assert_eq!(pool(Pooling::Mean), vec![3.0, 5.0]);
        assert_eq!(pool(Pooling::Cls), vec![1.0, 2.0]);
        assert_eq!(pool(Pooling::Last), vec![5.0, 9.0]);
        assert!(!wanted(Pooling::Last, 1, 3) && wanted(Pooling::Last, 2, 3));
        assert!(wanted(Pooling::Cls, 0, 3) && !wanted(Pooling::Cls, 1, 3));
    }

    #[test]
    fn a_pooler_starts_over_after_take() {
        let mut q = Pooler::new(Pooling::Mean, 1);
        q.accept(&[4.0]);
        assert_eq!(q.take(), vec![4.0]);
        q.accept(&[2.0]);
        assert_eq!((q.rows(), q.take()), (1, vec![2.0]));
    }

    #[test]
    fn finish_truncates_then_normalises_and_leaves_zero_alone() {
        assert_eq!(finish(vec![3.0, 4.0, 12.0], Some(2), true), vec![0.6, 0.8]);
        assert_eq!(finish(vec![3.0, 4.0], None, false), vec![3.0, 4.0]);
        assert_eq!(finish(vec![0.0, 0.0], None, true), vec![0.0, 0.0]);
        let v = finish(vec![1.0, 2.0, 2.0], None, true);
        assert!((v.iter().map(|x| x * x).sum::<f32>() - 1.0).abs() < 1e-6);
    }

    #[test]
    fn pooling_flags_parse_and_name_the_choices() {
        assert_eq!(parse_pooling("last"), Ok(Pooling::Last));
        assert!(parse_pooling("rank").unwrap_err().contains("mean, cls, last"));
    }
}
