//! Memory flags shared by the verbs that run a model (`--ram`, `--load`, `--verbose`), and the
//! glue from the planner's choice to a running context: context length and KV precision chosen
//! within the budget, weights made resident (populate / mlock / stream), the pressure governor
//! and its monitor thread.

use std::sync::Arc;
use std::time::Duration;

use clap::{Args, ValueEnum};
use memory::plan::{self, KvType, ModelFacts, Prediction, Request, Residency, Shape, Wants};
use memory::pressure::{Fit, Governor, Monitor};
use memory::probe::{self, Budget};
use memory::residency::{self, Streamer};
use model::{Context, Model, ModelConfig};

/// `--load`: how the weights stay in memory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum LoadMode {
    /// mmap when the model fits the budget, else stream.
    #[default]
    Auto,
    /// Zero-copy mapping; pages come in on first touch.
    Mmap,
    /// Read the whole file in at load.
    Populate,
    /// Read it in and pin it (needs RLIMIT_MEMLOCK).
    Mlock,
    /// Pin as many layers as fit and stream the rest layer by layer.
    Stream,
}

#[derive(Args, Clone, Debug, Default)]
pub struct MemArgs {
    /// Memory budget, e.g. 6G or 2.5GiB (default: the cgroup limit, else MemAvailable).
    #[arg(long, value_parser = plan::parse_bytes)]
    pub ram: Option<u64>,
    /// How weights stay in memory: auto, mmap, populate, mlock or stream.
    #[arg(long = "load", value_enum, default_value_t = LoadMode::Auto)]
    pub load: LoadMode,
    /// Print the whole memory plan, and the peak RSS at exit.
    #[arg(long)]
    pub verbose: bool,
}

/// The planner's view of a model's shape.
pub fn shape(c: &ModelConfig) -> Shape {
    Shape {
        n_layer: c.n_layer,
        n_embd: c.n_embd,
        n_ff: c.n_ff,
        n_head: c.n_head,
        n_head_kv: c.n_head_kv,
        head_dim: c.head_dim,
        n_vocab: c.n_vocab,
        n_ctx_train: c.n_ctx_train,
        windows: c.layers.iter().map(|l| l.window).collect(),
    }
}

pub fn to_model_kv(k: KvType) -> model::KvType {
    match k {
        KvType::F16 => model::KvType::F16,
        KvType::Q8 => model::KvType::Q8,
        KvType::Q4 => model::KvType::Q4,
    }
}

pub fn from_model_kv(k: model::KvType) -> KvType {
    match k {
        model::KvType::F16 => KvType::F16,
        model::KvType::Q8 => KvType::Q8,
        model::KvType::Q4 => KvType::Q4,
    }
}

impl MemArgs {
    pub fn residency(&self) -> Option<Residency> {
        match self.load {
            LoadMode::Auto => None,
            LoadMode::Mmap => Some(Residency::Mmap),
            LoadMode::Populate => Some(Residency::Populate),
            LoadMode::Mlock => Some(Residency::Mlock),
            LoadMode::Stream => Some(Residency::Stream),
        }
    }

    pub fn budget(&self) -> Budget {
        probe::budget(self.ram)
    }
}

/// What was chosen for one run.
pub struct Planned {
    pub request: Request,
    pub prediction: Prediction,
    pub budget: Budget,
    pub verbose: bool,
    shape: Shape,
    facts: ModelFacts,
}

/// Weights residency and pressure governor kept alive for a run.
pub struct Residence {
    governor: Arc<Governor>,
    _monitor: Monitor,
    predicted: u64,
    verbose: bool,
}

impl Residence {
    /// Before a generation that may fill the KV cache up to `n_kv` positions: pins as many
    /// layers as the plan's peak leaves room for at that length (prints what moved).
    pub fn fit_kv(&self, n_kv: usize) {
        if let Some(line) = self.governor.fit_kv(n_kv) {
            eprintln!("{line}");
        }
    }

    /// With `--verbose`: peak RSS against the prediction and how many layers stayed pinned, on
    /// stderr.
    pub fn report(&self) {
        if self.verbose {
            if let Some(hwm) = probe::self_peak_rss() {
                let d = (hwm as f64 / self.predicted.max(1) as f64 - 1.0) * 100.0;
                eprintln!(
                    "snug: peak RSS (VmHWM) {} — predicted {} ({d:+.1}%)",
                    plan::fmt_bytes(hwm),
                    plan::fmt_bytes(self.predicted)
                );
            }
            let st = self.governor.streamer();
            eprintln!(
                "snug: {} of {} layers pinned at exit; {} streamed-weight drops",
                st.pinned(),
                st.n_layer(),
                st.drops.load(std::sync::atomic::Ordering::Relaxed)
            );
        }
    }
}

/// Chooses context, KV precision and residency for `model` within the budget; prints one line
/// saying what and why (`--verbose`: the whole plan). `n_kv`: the positions the job will fill
/// at most, when known (a short job leaves room for more pinned layers). Fails with numbers
/// when nothing fits.
#[allow(clippy::too_many_arguments)]
pub fn plan_run(
    mem: &MemArgs,
    model: &Model,
    ctx: Option<usize>,
    kv: Option<KvType>,
    n_ctx_min: usize,
    n_kv: Option<usize>,
    n_ubatch: usize,
    n_threads: usize,
) -> anyhow::Result<Planned> {
    let s = shape(&model.config);
    let facts = ModelFacts::from_gguf(&model.file);
    let budget = mem.budget();
    let wants = Wants {
        n_ctx: ctx,
        kv,
        residency: mem.residency(),
        n_ctx_min,
        n_kv,
        n_ubatch,
        n_threads,
        kv_available: KvType::ALL.to_vec(),
        kv_windowed: true,
    };
    let choice = plan::choose(&s, &facts, budget.bytes, &wants)
        .map_err(|e| anyhow::anyhow!("{e} (budget from {})", budget.source))?;
    eprintln!(
        "snug: {} — {}; budget {} from {}",
        plan::describe(&choice.request),
        choice.reason,
        plan::fmt_bytes(budget.bytes),
        budget.source
    );
    if mem.verbose {
        eprintln!("{}", crate::cmd_plan::breakdown(&choice.prediction));
    }
    Ok(Planned {
        request: choice.request,
        prediction: choice.prediction,
        budget,
        verbose: mem.verbose,
        shape: s,
        facts,
    })
}

impl Planned {
    /// Makes the weights resident as planned, hooks a [`Streamer`] into `ctx`'s layer loop (in
    /// every mode: it does nothing until layers are demoted) and starts the pressure monitor.
    pub fn attach(
        &self,
        model: &Arc<Model>,
        path: &std::path::Path,
        ctx: &Context,
    ) -> anyhow::Result<Residence> {
        let mapping = model
            .file
            .mapping()
            .cloned()
            .ok_or_else(|| anyhow::anyhow!("the model is not mapped from a file"))?;
        let map: &[u8] = &mapping;
        let layers: Vec<_> =
            (0..model.config.n_layer).map(|il| model.weights.layer_stages(il)).collect();
        let n_layer = layers.len();
        let (pinned, lock) = match self.request.residency {
            Residency::Mlock => {
                residency::populate(map);
                residency::lock_all(map).map_err(anyhow::Error::msg)?;
                (n_layer, true)
            }
            Residency::Populate => {
                residency::populate(map);
                (n_layer, false)
            }
            Residency::Mmap => (n_layer, false),
            // Pinned layers are kept, not locked: a limit lowered under the running model can
            // then be met by reclaiming their pages (cgroup v1 refuses a limit below locked
            // memory, v2 OOM-kills), and the governor turns them into streamed layers.
            Residency::Stream => (self.request.pinned_layers, false),
        };
        let streamer = Arc::new(
            Streamer::new(mapping, path, layers, pinned, lock, plan::stream_window(&self.facts))
                .map_err(anyhow::Error::msg)?,
        );
        ctx.set_layer_observer(streamer.clone());
        let fit = Fit::new(self.shape.clone(), self.facts.clone(), self.request, self.budget.bytes);
        let governor = Arc::new(Governor::new(fit, streamer, &self.budget));
        Ok(Residence {
            _monitor: Monitor::start(governor.clone(), Duration::from_millis(100)),
            governor,
            predicted: self.prediction.total,
            verbose: self.verbose,
        })
    }
}
