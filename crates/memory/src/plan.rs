//! The planner: peak resident memory predicted from the GGUF header alone, and the configuration
//! (context, KV precision, residency) chosen for a budget.
//!
//! Peak RSS = weights touched through the mapping + KV cache + activation arena + logits +
//! tokenizer heap + fixed process overhead. Each term is an exact formula of the shape except
//! the tokenizer heap and the fixed overhead, whose constants were measured on this runtime
//! (see `crates/cli/tests/plan_vs_rss.rs`, which holds the prediction to ±5% of `VmHWM`).

use gguf::GgufFile;
use serde::Serialize;

use crate::stages::{self, GROUPS};

const MIB: u64 = 1 << 20;

/// Bytes the process holds before any model: binary text and data, libc, allocator arenas,
/// main stack (measured: `snug --help` peaks at 4.3 MiB; a run adds its arenas' bookkeeping).
pub const FIXED_OVERHEAD: u64 = 6 * MIB;
/// Each worker thread: touched stack plus its allocator arena (measured ≈ 0.3 MiB).
pub const PER_THREAD: u64 = 320 * 1024;
/// Tokenizer heap per vocabulary entry beyond its text: its span in the GGUF metadata's string
/// array (8 bytes) and its type there (4), the tokenizer's own text span (8), index slots
/// (4/3 × 8), attribute (2) and piece offset (4) — 37 bytes; SentencePiece vocabularies add a
/// score in the metadata and in the tokenizer (8), which the header facts do not tell apart, so
/// this covers both (measured with 4-byte text offsets: qwen2.5 BPE 31.6, gemma3 SPM 40.9 bytes
/// a token; the spans add 4).
pub const TOK_PER_TOKEN: u64 = 44;
/// Tokenizer heap per byte of token text: stored once in the metadata's string array, once in the
/// tokenizer's texts and once more as the detokenized piece.
pub const TOK_PER_TEXT_BYTE: u64 = 3;
/// Per merge rule beyond its text (held once, in the metadata): its span in the metadata (8) and
/// the merge map entry, 16 bytes in a hash table at most 7/8 full and sized to a power of two
/// (29 bytes a merge for qwen2.5's 151k merges; between 19 and 39 for other counts).
pub const TOK_PER_MERGE: u64 = 37;
/// Linux maps up to 16 neighbouring pages of a file on one read fault (`fault_around_bytes`).
pub const FAULT_AROUND: u64 = 64 * 1024;
/// Fault-around windows of an untied embedding a prompt of `n` tokens touches, per √n: text
/// reuses few distinct tokens and BPE gives frequent ones low, clustered ids (measured: 4096
/// tokens of English touch ≈ 16 MiB of qwen2.5's 93 MiB table).
pub const EMBD_WINDOWS_PER_SQRT_TOKEN: f64 = 4.0;
/// Streamed bytes the readers may ask for past the stage computing (on top of the biggest
/// stage, which they must be able to hold whole): enough to keep the disk busy while a
/// resident stage computes.
pub const STREAM_LOOKAHEAD: u64 = 64 * MIB;
/// Streamed weights resident beyond what the readers asked for: each reader's last read fault
/// brings in two huge-page folios past its claim at most, and a stage's last folio stays until
/// the next stage is dropped.
pub const STREAM_READAHEAD: u64 = crate::residency::READERS as u64 * 4 * MIB;

/// KV cache element precision.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum KvType {
    F16,
    /// Values: 32 values in 8 bits + one f16 scale, 34 bytes per 32 values. Keys: per channel
    /// over 32-token blocks (8 bits + an f16 scale and min per channel per block), 36 bytes per
    /// 32 values, plus the block being filled kept in f16.
    Q8,
    /// As `Q8` with 4 bits: values 18 bytes per 32 values, keys 20.
    Q4,
}

impl KvType {
    pub const ALL: [KvType; 3] = [KvType::F16, KvType::Q8, KvType::Q4];

    /// Bytes for `n` values of one token's value head (`n` a multiple of 32 in practice;
    /// rounded up to whole blocks).
    pub fn bytes(self, n: u64) -> u64 {
        match self {
            KvType::F16 => 2 * n,
            KvType::Q8 => n.div_ceil(32) * 34,
            KvType::Q4 => n.div_ceil(32) * 18,
        }
    }

    /// Bytes one token's key head of `d` channels takes (`model::KvType::k_head_bytes`): a
    /// quantized key block of 32 tokens is 32 rows of codes (`d` bytes for q8, `ceil(d/2)` for
    /// q4) + `d` f16 scales + `d` f16 mins, rounded up to a multiple of 32.
    pub fn key_head_bytes(self, d: u64) -> u64 {
        let block = |codes: u64| (4 * d + 32 * codes).div_ceil(32);
        match self {
            KvType::F16 => self.bytes(d),
            KvType::Q8 => block(d),
            KvType::Q4 => block(d.div_ceil(2)),
        }
    }

    /// Bytes of f16 keys kept per layer outside the blocks for the block being filled: 32
    /// tokens of `kv_dim` values with quantized keys, none with f16 keys.
    pub fn staged_bytes(self, kv_dim: u64) -> u64 {
        match self {
            KvType::Q8 | KvType::Q4 => 32 * kv_dim * 2,
            KvType::F16 => 0,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            KvType::F16 => "f16",
            KvType::Q8 => "q8",
            KvType::Q4 => "q4",
        }
    }

    pub fn parse(s: &str) -> Option<KvType> {
        match s {
            "f16" => Some(KvType::F16),
            "q8" | "q8_0" => Some(KvType::Q8),
            "q4" | "q4_0" => Some(KvType::Q4),
            _ => None,
        }
    }
}

/// How the weights are kept in memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Residency {
    /// Zero-copy mapping; pages come in on first touch and the kernel may evict them.
    Mmap,
    /// Mapping prefaulted at load.
    Populate,
    /// Mapping prefaulted and pinned (`mlock`).
    Mlock,
    /// The first `pinned` layers locked, the rest read layer by layer and dropped after use.
    Stream,
}

impl Residency {
    pub fn name(self) -> &'static str {
        match self {
            Residency::Mmap => "mmap",
            Residency::Populate => "populate",
            Residency::Mlock => "mlock",
            Residency::Stream => "stream",
        }
    }
}

/// The model's shape as the forward pass sees it (the CLI fills it from `model::ModelConfig`).
#[derive(Clone, Debug, Serialize)]
pub struct Shape {
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_ff: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub n_vocab: usize,
    pub n_ctx_train: usize,
    /// Per layer: sliding-window length, `None` for global attention.
    pub windows: Vec<Option<usize>>,
}

impl Shape {
    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }
    pub fn kv_dim(&self) -> usize {
        self.n_head_kv * self.head_dim
    }
}

/// Byte counts read from the GGUF header: the file, its layers, its vocabulary.
#[derive(Clone, Debug, Serialize)]
pub struct ModelFacts {
    pub file_bytes: u64,
    /// Header (metadata + tensor table), read at open.
    pub header_bytes: u64,
    /// `[n_layer]` bytes of each `blk.N.*` tensor group.
    pub layer_bytes: Vec<u64>,
    /// Bytes of the biggest stage ([`stages`]: a block of rows of one group of a layer's
    /// matrices, what streaming holds whole while it computes).
    pub biggest_stage: u64,
    pub embd_bytes: u64,
    pub embd_row_bytes: u64,
    /// The output projection reuses the token embedding (it is then read whole every token).
    pub output_tied: bool,
    /// Tensors outside the layers and the embedding (output, norms).
    pub other_bytes: u64,
    pub n_tokens: u64,
    pub token_text_bytes: u64,
    pub n_merges: u64,
    pub merge_text_bytes: u64,
}

impl ModelFacts {
    pub fn from_gguf(f: &GgufFile) -> ModelFacts {
        let mut layer_bytes: Vec<u64> = Vec::new();
        let mut groups: Vec<[u64; GROUPS]> = Vec::new();
        let mut max_row = 0u64;
        let (mut embd_bytes, mut embd_rows, mut other) = (0u64, 1u64, 0u64);
        let mut output_tied = true;
        for t in &f.tensors {
            if let Some(il) = t
                .name
                .strip_prefix("blk.")
                .and_then(|r| r.split('.').next())
                .and_then(|n| n.parse::<usize>().ok())
            {
                if layer_bytes.len() <= il {
                    layer_bytes.resize(il + 1, 0);
                    groups.resize(il + 1, [0; GROUPS]);
                }
                layer_bytes[il] += t.size;
                let suffix = t.name.splitn(3, '.').nth(2).unwrap_or("");
                if let Some(g) = stages::group_of(suffix) {
                    groups[il][g] += t.size;
                    max_row = max_row.max(t.size / t.dims.get(1).copied().unwrap_or(1).max(1));
                }
            } else if t.name == "token_embd.weight" {
                embd_bytes = t.size;
                embd_rows = t.dims.get(1).copied().unwrap_or(1).max(1);
            } else {
                if t.name == "output.weight" {
                    output_tied = false;
                }
                other += t.size;
            }
        }
        let strings = |k: &str| f.get_array(k).and_then(|a| a.as_strings()).unwrap_or(&[]);
        let toks = strings("tokenizer.ggml.tokens");
        let merges = strings("tokenizer.ggml.merges");
        let max_group = std::array::from_fn(|g| groups.iter().map(|l| l[g]).max().unwrap_or(0));
        ModelFacts {
            file_bytes: f.file_len(),
            header_bytes: f.data_offset,
            layer_bytes,
            biggest_stage: stages::biggest_stage(max_group, max_row),
            embd_bytes,
            embd_row_bytes: embd_bytes / embd_rows,
            output_tied,
            other_bytes: other,
            n_tokens: toks.len() as u64,
            token_text_bytes: toks.iter().map(|s| s.len() as u64).sum(),
            n_merges: merges.len() as u64,
            merge_text_bytes: merges.iter().map(|s| s.len() as u64).sum(),
        }
    }

    fn layers_total(&self) -> u64 {
        self.layer_bytes.iter().sum()
    }
}

/// One configuration to predict.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Request {
    pub n_ctx: usize,
    /// Positions the KV cache holds at its peak: `n_ctx`, or fewer when the job is known to
    /// need fewer (a prompt plus the tokens to generate). The cache is paged, so that is what
    /// it costs.
    pub n_kv: usize,
    pub kv: KvType,
    pub n_ubatch: usize,
    pub n_threads: usize,
    pub residency: Residency,
    /// Layers kept resident under [`Residency::Stream`] (ignored otherwise).
    pub pinned_layers: usize,
    /// The KV cache stores only the last `window` positions of sliding-window layers.
    pub kv_windowed: bool,
}

/// Predicted peak resident bytes, by term.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Prediction {
    pub weights: u64,
    pub kv: u64,
    pub arena: u64,
    pub logits: u64,
    pub tokenizer: u64,
    pub overhead: u64,
    pub total: u64,
}

/// KV bytes for one token position in every layer (no windows): what a paged cache grows by.
pub fn kv_bytes_per_token(s: &Shape, kv: KvType) -> u64 {
    s.n_layer as u64 * kv_row_bytes(s, kv)
}

/// KV bytes of one token in one layer: every KV head's keys and values.
fn kv_row_bytes(s: &Shape, kv: KvType) -> u64 {
    let hd = s.head_dim as u64;
    s.n_head_kv as u64 * (kv.key_head_bytes(hd) + kv.bytes(hd))
}

/// Tokens per KV block of the paged cache (`model::kv::BLOCK_TOKENS`).
pub const KV_BLOCK_TOKENS: usize = 32;

/// KV bytes at the peak of a full context of `n_ctx` positions. Blocks hold 32 positions; with
/// `windowed`, a sliding-window layer holds at most its window plus the micro-batch being
/// computed plus one partly filled edge block (freed blocks are reused before fresh ones).
/// Quantized keys add each layer's f16 block being filled.
pub fn kv_bytes(s: &Shape, kv: KvType, n_ctx: usize, n_ubatch: usize, windowed: bool) -> u64 {
    let row = kv_row_bytes(s, kv);
    let staged = s.n_layer as u64 * kv.staged_bytes(s.kv_dim() as u64);
    (0..s.n_layer)
        .map(|il| {
            let w = if windowed { s.windows.get(il).copied().flatten() } else { None };
            let pos = w.map_or(n_ctx, |w| (w + n_ubatch.max(1) + KV_BLOCK_TOKENS).min(n_ctx));
            row * (pos.div_ceil(KV_BLOCK_TOKENS) * KV_BLOCK_TOKENS) as u64
        })
        .sum::<u64>()
        + staged
}

/// Weight bytes resident under `r`: the whole file when every page is read each token (tied
/// output) or prefaulted; otherwise the layers, the other tensors and the embedding rows touched
/// (each with its fault-around neighbourhood). Streaming keeps `pinned` layers plus the
/// readers' window ([`stream_window`]) and the readahead past it ([`STREAM_READAHEAD`]).
pub fn weights_resident(s: &Shape, m: &ModelFacts, r: &Request) -> u64 {
    let embd_touched =
        if m.output_tied || matches!(r.residency, Residency::Populate | Residency::Mlock) {
            m.embd_bytes
        } else {
            let windows = (EMBD_WINDOWS_PER_SQRT_TOKEN * (r.n_ctx as f64).sqrt()).ceil() as u64;
            m.embd_bytes.min(windows * m.embd_row_bytes.max(FAULT_AROUND))
        };
    let fixed = m.header_bytes + m.other_bytes + embd_touched;
    match r.residency {
        Residency::Stream => {
            let pinned = r.pinned_layers.min(s.n_layer);
            let streamed = if pinned < s.n_layer {
                stream_window(m) + STREAM_READAHEAD.min(biggest_layer(m))
            } else {
                0
            };
            fixed + m.layer_bytes[..pinned.min(m.layer_bytes.len())].iter().sum::<u64>() + streamed
        }
        _ => fixed + m.layers_total(),
    }
}

/// Most streamed bytes the reader threads hold from the stage computing on: the biggest stage
/// and [`STREAM_LOOKAHEAD`] past it, at most a layer past it on small models.
pub fn stream_window(m: &ModelFacts) -> u64 {
    m.biggest_stage + STREAM_LOOKAHEAD.min(biggest_layer(m))
}

fn biggest_layer(m: &ModelFacts) -> u64 {
    m.layer_bytes.iter().copied().max().unwrap_or(0)
}

/// Activation arena of `model::Context` for `n_ubatch` tokens (the `Scratch` formulas) plus the
/// per-thread attention rows and the engine's per-token batch arrays.
pub fn arena_bytes(s: &Shape, r: &Request) -> u64 {
    // Rows past the longest micro-batch the job can compute are reserved, never touched: a job
    // filling `n_kv` positions never computes more than `n_kv` tokens at once.
    let ub = r.n_ubatch.clamp(1, r.n_kv.max(1)) as u64;
    let (d, qd, kvd, ff) = (s.n_embd as u64, s.q_dim() as u64, s.kv_dim() as u64, s.n_ff as u64);
    let f32s = ub * (2 * d + 2 * qd + 2 * kvd + 2 * ff) + d;
    let qbuf = ub * ff.max(d) * 2;
    let group = (s.n_head / s.n_head_kv.max(1)) as u64;
    // model::attention::scratch_floats: per thread a 32-token key and value tile, 2 × head_dim
    // channel scales, and 8 tokens × group rows of (32 scores, max, sum, output row); plus
    // 4 split-K partials per thread of group × (head_dim + 2).
    let (hd, nth) = (s.head_dim as u64, r.n_threads.max(1) as u64);
    let per_thread = 64 * hd + 2 * hd + 8 * group * (32 + 2 + hd);
    let attn = (nth * per_thread + 4 * nth * group * (hd + 2)) * 4;
    // Prompt ids, batch (token, pos, seq, flag), sampler candidates ([n_vocab] id + logit + prob).
    let engine = r.n_ctx as u64 * (4 + 4 + 8 + 8 + 1) + s.n_vocab as u64 * 16;
    f32s * 4 + qbuf + attn + engine
}

/// Heap held by the tokenizer and the parsed GGUF metadata (measured after `Tokenizer::from_gguf`:
/// qwen2.5 15.3 MiB, gemma3 16.9 MiB with 4-byte text offsets; the spans that replaced them add
/// 4 bytes a token: 15.9 and 17.9 MiB, predicted 17.1 and 17.6).
pub fn tokenizer_bytes(m: &ModelFacts) -> u64 {
    m.n_tokens * TOK_PER_TOKEN
        + m.token_text_bytes * TOK_PER_TEXT_BYTE
        + m.n_merges * TOK_PER_MERGE
        + m.merge_text_bytes
}

pub fn predict(s: &Shape, m: &ModelFacts, r: &Request) -> Prediction {
    let weights = weights_resident(s, m, r);
    let kv = kv_bytes(s, r.kv, r.n_kv.min(r.n_ctx), r.n_ubatch, r.kv_windowed);
    let arena = arena_bytes(s, r);
    let logits = s.n_vocab as u64 * 4;
    let tokenizer = tokenizer_bytes(m);
    let overhead = FIXED_OVERHEAD + PER_THREAD * r.n_threads as u64;
    Prediction {
        weights,
        kv,
        arena,
        logits,
        tokenizer,
        overhead,
        total: weights + kv + arena + logits + tokenizer + overhead,
    }
}

/// Bytes kept free below the budget: page tables, the page cache of the file header, noise.
pub fn headroom(budget: u64) -> u64 {
    (budget / 32).max(64 * MIB)
}

/// What the caller asked for; `None` fields are chosen.
#[derive(Clone, Debug)]
pub struct Wants {
    pub n_ctx: Option<usize>,
    pub kv: Option<KvType>,
    pub residency: Option<Residency>,
    /// Least context the job needs (prompt + 1).
    pub n_ctx_min: usize,
    /// Positions the job will hold at most (prompt + tokens to generate); `None`: the whole
    /// context (a conversation, or a job whose length is not known).
    pub n_kv: Option<usize>,
    pub n_ubatch: usize,
    pub n_threads: usize,
    /// KV precisions the runtime's cache implements.
    pub kv_available: Vec<KvType>,
    pub kv_windowed: bool,
}

/// The chosen configuration and why.
#[derive(Clone, Debug, Serialize)]
pub struct Choice {
    pub request: Request,
    pub prediction: Prediction,
    pub budget: u64,
    pub reason: String,
}

/// Chooses context, KV precision and residency within `budget` (bytes), honouring `w`'s fixed
/// fields. Order of preference: the default context (training context, at most 4096) with f16
/// KV and plain mmap; then cheaper KV; then smaller contexts down to 2048; then streaming layers
/// at the default context with as many layers pinned as fit.
pub fn choose(s: &Shape, m: &ModelFacts, budget: u64, w: &Wants) -> Result<Choice, String> {
    let usable = budget.saturating_sub(headroom(budget));
    let default_ctx = s.n_ctx_train.clamp(1, 4096).max(w.n_ctx_min);
    let ctxs: Vec<usize> = match w.n_ctx {
        Some(c) => vec![c],
        None => {
            let mut v = vec![default_ctx];
            let mut c = default_ctx / 2;
            while c >= 2048 && c >= w.n_ctx_min {
                v.push(c);
                c /= 2;
            }
            v
        }
    };
    let kvs: Vec<KvType> = match w.kv {
        Some(k) => vec![k],
        // q4 keys break Qwen models (BASELINES.md): never chosen unasked.
        None => w.kv_available.iter().copied().filter(|&k| k != KvType::Q4).collect(),
    };
    let req = |n_ctx: usize, kv, residency, pinned| Request {
        n_ctx,
        n_kv: w.n_kv.map_or(n_ctx, |n| n.clamp(1, n_ctx)),
        kv,
        n_ubatch: w.n_ubatch,
        n_threads: w.n_threads,
        residency,
        pinned_layers: pinned,
        kv_windowed: w.kv_windowed,
    };
    let whole = match w.residency {
        Some(Residency::Stream) => vec![],
        Some(r) => vec![r],
        None => vec![Residency::Mmap],
    };
    for &r in &whole {
        for &n_ctx in &ctxs {
            for &kv in &kvs {
                let rq = req(n_ctx, kv, r, s.n_layer);
                let p = predict(s, m, &rq);
                if p.total <= usable {
                    let reason = format!(
                        "predicted peak {} fits {} usable ({} budget less {} headroom)",
                        fmt_bytes(p.total),
                        fmt_bytes(usable),
                        fmt_bytes(budget),
                        fmt_bytes(budget - usable)
                    );
                    return Ok(Choice { request: rq, prediction: p, budget, reason });
                }
            }
        }
    }
    if matches!(w.residency, None | Some(Residency::Stream)) {
        for &n_ctx in &ctxs {
            for &kv in &kvs {
                // Most layers pinned such that the rest streams within the budget.
                let pinned = (0..s.n_layer).rev().find(|&k| {
                    predict(s, m, &req(n_ctx, kv, Residency::Stream, k)).total <= usable
                });
                if let Some(k) = pinned {
                    let rq = req(n_ctx, kv, Residency::Stream, k);
                    let p = predict(s, m, &rq);
                    let full = predict(s, m, &req(n_ctx, kv, Residency::Mmap, s.n_layer)).total;
                    let reason = format!(
                        "the whole model needs {} but {} is usable: {} of {} layers pinned, the rest streamed ({} peak)",
                        fmt_bytes(full),
                        fmt_bytes(usable),
                        k,
                        s.n_layer,
                        fmt_bytes(p.total)
                    );
                    return Ok(Choice { request: rq, prediction: p, budget, reason });
                }
            }
        }
    }
    // Nothing fits: say by how much, and what would.
    let n_ctx = ctxs[0];
    let kv = kvs.first().copied().unwrap_or(KvType::F16);
    let r = w.residency.unwrap_or(Residency::Mmap);
    let p = predict(s, m, &req(n_ctx, kv, r, 0));
    let mut options = Vec::new();
    for c in [n_ctx / 2, n_ctx / 4, 2048, 512]
        .into_iter()
        .filter(|&c| c >= w.n_ctx_min.max(1) && c < n_ctx)
    {
        let q = predict(s, m, &req(c, kv, r, 0));
        if q.total <= usable {
            options.push(format!("--ctx {c} ({})", fmt_bytes(q.total)));
            break;
        }
    }
    for k in [KvType::Q8, KvType::Q4] {
        if k != kv && w.kv_available.contains(&k) {
            let q = predict(s, m, &req(n_ctx, k, r, 0));
            if q.total <= usable {
                options.push(format!("--kv {} ({})", k.name(), fmt_bytes(q.total)));
                break;
            }
        }
    }
    if r != Residency::Stream {
        let q = predict(s, m, &req(n_ctx, kv, Residency::Stream, 0));
        if q.total <= usable {
            options.push(format!("--load stream ({} with no layer pinned)", fmt_bytes(q.total)));
        }
    }
    let what = describe(&req(n_ctx, kv, r, 0));
    Err(format!(
        "{what} needs {} (weights {}, KV cache {}, activations {}, tokenizer {}, process {}) but only {} is usable ({} budget); {}",
        fmt_bytes(p.total),
        fmt_bytes(p.weights),
        fmt_bytes(p.kv),
        fmt_bytes(p.arena + p.logits),
        fmt_bytes(p.tokenizer),
        fmt_bytes(p.overhead),
        fmt_bytes(usable),
        fmt_bytes(budget),
        if options.is_empty() { "no smaller configuration fits: give it more memory (--ram) or use a smaller model".to_string() } else { format!("try {}", options.join(", or ")) }
    ))
}

/// `ctx 4096, KV f16, mmap` (a job needing fewer positions than the context says how many;
/// streaming adds the pinned count).
pub fn describe(r: &Request) -> String {
    let used = if r.n_kv < r.n_ctx { format!(" for {} positions", r.n_kv) } else { String::new() };
    let kv = format!("ctx {}, KV {}{used}", r.n_ctx, r.kv.name());
    match r.residency {
        Residency::Stream => format!("{kv}, stream ({} layers pinned)", r.pinned_layers),
        m => format!("{kv}, {}", m.name()),
    }
}

/// `1.23 GiB`, `456.7 MiB`, `12 KiB`.
pub fn fmt_bytes(b: u64) -> String {
    let f = b as f64;
    if f >= (1u64 << 30) as f64 {
        format!("{:.2} GiB", f / (1u64 << 30) as f64)
    } else if f >= MIB as f64 {
        format!("{:.1} MiB", f / MIB as f64)
    } else {
        format!("{} KiB", b / 1024)
    }
}

/// Parses `6G`, `512M`, `3GiB`, `1.5g`, `123456` (bytes).
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let x: f64 =
        num.parse().map_err(|_| format!("{s:?} is not a size; write e.g. 6G, 512M or 3GiB"))?;
    let mult = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1u64,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        u => return Err(format!("unknown size unit {u:?} in {s:?}; use K, M, G or T")),
    };
    if !(x.is_finite() && x > 0.0) {
        return Err(format!("size {s:?} must be positive"));
    }
    Ok((x * mult as f64) as u64)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Qwen2.5-7B Q4_K_M as the planner sees it (shared with the pressure tests).
    pub(crate) fn qwen7b() -> (Shape, ModelFacts) {
        let s = Shape {
            n_layer: 28,
            n_embd: 3584,
            n_ff: 18944,
            n_head: 28,
            n_head_kv: 4,
            head_dim: 128,
            n_vocab: 151936,
            n_ctx_train: 32768,
            windows: vec![None; 28],
        };
        let m = ModelFacts {
            file_bytes: 4_682_436_000,
            header_bytes: 6 << 20,
            layer_bytes: vec![140_000_000; 28],
            biggest_stage: 15_400_000,
            embd_bytes: 306_000_000,
            embd_row_bytes: 2016,
            output_tied: false,
            other_bytes: 446_000_000,
            n_tokens: 151936,
            token_text_bytes: 1_000_000,
            n_merges: 151387,
            merge_text_bytes: 1_500_000,
        };
        (s, m)
    }

    #[test]
    fn kv_block_scales_cost_two_bytes_per_32_values() {
        assert_eq!(KvType::F16.bytes(64), 128);
        assert_eq!(KvType::Q8.bytes(64), 68);
        assert_eq!(KvType::Q4.bytes(64), 36);
    }

    #[test]
    fn quantized_keys_cost_a_scale_and_a_min_per_channel_per_32_tokens() {
        assert_eq!(KvType::Q4.key_head_bytes(64), 40);
        assert_eq!(KvType::Q8.key_head_bytes(64), 72);
        assert_eq!(KvType::F16.key_head_bytes(64), 128);
        let (s, _) = qwen7b();
        // 4 KV heads × (80 + 72) bytes per layer.
        assert_eq!(kv_bytes_per_token(&s, KvType::Q4), 28 * 4 * (80 + 72));
        let staged = 28 * 32 * 512 * 2;
        assert_eq!(
            kv_bytes(&s, KvType::Q4, 4096, 512, false),
            kv_bytes_per_token(&s, KvType::Q4) * 4096 + staged
        );
    }

    #[test]
    fn gqa_kv_per_token_for_qwen7b_is_56_kib() {
        let (s, _) = qwen7b();
        assert_eq!(kv_bytes_per_token(&s, KvType::F16), 2 * 28 * 512 * 2);
    }

    #[test]
    fn sliding_windows_cap_local_layers() {
        let mut s = qwen7b().0;
        s.windows = (0..28).map(|il| if il % 6 == 5 { None } else { Some(512) }).collect();
        let full = kv_bytes(&s, KvType::F16, 4096, 512, false);
        let win = kv_bytes(&s, KvType::F16, 4096, 512, true);
        let row = 2 * 512 * 2;
        assert_eq!(full, row * 28 * 4096);
        assert_eq!(win, row * (4 * 4096 + 24 * 1056));
        assert!(win < full);
    }

    pub(crate) fn wants() -> Wants {
        Wants {
            n_ctx: None,
            kv: None,
            residency: None,
            n_ctx_min: 1,
            n_kv: None,
            n_ubatch: 512,
            n_threads: 2,
            kv_available: vec![KvType::F16],
            kv_windowed: false,
        }
    }

    #[test]
    fn six_gib_runs_the_7b_from_the_mapping() {
        let (s, m) = qwen7b();
        let c = choose(&s, &m, 6 << 30, &wants()).unwrap();
        assert_eq!(c.request.residency, Residency::Mmap);
        assert_eq!(c.request.n_ctx, 4096);
    }

    #[test]
    fn three_gib_streams_with_layers_pinned_within_budget() {
        let (s, m) = qwen7b();
        let c = choose(&s, &m, 3 << 30, &wants()).unwrap();
        assert_eq!(c.request.residency, Residency::Stream);
        assert!(c.request.pinned_layers > 0 && c.request.pinned_layers < 28);
        assert!(c.prediction.total <= 3 << 30);
    }

    #[test]
    fn a_short_job_pins_more_layers_and_predicts_only_the_kv_it_fills() {
        let (s, m) = qwen7b();
        let full = choose(&s, &m, 3 << 30, &wants()).unwrap();
        let mut w = wants();
        w.n_kv = Some(80);
        let short = choose(&s, &m, 3 << 30, &w).unwrap();
        assert_eq!((short.request.n_ctx, short.request.n_kv), (4096, 80));
        assert!(short.request.pinned_layers > full.request.pinned_layers);
        assert_eq!(short.prediction.kv, kv_bytes_per_token(&s, KvType::F16) * 96);
        assert!(short.prediction.total <= 3 << 30);
        assert!(describe(&short.request).contains("for 80 positions"));
    }

    #[test]
    fn too_small_a_budget_names_the_numbers_and_the_options() {
        let (s, m) = qwen7b();
        let mut w = wants();
        w.residency = Some(Residency::Mmap);
        let e = choose(&s, &m, 3 << 30, &w).unwrap_err();
        assert!(e.contains("needs") && e.contains("usable") && e.contains("--load stream"), "{e}");
        let e = choose(&s, &m, 200 << 20, &wants()).unwrap_err();
        assert!(e.contains("give it more memory"), "{e}");
    }

    #[test]
    fn sizes_parse_with_units() {
        assert_eq!(parse_bytes("6G"), Ok(6 << 30));
        assert_eq!(parse_bytes("512MiB"), Ok(512 << 20));
        assert_eq!(parse_bytes("1.5g"), Ok(3 << 29));
        assert!(parse_bytes("lots").is_err());
        assert!(parse_bytes("0").is_err());
        assert!(parse_bytes("3X").is_err());
    }
}
