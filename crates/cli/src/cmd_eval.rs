//! `snug eval MODEL --prompt-file F`: logits at every position and a greedy (or forced)
//! continuation, as JSON in the shape of the llama.cpp reference dumps.

use std::sync::Arc;

use anyhow::Context as _;
use clap::Args;
use model::{Context, ContextParams};
use serde_json::json;

use crate::common::{default_threads, load, LoraArgs};

#[derive(Args, Debug)]
pub struct EvalCmd {
    /// Model alias or .gguf path.
    pub model: String,
    /// The prompt.
    #[arg(long, short = 'f')]
    pub prompt_file: std::path::PathBuf,
    /// Parse special-token text in the prompt (chat prompts need this).
    #[arg(long)]
    pub special: bool,
    /// Greedy tokens to generate after the prompt.
    #[arg(long, default_value_t = 32)]
    pub n_predict: usize,
    /// How many of the best (token, logit) pairs to report per position.
    #[arg(long, default_value_t = 10)]
    pub top_k: usize,
    /// Score this continuation (comma-separated ids) instead of generating one.
    #[arg(long, value_delimiter = ',')]
    pub force_tokens: Option<Vec<u32>>,
    /// Write JSON (the only format; kept for symmetry with the other verbs).
    #[arg(long)]
    pub json: bool,
    #[arg(long, short = 't')]
    pub threads: Option<usize>,
    #[command(flatten)]
    pub lora: LoraArgs,
}

pub fn run(cmd: EvalCmd) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(&cmd.prompt_file)
        .with_context(|| format!("reading {}", cmd.prompt_file.display()))?;
    if cmd.top_k == 0 {
        anyhow::bail!("--top-k must be at least 1");
    }
    let (model, tok) = load(&cmd.model)?;
    let prompt = tok.encode(&text, true, cmd.special);
    if prompt.is_empty() {
        anyhow::bail!("the prompt is empty after tokenization");
    }
    if let Some(f) = &cmd.force_tokens {
        if let Some(bad) = f.iter().find(|&&t| t as usize >= tok.n_vocab()) {
            anyhow::bail!(
                "--force-tokens: token {bad} is outside the vocabulary of {}",
                tok.n_vocab()
            );
        }
    }
    let n_gen = cmd.force_tokens.as_ref().map_or(cmd.n_predict, |f| f.len());
    let chunk = 128;
    let params = ContextParams {
        n_ctx: prompt.len() + n_gen + 8,
        n_ubatch: chunk,
        n_outputs_max: chunk,
        n_seq_max: 1,
        n_threads: cmd.threads.unwrap_or_else(default_threads),
        ..ContextParams::default()
    };
    let mut ctx = Context::new(Arc::clone(&model), params);
    cmd.lora.apply(&mut ctx)?;
    let r = engine::evaluate(
        &mut ctx,
        0,
        &prompt,
        cmd.n_predict,
        cmd.top_k,
        cmd.force_tokens.as_deref(),
    )?;
    let hex = |ids: &[u32]| -> Vec<String> {
        ids.iter()
            .map(|&t| tok.token_piece(t).iter().map(|b| format!("{b:02x}")).collect())
            .collect()
    };
    let positions: Vec<_> = r
        .positions
        .iter()
        .map(|p| json!({"pos": p.pos, "token": p.token, "is_prompt": p.is_prompt, "top10": p.top10, "lse": p.lse}))
        .collect();
    let out = json!({
        "model_file": cmd.model,
        "general.architecture": model.config.arch.name(),
        "general.name": model.config.name,
        "n_vocab": model.config.n_vocab,
        "vocab_add_bos": tok.add_bos(),
        "bos_id": tok.bos(),
        "eos_id": tok.eos(),
        "settings": {"n_ctx": params.n_ctx, "n_threads": params.n_threads, "kv": "f16", "sampling": "greedy argmax over f32 logits; ties -> lowest token id"},
        "results": [{
            "name": cmd.prompt_file.file_name().map(|s| s.to_string_lossy().to_string()),
            "prompt": text,
            "parse_special": cmd.special,
            "prompt_tokens": r.prompt_tokens,
            "prompt_token_pieces_hex": hex(&r.prompt_tokens),
            "n_prompt": r.n_prompt,
            "gen_tokens": r.gen_tokens,
            "gen_is_eog": r.gen_tokens.iter().map(|&t| tok.is_eog(t)).collect::<Vec<_>>(),
            "gen_token_pieces_hex": hex(&r.gen_tokens),
            "gen_text": tok.decode(&r.gen_tokens),
            "next_token_after_gen": r.next_token_after_gen,
            "positions": positions,
        }],
    });
    println!("{}", serde_json::to_string(&out)?);
    Ok(())
}
