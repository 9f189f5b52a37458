//! `snug perplexity MODEL FILE`: perplexity of a text, computed as llama-perplexity does.

use std::sync::Arc;

use anyhow::Context as _;
use clap::Args;
use model::{Context, ContextParams};

use crate::common::{default_threads, load, LoraArgs};
use crate::kv_args::KvArgs;

#[derive(Args, Debug)]
pub struct PerplexityCmd {
    /// Model alias or .gguf path.
    pub model: String,
    /// The text to score.
    pub file: std::path::PathBuf,
    /// Tokens per chunk; the second half of each chunk is scored.
    #[arg(long, default_value_t = 512)]
    pub ctx: usize,
    /// Score at most this many chunks.
    #[arg(long)]
    pub chunks: Option<usize>,
    #[arg(long, short = 't')]
    pub threads: Option<usize>,
    /// Print JSON (top-level keys `ppl` and `ppl_stderr`).
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub kv: KvArgs,
    #[command(flatten)]
    pub lora: LoraArgs,
}

pub fn run(cmd: PerplexityCmd) -> anyhow::Result<()> {
    if cmd.ctx < 4 {
        anyhow::bail!("--ctx must be at least 4");
    }
    let text = std::fs::read_to_string(&cmd.file)
        .with_context(|| format!("reading {}", cmd.file.display()))?;
    let (model, tok) = load(&cmd.model)?;
    let tokens = tok.encode(&text, true, false);
    let rows = 128.min(cmd.ctx);
    let mut params = ContextParams {
        n_ctx: cmd.ctx,
        n_ubatch: rows,
        n_outputs_max: rows,
        n_seq_max: 1,
        n_threads: cmd.threads.unwrap_or_else(default_threads),
        ..ContextParams::default()
    };
    cmd.kv.apply(&mut params)?;
    let kv_label = cmd.kv.label()?;
    let mut ctx = Context::new(Arc::clone(&model), params);
    cmd.lora.apply(&mut ctx)?;
    let bos = if tok.add_bos() { tok.bos() } else { None };
    let t = std::time::Instant::now();
    let r = engine::perplexity(&mut ctx, &tokens, bos, cmd.chunks)?;
    let secs = t.elapsed().as_secs_f64();
    if cmd.json {
        let mut v = serde_json::to_value(&r)?;
        v["model"] = cmd.model.clone().into();
        v["kv"] = kv_label.clone().into();
        v["seconds"] = secs.into();
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        println!("{} (KV {kv_label}): perplexity {:.4} ± {:.5} over {} chunks of {} tokens ({} scored, {:.1} s)", cmd.model, r.ppl, r.ppl_stderr, r.n_chunks, r.n_ctx, r.n_scored, secs);
    }
    Ok(())
}
