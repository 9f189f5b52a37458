//! snug's own next-token distributions saved in the file format `llama-perplexity
//! --kl-divergence-base FILE` writes (read back by [`crate::KlBase`]), so a run can be compared
//! with another snug run (a KV precision or rotation against f16) as with llama.cpp: the same
//! chunks, top-1 agreement and mean KL. Rows are quantized as llama.cpp's `log_softmax` does:
//! 16 bits over the top 16 nats of each row. Memory: one row's bytes (2 per vocabulary entry).

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use model::Context;

use crate::kl_base::KlBaseError;
use crate::perplexity::{for_each_scored_row, Nll};

/// Scores up to `max_chunks` chunks of `ctx.params.n_ctx` tokens of `tokens` as
/// [`crate::perplexity`] does and writes every scored row's log-probabilities to `path`;
/// returns the perplexity.
pub fn save_kl_base(
    ctx: &mut Context,
    tokens: &[u32],
    bos: Option<u32>,
    max_chunks: Option<usize>,
    path: &Path,
) -> Result<f64, KlBaseError> {
    let io = |source| KlBaseError::Io { path: path.to_owned(), source };
    let n_ctx = ctx.params.n_ctx;
    let n_vocab = ctx.model().config.n_vocab;
    let available = tokens.len() / n_ctx;
    let n_chunks = max_chunks.map_or(available, |m| m.min(available));
    if n_chunks == 0 {
        let what = format!("the text has {} tokens, less than one chunk of {n_ctx}", tokens.len());
        return Err(KlBaseError::Header { path: path.to_owned(), what });
    }
    let tokens = &tokens[..n_chunks * n_ctx];
    let mut out = BufWriter::with_capacity(1 << 20, File::create(path).map_err(io)?);
    let i32_of = |v: usize| i32::try_from(v).unwrap_or(i32::MAX).to_le_bytes();
    out.write_all(b"_logits_").map_err(io)?;
    for v in [n_ctx, n_vocab, n_chunks] {
        out.write_all(&i32_of(v)).map_err(io)?;
    }
    for &t in tokens {
        out.write_all(&i32_of(t as usize)).map_err(io)?;
    }
    let mut row = Vec::with_capacity(8 + 2 * n_vocab.div_ceil(2) * 2);
    let mut nll = Nll::default();
    for_each_scored_row(ctx, tokens, bos, |chunk, j, logits| {
        nll.add(encode_row(&logits[..n_vocab], chunk[j + 1], &mut row));
        out.write_all(&row).map_err(io)
    })?;
    out.flush().map_err(io)?;
    Ok(nll.ppl())
}

/// One row as llama.cpp's `log_softmax` writes it: f32 scale, f32 least log-probability, then
/// `n_vocab` u16 (padded to an even count); returns ln p(`token`).
fn encode_row(logits: &[f32], token: u32, row: &mut Vec<u8>) -> f64 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let min = logits.iter().copied().fold(f32::INFINITY, f32::min).max(max - 16.0);
    let sum: f64 = logits.iter().map(|&l| ((l - max) as f64).exp()).sum();
    let lse = sum.ln() as f32;
    let scale = (max - min) / 65535.0;
    row.clear();
    row.extend(scale.to_le_bytes());
    row.extend((min - max - lse).to_le_bytes());
    for &l in logits {
        let q = if scale > 0.0 && l > min { ((l - min) / scale).round() as u16 } else { 0 };
        row.extend(q.to_le_bytes());
    }
    if logits.len() % 2 == 1 {
        row.extend([0, 0]);
    }
    logits[token as usize] as f64 - max as f64 - sum.ln()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use model::{ContextParams, Model};

    use super::*;
    use crate::{kl_divergence, KlBase};

    #[test]
    fn a_saved_base_reads_back_and_scores_its_own_run_as_the_same() {
        let p = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../testdata/refdata/tiny/tiny-qwen2.gguf");
        let m = Arc::new(Model::load(&p).unwrap());
        let n_vocab = m.config.n_vocab;
        let params =
            ContextParams { n_ctx: 64, n_ubatch: 64, n_outputs_max: 64, ..Default::default() };
        let toks: Vec<u32> =
            (0..200u64).map(|i| ((i * 2654435761 + 7) % n_vocab as u64) as u32).collect();
        let path = std::env::temp_dir().join(format!("snug-kl-save-{}.bin", std::process::id()));
        let mut ctx = Context::new(Arc::clone(&m), params);
        let ppl = save_kl_base(&mut ctx, &toks, None, Some(3), &path).unwrap();
        let mut base = KlBase::open(&path).unwrap();
        assert_eq!((base.n_ctx, base.n_vocab, base.n_chunk), (64, n_vocab, 3));
        assert_eq!(base.tokens, toks[..192]);
        let a = kl_divergence(&mut ctx, &mut base, None, None).unwrap();
        std::fs::remove_file(&path).ok();
        assert_eq!(a.top1, 1.0);
        assert!(a.mean_kl < 1e-6, "{}", a.mean_kl);
        assert!((a.ppl_base / ppl - 1.0).abs() < 1e-3, "{} vs {ppl}", a.ppl_base);
        assert!((a.ppl - ppl).abs() < 1e-9 * ppl, "{} vs {ppl}", a.ppl);
    }
}
