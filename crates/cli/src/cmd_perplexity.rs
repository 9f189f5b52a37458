//! `snug perplexity MODEL FILE`: perplexity of a text, computed as llama-perplexity does; with
//! `--kl-divergence-base`, agreement with the logits llama-perplexity saved instead.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context as _;
use clap::Args;
use engine::KlBase;
use model::{Context, ContextParams};

use crate::common::{default_threads, load, LoraArgs};
use crate::kv_args::KvArgs;

#[derive(Args, Debug)]
pub struct PerplexityCmd {
    /// Model alias or .gguf path.
    pub model: String,
    /// The text to score.
    #[arg(required_unless_present = "kl_divergence_base", conflicts_with = "kl_divergence_base")]
    pub file: Option<PathBuf>,
    /// Compare with llama.cpp instead: FILE is what `llama-perplexity --kl-divergence-base FILE`
    /// saved (its tokens and log-probabilities). Prints top-1 agreement and mean KL(llama.cpp ‖
    /// snug) over its scored positions; --ctx is the file's.
    #[arg(long, value_name = "FILE")]
    pub kl_divergence_base: Option<PathBuf>,
    /// Also save this run's log-probabilities to FILE in llama-perplexity's format, to compare
    /// another snug run with this one (e.g. a quantized KV cache against f16) through
    /// --kl-divergence-base.
    #[arg(long, value_name = "FILE", conflicts_with = "kl_divergence_base")]
    pub save_kl_base: Option<PathBuf>,
    /// Tokens per chunk; the second half of each chunk is scored [default: 512].
    #[arg(long)]
    pub ctx: Option<usize>,
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
    let mut base = cmd.kl_divergence_base.as_deref().map(KlBase::open).transpose()?;
    let n_ctx = match (&base, cmd.ctx) {
        (Some(b), Some(ctx)) if ctx != b.n_ctx => {
            anyhow::bail!(
                "--ctx {ctx} differs from the {} tokens the base file was made with",
                b.n_ctx
            )
        }
        (Some(b), _) => b.n_ctx,
        (None, ctx) => ctx.unwrap_or(512),
    };
    if n_ctx < 4 {
        anyhow::bail!("--ctx must be at least 4");
    }
    let (model, tok) = load(&cmd.model)?;
    let rows = 128.min(n_ctx);
    let mut params = ContextParams {
        n_ctx,
        n_ubatch: rows,
        n_outputs_max: rows,
        n_seq_max: 1,
        n_threads: cmd.threads.unwrap_or_else(default_threads),
        ..ContextParams::default()
    };
    cmd.kv.apply(&mut params)?;
    let kv_label = cmd.kv.label()?;
    let mut ctx = Context::new(Arc::clone(&model), params);
    let rot = |b: Option<usize>| b.is_some();
    let rotated = model::KvRotate { k: rot(ctx.kv.rot_k()), v: rot(ctx.kv.rot_v()) }.name();
    cmd.lora.apply(&mut ctx)?;
    let bos = if tok.add_bos() { tok.bos() } else { None };
    let t = std::time::Instant::now();
    let (json, line) = if let Some(base) = &mut base {
        let a = engine::kl_divergence(&mut ctx, base, bos, cmd.chunks)?;
        let line = format!(
            "against llama.cpp: top-1 agreement {:.2} ± {:.2}%, mean KL {:.5} ± {:.5} (max {:.4}), perplexity {:.4} (llama.cpp's {:.4}) over {} positions ({} chunks of {}",
            100.0 * a.top1, 100.0 * a.top1_stderr, a.mean_kl, a.kl_stderr, a.max_kl, a.ppl,
            a.ppl_base, a.n_positions, a.n_chunks, a.n_ctx
        );
        (serde_json::to_value(&a)?, line)
    } else {
        let file = cmd.file.as_ref().expect("clap requires FILE without --kl-divergence-base");
        let text =
            std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
        let tokens = tok.encode(&text, true, false);
        if let Some(path) = &cmd.save_kl_base {
            engine::save_kl_base(&mut ctx, &tokens, bos, cmd.chunks, path)?;
        }
        let r = engine::perplexity(&mut ctx, &tokens, bos, cmd.chunks)?;
        let line = format!(
            "perplexity {:.4} ± {:.5} over {} chunks of {} tokens ({} scored",
            r.ppl, r.ppl_stderr, r.n_chunks, r.n_ctx, r.n_scored
        );
        (serde_json::to_value(&r)?, line)
    };
    let secs = t.elapsed().as_secs_f64();
    if cmd.json {
        let mut v = json;
        v["model"] = cmd.model.clone().into();
        v["kv"] = kv_label.into();
        v["kv_rotate"] = rotated.into();
        v["seconds"] = secs.into();
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        println!("{} (KV {kv_label}, rotated {rotated}): {line}, {secs:.1} s)", cmd.model);
    }
    Ok(())
}
