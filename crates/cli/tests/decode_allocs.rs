//! A decoded token allocates nothing: `Context::decode` of a one-token batch plus
//! `Sampler::sample` run under a counting global allocator (`alloc-count`) after warm-up.

mod common;

use std::sync::Arc;

use engine::{Sampler, SamplerParams};
use model::{Batch, Context, ContextParams, Model};

#[global_allocator]
static ALLOC: alloc_count::Counting = alloc_count::Counting;

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
    let mut sampler =
        Sampler::new(SamplerParams { seed: 7, ..SamplerParams::default() }, model.config.n_vocab);
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
    let before = alloc_count::allocations();
    for _ in 0..24 {
        step(&mut ctx, &mut sampler, &mut batch, &mut tok, &mut pos);
    }
    let n = alloc_count::allocations() - before;
    assert_eq!(n, 0, "{alias}: {n} heap allocations in 24 decoded tokens ({n_threads} threads)");
}

/// One test (the counter is process-wide, so models run one after another).
#[test]
fn decoding_a_token_allocates_nothing() {
    decode_allocations("gemma3-270m", 2);
    decode_allocations("qwen2.5-coder-0.5b", 1);
}
