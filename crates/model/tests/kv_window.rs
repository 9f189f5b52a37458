//! A long greedy generation with a 512-token window + 4 sinks runs in flat memory: VmRSS at the
//! last token within 2% of VmRSS at token 1,000, and the cache never holds more than the window.
//! Real model (gemma3-270m, whose local layers also keep their own 512 window); fails with the
//! fetch command when it is not downloaded. Length: `SNUG_KV_WINDOW_TOKENS` (default 3,000 to keep test time modest).

use std::sync::Arc;

use model::{Batch, Context, ContextParams, KvType, Model};

fn vm_rss_kib() -> usize {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

#[test]
fn window_512_with_4_sinks_generates_past_the_context_in_flat_memory() {
    let path = hub::model_path("gemma3-270m");
    assert!(
        path.exists(),
        "{} is missing: run `snug pull gemma3-270m` (scripts/test.sh does this)",
        path.display()
    );
    let n: usize =
        std::env::var("SNUG_KV_WINDOW_TOKENS").ok().and_then(|s| s.parse().ok()).unwrap_or(3000);
    let model = Arc::new(Model::load(&path).unwrap());
    let n_vocab = model.config.n_vocab;
    let p = ContextParams {
        n_ctx: 1024,
        n_ubatch: 64,
        n_threads: 2,
        kv_k: KvType::Q8,
        kv_v: KvType::Q8,
        kv_window: Some(512),
        kv_sinks: 4,
        ..ContextParams::default()
    };
    let mut ctx = Context::new(Arc::clone(&model), p);
    let mut b = Batch::default();
    let mut tok = 2u32; // BOS
    let mut recent: Vec<u32> = Vec::new();
    let (mut rss_1000, mut peak_kv) = (0, 0);
    for pos in 0..n {
        b.clear();
        b.push(tok, pos, 0, true);
        ctx.decode(&b).unwrap();
        let l = ctx.logits(0);
        // Greedy, but never one of the last 16 tokens, so the text keeps moving.
        tok = (0..n_vocab)
            .filter(|t| !recent.contains(&(*t as u32)))
            .max_by(|&i, &j| l[i].total_cmp(&l[j]))
            .unwrap() as u32;
        recent.push(tok);
        if recent.len() > 16 {
            recent.remove(0);
        }
        peak_kv = peak_kv.max(ctx.kv.bytes_used());
        if pos + 1 == 1000 {
            rss_1000 = vm_rss_kib();
        }
    }
    let rss_end = vm_rss_kib();
    let kv_bound = (512 + 4 + 2 * 32 + 64) * ctx.kv.bytes_per_token();
    eprintln!("gemma3-270m window 512 + 4 sinks, q8 KV: VmRSS {rss_1000} KiB at token 1000, {rss_end} KiB at token {n}; KV peak {peak_kv} B (bound {kv_bound} B)");
    assert!(peak_kv <= kv_bound);
    assert!(
        (rss_end as f64) <= rss_1000 as f64 * 1.02,
        "RSS grew from {rss_1000} KiB to {rss_end} KiB"
    );
}
