//! Flags shared by the verbs that run a model, and loading a model with its tokenizer.

use std::sync::Arc;

use anyhow::Context as _;
use clap::Args;
use engine::SamplerParams;
use model::{AdapterSet, Context, ContextParams, Lora, Model, ModelConfig};
use runtime::{Loaded, Planned, Residence, RunOptions};

pub use crate::advice::explain;

use crate::draft_args::DraftArgs;
use tokenizer::Tokenizer;

pub use hub::DEFAULT_MODEL;
pub use runtime::default_threads;

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
    #[command(flatten)]
    pub lora: LoraArgs,
}

/// `--lora FILE[:SCALE]`, repeatable: LoRA adapters applied together (their deltas add up).
#[derive(Args, Clone, Debug, Default)]
pub struct LoraArgs {
    /// A LoRA adapter (llama.cpp's GGUF adapter format) and its scale (default 1); repeat the
    /// flag to apply several.
    #[arg(long = "lora", value_name = "FILE[:SCALE]", value_parser = parse_lora)]
    pub lora: Vec<(std::path::PathBuf, f32)>,
    /// The adapters, loaded once for the model (the planner counts them, the context applies them).
    #[arg(skip)]
    loaded: std::sync::OnceLock<AdapterSet>,
}

/// `FILE[:SCALE]`: a trailing `:number` is the scale, anything else is part of the path.
fn parse_lora(s: &str) -> Result<(std::path::PathBuf, f32), String> {
    if let Some((path, scale)) = s.rsplit_once(':') {
        if let Ok(v) = scale.parse::<f32>() {
            if !v.is_finite() {
                return Err(format!("the scale {scale} of --lora {s} is not a finite number"));
            }
            return Ok((path.into(), v));
        }
    }
    Ok((s.into(), 1.0))
}

impl LoraArgs {
    /// The adapters, loaded for a model of configuration `c` on the first call.
    pub fn adapters(&self, c: &ModelConfig) -> anyhow::Result<&AdapterSet> {
        if let Some(set) = self.loaded.get() {
            return Ok(set);
        }
        let mut set = AdapterSet::new();
        for (path, scale) in &self.lora {
            let l = Lora::load(path, c)
                .with_context(|| format!("loading the LoRA adapter {}", path.display()))?;
            set.push((Arc::new(l), *scale));
        }
        Ok(self.loaded.get_or_init(|| set))
    }

    /// Heap bytes of the adapters (0 without `--lora`), for the memory plan.
    pub fn bytes(&self, c: &ModelConfig) -> anyhow::Result<u64> {
        Ok(self.adapters(c)?.iter().map(|(l, _)| l.bytes() as u64).sum())
    }

    /// Applies the adapters to every sequence of `ctx`.
    pub fn apply(&self, ctx: &mut Context) -> anyhow::Result<()> {
        let set = self.adapters(ctx.config())?.clone();
        if set.is_empty() {
            return Ok(());
        }
        for seq in 0..ctx.params.n_seq_max.max(1) {
            ctx.set_adapters(seq, &set)?;
        }
        let names: Vec<String> =
            set.iter().map(|(l, s)| format!("{} ×{s} (rank {})", l.name, l.max_rank())).collect();
        eprintln!("snug: LoRA {}", names.join(" + "));
        Ok(())
    }
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

/// Resolves `name` (alias or path; pulls an alias if needed) and loads model and tokenizer.
pub fn open(name: &str) -> anyhow::Result<Loaded> {
    runtime::open(name).map_err(explain)
}

/// [`open`] for the verbs that do not manage memory (eval, perplexity).
pub fn load(name: &str) -> anyhow::Result<(Arc<Model>, Arc<Tokenizer>)> {
    open(name).map(|m| (m.model, m.tok))
}

/// Weights made resident as planned for `ctx`; the pressure monitor's lines go to stderr.
pub fn attach(planned: &Planned, m: &Loaded, ctx: &Context) -> anyhow::Result<Residence> {
    planned.attach(m, ctx, |line| eprintln!("{line}")).map_err(explain)
}

/// With `--verbose`: peak RSS against the prediction and the layers pinned, on stderr.
pub fn report(residence: &Residence, mem: &crate::mem_args::MemArgs) {
    if mem.verbose {
        eprintln!("{}", residence.report());
    }
}

impl RunArgs {
    /// Context sizes for one sequence and the memory plan behind them (`runtime::plan_context`);
    /// `needed` is the least context the job needs, `n_kv` the most positions it will fill when
    /// that is known (prompt + tokens to generate). Prints the plan's one line (`--verbose`: the
    /// whole plan). Every verb that runs a model goes through here and then [`attach`], so
    /// `--ram`, `--load` and `--verbose` mean the same everywhere.
    /// `json_mode`: the answer may be constrained (its vocabulary table counts); `draft`: the
    /// speculative decoding the run uses (its rows of logits and draft model count).
    pub fn plan(
        &self,
        model: &Model,
        needed: usize,
        n_kv: Option<usize>,
        json_mode: bool,
        draft: &DraftArgs,
    ) -> anyhow::Result<(ContextParams, Planned)> {
        let (kv_k, kv_v) = self.kv.types()?;
        let kv_given = self.kv.kv.is_some() || self.kv.kv_k.is_some() || self.kv.kv_v.is_some();
        let o = RunOptions {
            n_ctx: self.ctx,
            n_threads: self.threads,
            n_ubatch: self.ubatch,
            kv: kv_given.then_some((kv_k, kv_v)),
            kv_window: self.kv.window,
            kv_sinks: self.kv.sinks,
            n_seq: 1,
            mem: self.mem.options(),
            adapter_bytes: self.lora.bytes(&model.config)?,
            json_mode,
            draft_tokens: draft.tokens(),
            draft_bytes: draft.bytes(
                model.config.n_ctx_or_default(self.ctx, needed),
                self.ubatch,
                self.threads.unwrap_or_else(default_threads),
            )?,
            prefix_disk: false,
        };
        let (mut params, planned) =
            runtime::plan_context(model, &o, needed, n_kv).map_err(explain)?;
        // Rotation is done in place: it changes no size the plan counts.
        params.kv_rotate = self.kv.rotate()?;
        eprintln!("snug: {}", crate::advice::summary(&planned));
        if self.mem.verbose {
            eprintln!("{}", planned.choice.prediction.breakdown());
        }
        Ok((params, planned))
    }
}
