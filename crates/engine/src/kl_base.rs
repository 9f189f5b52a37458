//! Agreement with llama.cpp's own next-token distributions: the file `llama-perplexity
//! --kl-divergence-base FILE` saves (the evaluation tokens, then for every scored row of every
//! chunk its log-probabilities over the whole vocabulary), read a row at a time, and snug's
//! logits on the same chunks scored against it as llama.cpp's `--kl-divergence` does: top-1
//! agreement, mean KL(llama.cpp ‖ snug), both perplexities. Memory: one row of the file
//! (2 bytes per vocabulary entry) beside the context.

use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

use model::{Context, ModelError};
use serde::Serialize;

use crate::perplexity::{for_each_scored_row, Nll};
use crate::sampling::greedy;

/// Why a `--kl-divergence-base` file cannot be used, or the comparison could not run.
#[derive(Debug, thiserror::Error)]
pub enum KlBaseError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error("reading {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path} is not a llama-perplexity logits file (it does not start with `_logits_`)")]
    NotLogits { path: PathBuf },
    #[error("{path}: {what}")]
    Header { path: PathBuf, what: String },
    #[error("{path} has {have} bytes where its header promises {want}; regenerate it")]
    Size { path: PathBuf, have: u64, want: u64 },
    #[error(
        "{path} holds logits over {file} tokens but the model's vocabulary has {model}: it was \
         made with another model"
    )]
    Vocab { path: PathBuf, file: usize, model: usize },
    #[error("{path} was made with a context of {file} tokens; this run asks for {ctx}")]
    Ctx { path: PathBuf, file: usize, ctx: usize },
}

/// An open `--kl-divergence-base` file: header and tokens read, rows read one at a time.
pub struct KlBase {
    path: PathBuf,
    pub n_ctx: usize,
    pub n_vocab: usize,
    pub n_chunk: usize,
    /// [n_chunk × n_ctx] the tokens llama.cpp evaluated.
    pub tokens: Vec<u32>,
    reader: BufReader<File>,
    /// One row's bytes: f32 scale, f32 minimum log-probability, then `n_vocab` u16 (padded to
    /// an even count).
    row: Vec<u8>,
}

/// Bytes before the tokens: magic, then n_ctx, n_vocab, n_chunk as i32.
const HEADER: u64 = 20;

impl KlBase {
    pub fn open(path: &Path) -> Result<Self, KlBaseError> {
        let io = |source| KlBaseError::Io { path: path.to_owned(), source };
        let file = File::open(path).map_err(io)?;
        let have = file.metadata().map_err(io)?.len();
        let mut reader = BufReader::with_capacity(1 << 20, file);
        let mut head = [0u8; HEADER as usize];
        reader.read_exact(&mut head).map_err(|_| KlBaseError::NotLogits { path: path.into() })?;
        if &head[..8] != b"_logits_" {
            return Err(KlBaseError::NotLogits { path: path.into() });
        }
        let header = |what: String| KlBaseError::Header { path: path.into(), what };
        let field = |o: usize, name: &str| {
            let v = i32::from_le_bytes(head[o..o + 4].try_into().expect("4 bytes"));
            usize::try_from(v).map_err(|_| header(format!("{name} is {v}")))
        };
        let (n_ctx, n_vocab, n_chunk) =
            (field(8, "n_ctx")?, field(12, "n_vocab")?, field(16, "n_chunk")?);
        if n_ctx < 4 || n_vocab == 0 || n_chunk == 0 {
            return Err(header(format!("n_ctx {n_ctx}, n_vocab {n_vocab}, n_chunk {n_chunk}")));
        }
        let row_bytes = 2 * (2 * n_vocab.div_ceil(2) + 4) as u64;
        let n_rows = (n_chunk * (n_ctx - 1 - n_ctx / 2)) as u64;
        let want = (n_chunk as u64)
            .checked_mul(4 * n_ctx as u64)
            .and_then(|t| n_rows.checked_mul(row_bytes).and_then(|r| r.checked_add(t)))
            .and_then(|b| b.checked_add(HEADER));
        if want != Some(have) {
            return Err(KlBaseError::Size {
                path: path.into(),
                have,
                want: want.unwrap_or(u64::MAX),
            });
        }
        let mut raw = vec![0u8; 4 * n_chunk * n_ctx];
        reader.read_exact(&mut raw).map_err(io)?;
        let tokens: Vec<u32> = raw
            .chunks_exact(4)
            .map(|b| i32::from_le_bytes(b.try_into().expect("4 bytes")))
            .map(|t| u32::try_from(t).ok().filter(|&t| (t as usize) < n_vocab))
            .collect::<Option<_>>()
            .ok_or_else(|| header(format!("a token outside the vocabulary of {n_vocab}")))?;
        let row = vec![0u8; row_bytes as usize];
        Ok(KlBase { path: path.into(), n_ctx, n_vocab, n_chunk, tokens, reader, row })
    }

    /// Reads the next row.
    fn next_row(&mut self) -> Result<BaseRow<'_>, KlBaseError> {
        let path = &self.path;
        self.reader
            .read_exact(&mut self.row)
            .map_err(|source| KlBaseError::Io { path: path.clone(), source })?;
        Ok(BaseRow::new(&self.row, self.n_vocab))
    }
}

/// One row of llama.cpp's log-probabilities, 16-bit quantized over the top 16 nats:
/// ln p(i) = `min_log_prob + scale × q[i]`.
struct BaseRow<'a> {
    scale: f32,
    min_log_prob: f32,
    q: &'a [u8],
}

impl<'a> BaseRow<'a> {
    fn new(row: &'a [u8], n_vocab: usize) -> Self {
        let f32_at = |o: usize| f32::from_le_bytes(row[o..o + 4].try_into().expect("4 bytes"));
        BaseRow { scale: f32_at(0), min_log_prob: f32_at(4), q: &row[8..8 + 2 * n_vocab] }
    }

    fn log_prob(&self, i: usize) -> f32 {
        self.scale * u16::from_le_bytes([self.q[2 * i], self.q[2 * i + 1]]) as f32
            + self.min_log_prob
    }
}

/// One position's comparison, computed as llama.cpp's `--kl-divergence` does (entries below
/// e^-16 in the base are left out of the KL sum; ties go to the lowest token id).
struct RowScore {
    kl: f64,
    same_top: bool,
    /// ln p(token) under snug's distribution and under llama.cpp's.
    log_prob: f64,
    log_prob_base: f64,
}

/// Scores one row: one pass over the vocabulary for snug's normaliser, one for the KL sum and
/// llama.cpp's top token.
fn score_row(base: &BaseRow, logits: &[f32], token: u32) -> RowScore {
    let top = greedy(logits.iter().enumerate().map(|(i, &l)| (i as u32, l)));
    let max = logits[top as usize];
    let lse = max as f64 + logits.iter().map(|&l| ((l - max) as f64).exp()).sum::<f64>().ln();
    let mut kl = 0.0;
    let mut top_base = (0u32, f32::NEG_INFINITY);
    for (i, &l) in logits.iter().enumerate() {
        let lp_base = base.log_prob(i);
        if lp_base > top_base.1 {
            top_base = (i as u32, lp_base);
        }
        if lp_base > -16.0 {
            kl += (lp_base as f64).exp() * (lp_base as f64 - (l as f64 - lse));
        }
    }
    RowScore {
        kl,
        same_top: top == top_base.0,
        log_prob: logits[token as usize] as f64 - lse,
        log_prob_base: base.log_prob(token as usize) as f64,
    }
}

/// snug's next-token distributions against llama.cpp's over the same positions.
#[derive(Clone, Debug, Serialize)]
pub struct Agreement {
    /// Share of positions where both put the same token first.
    pub top1: f64,
    /// Its standard error, √(p(1-p)/(n-1)).
    pub top1_stderr: f64,
    /// Mean KL(llama.cpp ‖ snug) in nats.
    pub mean_kl: f64,
    pub kl_stderr: f64,
    pub max_kl: f64,
    pub n_positions: usize,
    pub n_chunks: usize,
    pub n_ctx: usize,
    /// Perplexity of the chunks' tokens under snug's and under llama.cpp's distributions.
    pub ppl: f64,
    pub ppl_base: f64,
}

/// Runs up to `max_chunks` of the base file's chunks through `ctx` (whose `n_ctx` must be the
/// file's) and compares every scored position with llama.cpp's.
pub fn kl_divergence(
    ctx: &mut Context,
    base: &mut KlBase,
    bos: Option<u32>,
    max_chunks: Option<usize>,
) -> Result<Agreement, KlBaseError> {
    let n_vocab = ctx.model().config.n_vocab;
    if base.n_vocab != n_vocab {
        let path = base.path.clone();
        return Err(KlBaseError::Vocab { path, file: base.n_vocab, model: n_vocab });
    }
    if base.n_ctx != ctx.params.n_ctx {
        let (path, file, ctx) = (base.path.clone(), base.n_ctx, ctx.params.n_ctx);
        return Err(KlBaseError::Ctx { path, file, ctx });
    }
    let n_chunks = max_chunks.map_or(base.n_chunk, |m| m.min(base.n_chunk));
    let tokens = std::mem::take(&mut base.tokens);
    let (mut nll, mut nll_base) = (Nll::default(), Nll::default());
    let (mut kl_sum, mut kl_sum2, mut kl_max, mut same_top) = (0.0f64, 0.0f64, 0.0f64, 0usize);
    let run =
        for_each_scored_row(ctx, &tokens[..n_chunks * base.n_ctx], bos, |chunk, j, logits| {
            let row = score_row(&base.next_row()?, logits, chunk[j + 1]);
            nll.add(row.log_prob);
            nll_base.add(row.log_prob_base);
            kl_sum += row.kl;
            kl_sum2 += row.kl * row.kl;
            kl_max = kl_max.max(row.kl);
            same_top += usize::from(row.same_top);
            Ok::<_, KlBaseError>(())
        });
    base.tokens = tokens;
    run?;
    let n = nll.count as f64;
    let top1 = same_top as f64 / n;
    let mean_kl = kl_sum / n;
    let stderr = |var: f64| if n > 1.0 { (var.max(0.0) / (n - 1.0)).sqrt() } else { 0.0 };
    Ok(Agreement {
        top1,
        top1_stderr: stderr(top1 * (1.0 - top1)),
        mean_kl,
        kl_stderr: stderr(kl_sum2 / n - mean_kl * mean_kl),
        max_kl: kl_max,
        n_positions: nll.count,
        n_chunks,
        n_ctx: base.n_ctx,
        ppl: nll.ppl(),
        ppl_base: nll_base.ppl(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A row as llama.cpp's `log_softmax` writes it from `logits`.
    fn quantize(logits: &[f32]) -> Vec<u8> {
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let min = logits.iter().copied().fold(f32::INFINITY, f32::min).max(max - 16.0);
        let lse = logits.iter().map(|&l| ((l - max) as f64).exp()).sum::<f64>().ln() as f32;
        let scale = (max - min) / 65535.0;
        let mut row = Vec::new();
        row.extend(scale.to_le_bytes());
        row.extend((min - max - lse).to_le_bytes());
        for &l in logits {
            let q = if l > min { ((l - min) / scale).round() as u16 } else { 0 };
            row.extend(q.to_le_bytes());
        }
        row
    }

    fn score(base: &[f32], logits: &[f32]) -> RowScore {
        let row = quantize(base);
        score_row(&BaseRow::new(&row, base.len()), logits, 0)
    }

    #[test]
    fn the_same_distribution_scores_zero_kl_and_the_same_top() {
        let logits = [0.5, 3.0, -1.0, 2.0, 2.5];
        let shifted: Vec<f32> = logits.iter().map(|l| l + 7.0).collect();
        let r = score(&logits, &shifted);
        // Only the 16-bit quantization of the base differs: ~1e-5 nats.
        assert!(r.kl.abs() < 2e-5, "{}", r.kl);
        assert!(r.same_top);
        let p0 = (0.5f64 - logits.iter().map(|&l| (l as f64).exp()).sum::<f64>().ln()).exp();
        assert!((r.log_prob_base.exp() - p0).abs() < 1e-5);
    }

    #[test]
    fn a_different_distribution_scores_its_kl_and_a_different_top() {
        let (p, q) = ([0.0f32, 1.0, 2.0], [2.0f32, 1.0, 0.0]);
        let r = score(&p, &q);
        let ln_z = |v: &[f32]| v.iter().map(|&l| (l as f64).exp()).sum::<f64>().ln();
        let want: f64 = (0..3)
            .map(|i| {
                let lp = p[i] as f64 - ln_z(&p);
                lp.exp() * (lp - (q[i] as f64 - ln_z(&q)))
            })
            .sum();
        assert!((r.kl - want).abs() < 1e-4, "{} against {want}", r.kl);
        assert!(!r.same_top);
    }

    #[test]
    fn ties_go_to_the_lowest_id_on_both_sides() {
        assert!(score(&[1.0, 4.0, 4.0], &[1.0, 4.0, 4.0]).same_top);
        assert_eq!(greedy([(0, 1.0), (1, 4.0), (2, 4.0)].into_iter()), 1);
    }

    fn write(name: &str, bytes: &[u8]) -> PathBuf {
        let path = std::env::temp_dir().join(format!("snug-kl-{}-{name}", std::process::id()));
        std::fs::write(&path, bytes).unwrap();
        path
    }

    /// A header, tokens and the rows a file of `n_ctx`, `n_vocab`, `n_chunk` needs.
    fn file(n_ctx: i32, n_vocab: i32, n_chunk: i32, token: i32) -> Vec<u8> {
        let mut b = b"_logits_".to_vec();
        for v in [n_ctx, n_vocab, n_chunk] {
            b.extend(v.to_le_bytes());
        }
        for _ in 0..n_ctx * n_chunk {
            b.extend(token.to_le_bytes());
        }
        let rows = n_chunk * (n_ctx - 1 - n_ctx / 2);
        let row = quantize(&vec![0.0; n_vocab as usize]);
        for _ in 0..rows {
            b.extend(&row);
            b.extend([0, 0].repeat((n_vocab % 2) as usize));
        }
        b
    }

    #[test]
    fn reads_a_well_formed_file_and_its_rows() {
        let path = write("good", &file(8, 5, 2, 3));
        let mut base = KlBase::open(&path).unwrap();
        assert_eq!((base.n_ctx, base.n_vocab, base.n_chunk), (8, 5, 2));
        assert_eq!(base.tokens, vec![3; 16]);
        for _ in 0..2 * 3 {
            let row = base.next_row().unwrap();
            assert!((row.log_prob(4) - -(5f32).ln()).abs() < 1e-6);
        }
        assert!(matches!(base.next_row(), Err(KlBaseError::Io { .. })));
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn refuses_bad_files_with_the_reason() {
        let good = file(8, 5, 2, 3);
        let cases: [(&str, Vec<u8>); 5] = [
            ("magic", [b"_logitz_", &good[8..]].concat()),
            ("short", good[..good.len() - 1].to_vec()),
            ("long", [&good[..], &[0]].concat()),
            ("token", file(8, 5, 2, 5)),
            ("negative", [&good[..12], &(-5i32).to_le_bytes(), &good[16..]].concat()),
        ];
        for (name, bytes) in cases {
            let path = write(name, &bytes);
            let err = KlBase::open(&path).err().unwrap_or_else(|| panic!("{name} was accepted"));
            std::fs::remove_file(path).unwrap();
            let ok = match name {
                "magic" => matches!(err, KlBaseError::NotLogits { .. }),
                "short" | "long" => matches!(err, KlBaseError::Size { .. }),
                _ => matches!(err, KlBaseError::Header { .. }),
            };
            assert!(ok, "{name}: {err}");
        }
    }
}
