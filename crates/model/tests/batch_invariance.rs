//! A token's result does not depend on what shares its batch, on a real model whose Q4_K and
//! Q6_K matrices take the prefill panels where the CPU has them (AVX-512 VNNI; the panels give
//! the row kernels' bits): the last prompt token's logits are bit-identical whether the prompt
//! runs alone in one batch, in micro-batches that are no multiple of a block, in chunks aligned
//! to KV blocks or not (5, 17 tokens: a speculative verification's size), token by token at
//! the end (one-token decode, on the row kernels), or beside another sequence's prompt and a
//! decode token.

use std::sync::Arc;

use model::{Batch, Context, ContextParams, Model, SeqId};

fn model() -> Arc<Model> {
    let path = hub::model_path("qwen2.5-coder-0.5b");
    assert!(path.is_file(), "{} is missing: run `snug pull qwen2.5-coder-0.5b`", path.display());
    Arc::new(Model::load(&path).unwrap())
}

fn context(m: &Arc<Model>, n_ubatch: usize) -> Context {
    let params = ContextParams {
        n_ctx: 512,
        n_ubatch,
        n_outputs_max: 8,
        n_seq_max: 2,
        n_threads: 2,
        ..ContextParams::default()
    };
    Context::new(Arc::clone(m), params)
}

/// A deterministic prompt of `n` tokens.
fn prompt(n: usize, salt: u64) -> Vec<u32> {
    (0..n as u64).map(|i| ((i * 2654435761 + salt) % 30000 + 100) as u32).collect()
}

/// Pushes `toks` of sequence `seq` at positions `start..`, asking for the last one's logits.
fn push(b: &mut Batch, seq: SeqId, start: usize, toks: &[u32], want_last: bool) {
    for (i, &t) in toks.iter().enumerate() {
        b.push(t, start + i, seq, want_last && i + 1 == toks.len());
    }
}

/// Sequence 0's prompt in chunks of the given sizes; the last chunk's last logits.
fn chunked(ctx: &mut Context, toks: &[u32], chunks: &[usize]) -> Vec<f32> {
    let mut b = Batch::default();
    let mut at = 0;
    for &n in chunks {
        b.clear();
        push(&mut b, 0, at, &toks[at..at + n], at + n == toks.len());
        ctx.decode(&b).unwrap();
        at += n;
    }
    assert_eq!(at, toks.len());
    ctx.logits(0).to_vec()
}

/// `got` is bit-identical to `want`; otherwise names the first differing logit.
fn same(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: logits rows differ in length");
    if let Some(i) = (0..got.len()).find(|&i| got[i].to_bits() != want[i].to_bits()) {
        panic!("{what}: logit {i} is {} where the prompt alone gives {}", got[i], want[i]);
    }
}

#[test]
fn a_prompt_token_gets_the_same_logits_in_any_batch() {
    let m = model();
    let toks = prompt(150, 7);
    let alone = chunked(&mut context(&m, 512), &toks, &[150]);
    // Micro-batches of 40 tokens, which cut KV blocks.
    same(&chunked(&mut context(&m, 40), &toks, &[150]), &alone, "n_ubatch 40");
    // Chunks that end on block boundaries, as the scheduler cuts them.
    same(&chunked(&mut context(&m, 512), &toks, &[64, 32, 54]), &alone, "aligned chunks");
    // Chunks that cut blocks anywhere, a 5-token and a 17-token one among them.
    let unaligned = [5, 17, 3, 45, 8, 40, 32];
    same(&chunked(&mut context(&m, 512), &toks, &unaligned), &alone, "unaligned chunks");
    // The prompt's last tokens one at a time, as decode steps run them.
    let tail = [141, 5, 1, 1, 1, 1];
    same(&chunked(&mut context(&m, 512), &toks, &tail), &alone, "one-token steps");
    // Beside a decode token of another sequence and that sequence's own prompt.
    let mut ctx = context(&m, 512);
    let other = prompt(70, 11);
    let mut b = Batch::default();
    push(&mut b, 1, 0, &other[..69], false);
    ctx.decode(&b).unwrap();
    b.clear();
    push(&mut b, 1, 69, &other[69..], true);
    push(&mut b, 0, 0, &toks, true);
    ctx.decode(&b).unwrap();
    same(ctx.logits(1), &alone, "beside another sequence");
}
