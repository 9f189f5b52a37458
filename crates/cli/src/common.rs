//! Flags shared by the verbs that run a model, and loading a model with its tokenizer.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context as _;
use clap::Args;
use engine::SamplerParams;
use model::{ContextParams, Model};
use tokenizer::Tokenizer;

/// The model used when none is named.
pub const DEFAULT_MODEL: &str = "qwen2.5-coder-1.5b";

#[derive(Args, Clone, Debug)]
pub struct RunArgs {
    /// Context length in tokens (default: the model's training context, at most 4096).
    #[arg(long)]
    pub ctx: Option<usize>,
    /// Worker threads (default: the number of CPUs available to this process).
    #[arg(long, short = 't')]
    pub threads: Option<usize>,
    /// Tokens computed together during prompt processing.
    #[arg(long, default_value_t = 512)]
    pub ubatch: usize,
    #[command(flatten)]
    pub kv: crate::kv_args::KvArgs,
    #[command(flatten)]
    pub mem: crate::mem_args::MemArgs,
}

#[derive(Args, Clone, Debug)]
pub struct SamplingArgs {
    /// Sampling temperature; 0 is greedy.
    #[arg(long = "temp", default_value_t = 0.8)]
    pub temperature: f32,
    /// Keep only the k most likely tokens (0 = off).
    #[arg(long, default_value_t = 40)]
    pub top_k: usize,
    /// Keep the most likely tokens up to this probability mass (1 = off).
    #[arg(long, default_value_t = 0.95)]
    pub top_p: f32,
    /// Drop tokens less likely than this fraction of the best one (0 = off).
    #[arg(long, default_value_t = 0.05)]
    pub min_p: f32,
    /// Penalise recently seen tokens (1 = off).
    #[arg(long, default_value_t = 1.0)]
    pub repeat_penalty: f32,
    /// How many recent tokens the penalties consider.
    #[arg(long, default_value_t = 64)]
    pub repeat_last_n: usize,
    #[arg(long, default_value_t = 0.0)]
    pub presence_penalty: f32,
    #[arg(long, default_value_t = 0.0)]
    pub frequency_penalty: f32,
    /// Random seed: the same seed gives the same text.
    #[arg(long, default_value_t = 0x5eed)]
    pub seed: u64,
}

impl SamplingArgs {
    pub fn params(&self) -> anyhow::Result<SamplerParams> {
        let p = SamplerParams {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            repeat_last_n: self.repeat_last_n,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            seed: self.seed,
        };
        p.validate().map_err(anyhow::Error::msg)?;
        Ok(p)
    }
}

pub fn default_threads() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

/// A model resolved to its file and loaded with its tokenizer.
pub struct Loaded {
    /// The `.gguf` file (residency modes open it again for `posix_fadvise`).
    pub path: PathBuf,
    pub model: Arc<Model>,
    pub tok: Arc<Tokenizer>,
}

/// Resolves `name` (alias or path; pulls an alias if needed) and loads model and tokenizer.
pub fn open(name: &str) -> anyhow::Result<Loaded> {
    let path = hub::resolve(name)?;
    let model = Model::load(&path).with_context(|| format!("loading {}", path.display()))?;
    let tok = Tokenizer::from_gguf(&model.file)
        .with_context(|| format!("reading the tokenizer of {}", path.display()))?;
    if tok.n_vocab() != model.config.n_vocab {
        anyhow::bail!(
            "{}: tokenizer has {} tokens but the model's embedding has {}",
            path.display(),
            tok.n_vocab(),
            model.config.n_vocab
        );
    }
    Ok(Loaded { path, model: Arc::new(model), tok: Arc::new(tok) })
}

/// [`open`] for the verbs that do not manage memory (eval, perplexity).
pub fn load(name: &str) -> anyhow::Result<(Arc<Model>, Arc<Tokenizer>)> {
    open(name).map(|m| (m.model, m.tok))
}

impl RunArgs {
    /// Context sizes for one sequence and the memory plan behind them; `needed` is the least
    /// context the job needs, `n_kv` the most positions it will fill when that is known (prompt
    /// + tokens to generate). Context length and KV precision not given are chosen within the
    /// memory budget. Every verb that runs a model goes through here and then
    /// [`crate::mem_args::Planned::attach`], so `--ram`, `--load` and `--verbose` mean the same
    /// everywhere.
    pub fn plan(
        &self,
        model: &Model,
        needed: usize,
        n_kv: Option<usize>,
    ) -> anyhow::Result<(ContextParams, crate::mem_args::Planned)> {
        use crate::mem_args::{from_model_kv, plan_run, to_model_kv};
        let mut p = self.fixed_params(model, needed)?;
        let kv_given = self.kv.kv.is_some() || self.kv.kv_k.is_some() || self.kv.kv_v.is_some();
        let n_ctx_min = if self.kv.window.is_some() { 1 } else { needed };
        let planned = plan_run(
            &self.mem,
            model,
            self.ctx,
            kv_given.then(|| from_model_kv(p.kv_k)),
            n_ctx_min,
            n_kv,
            p.n_ubatch,
            p.n_threads,
        )?;
        p.n_ctx = planned.request.n_ctx;
        if !kv_given {
            p.kv_k = to_model_kv(planned.request.kv);
            p.kv_v = p.kv_k;
        }
        Ok((p, planned))
    }

    fn fixed_params(&self, model: &Model, needed: usize) -> anyhow::Result<ContextParams> {
        let n_ctx = self.ctx.unwrap_or_else(|| model.config.n_ctx_train.min(4096).max(needed));
        if n_ctx == 0 {
            anyhow::bail!("--ctx must be at least 1");
        }
        if needed > n_ctx && self.kv.window.is_none() {
            anyhow::bail!("the prompt needs {needed} tokens of context but --ctx is {n_ctx}; raise --ctx or shorten the prompt");
        }
        let threads = self.threads.unwrap_or_else(default_threads);
        if threads == 0 {
            anyhow::bail!("--threads must be at least 1");
        }
        if self.ubatch == 0 {
            anyhow::bail!("--ubatch must be at least 1");
        }
        let mut p = ContextParams {
            n_ctx,
            n_ubatch: self.ubatch,
            n_outputs_max: 1,
            n_seq_max: 1,
            n_threads: threads,
            ..ContextParams::default()
        };
        self.kv.apply(&mut p)?;
        Ok(p)
    }
}
