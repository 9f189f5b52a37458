//! Fuzz the memory planner (`runtime::plan`): arbitrary hyper-parameters (through a GGUF header
//! and `ModelConfig::from_gguf`, as a real file gives them), byte counts of the file's parts,
//! requests, wants and budgets through `predict` and `choose`. Nothing may panic or overflow
//! (overflow checks are on), and a configuration `choose` returns must fit its budget.
//!
//! Bounds that real inputs have are kept: the model crate accepts hyper-parameters below 2^31,
//! and byte counts come from a file (each below 2^44 here, 16 TiB). Layers are at most 2^16
//! (a `block_count` near 2^31 is the model crate's to refuse: it allocates a record per layer).

#![no_main]

use gguf::{GgufFile, GgufWriter, Value};
use libfuzzer_sys::{arbitrary, fuzz_target};
use model::{KvType, ModelConfig};
use runtime::plan::{self, ModelFacts, Request, Residency, Wants};

#[derive(arbitrary::Arbitrary, Debug)]
struct Input {
    arch: u8,
    n_embd: u32,
    n_layer: u16,
    n_head: u32,
    n_head_kv: Option<u32>,
    key_length: Option<u32>,
    n_ff: u32,
    n_ctx_train: Option<u64>,
    window: Option<u64>,
    n_vocab: u32,
    facts: Facts,
    request: Req,
    wants: W,
    budget: u64,
}

#[derive(arbitrary::Arbitrary, Debug)]
struct Facts {
    header: u32,
    layer: Vec<u32>,
    scale: u8,
    biggest_stage: u32,
    embd: u32,
    embd_rows: u32,
    output_tied: bool,
    other: u32,
    token_text: u32,
    n_merges: u32,
    merge_text: u32,
}

#[derive(arbitrary::Arbitrary, Debug)]
struct Req {
    n_ctx: u32,
    n_kv: u32,
    kv: (u8, u8),
    n_ubatch: u16,
    n_threads: u8,
    n_seq: u8,
    residency: u8,
    pinned_layers: u16,
    kv_windowed: bool,
    json_mode: bool,
}

#[derive(arbitrary::Arbitrary, Debug)]
struct W {
    n_ctx: Option<u32>,
    kv: Option<(u8, u8)>,
    residency: Option<u8>,
    n_ctx_min: u32,
    n_kv: Option<u32>,
    n_ubatch: u16,
    n_threads: u8,
    n_seq: u8,
    kv_available: Vec<u8>,
    kv_windowed: bool,
    json_mode: bool,
}

const ARCHS: [&str; 5] = ["llama", "qwen2", "gemma2", "gemma3", "phi3"];

fn kv(i: u8) -> KvType {
    [KvType::F16, KvType::Q8, KvType::Q4][i as usize % 3]
}

fn residency(i: u8) -> Residency {
    [Residency::Mmap, Residency::Populate, Residency::Mlock, Residency::Stream][i as usize % 4]
}

/// The GGUF header a converter would write for these hyper-parameters (no tensors, no vocab).
fn config(i: &Input) -> Option<ModelConfig> {
    let arch = ARCHS[i.arch as usize % ARCHS.len()];
    let mut w = GgufWriter::new(Vec::new());
    w.add_kv("general.architecture", Value::String(arch.into()));
    let mut u = |k: &str, v: u64| {
        w.add_kv(format!("{arch}.{k}"), Value::U64(v));
    };
    u("embedding_length", i.n_embd.into());
    u("block_count", i.n_layer.into());
    u("attention.head_count", i.n_head.into());
    u("feed_forward_length", i.n_ff.into());
    u("vocab_size", i.n_vocab.into());
    for (k, v) in [
        ("attention.head_count_kv", i.n_head_kv.map(u64::from)),
        ("attention.key_length", i.key_length.map(u64::from)),
        ("attention.value_length", i.key_length.map(u64::from)),
        ("context_length", i.n_ctx_train),
        ("attention.sliding_window", i.window),
    ] {
        if let Some(v) = v {
            u(k, v);
        }
    }
    let f = GgufFile::from_bytes(w.finish().ok()?).ok()?;
    ModelConfig::from_gguf(&f).ok()
}

fn facts(f: &Facts, n_layer: usize, n_vocab: usize) -> ModelFacts {
    let shift = f.scale % 13; // u32 << 12 at most: below 2^44 bytes
    let b = |x: u32| u64::from(x) << shift;
    let mut layer_bytes: Vec<u64> = f.layer.iter().map(|&x| b(x)).collect();
    layer_bytes.resize(n_layer, layer_bytes.last().copied().unwrap_or(0));
    let embd = b(f.embd);
    let total = b(f.header) + layer_bytes.iter().sum::<u64>() + embd + b(f.other);
    ModelFacts {
        file_bytes: total,
        header_bytes: b(f.header),
        layer_bytes,
        expert_bytes: 0,
        biggest_stage: b(f.biggest_stage),
        embd_bytes: embd,
        embd_row_bytes: embd / u64::from(f.embd_rows.max(1)),
        output_tied: f.output_tied,
        other_bytes: b(f.other),
        n_tokens: n_vocab as u64,
        token_text_bytes: u64::from(f.token_text),
        n_merges: u64::from(f.n_merges),
        merge_text_bytes: u64::from(f.merge_text),
        adapter_bytes: 0,
        draft_bytes: 0,
    }
}

fuzz_target!(|i: Input| {
    let Some(c) = config(&i) else { return };
    let m = facts(&i.facts, c.n_layer, c.n_vocab);
    let r = &i.request;
    let req = Request {
        n_ctx: r.n_ctx as usize,
        n_kv: r.n_kv as usize,
        kv_k: kv(r.kv.0),
        kv_v: kv(r.kv.1),
        n_ubatch: r.n_ubatch as usize,
        n_threads: r.n_threads as usize,
        n_seq: r.n_seq as usize,
        residency: residency(r.residency),
        pinned_layers: r.pinned_layers as usize,
        kv_windowed: r.kv_windowed,
        json_mode: r.json_mode,
        draft_tokens: (r.n_seq % 17) as usize,
        prefix_disk: r.json_mode,
    };
    let p = plan::predict(&c, &m, &req);
    let _ = (p.breakdown(), req.kv_label(), plan::describe(&req));
    let w = &i.wants;
    let wants = Wants {
        n_ctx: w.n_ctx.map(|n| n as usize),
        kv: w.kv.map(|(k, v)| (kv(k), kv(v))),
        residency: w.residency.map(residency),
        n_ctx_min: w.n_ctx_min as usize,
        n_kv: w.n_kv.map(|n| n as usize),
        n_ubatch: w.n_ubatch as usize,
        n_threads: w.n_threads as usize,
        n_seq: w.n_seq as usize,
        kv_available: w.kv_available.iter().map(|&k| kv(k)).collect(),
        kv_windowed: w.kv_windowed,
        json_mode: w.json_mode,
        draft_tokens: (w.n_seq % 17) as usize,
        prefix_disk: w.json_mode,
    };
    if let Ok(choice) = plan::choose(&c, &m, i.budget, &wants) {
        assert!(
            choice.prediction.total <= i.budget,
            "chose {} bytes for a budget of {}",
            choice.prediction.total,
            i.budget
        );
    }
});
