//! `snug plan MODEL [--ram 6G] [--ctx N] [--kv f16|q8|q4] [--json]`: predicted peak memory from
//! the GGUF header alone (nothing is read past the header), a table of contexts × KV
//! precisions marking what fits the budget, and the configuration `snug run` would choose.

use anyhow::Context as _;
use clap::Args;
use gguf::GgufFile;
use memory::plan::{self, fmt_bytes, KvType, ModelFacts, Prediction, Request, Residency, Wants};
use model::ModelConfig;
use serde_json::json;

use crate::common::default_threads;
use crate::mem_args::{shape, MemArgs};

#[derive(Args, Debug)]
pub struct PlanArgs {
    /// Model alias or .gguf path.
    pub model: String,
    /// Context length to plan for (default: chosen within the budget).
    #[arg(long)]
    pub ctx: Option<usize>,
    /// KV cache precision: f16, q8 or q4 (default: chosen within the budget).
    #[arg(long)]
    pub kv: Option<String>,
    /// Positions the job will fill at most (prompt + tokens to generate), as `snug run` knows
    /// them (default: the whole context). The KV cache is paged: fewer positions cost less and
    /// leave room for more pinned layers.
    #[arg(long)]
    pub tokens: Option<usize>,
    /// Tokens computed together during prompt processing.
    #[arg(long, default_value_t = 512)]
    pub ubatch: usize,
    /// Worker threads (default: the CPUs available).
    #[arg(long, short = 't')]
    pub threads: Option<usize>,
    /// Machine-readable output; top-level `predicted_peak_rss_bytes`.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub mem: MemArgs,
}

/// One line per term of a prediction.
pub fn breakdown(p: &Prediction) -> String {
    format!(
        "  weights resident {:>11}\n  KV cache         {:>11}\n  activations      {:>11}\n  logits           {:>11}\n  tokenizer heap   {:>11}\n  process          {:>11}\n  peak RSS         {:>11}",
        fmt_bytes(p.weights),
        fmt_bytes(p.kv),
        fmt_bytes(p.arena),
        fmt_bytes(p.logits),
        fmt_bytes(p.tokenizer),
        fmt_bytes(p.overhead),
        fmt_bytes(p.total)
    )
}

pub fn run(a: PlanArgs) -> anyhow::Result<()> {
    let path = hub::resolve(&a.model)?;
    let file = GgufFile::open(&path)
        .with_context(|| format!("reading the header of {}", path.display()))?;
    let cfg = ModelConfig::from_gguf(&file)
        .with_context(|| format!("reading the configuration of {}", path.display()))?;
    let s = shape(&cfg);
    let facts = ModelFacts::from_gguf(&file);
    let kv = a
        .kv
        .as_deref()
        .map(|k| KvType::parse(k).ok_or_else(|| anyhow::anyhow!("--kv {k:?}: use f16, q8 or q4")))
        .transpose()?;
    let threads = a.threads.unwrap_or_else(default_threads).max(1);
    if a.ubatch == 0 || a.ctx == Some(0) || a.tokens == Some(0) {
        anyhow::bail!("--ubatch, --ctx and --tokens must be at least 1");
    }
    let budget = a.mem.budget();
    let wants = Wants {
        n_ctx: a.ctx,
        kv,
        residency: a.mem.residency(),
        n_ctx_min: 1,
        n_kv: a.tokens,
        n_ubatch: a.ubatch,
        n_threads: threads,
        kv_available: KvType::ALL.to_vec(),
        kv_windowed: true,
    };
    let choice = plan::choose(&s, &facts, budget.bytes, &wants);
    // The configuration reported: the chosen one, or the requested one when nothing fits.
    let n_kv = |n_ctx: usize| a.tokens.map_or(n_ctx, |t| t.min(n_ctx));
    let req = match &choice {
        Ok(c) => c.request,
        Err(_) => Request {
            n_ctx: a.ctx.unwrap_or_else(|| cfg.n_ctx_train.clamp(1, 4096)),
            n_kv: n_kv(a.ctx.unwrap_or_else(|| cfg.n_ctx_train.clamp(1, 4096))),
            kv: kv.unwrap_or(KvType::F16),
            n_ubatch: a.ubatch,
            n_threads: threads,
            residency: a.mem.residency().unwrap_or(Residency::Mmap),
            pinned_layers: 0,
            kv_windowed: true,
        },
    };
    let pred = plan::predict(&s, &facts, &req);
    let usable = budget.bytes.saturating_sub(plan::headroom(budget.bytes));
    let mut ctxs: Vec<usize> = [512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072]
        .into_iter()
        .filter(|&c| c <= cfg.n_ctx_train.max(512))
        .collect();
    if let Some(c) = a.ctx {
        if !ctxs.contains(&c) {
            ctxs.push(c);
            ctxs.sort_unstable();
        }
    }
    let cell = |n_ctx: usize, kv: KvType| {
        let r = Request {
            n_ctx,
            n_kv: n_kv(n_ctx),
            kv,
            residency: Residency::Mmap,
            pinned_layers: s.n_layer,
            ..req
        };
        plan::predict(&s, &facts, &r).total
    };
    if a.json {
        let table: Vec<_> = ctxs
            .iter()
            .flat_map(|&c| KvType::ALL.map(|k| (c, k)))
            .map(|(c, k)| {
                let t = cell(c, k);
                json!({"n_ctx": c, "kv": k, "predicted_peak_rss_bytes": t, "fits": t <= usable})
            })
            .collect();
        let out = json!({
            "model": path.display().to_string(),
            "predicted_peak_rss_bytes": pred.total,
            "fits": choice.is_ok(),
            "budget_bytes": budget.bytes,
            "usable_bytes": usable,
            "budget_source": budget.source.to_string(),
            "config": req,
            "breakdown": pred,
            "facts": {"file_bytes": facts.file_bytes, "header_bytes": facts.header_bytes, "embd_bytes": facts.embd_bytes, "output_tied": facts.output_tied, "other_bytes": facts.other_bytes, "n_tokens": facts.n_tokens, "token_text_bytes": facts.token_text_bytes, "n_merges": facts.n_merges, "merge_text_bytes": facts.merge_text_bytes},
            "kv_bytes_per_token": plan::kv_bytes_per_token(&s, req.kv),
            "reason": match &choice { Ok(c) => c.reason.clone(), Err(e) => e.clone() },
            "table": table,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    println!(
        "{} — {} layers, n_embd {}, {} heads / {} KV heads × {}, vocab {}, file {}",
        path.display(),
        s.n_layer,
        s.n_embd,
        s.n_head,
        s.n_head_kv,
        s.head_dim,
        s.n_vocab,
        fmt_bytes(facts.file_bytes)
    );
    let n_win = s.windows.iter().filter(|w| w.is_some()).count();
    if n_win > 0 {
        println!(
            "sliding window on {n_win} of {} layers ({} positions)",
            s.n_layer,
            s.windows.iter().flatten().next().copied().unwrap_or(0)
        );
    }
    println!(
        "budget {} from {} ({} usable after headroom)",
        fmt_bytes(budget.bytes),
        budget.source,
        fmt_bytes(usable)
    );
    println!(
        "KV per token (all layers): f16 {}  q8 {}  q4 {}",
        fmt_bytes(plan::kv_bytes_per_token(&s, KvType::F16)),
        fmt_bytes(plan::kv_bytes_per_token(&s, KvType::Q8)),
        fmt_bytes(plan::kv_bytes_per_token(&s, KvType::Q4))
    );
    println!();
    let filled = a.tokens.map(|t| format!(", KV filled to {t} positions")).unwrap_or_default();
    println!("predicted peak RSS, weights mmap'd{filled} (* = fits)");
    println!("{:>8}  {:>13}  {:>13}  {:>13}", "ctx", "KV f16", "KV q8", "KV q4");
    for &c in &ctxs {
        let row: Vec<String> = KvType::ALL
            .iter()
            .map(|&k| {
                let t = cell(c, k);
                format!("{:>11} {}", fmt_bytes(t), if t <= usable { "*" } else { " " })
            })
            .collect();
        println!("{c:>8}  {}", row.join("  "));
    }
    println!();
    match &choice {
        Ok(c) => {
            println!("snug would run: {}", plan::describe(&c.request));
            println!("  because {}", c.reason);
        }
        Err(e) => println!("nothing fits: {e}"),
    }
    println!("{}", breakdown(&pred));
    Ok(())
}
