//! The runtime as a library, end to end on the tiny seeded models: a plan's context is what the
//! planner chose, its KV prediction is what the real cache holds after filling those positions
//! (an upper bound where sliding windows free blocks),
//! parallel sequences cost their KV each, and what cannot run is a typed error with the numbers.

use std::path::PathBuf;

use model::{Batch, Context, KvType};
use runtime::{plan_context, Loaded, MemOptions, RunOptions, RuntimeError};

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
