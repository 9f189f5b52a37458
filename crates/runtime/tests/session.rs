//! The runtime as a library, end to end on the tiny seeded models: a plan's context is what the
//! planner chose, its KV prediction is what the real cache holds after filling those positions
//! (an upper bound where sliding windows free blocks),
//! parallel sequences cost their KV each, and what cannot run is a typed error with the numbers.

use std::path::PathBuf;
use std::sync::atomic::Ordering::Relaxed;

use model::{Batch, Context, KvType};
use runtime::{plan_context, Loaded, MemOptions, Residency, RunOptions, RuntimeError};

fn tiny(arch: &str) -> Loaded {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join(format!("../../testdata/refdata/tiny/tiny-{arch}.gguf"));
    runtime::open(p.to_str().expect("utf-8 path"))
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn opts(ram: u64) -> RunOptions {
    RunOptions {
        n_threads: Some(1),
        mem: MemOptions { ram: Some(ram), residency: None },
        ..RunOptions::default()
    }
}

#[test]
fn the_planned_kv_is_what_the_cache_holds_once_filled() {
    for arch in ["llama", "qwen2", "gemma3"] {
        let m = tiny(arch);
        for kv in [KvType::F16, KvType::Q4] {
            let o = RunOptions { n_ctx: Some(256), kv: Some((kv, kv)), ..opts(1 << 30) };
            let (params, planned) = plan_context(&m.model, &o, 1, Some(64)).expect("fits");
            assert_eq!(params.n_ctx, 256);
            assert_eq!((params.kv_k, params.kv_v), (kv, kv));
            let mut ctx = Context::new(m.model.clone(), params);
            let mut batch = Batch::default();
            for pos in 0..64 {
                batch.push((pos % 7) as u32 + 1, pos, 0, pos == 63);
            }
            ctx.decode(&batch).expect("decodes");
            // The most the cache ever held: blocks in use or freed but kept warm.
            let peak = (ctx.kv.bytes_committed() + ctx.kv.bytes_staged()) as u64;
            let predicted = planned.choice.prediction.kv;
            if m.model.config.layers.iter().all(|l| l.window.is_none()) {
                assert_eq!(predicted, peak, "{arch} {kv}");
            } else {
                // A sliding-window layer is budgeted its window plus a micro-batch and an edge
                // block: an upper bound, never under.
                assert!(peak <= predicted && peak > 0, "{arch} {kv}: {peak} > {predicted}");
            }
        }
    }
}

#[test]
fn parallel_sequences_each_get_their_kv_and_a_logits_row() {
    let m = tiny("qwen2");
    let one = RunOptions { n_ctx: Some(128), ..opts(1 << 30) };
    let four = RunOptions { n_seq: 4, ..one };
    let (_, p1) = plan_context(&m.model, &one, 1, None).expect("fits");
    let (params, p4) = plan_context(&m.model, &four, 1, None).expect("fits");
    assert_eq!((params.n_seq_max, params.n_outputs_max), (4, 4));
    assert_eq!(p4.choice.prediction.kv, 4 * p1.choice.prediction.kv);
    assert!(p4.choice.prediction.logits > p1.choice.prediction.logits);
}

#[test]
fn what_cannot_run_is_a_typed_error_with_the_numbers() {
    let m = tiny("llama");
    let o = RunOptions { n_ctx: Some(64), ..opts(1 << 30) };
    match plan_context(&m.model, &o, 100, None) {
        Err(RuntimeError::PromptTooLong { needed: 100, n_ctx: 64 }) => {}
        other => panic!("expected PromptTooLong, got {:?}", other.map(|_| ())),
    }
    let o = RunOptions { n_ubatch: 0, ..opts(1 << 30) };
    assert!(matches!(plan_context(&m.model, &o, 1, None), Err(RuntimeError::Zero { .. })));
    match plan_context(&m.model, &opts(1 << 20), 1, None) {
        Err(RuntimeError::DoesNotFit { fit, .. }) => {
            assert!(fit.prediction.total > fit.usable, "{fit}");
            assert_eq!(fit.budget, 1 << 20);
            assert!(fit.to_string().contains("usable"), "{fit}");
        }
        other => panic!("expected DoesNotFit, got {:?}", other.map(|_| ())),
    }
}

/// A mixture of experts planned to stream keeps its experts in a cache apart from its layers;
/// a cache too small for them all reads, evicts and reads again, and the logits are those of
/// the experts read through the mapping, bit for bit.
#[test]
fn experts_from_a_cache_too_small_for_them_give_the_mappings_logits() {
    cache_gives_the_mappings_logits("tiny-qwen3moe.gguf");
}

/// The same with a shared expert beside the routed ones (qwen2moe): the stages of a streamed
/// layer hold it while the cache serves the routed experts.
#[test]
fn a_shared_expert_streams_beside_the_expert_cache() {
    cache_gives_the_mappings_logits("tiny-qwen2moe.gguf");
}

fn cache_gives_the_mappings_logits(file: &str) {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/agreement").join(file);
    let m = runtime::open(p.to_str().expect("utf-8 path")).expect("opens");
    let moe = m.model.config.moe.expect("a mixture of experts");
    let tokens: Vec<u32> = (0..48).map(|i| (i * 37 % 200) as u32 + 1).collect();
    let run = |o: &RunOptions| {
        let (params, planned) = plan_context(&m.model, o, 1, Some(57)).expect("fits");
        let mut ctx = Context::new(m.model.clone(), params);
        let residence = planned.attach(&m, &ctx, |_| {}).expect("attaches");
        let mut logits: Vec<f32> = Vec::new();
        // The prompt in micro-batches of 16, then greedy decoding a token at a time.
        let mut pos = 0;
        for chunk in tokens.chunks(16) {
            let mut batch = Batch::default();
            for (j, &t) in chunk.iter().enumerate() {
                batch.push(t, pos + j, 0, j + 1 == chunk.len());
            }
            pos += chunk.len();
            ctx.decode(&batch).expect("decodes");
            logits.extend_from_slice(ctx.logits(0));
        }
        for _ in 0..8 {
            let row = &logits[logits.len() - m.model.config.n_vocab..];
            let next = (0..row.len()).fold(0, |b, i| if row[i] > row[b] { i } else { b });
            let mut batch = Batch::default();
            batch.push(next as u32, pos, 0, true);
            pos += 1;
            ctx.decode(&batch).expect("decodes");
            logits.extend_from_slice(ctx.logits(0));
        }
        let stats = residence.experts().map(|c| {
            let s = c.stats();
            (c.slots(), s.hits.load(Relaxed), s.misses.load(Relaxed))
        });
        (planned.choice.request, logits, stats)
    };
    // The same context and cache precision for both (streaming might otherwise pick another).
    let base =
        RunOptions { n_ctx: Some(128), kv: Some((KvType::F16, KvType::F16)), ..opts(1 << 30) };
    let (plain, want, none) = run(&base);
    assert_eq!(plain.residency, Residency::Mmap);
    assert!(none.is_none(), "no cache when the model fits");
    // Streaming in the least memory it fits: the cache then holds the fewest experts planned.
    let stream = |ram: u64| RunOptions {
        mem: MemOptions { ram: Some(ram), residency: Some(Residency::Stream) },
        ..base
    };
    let (mut lo, mut hi) = (1u64 << 20, 1u64 << 30);
    while hi - lo > 1024 {
        let mid = (lo + hi) / 2;
        if plan_context(&m.model, &stream(mid), 1, Some(57)).is_ok() {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    let (req, got, stats) = run(&stream(hi));
    let all = (moe.n_expert * m.model.config.n_layer) as u64;
    assert!(req.expert_cache > 0 && (stats.expect("a cache").0 as u64) < all, "{req:?}");
    assert_eq!(req.residency, Residency::Stream);
    assert!(req.expert_cache > 0);
    let (slots, hits, misses) = stats.expect("a cache");
    assert!(misses > slots as u64, "{misses} misses for {slots} slots: nothing was evicted");
    assert!(hits > 0);
    assert_eq!((req.n_ctx, req.kv_k), (plain.n_ctx, plain.kv_k));
    let diff = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert!(got.len() == want.len() && diff == 0.0, "the cache's logits differ by {diff}");
}
