//! The planner: peak resident memory predicted from the GGUF header alone, and the configuration
//! (context, KV precision, residency) chosen for a budget.
//!
//! Peak RSS = weights touched through the mapping + KV cache + activation arena + logits +
//! tokenizer heap + fixed process overhead. Each term is an exact formula of the shape except
//! the tokenizer heap and the fixed overhead, whose constants were measured on this runtime
//! (see `crates/cli/tests/plan_vs_rss.rs`, which holds the prediction to ±5% of `VmHWM`).
//!
//! The planner owns none of the runtime's sizes: KV bytes per token and per layer, the block
//! size and the window rule come from `model::kv`, the activation buffers from
//! `model::forward::ScratchSizes`, the session's arrays from `engine::Session::heap_bytes`, the
//! tensor names from `model::names` and the streaming stages from `memory::stages`. What it
//! adds is what the runtime does not allocate itself: pages of the mapping it touches, the
//! tokenizer heap and the process. Cost: a prediction is a few hundred additions; `choose` tries
//! at most a few hundred configurations.

use gguf::GgufFile;
use memory::stages::{self, GROUPS};
pub use memory::{fmt_bytes, parse_bytes};
use model::forward::ScratchSizes;
use model::{kv, names, ContextParams, KvType, ModelConfig};
use serde::Serialize;

const MIB: u64 = 1 << 20;
const PAGE: u64 = 4096;

/// Bytes the process holds before any model: binary text and data, libc, allocator arenas,
/// main stack (measured: `snug --help` peaks at 4.3 MiB; a run adds its arenas' bookkeeping).
pub const FIXED_OVERHEAD: u64 = 6 * MIB;
/// Each worker thread: touched stack plus its allocator arena (measured ≈ 0.3 MiB).
pub const PER_THREAD: u64 = 320 * 1024;
/// Tokenizer heap per vocabulary entry beyond its text: its span in the GGUF metadata's string
/// array (8 bytes) and its type there (4), the tokenizer's own text span (8), index slots
/// (4/3 × 8), attribute (2) and piece offset (4) — 37 bytes; SentencePiece vocabularies add a
/// score in the metadata and in the tokenizer (8), which the header facts do not tell apart, so
/// this covers both (calibration: BENCHMARKS.md, "Planner calibration").
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
pub const STREAM_READAHEAD: u64 = memory::residency::READERS as u64 * 4 * MIB;

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

/// Byte counts read from the GGUF header: the file, its layers, its vocabulary.
#[derive(Clone, Debug, Serialize)]
pub struct ModelFacts {
    pub file_bytes: u64,
    /// Header (metadata + tensor table), read at open.
    pub header_bytes: u64,
    /// `[n_layer]` bytes of each `blk.N.*` tensor group.
    pub layer_bytes: Vec<u64>,
    /// Bytes of the layers' stacked expert tensors (`ffn_*_exps`, part of `layer_bytes`); 0 for a
    /// dense model.
    pub expert_bytes: u64,
    /// `[n_layer]` of those, per layer.
    pub layer_expert_bytes: Vec<u64>,
    /// Most bytes one expert's slot in an expert cache takes (its gate, up and down blocks, each
    /// widened to whole pages); 0 unless every layer is a mixture of experts.
    pub expert_slot_bytes: u64,
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
    /// Heap bytes of the LoRA adapters loaded beside the model (`model::Lora::bytes`); 0
    /// without adapters. Not part of the file: callers that load adapters set it.
    pub adapter_bytes: u64,
    /// A draft model's predicted peak beside this one (its mapped weights, cache and buffers,
    /// [`draft_bytes`]); 0 without. Not part of the file: callers that load one set it.
    pub draft_bytes: u64,
}

impl ModelFacts {
    /// The byte counts of `f`, whose configuration is `c`: tensors of layers past `c.n_layer`
    /// are never read, so they are not counted (nor allocated for: a layer number comes from
    /// the file).
    pub fn from_gguf(f: &GgufFile, c: &ModelConfig) -> ModelFacts {
        let mut layer_bytes: Vec<u64> = vec![0; c.n_layer];
        let mut groups: Vec<[u64; GROUPS]> = vec![[0; GROUPS]; c.n_layer];
        let mut max_row = 0u64;
        let (mut embd_bytes, mut embd_rows, mut other) = (0u64, 1u64, 0u64);
        let mut output_tied = true;
        let mut expert_bytes = 0u64;
        let mut layer_experts: Vec<u64> = vec![0; c.n_layer];
        let mut slot: Vec<u64> = vec![0; c.n_layer];
        let n_expert = c.moe.map_or(1, |m| m.n_expert.max(1)) as u64;
        for t in &f.tensors {
            if let Some((il, suffix)) = names::split_layer(&t.name) {
                if il >= c.n_layer {
                    continue;
                }
                layer_bytes[il] += t.size;
                if names::is_experts(suffix) {
                    expert_bytes += t.size;
                    layer_experts[il] += t.size;
                    // Widened to whole pages: at most a page more than its bytes rounded up.
                    slot[il] += (t.size / n_expert).next_multiple_of(PAGE) + PAGE;
                }
                if let Some(g) = names::stage_group(suffix) {
                    groups[il][g] += t.size;
                    max_row = max_row.max(t.size / t.dims.get(1).copied().unwrap_or(1).max(1));
                }
            } else if t.name == names::TOKEN_EMBD {
                embd_bytes = t.size;
                embd_rows = t.dims.get(1).copied().unwrap_or(1).max(1);
            } else {
                if t.name == names::OUTPUT {
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
            expert_bytes,
            expert_slot_bytes: if c.moe.is_some() && layer_experts.iter().all(|&b| b > 0) {
                slot.iter().copied().max().unwrap_or(0)
            } else {
                0
            },
            layer_expert_bytes: layer_experts,
            biggest_stage: stages::biggest_stage(max_group, max_row),
            embd_bytes,
            embd_row_bytes: embd_bytes / embd_rows,
            output_tied,
            other_bytes: other,
            adapter_bytes: 0,
            draft_bytes: 0,
            n_tokens: toks.len() as u64,
            token_text_bytes: toks.iter().map(|s| s.len() as u64).sum(),
            n_merges: merges.len() as u64,
            merge_text_bytes: merges.iter().map(|s| s.len() as u64).sum(),
        }
    }

    /// Weight bytes one decoded token reads: every tensor but the experts, of those the share a
    /// token uses (`n_expert_used / n_expert`), and of the token embedding one row (all of it
    /// when it is also the output). Decode is bandwidth-bound, so this is what a token costs.
    pub fn bytes_read_per_token(&self, c: &ModelConfig) -> u64 {
        let dense = self.file_bytes.saturating_sub(self.header_bytes + self.expert_bytes);
        let experts = c.moe.map_or(0, |m| {
            (self.expert_bytes as u128 * m.n_expert_used as u128 / m.n_expert.max(1) as u128) as u64
        });
        let embd_unread =
            if self.output_tied { 0 } else { self.embd_bytes.saturating_sub(self.embd_row_bytes) };
        dense.saturating_sub(embd_unread) + experts
    }

    /// Experts of all layers (0 unless every layer is a mixture of experts).
    pub fn n_experts(&self, c: &ModelConfig) -> u64 {
        if self.expert_slot_bytes == 0 {
            return 0;
        }
        c.moe.map_or(0, |moe| (moe.n_expert * c.n_layer) as u64)
    }

    fn layers_total(&self) -> u64 {
        self.layer_bytes.iter().fold(0, |a, &b| a.saturating_add(b))
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
    /// Precision of cached keys and of cached values.
    pub kv_k: KvType,
    pub kv_v: KvType,
    pub n_ubatch: usize,
    pub n_threads: usize,
    /// Sequences held and decoded together (a server's parallel slots; 1 for one conversation).
    /// Each holds up to `n_kv` positions and gets a row of logits a step.
    pub n_seq: usize,
    pub residency: Residency,
    /// Layers kept resident under [`Residency::Stream`] (ignored otherwise).
    pub pinned_layers: usize,
    /// Under [`Residency::Stream`], bytes of an expert cache holding a mixture of experts'
    /// experts apart from their layers (`memory::residency::ExpertCache`); 0: the experts
    /// stay in their layers.
    pub expert_cache: u64,
    /// The KV cache stores only the last `window` positions of sliding-window layers.
    pub kv_windowed: bool,
    /// JSON mode may run (a server): its per-vocabulary table and masked row of logits
    /// (`engine::JsonVocab::heap_bytes`) count, from the first JSON-mode request on.
    pub json_mode: bool,
    /// Drafted tokens a step may verify beside its decode tokens (speculative decoding, at most
    /// `engine::draft::MAX_DRAFT`; 0 without): each is one more row of logits.
    pub draft_tokens: usize,
    /// The prefix cache's disk tier is on (a server): its queue and buffers
    /// (`model::kv::disk::heap_bytes`) count.
    pub prefix_disk: bool,
}

impl Request {
    /// `f16` when keys and values agree, else `keys/values` such as `q8/q4`.
    pub fn kv_label(&self) -> String {
        kv_label(self.kv_k, self.kv_v)
    }

    /// The context sizes the runtime allocates for this configuration: `n_seq` sequences with a
    /// row of logits each and one per drafted token, the KV precisions chosen.
    pub fn context_params(&self, base: ContextParams) -> ContextParams {
        ContextParams {
            n_ctx: self.n_ctx,
            n_ubatch: self.n_ubatch,
            n_threads: self.n_threads,
            n_seq_max: self.n_seq.max(1),
            n_outputs_max: self.n_seq.max(1) + self.draft_tokens,
            kv_k: self.kv_k,
            kv_v: self.kv_v,
            ..base
        }
    }
}

/// `f16` when keys and values agree, else `keys/values` such as `q8/q4`.
pub fn kv_label(k: KvType, v: KvType) -> String {
    if k == v {
        k.to_string()
    } else {
        format!("{k}/{v}")
    }
}

/// Predicted peak resident bytes, by term.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Prediction {
    pub weights: u64,
    pub kv: u64,
    pub arena: u64,
    pub logits: u64,
    pub tokenizer: u64,
    /// LoRA adapters ([`ModelFacts::adapter_bytes`]).
    pub adapters: u64,
    /// A draft model ([`ModelFacts::draft_bytes`]).
    pub draft: u64,
    pub overhead: u64,
    pub total: u64,
}

impl Prediction {
    /// One line per term.
    pub fn breakdown(&self) -> String {
        [
            ("weights resident", self.weights),
            ("KV cache", self.kv),
            ("activations", self.arena),
            ("logits", self.logits),
            ("tokenizer heap", self.tokenizer),
            ("LoRA adapters", self.adapters),
            ("draft model", self.draft),
            ("process", self.overhead),
            ("peak RSS", self.total),
        ]
        .map(|(what, b)| format!("  {what:<16} {:>11}", fmt_bytes(b)))
        .join("\n")
    }
}

/// KV bytes at the peak of `n_ctx` positions held: each layer holds
/// [`kv::layer_peak_positions`] (every position, or with `windowed` a sliding-window layer's
/// window and its edges); quantized keys add each layer's f16 block being filled.
pub fn kv_bytes(
    c: &ModelConfig,
    (k, v): (KvType, KvType),
    n_ctx: usize,
    n_ubatch: usize,
    windowed: bool,
) -> u64 {
    let row = kv::kv_row_bytes(c, k, v) as u64;
    let held: u64 = c
        .layers
        .iter()
        .map(|l| {
            let w = if windowed { l.window } else { None };
            kv::layer_peak_positions(w, n_ctx, n_ubatch) as u64
        })
        .fold(0, u64::saturating_add);
    row.saturating_mul(held).saturating_add(kv::kv_staged_bytes(c, k) as u64)
}

/// Weight bytes resident under `r`: the whole file when every page is read each token (tied
/// output) or prefaulted; otherwise the layers, the other tensors and the embedding rows touched
/// (each with its fault-around neighbourhood). Streaming keeps `pinned` layers plus the
/// readers' window ([`stream_window`]) and the readahead past it ([`STREAM_READAHEAD`]).
pub fn weights_resident(c: &ModelConfig, m: &ModelFacts, r: &Request) -> u64 {
    let embd_touched =
        if m.output_tied || matches!(r.residency, Residency::Populate | Residency::Mlock) {
            m.embd_bytes
        } else {
            let windows = (EMBD_WINDOWS_PER_SQRT_TOKEN * (r.n_ctx as f64).sqrt()).ceil() as u64;
            m.embd_bytes.min(windows.saturating_mul(m.embd_row_bytes.max(FAULT_AROUND)))
        };
    let fixed = m.header_bytes.saturating_add(m.other_bytes).saturating_add(embd_touched);
    match r.residency {
        Residency::Stream => {
            let pinned = r.pinned_layers.min(c.n_layer);
            let streamed = if pinned < c.n_layer {
                stream_window(m).saturating_add(STREAM_READAHEAD.min(biggest_layer(m)))
            } else {
                0
            };
            // With an expert cache a layer is what is left without its experts.
            let apart = |il: usize| {
                if r.expert_cache > 0 {
                    m.layer_expert_bytes.get(il).copied().unwrap_or(0)
                } else {
                    0
                }
            };
            let pinned_bytes = (0..pinned.min(m.layer_bytes.len()))
                .map(|il| m.layer_bytes[il] - apart(il))
                .fold(0u64, u64::saturating_add);
            fixed
                .saturating_add(pinned_bytes)
                .saturating_add(streamed)
                .saturating_add(r.expert_cache)
        }
        _ => fixed.saturating_add(m.layers_total()),
    }
}

/// What an expert cache of `r.expert_cache` bytes is expected to do for a decoded token, when
/// routing is uniform (a synthetic model; real routing is skewed, and hits more): the share of
/// chosen experts it holds (slots over all experts) and the bytes a token then reads from disk
/// (the misses of its `n_expert_used` experts in every layer). `None` without a cache.
pub fn expert_reads(c: &ModelConfig, m: &ModelFacts, r: &Request) -> Option<(f64, u64)> {
    let all = m.n_experts(c);
    if r.expert_cache == 0 || all == 0 || r.residency != Residency::Stream {
        return None;
    }
    let hit = ((r.expert_cache / m.expert_slot_bytes.max(1)) as f64 / all as f64).min(1.0);
    let per_token = c.moe.map_or(0, |moe| {
        (m.expert_bytes as u128 * moe.n_expert_used as u128 / moe.n_expert.max(1) as u128) as u64
    });
    Some((hit, (per_token as f64 * (1.0 - hit)) as u64))
}

/// The smallest expert cache streaming plans for a mixture of experts: two tokens' experts (one
/// computed on, one read), at most every expert; 0 when its experts cannot be kept apart.
pub fn expert_cache_min(c: &ModelConfig, m: &ModelFacts) -> u64 {
    let per_token = c.moe.map_or(0, |moe| moe.n_expert_used as u64);
    (2 * per_token).min(m.n_experts(c)).saturating_mul(m.expert_slot_bytes)
}

/// Most streamed bytes the reader threads hold from the stage computing on: the biggest stage
/// and [`STREAM_LOOKAHEAD`] past it, at most a layer past it on small models.
pub fn stream_window(m: &ModelFacts) -> u64 {
    m.biggest_stage.saturating_add(STREAM_LOOKAHEAD.min(biggest_layer(m)))
}

fn biggest_layer(m: &ModelFacts) -> u64 {
    m.layer_bytes.iter().copied().max().unwrap_or(0)
}

/// The context's buffers as `model::Context` allocates them for `r`.
fn scratch(c: &ModelConfig, r: &Request) -> ScratchSizes {
    // Rows past the longest micro-batch the job can compute are reserved, never touched: a job
    // filling `n_kv` positions never computes more than `n_kv` tokens at once.
    let n_ubatch = r.n_ubatch.clamp(1, r.n_kv.max(1));
    let p = r.context_params(ContextParams::default());
    ScratchSizes::new(c, &ContextParams { n_ubatch, ..p })
}

/// Activation arena of `model::Context` (its [`ScratchSizes`]) plus each sequence's arrays
/// (`engine::Session::heap_bytes`) and, when drafting is on (the default `--draft ngram`), its
/// n-gram index (`engine::draft::Ngram::heap_bytes`), and, when JSON mode may run, its tables
/// (`engine::JsonVocab::heap_bytes`); and the recent sequences kept for prompt reuse by text
/// (`engine::reuse::Recent::heap_bytes`).
pub fn arena_bytes(c: &ModelConfig, r: &Request) -> u64 {
    let mut per_seq = engine::Session::heap_bytes(r.n_ctx, c.n_vocab);
    if r.draft_tokens > 0 {
        per_seq = per_seq.saturating_add(engine::draft::Ngram::heap_bytes(r.n_ctx));
    }
    let sessions = r.n_seq.max(1).saturating_mul(per_seq);
    let json = if r.json_mode { engine::JsonVocab::heap_bytes(c.n_vocab) } else { 0 };
    let disk = if r.prefix_disk { prefix_disk_bytes(c, r) } else { 0 };
    let recent = engine::reuse::Recent::heap_bytes(r.n_ctx);
    let heap = sessions.saturating_add(json).saturating_add(disk).saturating_add(recent);
    scratch(c, r).activation_bytes().saturating_add(heap) as u64
}

/// The prefix cache's disk tier's queue and buffers (`model::kv::disk::heap_bytes`) for
/// blocks of `r`'s KV precisions.
pub fn prefix_disk_bytes(c: &ModelConfig, r: &Request) -> usize {
    let block = model::kv::BLOCK_TOKENS * model::kv::kv_bytes_per_token(c, r.kv_k, r.kv_v);
    model::kv::disk::heap_bytes(block)
}

/// Heap held by the tokenizer and the parsed GGUF metadata after `Tokenizer::from_gguf`
/// (calibration: BENCHMARKS.md, "Planner calibration").
pub fn tokenizer_bytes(m: &ModelFacts) -> u64 {
    [
        m.n_tokens.saturating_mul(TOK_PER_TOKEN),
        m.token_text_bytes.saturating_mul(TOK_PER_TEXT_BYTE),
        m.n_merges.saturating_mul(TOK_PER_MERGE),
    ]
    .into_iter()
    .fold(m.merge_text_bytes, u64::saturating_add)
}

pub fn predict(c: &ModelConfig, m: &ModelFacts, r: &Request) -> Prediction {
    let weights = weights_resident(c, m, r);
    let kv = (r.n_seq.max(1) as u64).saturating_mul(kv_bytes(
        c,
        (r.kv_k, r.kv_v),
        r.n_kv.min(r.n_ctx),
        r.n_ubatch,
        r.kv_windowed,
    ));
    let arena = arena_bytes(c, r);
    let logits = scratch(c, r).logits_bytes() as u64;
    let tokenizer = tokenizer_bytes(m);
    let overhead = FIXED_OVERHEAD.saturating_add(PER_THREAD.saturating_mul(r.n_threads as u64));
    Prediction {
        weights,
        kv,
        arena,
        logits,
        tokenizer,
        adapters: m.adapter_bytes,
        draft: m.draft_bytes,
        overhead,
        total: [kv, arena, logits, tokenizer, m.adapter_bytes, m.draft_bytes, overhead]
            .into_iter()
            .fold(weights, u64::saturating_add),
    }
}

/// What a draft model (configuration `c`, file facts `m`) costs beside the model at its peak:
/// its weights as mapped, its f16 KV cache for `n_ctx` positions of one sequence, its buffers
/// and one row of logits. The tokenizer and the process are the model's, counted once.
pub fn draft_bytes(
    c: &ModelConfig,
    m: &ModelFacts,
    n_ctx: usize,
    n_ubatch: usize,
    n_threads: usize,
) -> u64 {
    let r = Request {
        n_ctx,
        n_kv: n_ctx,
        kv_k: KvType::F16,
        kv_v: KvType::F16,
        n_ubatch,
        n_threads,
        n_seq: 1,
        residency: Residency::Mmap,
        pinned_layers: c.n_layer,
        expert_cache: 0,
        kv_windowed: true,
        json_mode: false,
        draft_tokens: 0,
        prefix_disk: false,
    };
    let p = predict(c, &ModelFacts { adapter_bytes: 0, draft_bytes: 0, ..m.clone() }, &r);
    p.total.saturating_sub(p.tokenizer).saturating_sub(p.overhead)
}

/// Bytes kept free below the budget: page tables, the page cache of the file header, noise.
pub fn headroom(budget: u64) -> u64 {
    (budget / 32).max(64 * MIB)
}

/// What the caller asked for; `None` fields are chosen.
#[derive(Clone, Debug)]
pub struct Wants {
    pub n_ctx: Option<usize>,
    /// Key and value precisions.
    pub kv: Option<(KvType, KvType)>,
    pub residency: Option<Residency>,
    /// Least context the job needs (prompt + 1).
    pub n_ctx_min: usize,
    /// Positions the job will hold at most (prompt + tokens to generate); `None`: the whole
    /// context (a conversation, or a job whose length is not known).
    pub n_kv: Option<usize>,
    pub n_ubatch: usize,
    pub n_threads: usize,
    /// Sequences held together ([`Request::n_seq`]).
    pub n_seq: usize,
    /// KV precisions the runtime's cache implements.
    pub kv_available: Vec<KvType>,
    pub kv_windowed: bool,
    /// [`Request::json_mode`].
    pub json_mode: bool,
    /// [`Request::draft_tokens`].
    pub draft_tokens: usize,
    /// [`Request::prefix_disk`].
    pub prefix_disk: bool,
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
/// at the default context with as many layers pinned as fit, in the KV precision that pins the
/// most (a streamed layer costs a disk read every token; a cheaper cache costs little quality).
pub fn choose(
    c: &ModelConfig,
    m: &ModelFacts,
    budget: u64,
    w: &Wants,
) -> Result<Choice, Box<DoesNotFit>> {
    let usable = budget.saturating_sub(headroom(budget));
    let default_ctx = c.default_n_ctx(w.n_ctx_min);
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
    let kvs: Vec<(KvType, KvType)> = match w.kv {
        Some(k) => vec![k],
        // q4 keys break Qwen models (BASELINES.md): never chosen unasked.
        None => {
            w.kv_available.iter().copied().filter(|&k| k != KvType::Q4).map(|k| (k, k)).collect()
        }
    };
    let req = |n_ctx: usize, (kv_k, kv_v): (KvType, KvType), residency, pinned| Request {
        n_ctx,
        n_kv: w.n_kv.map_or(n_ctx, |n| n.clamp(1, n_ctx.max(1))),
        kv_k,
        kv_v,
        n_ubatch: w.n_ubatch,
        n_threads: w.n_threads,
        n_seq: w.n_seq.max(1),
        residency,
        pinned_layers: pinned,
        expert_cache: 0,
        kv_windowed: w.kv_windowed,
        json_mode: w.json_mode,
        draft_tokens: w.draft_tokens,
        prefix_disk: w.prefix_disk,
    };
    let whole = match w.residency {
        Some(Residency::Stream) => vec![],
        Some(r) => vec![r],
        None => vec![Residency::Mmap],
    };
    for &r in &whole {
        for &n_ctx in &ctxs {
            for &kv in &kvs {
                let rq = req(n_ctx, kv, r, c.n_layer);
                let p = predict(c, m, &rq);
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
    // Streaming a mixture of experts keeps its experts in a cache of their own, at least two
    // tokens' worth; whatever room is left once every layer's attention is pinned goes to it.
    let cache_min = expert_cache_min(c, m);
    let stream = |n_ctx: usize, kv, pinned| Request {
        expert_cache: cache_min,
        ..req(n_ctx, kv, Residency::Stream, pinned)
    };
    if matches!(w.residency, None | Some(Residency::Stream)) {
        for &n_ctx in &ctxs {
            // Most layers pinned such that the rest streams within the budget, per precision.
            // Each pinned layer adds its bytes, so the peak grows with the pinned count: a
            // binary search over it (O(layers · log layers); a linear one was quadratic).
            let pinned = |kv| {
                let fits = |k: &usize| predict(c, m, &stream(n_ctx, kv, *k)).total <= usable;
                // All of them only when the experts are apart (else that is the whole model).
                let layers: Vec<usize> = (0..=c.n_layer).collect();
                layers.partition_point(fits).checked_sub(1)
            };
            // A streamed layer is read from disk every token, over ten times slower than memory:
            // the precision that keeps the most layers pinned wins; the finer one on a tie.
            let mut best: Option<(usize, (KvType, KvType))> = None;
            for &kv in &kvs {
                if let Some(k) = pinned(kv) {
                    if best.is_none_or(|(b, _)| k > b) {
                        best = Some((k, kv));
                    }
                }
            }
            if let Some((k, kv)) = best {
                let mut rq = stream(n_ctx, kv, k);
                if cache_min > 0 && k == c.n_layer {
                    let slot = m.expert_slot_bytes;
                    let room = usable.saturating_sub(predict(c, m, &rq).total);
                    let all = slot.saturating_mul(m.n_experts(c));
                    rq.expert_cache =
                        cache_min.saturating_add(room / slot * slot).min(all).max(cache_min);
                }
                let p = predict(c, m, &rq);
                let full = predict(c, m, &req(n_ctx, kv, Residency::Mmap, c.n_layer)).total;
                let finer = kvs.first().filter(|&&f| f != kv).and_then(|&f| Some((f, pinned(f)?)));
                let trade = match finer {
                    Some((f, fk)) => format!(
                        "; KV {} pins {} more than {} would ({fk})",
                        rq.kv_label(),
                        k - fk,
                        kv_label(f.0, f.1)
                    ),
                    None => String::new(),
                };
                let experts = if rq.expert_cache > 0 {
                    format!(
                        "; experts apart from their layers: {} of {} cached in {}",
                        rq.expert_cache / m.expert_slot_bytes,
                        m.n_experts(c),
                        fmt_bytes(rq.expert_cache)
                    )
                } else {
                    String::new()
                };
                let layers = if k == c.n_layer {
                    format!("all {k} layers pinned")
                } else {
                    format!("{k} of {} layers pinned, the rest streamed", c.n_layer)
                };
                let reason = format!(
                    "the whole model needs {} but {} is usable: {layers} ({} peak){experts}{trade}",
                    fmt_bytes(full),
                    fmt_bytes(usable),
                    fmt_bytes(p.total)
                );
                return Ok(Choice { request: rq, prediction: p, budget, reason });
            }
        }
    }
    // Nothing fits: say by how much, and what would.
    let n_ctx = ctxs[0];
    let kv = kvs.first().copied().unwrap_or((KvType::F16, KvType::F16));
    let r = w.residency.unwrap_or(Residency::Mmap);
    let request = req(n_ctx, kv, r, 0);
    let mut alternatives = Vec::new();
    let smaller_ctx = [n_ctx / 2, n_ctx / 4, 2048, 512]
        .into_iter()
        .filter(|&n| n >= w.n_ctx_min.max(1) && n < n_ctx)
        .map(|n| (n, predict(c, m, &req(n, kv, r, 0)).total))
        .find(|&(_, t)| t <= usable);
    alternatives.extend(smaller_ctx.map(|(n, t)| Alternative::Context(n, t)));
    let cheaper_kv = [KvType::Q8, KvType::Q4]
        .into_iter()
        .filter(|&k| (k, k) != kv && w.kv_available.contains(&k))
        .map(|k| (k, predict(c, m, &req(n_ctx, (k, k), r, 0)).total))
        .find(|&(_, t)| t <= usable);
    alternatives.extend(cheaper_kv.map(|(k, t)| Alternative::Kv(k, t)));
    if r != Residency::Stream {
        let t = predict(c, m, &stream(n_ctx, kv, 0)).total;
        if t <= usable {
            alternatives.push(Alternative::Stream(t));
        }
    }
    Err(Box::new(DoesNotFit {
        request,
        prediction: predict(c, m, &request),
        usable,
        budget,
        alternatives,
    }))
}

/// A configuration that fits where the one asked for does not, with its predicted peak.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase", tag = "change", content = "to")]
pub enum Alternative {
    /// A shorter context.
    Context(usize, u64),
    /// Cheaper KV precision (keys and values).
    Kv(KvType, u64),
    /// Streaming layers (the peak with none pinned).
    Stream(u64),
}

/// Nothing fits the budget: the configuration asked for, what it needs, what is usable, and
/// the alternatives that would fit. `Display` words it for the command line (flags); other
/// front ends word the fields for themselves.
#[derive(Clone, Debug, Serialize)]
pub struct DoesNotFit {
    pub request: Request,
    pub prediction: Prediction,
    pub usable: u64,
    pub budget: u64,
    pub alternatives: Vec<Alternative>,
}

impl DoesNotFit {
    /// What does not fit, with the numbers (`ctx 4096, KV f16, mmap needs 7.1 GiB (weights …)
    /// but only 5.2 GiB is usable (6.0 GiB budget)`); the alternatives are for the caller to word
    /// in its own options.
    pub fn facts(&self) -> String {
        let p = &self.prediction;
        format!(
            "{} needs {} (weights {}, KV cache {}, activations {}, tokenizer {}, process {}) but \
             only {} is usable ({} budget)",
            describe(&self.request),
            fmt_bytes(p.total),
            fmt_bytes(p.weights),
            fmt_bytes(p.kv),
            fmt_bytes(p.arena + p.logits),
            fmt_bytes(p.tokenizer),
            fmt_bytes(p.overhead),
            fmt_bytes(self.usable),
            fmt_bytes(self.budget),
        )
    }

    /// What to do: `try A, or B` with each alternative in `word`s (the caller names its own
    /// options), or `none` when no smaller configuration fits.
    pub fn advice(&self, word: impl Fn(Alternative) -> String, none: &str) -> String {
        if self.alternatives.is_empty() {
            return format!("no smaller configuration fits: {none}");
        }
        let options: Vec<String> = self.alternatives.iter().map(|&a| word(a)).collect();
        format!("try {}", options.join(", or "))
    }
}

impl std::fmt::Display for DoesNotFit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let word = |a| match a {
            Alternative::Context(n, t) => format!("a context of {n} ({})", fmt_bytes(t)),
            Alternative::Kv(k, t) => format!("KV {k} ({})", fmt_bytes(t)),
            Alternative::Stream(t) => {
                format!("streaming layers ({} with no layer pinned)", fmt_bytes(t))
            }
        };
        let advice = self.advice(word, "give it more memory or use a smaller model");
        write!(f, "{}; {advice}", self.facts())
    }
}

impl std::error::Error for DoesNotFit {}

/// `ctx 4096, KV f16, mmap` (a job needing fewer positions than the context says how many;
/// streaming adds the pinned count).
pub fn describe(r: &Request) -> String {
    let used = if r.n_kv < r.n_ctx { format!(" for {} positions", r.n_kv) } else { String::new() };
    let kv = format!("ctx {}, KV {}{used}", r.n_ctx, r.kv_label());
    match r.residency {
        Residency::Stream => format!("{kv}, stream ({} layers pinned)", r.pinned_layers),
        m => format!("{kv}, {}", m.name()),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Qwen2.5-7B Q4_K_M as the planner sees it (shared with the pressure tests).
    pub(crate) fn qwen7b() -> (ModelConfig, ModelFacts) {
        let arch = model::Arch::Qwen2;
        let layer = model::config::LayerAttn {
            window: None,
            rope_base: 1e6,
            rope_freq_scale: 1.0,
            rope: true,
        };
        let c = ModelConfig {
            arch,
            spec: arch.spec(),
            name: "qwen2.5-7b".into(),
            n_vocab: 152064,
            n_embd: 3584,
            n_layer: 28,
            n_head: 28,
            n_head_kv: 4,
            head_dim: 128,
            head_dim_v: 128,
            n_ff: 18944,
            n_rot: 128,
            n_ctx_train: 32768,
            rms_eps: 1e-6,
            attn_scale: 1.0 / 128f32.sqrt(),
            attn_softcap: None,
            final_softcap: None,
            embd_scale: 1.0,
            rope_attn_factor: 1.0,
            n_ctx_orig: 32768,
            layers: vec![layer; 28],
            moe: None,
            pooling: None,
        };
        let m = ModelFacts {
            file_bytes: 4_682_436_000,
            header_bytes: 6 << 20,
            layer_bytes: vec![140_000_000; 28],
            expert_bytes: 0,
            layer_expert_bytes: vec![0; 28],
            expert_slot_bytes: 0,
            biggest_stage: 15_400_000,
            embd_bytes: 306_000_000,
            embd_row_bytes: 2016,
            output_tied: false,
            other_bytes: 446_000_000,
            n_tokens: 151936,
            token_text_bytes: 1_000_000,
            n_merges: 151387,
            merge_text_bytes: 1_500_000,
            adapter_bytes: 0,
            draft_bytes: 0,
        };
        (c, m)
    }

    #[test]
    fn a_mixture_too_big_for_the_budget_pins_every_layer_and_caches_experts_in_the_rest() {
        let (mut c, mut m) = qwen7b();
        c.moe = Some(model::config::MoeConfig {
            n_expert: 64,
            n_expert_used: 4,
            n_ff_exp: 768,
            gating: model::arch::Gating::Softmax,
            norm_weights: true,
            weights_scale: 1.0,
            n_ff_shexp: 0,
        });
        // Each layer: 20 MB of attention and router, 64 experts of 2 MB.
        m.layer_expert_bytes = vec![128 << 20; 28];
        m.layer_bytes = vec![(20 << 20) + (128 << 20); 28];
        m.expert_bytes = 28 * (128 << 20);
        m.expert_slot_bytes = (2 << 20) + 3 * 4096;
        let budget = 3u64 << 30;
        let ch = choose(&c, &m, budget, &wants()).expect("fits by streaming");
        let r = ch.request;
        assert_eq!((r.residency, r.pinned_layers), (Residency::Stream, 28), "{}", ch.reason);
        assert!(r.expert_cache > expert_cache_min(&c, &m), "the rest of the room holds experts");
        assert_eq!(r.expert_cache % m.expert_slot_bytes, 0, "whole slots");
        let usable = budget - headroom(budget);
        assert!(ch.prediction.total <= usable);
        assert!(ch.prediction.total + m.expert_slot_bytes > usable, "no slot left unused");
        let (hit, disk) = expert_reads(&c, &m, &r).expect("a cache");
        let slots = r.expert_cache / m.expert_slot_bytes;
        assert!((hit - slots as f64 / (28.0 * 64.0)).abs() < 1e-9);
        assert!(disk < m.expert_bytes * 4 / 64 && disk > 0);
        // The same model without its experts apart (a dense model's facts) streams layers.
        m.expert_slot_bytes = 0;
        let dense = choose(&c, &m, budget, &wants()).expect("fits by streaming");
        assert_eq!(dense.request.expert_cache, 0);
        assert!(dense.request.pinned_layers < 28);
    }

    #[test]
    fn a_token_of_a_mixture_of_experts_reads_its_share_of_the_experts() {
        let (mut c, mut m) = qwen7b();
        let dense = m.bytes_read_per_token(&c);
        assert_eq!(dense, m.file_bytes - m.header_bytes - (m.embd_bytes - m.embd_row_bytes));
        m.expert_bytes = 1 << 30;
        c.moe = Some(model::config::MoeConfig {
            n_expert: 128,
            n_expert_used: 8,
            n_ff_exp: 768,
            gating: model::arch::Gating::Softmax,
            norm_weights: true,
            weights_scale: 1.0,
            n_ff_shexp: 0,
        });
        assert_eq!(m.bytes_read_per_token(&c), dense - (1 << 30) + (1 << 26));
    }

    #[test]
    fn kv_bytes_are_the_caches_own_rows_times_the_positions_each_layer_holds() {
        let (c, _) = qwen7b();
        let q4 = (KvType::Q4, KvType::Q4);
        let row = kv::kv_row_bytes(&c, KvType::Q4, KvType::Q4) as u64;
        let staged = kv::kv_staged_bytes(&c, KvType::Q4) as u64;
        assert!(staged > 0, "q4 keys stage the block being filled in f16");
        assert_eq!(kv_bytes(&c, q4, 4096, 512, false), 28 * 4096 * row + staged);
        // A job of 80 positions holds three whole blocks per layer.
        assert_eq!(kv_bytes(&c, q4, 80, 512, false), 28 * 96 * row + staged);
    }

    #[test]
    fn sliding_windows_cap_local_layers() {
        let (mut c, _) = qwen7b();
        for (il, l) in c.layers.iter_mut().enumerate() {
            l.window = if il % 6 == 5 { None } else { Some(512) };
        }
        let f16 = (KvType::F16, KvType::F16);
        let full = kv_bytes(&c, f16, 4096, 512, false);
        let win = kv_bytes(&c, f16, 4096, 512, true);
        let row = 2 * 512 * 2;
        assert_eq!(full, row * 28 * 4096);
        // A local layer: window 512 + 16 kept for a draft's rollback + ubatch 512 + an edge block
        // of 32 = 1072 positions, in 34 whole blocks.
        assert_eq!(win, row * (4 * 4096 + 24 * 1088));
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
            n_seq: 1,
            kv_available: vec![KvType::F16],
            kv_windowed: false,
            json_mode: false,
            draft_tokens: 0,
            prefix_disk: false,
        }
    }

    /// A server's plan counts JSON mode's tables, from their owner's formula, and nothing else.
    #[test]
    fn a_server_plan_counts_json_modes_tables() {
        let (c, m) = qwen7b();
        let run = choose(&c, &m, 6 << 30, &wants()).unwrap().request;
        let serve = Request { json_mode: true, ..run };
        let (a, b) = (predict(&c, &m, &run), predict(&c, &m, &serve));
        let json = engine::JsonVocab::heap_bytes(c.n_vocab) as u64;
        assert_eq!(b.arena - a.arena, json);
        assert_eq!(b.total - a.total, json);
        assert!(json > 1 << 20, "{json}: a 152 k vocabulary's table and row exceed 1 MiB");
    }

    /// Drafting (the default `--draft ngram`) counts each sequence's n-gram index, from its
    /// owner's formula, beside the extra output rows the guesses take.
    #[test]
    fn a_drafting_plan_counts_each_sequences_ngram_index() {
        let (c, m) = qwen7b();
        let run = choose(&c, &m, 6 << 30, &wants()).unwrap().request;
        let four = Request { n_seq: 4, ..run };
        let drafting = Request { draft_tokens: 8, ..four };
        let rows =
            scratch(&c, &drafting).activation_bytes() - scratch(&c, &four).activation_bytes();
        let index = 4 * engine::draft::Ngram::heap_bytes(four.n_ctx) as u64;
        assert_eq!(arena_bytes(&c, &drafting) - arena_bytes(&c, &four), index + rows as u64);
        assert!(index > 4 * (four.n_ctx as u64) * 4 * 16, "{index}: four maps of an entry a token");
    }

    #[test]
    fn six_gib_runs_the_7b_from_the_mapping() {
        let (c, m) = qwen7b();
        let c = choose(&c, &m, 6 << 30, &wants()).unwrap();
        assert_eq!(c.request.residency, Residency::Mmap);
        assert_eq!(c.request.n_ctx, 4096);
    }

    #[test]
    fn three_gib_streams_with_layers_pinned_within_budget() {
        let (c, m) = qwen7b();
        let c = choose(&c, &m, 3 << 30, &wants()).unwrap();
        assert_eq!(c.request.residency, Residency::Stream);
        assert!(c.request.pinned_layers > 0 && c.request.pinned_layers < 28);
        assert!(c.prediction.total <= 3 << 30);
    }

    #[test]
    fn when_layers_must_stream_the_kv_precision_that_pins_the_most_wins() {
        let (c, m) = qwen7b();
        let f16_only = choose(&c, &m, 3 << 30, &wants()).unwrap();
        let mut w = wants();
        w.kv_available = KvType::ALL.to_vec();
        let any = choose(&c, &m, 3 << 30, &w).unwrap();
        assert_eq!(any.request.residency, Residency::Stream);
        assert_eq!((any.request.kv_k, any.request.kv_v), (KvType::Q8, KvType::Q8));
        assert!(any.request.pinned_layers > f16_only.request.pinned_layers);
        assert!(
            any.reason.contains("KV q8 pins") && any.reason.contains("than f16"),
            "{}",
            any.reason
        );
        // q4 is never chosen unasked, and a budget where the model is mapped whole keeps f16.
        let whole = choose(&c, &m, 6 << 30, &w).unwrap();
        assert_eq!((whole.request.kv_k, whole.request.residency), (KvType::F16, Residency::Mmap));
    }

    /// Fuzz findings (fuzz/findings/planner): sizes past any machine saturate instead of
    /// wrapping, a zero context with a job length does not panic, and the pinned-layer search
    /// is logarithmic in the layer count.
    #[test]
    fn absurd_shapes_and_requests_give_huge_predictions_not_panics() {
        let (mut c, m) = qwen7b();
        let mut w = wants();
        w.n_ctx = Some(usize::MAX / 2);
        w.n_ubatch = usize::MAX;
        w.n_seq = usize::MAX;
        let e = choose(&c, &m, 6 << 30, &w).unwrap_err();
        assert_eq!(e.prediction.kv, u64::MAX);
        assert_eq!(e.prediction.total, u64::MAX);
        let mut w = wants();
        w.n_ctx = Some(0);
        w.n_kv = Some(5);
        let _ = choose(&c, &m, 6 << 30, &w);
        c.n_layer = 4096;
        c.layers = vec![c.layers[0]; 4096];
        let mut m = m;
        m.layer_bytes = vec![1_000_000; 4096];
        let mut w = wants();
        w.n_kv = Some(64);
        let budget = 3 << 30;
        let ch = choose(&c, &m, budget, &w).unwrap();
        assert_eq!(ch.request.residency, Residency::Stream);
        let k = ch.request.pinned_layers;
        assert!(k > 0 && k < 4096);
        // The binary search finds the most layers that fit, as a linear one would.
        let usable = budget - headroom(budget);
        let one_more = Request { pinned_layers: k + 1, ..ch.request };
        assert!(ch.prediction.total <= usable && predict(&c, &m, &one_more).total > usable);
    }

    #[test]
    fn a_short_job_pins_more_layers_and_predicts_only_the_kv_it_fills() {
        let (c, m) = qwen7b();
        let full = choose(&c, &m, 3 << 30, &wants()).unwrap();
        let mut w = wants();
        w.n_kv = Some(80);
        let short = choose(&c, &m, 3 << 30, &w).unwrap();
        assert_eq!((short.request.n_ctx, short.request.n_kv), (4096, 80));
        assert!(short.request.pinned_layers > full.request.pinned_layers);
        assert_eq!(
            short.prediction.kv,
            kv::kv_bytes_per_token(&c, KvType::F16, KvType::F16) as u64 * 96
        );
        assert!(short.prediction.total <= 3 << 30);
        assert!(describe(&short.request).contains("for 80 positions"));
    }

    #[test]
    fn too_small_a_budget_names_the_numbers_and_the_options() {
        let (c, m) = qwen7b();
        let mut w = wants();
        w.residency = Some(Residency::Mmap);
        let e = choose(&c, &m, 3 << 30, &w).unwrap_err().to_string();
        assert!(
            e.contains("needs") && e.contains("usable") && e.contains("streaming layers"),
            "{e}"
        );
        let e = choose(&c, &m, 200 << 20, &wants()).unwrap_err();
        assert!(e.alternatives.is_empty() && e.prediction.total > e.usable, "{e:?}");
        let e = e.to_string();
        assert!(e.contains("give it more memory"), "{e}");
    }
}
