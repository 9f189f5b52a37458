//! `snug embed MODEL TEXT...`: each text's embedding as a JSON array (one line per text), pooled
//! as `snug serve` pools them (`--pooling`, else the file's `{arch}.pooling_type`, else mean;
//! `engine::embed`) and L2-normalised unless `--no-normalize`.
//!
//! Cost: one context of the longest text's tokens (KV for that many positions, one sequence)
//! and a prefill of each text; no logits are computed.

use std::sync::Arc;

use clap::Args;
use model::config::Pooling;
use model::{Context, ContextParams};

use crate::common::{default_threads, load};

#[derive(Args, Debug)]
pub struct EmbedCmd {
    /// Model alias or .gguf path.
    pub model: String,
    /// The texts to embed (one vector each).
    #[arg(required = true, num_args = 1..)]
    pub text: Vec<String>,
    /// How to pool the token states: mean, cls or last (default: the file's, else mean).
    #[arg(long, value_name = "MODE", value_parser = engine::embed::parse_pooling)]
    pub pooling: Option<Pooling>,
    /// Keep only the first N values (Matryoshka truncation), before normalising.
    #[arg(long, value_name = "N")]
    pub dimensions: Option<usize>,
    /// Print the pooled vectors as they are, not L2-normalised.
    #[arg(long)]
    pub no_normalize: bool,
    #[arg(long, short = 't')]
    pub threads: Option<usize>,
}

pub fn run(cmd: EmbedCmd) -> anyhow::Result<()> {
    let (model, tok) = load(&cmd.model)?;
    let n_embd = model.config.n_embd;
    if cmd.dimensions.is_some_and(|d| d == 0 || d > n_embd) {
        anyhow::bail!("--dimensions must be between 1 and the model's width, {n_embd}");
    }
    let inputs: Vec<Vec<u32>> = cmd.text.iter().map(|t| tok.encode(t, true, true)).collect();
    if let Some(i) = inputs.iter().position(Vec::is_empty) {
        anyhow::bail!("text {} has no tokens to embed", i + 1);
    }
    let longest = inputs.iter().map(Vec::len).max().unwrap_or(1);
    let limit = model.config.n_ctx_train.max(1);
    if longest > limit {
        anyhow::bail!("a text has {longest} tokens, more than the model's context of {limit}");
    }
    let pooling = engine::embed::pooling_for(&model.config, cmd.pooling);
    let ub = 512.min(longest);
    let params = ContextParams {
        n_ctx: longest + 1,
        n_ubatch: ub,
        n_outputs_max: 1,
        n_seq_max: 1,
        n_threads: cmd.threads.unwrap_or_else(default_threads),
        ..ContextParams::default()
    };
    let mut ctx = Context::new(Arc::clone(&model), params);
    for tokens in &inputs {
        let v = engine::embed::embed_tokens(&mut ctx, 0, tokens, pooling)?;
        let v = engine::embed::finish(v, cmd.dimensions, !cmd.no_normalize);
        println!("{}", serde_json::to_string(&v)?);
    }
    Ok(())
}
