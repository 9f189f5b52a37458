//! LoRA adapters on the tiny seeded qwen2 model: the loader refuses a wrong architecture, shape,
//! name or type with an error naming the tensor (and loads nothing), and a batch mixing
//! sequences on different adapters and on none gives each sequence the very logits it gets
//! alone (issue 15).

mod lora_common;

use std::sync::Arc;

use gguf::GgmlType;
use lora_common::{alone, load, params, tensors, tiny};
use model::{names, Batch, Context, Lora, LoraError, SeqId};

#[test]
fn adapters_of_each_type_and_target_load_with_their_rank_and_size() {
    let m = tiny();
    for ty in [GgmlType::F32, GgmlType::F16, GgmlType::Q8_0] {
        let t = tensors(&m, &[names::ATTN_Q, names::FFN_DOWN], 32, ty, 1);
        let l = load(&m, "qwen2", &t).unwrap_or_else(|e| panic!("{ty}: {e}"));
        assert_eq!(l.n_matrices(), 2 * m.config.n_layer);
        assert_eq!(l.max_rank(), 32);
        let floats: usize = t.iter().map(|t| t.a.len() + t.b.len()).sum();
        assert_eq!(l.bytes(), 4 * floats);
    }
}

#[test]
fn a_bad_adapter_is_refused_with_an_error_naming_the_tensor() {
    let m = tiny();
    let good = tensors(&m, &[names::ATTN_V], 4, GgmlType::F32, 2);
    let a_name = format!("{}.lora_a", good[0].weight);

    let e = load(&m, "llama", &good).unwrap_err();
    assert!(matches!(&e, LoraError::ArchMismatch { adapter, .. } if adapter == "llama"), "{e}");

    // lora_a one column short: the file is consistent, the base model's shape is not.
    let mut short = good.clone();
    short[0].a.truncate(4 * (m.config.n_embd - 32));
    let e = load(&m, "qwen2", &short).unwrap_err();
    assert!(matches!(&e, LoraError::BadShape { name, .. } if *name == a_name), "{e}");
    assert!(e.to_string().contains(&a_name), "{e}");

    let mut renamed = good.clone();
    renamed[0].weight = "blk.0.attn_qq.weight".into();
    let e = load(&m, "qwen2", &renamed).unwrap_err();
    assert!(matches!(&e, LoraError::UnknownTarget(n) if n == "blk.0.attn_qq.weight.lora_a"), "{e}");
    let mut past = good.clone();
    past[0].weight = names::layer_tensor(m.config.n_layer, names::ATTN_V);
    assert!(matches!(load(&m, "qwen2", &past), Err(LoraError::UnknownTarget(_))));

    let mut bf16 = good.clone();
    bf16[0].ty = GgmlType::BF16;
    let e = load(&m, "qwen2", &bf16).unwrap_err();
    assert!(
        matches!(&e, LoraError::BadType { name, ty: GgmlType::BF16 } if *name == a_name),
        "{e}"
    );

    let mut embd = good.clone();
    embd[0].weight = names::TOKEN_EMBD.into();
    assert!(matches!(load(&m, "qwen2", &embd), Err(LoraError::UnsupportedTarget(_))));
}

#[test]
fn a_file_that_is_not_a_lora_adapter_is_refused() {
    let m = tiny();
    let e = Lora::from_gguf(&m.file, &m.config, "base".into()).unwrap_err();
    assert!(matches!(e, LoraError::NotAdapter(ref t) if t.is_empty()), "{e}");
    assert!(matches!(load(&m, "qwen2", &[]), Err(LoraError::Empty)));
}

#[test]
fn a_mixed_batch_gives_every_sequence_the_logits_it_gets_alone() {
    let m = tiny();
    let all = [
        names::ATTN_Q,
        names::ATTN_K,
        names::ATTN_V,
        names::ATTN_OUTPUT,
        names::FFN_GATE,
        names::FFN_UP,
        names::FFN_DOWN,
    ];
    let lora = |sfx: &[&str], rank, ty, seed| {
        Arc::new(load(&m, "qwen2", &tensors(&m, sfx, rank, ty, seed)).expect("load"))
    };
    let (a, b) = (lora(&all, 8, GgmlType::F16, 11), lora(&all[..3], 4, GgmlType::F32, 12));
    let (c, d) = (
        lora(&all[4..], 32, GgmlType::Q8_0, 13),
        lora(&[names::ATTN_OUTPUT], 64, GgmlType::F16, 14),
    );
    let sets: [Vec<(Arc<Lora>, f32)>; 5] =
        [vec![(a.clone(), 1.0)], vec![(b, 0.5)], vec![(c, 1.0), (a, -0.7)], vec![(d, 2.0)], vec![]];
    let n_vocab = m.config.n_vocab as u64;
    let toks: Vec<Vec<u32>> = (0..5u64)
        .map(|s| (0..6 + s).map(|i| ((i * 2654435761 + s * 977) % n_vocab) as u32).collect())
        .collect();
    let want: Vec<_> = sets.iter().zip(&toks).map(|(set, t)| alone(&m, set, t)).collect();
    let bare = alone(&m, &[], &toks[0]);
    assert_ne!(want[0], bare, "the adapter does not change the logits");

    // One context, the five sequences interleaved in every batch, prompts in two steps.
    let mut ctx = Context::new(Arc::clone(&m), params(5));
    for (s, set) in sets.iter().enumerate() {
        ctx.set_adapters(s, set).expect("set adapters");
    }
    let mut got: Vec<Vec<Vec<f32>>> = vec![Vec::new(); 5];
    for (lo, hi) in [(0, 3), (3, usize::MAX)] {
        let mut b = Batch::default();
        let mut rows: Vec<SeqId> = Vec::new();
        for i in lo..hi.min(10) {
            for (s, t) in toks.iter().enumerate() {
                if let Some(&tok) = t.get(i) {
                    b.push(tok, i, s, true);
                    rows.push(s);
                }
            }
        }
        ctx.decode(&b).expect("decode");
        for (r, &s) in rows.iter().enumerate() {
            got[s].push(ctx.logits(r).to_vec());
        }
    }
    for s in 0..5 {
        assert!(got[s] == want[s], "sequence {s}: logits in the mixed batch differ from alone");
    }
}

#[test]
fn an_adapter_at_scale_zero_leaves_the_model_as_it_was() {
    let m = tiny();
    let l =
        Arc::new(load(&m, "qwen2", &tensors(&m, &[names::FFN_UP], 8, GgmlType::F16, 5)).unwrap());
    let toks = [1, 2, 3, 4];
    assert_eq!(alone(&m, &[(l, 0.0)], &toks), alone(&m, &[], &toks));
}
