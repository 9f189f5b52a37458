//! `snug plan MODEL [--ram 6G] [--ctx N] [--kv f16|q8|q4] [--json] [--svg FILE] [--html FILE]`:
//! predicted peak memory from the GGUF header alone (nothing is read past the header), a table
//! of contexts × KV precisions marking what fits the budget, and the configuration `snug run`
//! would choose. `--svg` / `--html` also write that configuration's memory picture, the one
//! `snug serve`'s page shows (`server::ui::memory_svg`).

use anyhow::Context as _;
use clap::Args;
use gguf::GgufFile;
use model::{KvType, ModelConfig};
use runtime::plan::{self, fmt_bytes, ModelFacts, Prediction, Request, Residency, Wants};
use serde_json::json;

use crate::common::default_threads;
use crate::mem_args::MemArgs;

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
    /// Sequences served at once (`snug serve --parallel`): each holds its own KV cache.
    #[arg(long, default_value_t = 1)]
    pub parallel: usize,
    /// Plan for `snug serve` (implied by `--parallel` above 1): counts what only the server
    /// holds, JSON mode's per-vocabulary tables.
    #[arg(long)]
    pub serve: bool,
    /// Speculative decoding as `run`, `chat` and `serve` default to (`ngram`): its rows of
    /// logits count; `off` plans without them.
    #[arg(long, value_name = "ngram|off", default_value = "ngram", value_parser = ["ngram", "off"])]
    pub draft: String,
    /// Machine-readable output; top-level `predicted_peak_rss_bytes`.
    #[arg(long)]
    pub json: bool,
    /// Also write the memory picture of the configuration chosen (or asked for) as SVG.
    #[arg(long, value_name = "FILE")]
    pub svg: Option<std::path::PathBuf>,
    /// Also write the memory picture as a standalone HTML page.
    #[arg(long, value_name = "FILE")]
    pub html: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub mem: MemArgs,
    #[command(flatten)]
    pub lora: crate::common::LoraArgs,
    /// With --serve: the disk tier of the prefix cache, as `snug serve` takes it (its queue
    /// counts; 0: off).
    #[command(flatten)]
    pub prefix_disk: crate::cmd_cache::PrefixDiskArgs,
}

pub fn run(a: PlanArgs) -> anyhow::Result<()> {
    let path = hub::resolve(&a.model)?;
    let file = GgufFile::open(&path)
        .with_context(|| format!("reading the header of {}", path.display()))?;
    let cfg = ModelConfig::from_gguf(&file)
        .with_context(|| format!("reading the configuration of {}", path.display()))?;
    let facts =
        ModelFacts { adapter_bytes: a.lora.bytes(&cfg)?, ..ModelFacts::from_gguf(&file, &cfg) };
    let kv =
        a.kv.as_deref()
            .map(|k| k.parse::<KvType>().map_err(|e| anyhow::anyhow!("--kv: {e}")))
            .transpose()?;
    let threads = a.threads.unwrap_or_else(default_threads).max(1);
    if a.ubatch == 0 || a.ctx == Some(0) || a.tokens == Some(0) || a.parallel == 0 {
        anyhow::bail!("--ubatch, --ctx, --tokens and --parallel must be at least 1");
    }
    let mem = a.mem.options();
    let budget = mem.budget();
    let wants = Wants {
        n_ctx: a.ctx,
        kv: kv.map(|k| (k, k)),
        residency: mem.residency,
        n_ctx_min: 1,
        n_kv: a.tokens,
        n_ubatch: a.ubatch,
        n_threads: threads,
        n_seq: a.parallel,
        kv_available: KvType::ALL.to_vec(),
        kv_windowed: true,
        json_mode: a.serve || a.parallel > 1,
        draft_tokens: engine::draft::DraftKind::parse(&a.draft).guess_rows(),
        prefix_disk: (a.serve || a.parallel > 1) && a.prefix_disk.prefix_cache_disk > 0,
    };
    let choice = plan::choose(&cfg, &facts, budget.bytes, &wants);
    // The configuration reported: the chosen one, or the requested one when nothing fits.
    let n_kv = |n_ctx: usize| a.tokens.map_or(n_ctx, |t| t.min(n_ctx));
    let req = match &choice {
        Ok(c) => c.request,
        Err(e) => e.request,
    };
    let pred = plan::predict(&cfg, &facts, &req);
    let pic = picture(&pred, budget.bytes, facts.file_bytes, &req);
    let write = |file: &std::path::Path, text: String| {
        std::fs::write(file, text).with_context(|| format!("writing {}", file.display()))
    };
    if let Some(f) = &a.svg {
        write(f, server::ui::memory_svg(&pic, None) + "\n")?;
    }
    if let Some(f) = &a.html {
        write(f, server::ui::plan_html(&path.display().to_string(), &pic))?;
    }
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
            kv_k: kv,
            kv_v: kv,
            residency: Residency::Mmap,
            pinned_layers: cfg.n_layer,
            ..req
        };
        plan::predict(&cfg, &facts, &r).total
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
            "budget_source": crate::advice::budget_source(&budget.source),
            "config": req,
            "breakdown": pred,
            "facts": {"file_bytes": facts.file_bytes, "header_bytes": facts.header_bytes, "embd_bytes": facts.embd_bytes, "output_tied": facts.output_tied, "other_bytes": facts.other_bytes, "n_tokens": facts.n_tokens, "token_text_bytes": facts.token_text_bytes, "n_merges": facts.n_merges, "merge_text_bytes": facts.merge_text_bytes},
            "kv_bytes_per_token": model::kv_bytes_per_token(&cfg, req.kv_k, req.kv_v),
            "prefix_disk_heap_bytes": req.prefix_disk.then(|| plan::prefix_disk_bytes(&cfg, &req)),
            "weight_bytes_read_per_token": facts.bytes_read_per_token(&cfg),
            "expert_bytes": facts.expert_bytes,
            "expert_cache": plan::expert_reads(&cfg, &facts, &req).map(|(hit, disk)| json!({"bytes": req.expert_cache, "uniform_hit_rate": hit, "disk_bytes_per_token": disk})),
            "reason": match &choice { Ok(c) => c.reason.clone(), Err(e) => e.to_string() },
            "alternatives": choice.as_ref().err().map(|e| e.alternatives.clone()),
            "table": table,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    println!(
        "{} — {} layers, n_embd {}, {} heads / {} KV heads × {}, vocab {}, file {}",
        path.display(),
        cfg.n_layer,
        cfg.n_embd,
        cfg.n_head,
        cfg.n_head_kv,
        cfg.head_dim,
        cfg.n_vocab,
        fmt_bytes(facts.file_bytes)
    );
    let windows = || cfg.layers.iter().filter_map(|l| l.window);
    let n_win = windows().count();
    if n_win > 0 {
        println!(
            "sliding window on {n_win} of {} layers ({} positions)",
            cfg.n_layer,
            windows().next().unwrap_or(0)
        );
    }
    if let Some(m) = cfg.moe {
        println!(
            "mixture of experts: {} of {} experts per token; experts {} of the file; a decoded \
             token reads {} of weights",
            m.n_expert_used,
            m.n_expert,
            fmt_bytes(facts.expert_bytes),
            fmt_bytes(facts.bytes_read_per_token(&cfg))
        );
        if let Some((hit, disk)) = plan::expert_reads(&cfg, &facts, &req) {
            println!(
                "expert cache {}: with uniform routing {:.0}% of chosen experts held, {} read \
                 from disk a token (skewed routing, as real models have, holds more)",
                fmt_bytes(req.expert_cache),
                100.0 * hit,
                fmt_bytes(disk)
            );
        }
    }
    println!(
        "budget {} from {} ({} usable after headroom)",
        fmt_bytes(budget.bytes),
        crate::advice::budget_source(&budget.source),
        fmt_bytes(usable)
    );
    let per_token = |k| fmt_bytes(model::kv_bytes_per_token(&cfg, k, k) as u64);
    println!(
        "KV per token (all layers): f16 {}  q8 {}  q4 {}",
        per_token(KvType::F16),
        per_token(KvType::Q8),
        per_token(KvType::Q4)
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
    println!("{}", pred.breakdown());
    if req.prefix_disk {
        println!(
            "prefix cache: in RAM, the KV pool's free blocks; on disk, at most {} in {} \
             ({} a 32-token block), its write queue and read buffers {} (in the arena above)",
            fmt_bytes(a.prefix_disk.prefix_cache_disk),
            a.prefix_disk.prefix_cache_dir.as_ref().map_or_else(
                || crate::cmd_cache::cache_home().display().to_string(),
                |d| d.display().to_string()
            ),
            fmt_bytes(
                (model::kv::BLOCK_TOKENS * model::kv_bytes_per_token(&cfg, req.kv_k, req.kv_v))
                    as u64
            ),
            fmt_bytes(plan::prefix_disk_bytes(&cfg, &req) as u64)
        );
    }
    Ok(())
}

/// The memory picture's numbers for a predicted configuration `req` in `budget` bytes, of a
/// model file of `mapped` bytes (also what `snug serve` hands its page).
pub fn picture(
    pred: &Prediction,
    budget: u64,
    mapped: u64,
    req: &Request,
) -> server::ui::PlanPicture {
    server::ui::PlanPicture {
        budget,
        headroom: plan::headroom(budget),
        weights: pred.weights,
        mapped,
        kv: pred.kv,
        adapters: pred.adapters,
        scratch: pred.arena.saturating_add(pred.logits),
        process: pred.tokenizer.saturating_add(pred.overhead),
        total: pred.total,
        config: plan::describe(req),
    }
}
