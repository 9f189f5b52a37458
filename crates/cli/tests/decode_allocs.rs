//! A decoded token allocates nothing: `Context::decode` of a one-token batch plus
//! `Sampler::sample` run under a counting global allocator after warm-up.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use engine::{Sampler, SamplerParams};
use model::{Batch, Context, ContextParams, Model};

struct Counting;

static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards every call to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: same contract as ours.
        unsafe { System.alloc(l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: same contract as ours.
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: same contract as ours.
        unsafe { System.realloc(p, l, n) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(p, l) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn model(alias: &str) -> Arc<Model> {
    Arc::new(Model::load(common::model(alias)).expect("model loads"))
}

fn decode_allocations(alias: &str, n_threads: usize) {
    let model = model(alias);
    let params = ContextParams {
        n_ctx: 256,
        n_ubatch: 64,
        n_outputs_max: 1,
        n_seq_max: 1,
        n_threads,
        ..ContextParams::default()
    };
    let mut ctx = Context::new(Arc::clone(&model), params);
    let mut sampler = Sampler::new(
        SamplerParams {
            seed: 7,
            ..SamplerParams::default()
        },
        model.config.n_vocab,
    );
    let mut batch = Batch::default();
    // Prompt of 8 tokens, then warm-up decode steps (first use of every buffer and KV block).
    for (i, t) in [1u32, 100, 200, 300, 400, 500, 600, 700].iter().enumerate() {
        batch.push(*t, i, 0, i == 7);
    }
    ctx.decode(&batch).expect("prefill");
    let mut tok = sampler.sample(ctx.logits(0));
    let mut pos = 8;
    let step = |ctx: &mut Context,
                    sampler: &mut Sampler,
                    batch: &mut Batch,
                    tok: &mut u32,
                    pos: &mut usize| {
        batch.clear();
        batch.push(*tok, *pos, 0, true);
        ctx.decode(batch).expect("decode");
        sampler.accept(*tok);
        *tok = sampler.sample(ctx.logits(0));
        *pos += 1;
    };
    for _ in 0..4 {
        step(&mut ctx, &mut sampler, &mut batch, &mut tok, &mut pos);
    }
    ALLOCS.store(0, Ordering::Relaxed);
    COUNTING.store(true, Ordering::Relaxed);
    for _ in 0..24 {
        step(&mut ctx, &mut sampler, &mut batch, &mut tok, &mut pos);
    }
    COUNTING.store(false, Ordering::Relaxed);
    let n = ALLOCS.load(Ordering::Relaxed);
    assert_eq!(
        n, 0,
        "{alias}: {n} heap allocations in 24 decoded tokens ({n_threads} threads)"
    );
}

/// One test (the counter is process-wide, so models run one after another).
#[test]
fn decoding_a_token_allocates_nothing() {
    decode_allocations("gemma3-270m", 2);
    decode_allocations("qwen2.5-coder-0.5b", 1);
}
