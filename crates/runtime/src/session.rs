//! The path from a model name to a running context, as one library call per step, shared by
//! every front end (the CLI's verbs, the server):
//!
//! 1. [`open`]: resolve a name (alias or path; an alias is pulled on first use), map the file,
//!    read its configuration and tokenizer.
//! 2. [`plan`]: context length, KV precision and residency chosen within the memory budget from
//!    the header alone ([`crate::plan::choose`]), or a typed [`RuntimeError`] that says why not.
//! 3. [`Planned::attach`]: make the weights resident as planned, hook the layer streamer into
//!    the context and start the pressure governor's monitor thread ([`crate::pressure`]).
//!
//! Nothing here prints or names a flag: results and errors carry the numbers, and each front
//! end words them for itself (flags for the CLI, HTTP statuses for the server).

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use memory::probe::{self, Budget};
use memory::residency::{self, ExpertCache, LayerObserver, Streamer};
use model::{Context, ContextParams, KvType, Model};
use tokenizer::Tokenizer;

use crate::plan::{self, Choice, DoesNotFit, ModelFacts, Request, Residency, Wants};
use crate::pressure::{Fit, Governor, Monitor};

/// How often the pressure monitor reads the budget.
pub const POLL_EVERY: Duration = Duration::from_millis(100);

/// Why a model could not be opened, planned or made resident.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error(transparent)]
    Hub(#[from] hub::HubError),
    #[error("loading {path}: {source}")]
    Load { path: PathBuf, source: model::ModelError },
    #[error("reading the tokenizer of {path}: {source}")]
    Tokenizer { path: PathBuf, source: tokenizer::TokenizerError },
    #[error("{path}: the tokenizer has {n_tok} tokens but the model's embedding has {n_vocab}")]
    VocabMismatch { path: PathBuf, n_tok: usize, n_vocab: usize },
    /// A size option is zero (`what`: the option's role, e.g. "context length").
    #[error("the {what} must be at least 1")]
    Zero { what: &'static str },
    /// The prompt alone needs more positions than the context holds.
    #[error("the prompt needs {needed} positions of context but the context holds {n_ctx}")]
    PromptTooLong { needed: usize, n_ctx: usize },
    /// Nothing fits the memory budget.
    #[error("{fit} (budget from {from})")]
    DoesNotFit { fit: Box<DoesNotFit>, from: probe::BudgetSource },
    /// The operating system refused to lock or map the weights as planned.
    #[error("making the weights resident: {0}")]
    Residency(String),
    /// The weights could not be locked in memory (`Residency::Mlock`).
    #[error("making the weights resident: {0}")]
    Lock(#[from] memory::residency::LockError),
}

/// A model resolved to its file and loaded with its tokenizer.
pub struct Loaded {
    /// The `.gguf` file (residency modes open it again for `posix_fadvise`).
    pub path: PathBuf,
    pub model: Arc<Model>,
    pub tok: Arc<Tokenizer>,
}

/// Resolves `name` (alias or path; pulls an alias if needed) and loads model and tokenizer.
pub fn open(name: &str) -> Result<Loaded, RuntimeError> {
    let path = hub::resolve(name)?;
    let model =
        Model::load(&path).map_err(|source| RuntimeError::Load { path: path.clone(), source })?;
    let tok = Tokenizer::from_gguf(&model.file)
        .map_err(|source| RuntimeError::Tokenizer { path: path.clone(), source })?;
    if tok.n_vocab() != model.config.n_vocab {
        return Err(RuntimeError::VocabMismatch {
            path,
            n_tok: tok.n_vocab(),
            n_vocab: model.config.n_vocab,
        });
    }
    Ok(Loaded { path, model: Arc::new(model), tok: Arc::new(tok) })
}

/// Memory options: the budget and how the weights stay in memory.
#[derive(Clone, Copy, Debug, Default)]
pub struct MemOptions {
    /// Bytes the process may hold (default: the cgroup limit, else MemAvailable).
    pub ram: Option<u64>,
    /// Residency mode (default: mmap when the model fits, else streaming).
    pub residency: Option<Residency>,
}

impl MemOptions {
    pub fn budget(&self) -> Budget {
        probe::budget(self.ram)
    }
}

/// What a front end asks of one context; `None` fields are chosen within the budget.
#[derive(Clone, Copy, Debug)]
pub struct RunOptions {
    pub n_ctx: Option<usize>,
    /// Worker threads (default: the CPUs available to this process).
    pub n_threads: Option<usize>,
    /// Tokens computed together during prompt processing.
    pub n_ubatch: usize,
    /// Key and value precisions.
    pub kv: Option<(KvType, KvType)>,
    /// Keep only the last `kv_window` positions (plus `kv_sinks` first ones) of layers without
    /// a window of their own; positions may then run past the context (context shift).
    pub kv_window: Option<usize>,
    pub kv_sinks: usize,
    /// Sequences held and decoded together (a server's parallel slots).
    pub n_seq: usize,
    pub mem: MemOptions,
    /// Heap bytes of the LoRA adapters the run applies (`model::Lora::bytes`), which the plan
    /// counts.
    pub adapter_bytes: u64,
    /// JSON mode may run (a server; [`crate::plan::Request::json_mode`]).
    pub json_mode: bool,
    /// Drafted tokens a step may verify ([`crate::plan::Request::draft_tokens`]; 0 without).
    pub draft_tokens: usize,
    /// A draft model's peak beside the model ([`crate::plan::draft_bytes`]; 0 without).
    pub draft_bytes: u64,
    /// The prefix cache's disk tier is on ([`crate::plan::Request::prefix_disk`]).
    pub prefix_disk: bool,
}

impl Default for RunOptions {
    fn default() -> Self {
        let p = ContextParams::default();
        RunOptions {
            n_ctx: None,
            n_threads: None,
            n_ubatch: p.n_ubatch,
            kv: None,
            kv_window: None,
            kv_sinks: p.kv_sinks,
            n_seq: 1,
            mem: MemOptions::default(),
            adapter_bytes: 0,
            json_mode: false,
            draft_tokens: 0,
            draft_bytes: 0,
            prefix_disk: false,
        }
    }
}

/// The CPUs available to this process.
pub fn default_threads() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

/// What was chosen for one context: the planner's choice and the budget it was chosen in.
pub struct Planned {
    pub choice: Choice,
    pub budget: Budget,
    facts: ModelFacts,
}

impl Planned {
    pub fn request(&self) -> &Request {
        &self.choice.request
    }

    /// Weight bytes one decoded token of this model reads ([`ModelFacts::bytes_read_per_token`]).
    pub fn bytes_read_per_token(&self, c: &model::config::ModelConfig) -> u64 {
        self.facts.bytes_read_per_token(c)
    }

    /// One line: the configuration, why, and the budget (`ctx 4096, KV f16, mmap — predicted
    /// peak … fits …; budget 6.00 GiB from cgroup v1 …`).
    pub fn summary(&self) -> String {
        self.summary_from(&self.budget.source.to_string())
    }

    /// [`Planned::summary`] with the budget's source in the caller's words (a front end names
    /// its own option for a budget it was given).
    pub fn summary_from(&self, source: &str) -> String {
        format!(
            "{} — {}; budget {} from {source}",
            plan::describe(&self.choice.request),
            self.choice.reason,
            plan::fmt_bytes(self.budget.bytes),
        )
    }
}

/// Chooses the context sizes for `o.n_seq` sequences and the memory plan behind them. `needed`: the
/// least context the job needs (prompt + 1); `n_kv`: the most positions it will fill when that
/// is known (prompt + tokens to generate: a short job leaves room for more pinned layers).
pub fn plan(
    model: &Model,
    o: &RunOptions,
    needed: usize,
    n_kv: Option<usize>,
) -> Result<(ContextParams, Planned), RuntimeError> {
    let c = &model.config;
    let n_ctx = c.n_ctx_or_default(o.n_ctx, needed);
    let n_threads = o.n_threads.unwrap_or_else(default_threads);
    for (v, what) in
        [(n_ctx, "context length"), (n_threads, "thread count"), (o.n_ubatch, "micro-batch")]
    {
        if v == 0 {
            return Err(RuntimeError::Zero { what });
        }
    }
    if o.kv_window == Some(0) {
        return Err(RuntimeError::Zero { what: "KV window" });
    }
    if needed > n_ctx && o.kv_window.is_none() {
        return Err(RuntimeError::PromptTooLong { needed, n_ctx });
    }
    let budget = o.mem.budget();
    let wants = Wants {
        n_ctx: o.n_ctx,
        kv: o.kv,
        residency: o.mem.residency,
        // A window lets positions run past the context: any context will do.
        n_ctx_min: if o.kv_window.is_some() { 1 } else { needed },
        n_kv,
        n_ubatch: o.n_ubatch,
        n_threads,
        n_seq: o.n_seq.max(1),
        kv_available: KvType::ALL.to_vec(),
        kv_windowed: true,
        json_mode: o.json_mode,
        draft_tokens: o.draft_tokens,
        prefix_disk: o.prefix_disk,
    };
    let facts = ModelFacts {
        adapter_bytes: o.adapter_bytes,
        draft_bytes: o.draft_bytes,
        ..ModelFacts::from_gguf(&model.file, c)
    };
    let choice = plan::choose(c, &facts, budget.bytes, &wants)
        .map_err(|fit| RuntimeError::DoesNotFit { fit, from: budget.source.clone() })?;
    let params = choice.request.context_params(ContextParams {
        kv_window: o.kv_window,
        kv_sinks: o.kv_sinks,
        ..ContextParams::default()
    });
    Ok((params, Planned { choice, budget, facts }))
}

/// Weights residency and the pressure governor kept alive for a context.
pub struct Residence {
    governor: Arc<Governor>,
    _monitor: Monitor,
    predicted: u64,
}

impl Planned {
    /// Makes the weights resident as planned, hooks a [`Streamer`] into `ctx`'s layer loop (in
    /// every mode: it does nothing until layers are demoted) and starts the pressure monitor,
    /// which hands each line it has to say to `log`.
    pub fn attach(
        &self,
        loaded: &Loaded,
        ctx: &Context,
        log: impl Fn(&str) + Send + 'static,
    ) -> Result<Residence, RuntimeError> {
        let model = &loaded.model;
        let mapping =
            model.file.mapping().cloned().ok_or_else(|| {
                RuntimeError::Residency("the model is not mapped from a file".into())
            })?;
        let map: &[u8] = &mapping;
        let request = self.choice.request;
        // Under an expert cache the layers' stages leave the experts out.
        let apart = request.residency == Residency::Stream && request.expert_cache > 0;
        let layers: Vec<_> =
            (0..model.config.n_layer).map(|il| model.weights.layer_stages(il, apart)).collect();
        let n_layer = layers.len();
        if apart {
            // What every token reads (the pinned layers' attention, norms and router, and the
            // output projection) is read in now and nothing else of the file stays, and from
            // then on a fault reads only its page: the experts are the cache's to read, and
            // read-around of an embedding row or of a page reclaimed under the limit would fill
            // the page cache with experts nobody chose, against the limit.
            let mut hot: Vec<(usize, usize)> = layers[..request.pinned_layers.min(n_layer)]
                .iter()
                .flatten()
                .flatten()
                .copied()
                .collect();
            let out = &model.weights.output;
            hot.push((out.offset, out.offset + out.len));
            residency::read_in_only(&loaded.path, map, &hot).map_err(RuntimeError::Residency)?;
        }
        let (pinned, lock) = match request.residency {
            Residency::Mlock => {
                residency::populate(map);
                residency::lock_all(map)?;
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
            Residency::Stream => (request.pinned_layers, false),
        };
        let mut streamer = Streamer::new(
            mapping,
            &loaded.path,
            layers,
            pinned,
            lock,
            plan::stream_window(&self.facts),
        )
        .map_err(RuntimeError::Residency)?;
        if apart {
            let n_expert = model.config.moe.map_or(0, |m| m.n_expert);
            let ranges = model.weights.expert_ranges(n_expert);
            let cache = ExpertCache::new(&loaded.path, ranges, request.expert_cache)
                .map_err(RuntimeError::Residency)?;
            streamer = streamer.with_experts(cache);
        }
        let streamer = Arc::new(streamer);
        ctx.set_layer_observer(streamer.clone());
        let fit = Fit::new(model.config.clone(), self.facts.clone(), request, self.budget.bytes);
        let governor = Arc::new(Governor::new(fit, streamer, &self.budget));
        Ok(Residence {
            _monitor: Monitor::start(governor.clone(), POLL_EVERY, log),
            governor,
            predicted: self.choice.prediction.total,
        })
    }
}

impl Residence {
    /// Before a generation that may fill the KV cache up to `n_kv` positions: pins as many
    /// layers as the plan's peak leaves room for at that length; says what moved, if anything.
    pub fn fit_kv(&self, n_kv: usize) -> Option<String> {
        self.governor.fit_kv(n_kv)
    }

    /// The expert cache, when a mixture of experts' experts are kept apart from its layers.
    pub fn experts(&self) -> Option<&ExpertCache> {
        self.governor.streamer().experts()
    }

    /// Peak RSS against the prediction and how many layers stayed pinned.
    pub fn report(&self) -> String {
        let mut out = String::new();
        if let Some(hwm) = probe::self_peak_rss() {
            let d = (hwm as f64 / self.predicted.max(1) as f64 - 1.0) * 100.0;
            out += &format!(
                "snug: peak RSS (VmHWM) {} — predicted {} ({d:+.1}%)\n",
                plan::fmt_bytes(hwm),
                plan::fmt_bytes(self.predicted)
            );
        }
        let st = self.governor.streamer();
        out += &format!(
            "snug: {} of {} layers pinned at exit; {} streamed-weight drops",
            st.pinned(),
            st.n_layer(),
            st.drops.load(Ordering::Relaxed)
        );
        if let Some(c) = self.experts() {
            let s = c.stats();
            out += &format!(
                "\nsnug: expert cache {} ({} experts): {} hits, {} misses ({:.1}% hit), {} read",
                plan::fmt_bytes(c.bytes()),
                c.slots(),
                s.hits.load(Ordering::Relaxed),
                s.misses.load(Ordering::Relaxed),
                100.0 * s.hit_rate(),
                plan::fmt_bytes(s.bytes_read.load(Ordering::Relaxed))
            );
        }
        out
    }
}
