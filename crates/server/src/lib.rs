//! `snug serve`: the OpenAI and Ollama HTTP APIs over snug's continuous-batching scheduler.
//!
//! Design: the engine's scheduler ([`engine::scheduler`]: one thread) owns the model's context
//! and runs every admitted request in one forward pass per step, each job's admission and step
//! isolated so that a panic fails that request alone (a 500) and `/health` says 503 if the
//! thread is ever gone. This crate is the HTTP side: it decodes a request into a
//! [`scheduler::Request`], submits it on the scheduler's [`Handle`] and turns the events back
//! into a response; `/metrics` registers the scheduler's [`scheduler::Counters`]. The HTTP side
//! (axum on a single-threaded tokio runtime) relays text; a request's decoding, schema compile,
//! template render and tokenization run on the blocking pool after the cheap refusals (unknown
//! model, no place free, a text certainly too long), so one heavy request cannot stall the
//! others. Each request gets an unbounded channel of [`scheduler::Event`]s
//! that its handler turns into a JSON body, SSE (`data: …` ending in `data: [DONE]`, OpenAI) or
//! NDJSON (Ollama). A handler dropped by a client that went away drops its receiver, and the
//! scheduler frees that sequence's KV blocks at its next step.
//!
//! Admission: `--parallel N` sequences run at once (the KV cache is planned for N whole
//! contexts, so a running request never runs out of blocks); up to `--queue` more wait; past
//! that a request is refused at once with 429 and `Retry-After`. A prompt that can never fit
//! the context is a 400 that says how many tokens it has and how many fit.
//!
//! A replica behind an inference gateway ([`replica`]): the port binds before the model loads,
//! `/ready` says 200 once the scheduler serves, vLLM's adapter load and unload routes are
//! there, and SIGTERM drains (503 to new work, `--drain-timeout` for the rest, then exit 0);
//! `/metrics` carries the gateway's protocol gauges under vLLM's names ([`metrics::vllm`]).
//!
//! The HTTP surface has one owner: the route table ([`routes::table`]) lists each path, its
//! handler, and the types it reads and answers ([`responses`]: the handlers send those
//! structs), and both the router and `/openapi.json` ([`openapi`]) are built from it.
//!
//! Beside the generation routes: `/health`, `/metrics` ([`metrics`]), `/openapi.json`, fill-in-the-middle
//! ([`fim`]: llama-server's `/infill`, the `suffix` of `/api/generate` and `/v1/completions`),
//! embeddings ([`embeddings`]: `/v1/embeddings`, `/api/embed`, `/api/embeddings`, run as
//! scheduler jobs beside generation), Ollama's `/api/pull`,
//! which fetches a known model into the cache without changing the served one, and `/ui`
//! ([`ui`]), a page showing the memory plan, the load and a chat.
//!
//! LoRA adapters ([`adapters`]): `BASE:ADAPTER` model names and llama-server's `lora` field pick
//! a request's adapters, leased in the handler (a cold one loads on the blocking pool) and
//! carried by the job; the scheduler applies them to that sequence only. `/v1/adapters` lists,
//! adds (a file of `--lora-dir`, nothing else) and removes them; `/lora-adapters` is
//! llama-server's list and default scales.
//!
//! Safety: loopback by default; `--api-key` requires `Authorization: Bearer` on every route but
//! `/health` and the page `/ui`; every request number and list is bounded ([`api::limits`]);
//! bodies are limited to `max_body` bytes; a request's model name is only compared
//! with the served model's and the registered adapters' names, never opened
//! ([`ModelCard::matches`]); an adapter file named over HTTP is confined to `--lora-dir`
//! ([`adapters::open_confined`]); [`access`] checks `Host`, `Origin`, the content type, the
//! key and the admin routes; [`transport`] bounds header, body and idle time and the open
//! connections. docs/SECURITY.md has the threat model. Cost of the HTTP side:
//! a template render and a tokenization per request, a small JSON encode per text piece.

pub mod access;
pub mod adapters;
pub mod agents;
pub mod api;
pub mod conns;
pub mod embeddings;
pub mod error;
pub mod fim;
pub mod flags;
pub mod keepalive;
pub mod logprobs;
pub mod metrics;
pub mod ollama;
pub mod openai;
pub mod openapi;
pub mod replica;
pub mod requests;
pub mod responses;
pub mod routes;
pub mod stall;
pub mod tools;
pub mod transport;
pub mod ui;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use model::lora::AdapterStore;
use model::{Context, ContextParams, Model};
use tokenizer::{ChatTemplate, Tokenizer};

use engine::scheduler::{self, Handle, SchedulerOptions};

/// How the server is run.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    pub host: String,
    pub port: u16,
    /// Required as `Authorization: Bearer KEY` when set.
    pub api_key: Option<String>,
    /// Required for the admin routes when set (and accepted wherever `api_key` is).
    pub admin_key: Option<String>,
    /// Without `admin_key`: the admin routes are open to whoever may use the API (else off).
    pub allow_admin: bool,
    /// Browser origins that may call the server (`*`: any); others are refused.
    pub allowed_origins: Vec<String>,
    /// Header, body and idle timeouts and the connection cap.
    pub limits: transport::Limits,
    /// Largest request body accepted, in bytes.
    pub max_body: usize,
    /// Requests waiting for a free sequence at most.
    pub queue: usize,
    /// Prefill tokens per step while other sequences decode (`None`: sized from step times).
    pub prefill_chunk: Option<usize>,
    /// Prompt-lookup speculative decoding while few sequences decode
    /// (`engine::scheduler::SchedulerOptions::draft`; the context was planned with its rows).
    pub draft: bool,
    /// The name clients use for the model (the alias or the file's stem).
    pub name: String,
    /// The memory budget the plan was made in, in bytes (shown beside the RSS in /metrics).
    pub budget: u64,
    /// `--lora-dir`: every `*.gguf` adapter there is served by its stem, and adapters may be
    /// added from it over HTTP.
    pub lora_dir: Option<PathBuf>,
    /// `--lora FILE[:SCALE]`: served by their stems, applied by default.
    pub loras: Vec<(PathBuf, f32)>,
    /// Bytes the adapter store may keep hot (the plan's adapter share).
    pub adapter_budget: usize,
    /// The plan's memory numbers, for the page's memory picture (`/ui`).
    pub plan: ui::PlanPicture,
    /// `--max-loras`: adapters kept ready at once (the protocol metrics' `max_lora`).
    pub max_loras: usize,
    /// `--drain-timeout`: how long requests in flight may take to finish after SIGTERM.
    pub drain_timeout: std::time::Duration,
    /// `--pooling`: how embeddings pool token states (`None`: the file's, else mean).
    pub pooling: Option<model::config::Pooling>,
    /// `--chat-template-file`: a chat template used instead of the model's (llama-server's
    /// flag: for a model whose own template is missing, broken or renders no tools).
    pub chat_template: Option<String>,
    /// `--prefix-cache-dir` and `--prefix-cache-disk`: the prefix cache's disk tier
    /// (`model::kv::disk`); `None`: off.
    pub prefix_disk: Option<model::kv::disk::DiskConfig>,
}

/// Where the memory governor's reactions go (the `log` of `runtime::Planned::attach`): each is
/// printed on stderr, counted in `/metrics` as a memory-pressure event, and sheds the prefix
/// cache (cached blocks no sequence holds are the first memory given back). The residency's
/// expert cache, when it has one, reports its counters here too, for `/metrics`.
#[derive(Clone)]
pub struct PressureLog {
    events: prometheus_client::metrics::counter::Counter,
    shed: scheduler::Shed,
    experts: metrics::ExpertSlot,
}

impl PressureLog {
    /// The expert cache's counters, which `/metrics` reports from now on.
    pub fn experts(&self, stats: Arc<memory::residency::ExpertStats>) {
        let _ = self.experts.set(stats);
    }

    pub fn say(&self, line: &str) {
        self.events.inc();
        self.shed.request();
        eprintln!("{line}");
    }
}

impl From<scheduler::Died> for ServeError {
    fn from(_: scheduler::Died) -> ServeError {
        ServeError::SchedulerDied
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot listen on {addr}: {reason}")]
    Bind { addr: String, reason: std::io::Error },
    /// The weights could not be made resident for the context (the caller's words).
    #[error("{0}")]
    Attach(String),
    #[error("the HTTP server failed: {0}")]
    Io(#[from] std::io::Error),
    #[error("the scheduler thread ended before its context was ready")]
    SchedulerDied,
    #[error("{0}")]
    Adapter(String),
    #[error("{0}")]
    Options(String),
}

/// The adapter store of a server with `opts`: when it serves adapters, one taking its pages
/// from the context's KV page pool (the plan's adapter share of it), so adapters and KV blocks
/// are one pool; else an empty one. Called on the scheduler thread, beside the context.
fn adapter_store(ctx: &mut Context, opts: &ServeOptions) -> Arc<AdapterStore> {
    let cfg = ctx.config().clone();
    if opts.lora_dir.is_none() && opts.loras.is_empty() {
        return Arc::new(AdapterStore::new(&cfg, 0));
    }
    let pool = ctx.kv.share_pool(opts.adapter_budget);
    Arc::new(AdapterStore::with_pool(&cfg, pool))
}

/// `store` with `opts`' adapters registered: every `*.gguf` of `--lora-dir` (a file that is
/// not a usable adapter is skipped with a warning on stderr) and each `--lora` file (an error
/// if it does not load or its stem names another file), the latter with their default scales.
pub fn open_adapters(
    store: Arc<AdapterStore>,
    opts: &ServeOptions,
) -> Result<adapters::Adapters, ServeError> {
    let stem =
        |p: &Path| p.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    if let Some(dir) = &opts.lora_dir {
        let files = adapters::dir_files(dir).map_err(|e| {
            ServeError::Adapter(format!("cannot read the adapter directory {}: {e}", dir.display()))
        })?;
        for f in files {
            if store.list().len() >= adapters::MAX_ADAPTERS {
                eprintln!(
                    "snug: skipping adapter {}: {} adapters are registered, the most a server keeps",
                    f.real.display(),
                    adapters::MAX_ADAPTERS
                );
                continue;
            }
            let ok = adapters::check_name(&f.stem).and_then(|()| {
                adapters::register_opened(&store, &f.stem, &f.real, &f.file)
                    .map(drop)
                    .map_err(|e| e.to_string())
            });
            if let Err(e) = ok {
                eprintln!("snug: skipping adapter {}: {e}", f.real.display());
            }
        }
    }
    let mut defaults = Vec::new();
    for (path, scale) in &opts.loras {
        let name = stem(path);
        let real = path
            .canonicalize()
            .map_err(|e| ServeError::Adapter(format!("adapter {}: {e}", path.display())))?;
        let known = store.list().into_iter().find(|a| a.name == name);
        match known {
            Some(a) if a.path.canonicalize().ok().as_ref() == Some(&real) => {}
            Some(a) => {
                return Err(ServeError::Adapter(format!(
                    "adapters {} and {} are both named {name:?}: rename one",
                    path.display(),
                    a.path.display()
                )))
            }
            None => {
                adapters::check_name(&name)
                    .map_err(|e| ServeError::Adapter(format!("adapter {}: {e}", path.display())))?;
                store
                    .register(&name, &real)
                    .map_err(|e| ServeError::Adapter(format!("adapter {}: {e}", path.display())))?;
            }
        }
        defaults.push((name, *scale));
    }
    adapters::Adapters::new(store, opts.lora_dir.as_deref(), &defaults, &opts.name)
        .map_err(|e| ServeError::Adapter(format!("cannot open the adapter directory: {e}")))
}

/// What the APIs tell about the served model.
#[derive(Clone, Debug)]
pub struct ModelCard {
    pub name: String,
    pub path: PathBuf,
    pub size: u64,
    pub arch: String,
    pub n_params: u64,
    /// The most common weight type of the layers (`Q4_K`, `Q8_0`...).
    pub quant: String,
    pub n_ctx_train: usize,
    /// Modification time of the file, seconds since the epoch.
    pub modified: u64,
    /// A 64-bit fingerprint of name, size and modification time, in hex (not a sha256: hashing
    /// gigabytes at start is not worth what clients do with it, which is display it).
    pub digest: String,
}

impl ModelCard {
    pub fn new(name: &str, path: &Path, model: &Model) -> ModelCard {
        let f = &model.file;
        let mut types: Vec<(String, u64)> = Vec::new();
        for t in f.tensors.iter().filter(|t| t.name.starts_with("blk.")) {
            let ty = t.ggml_type.to_string();
            match types.iter_mut().find(|(n, _)| *n == ty) {
                Some((_, b)) => *b += t.size,
                None => types.push((ty, t.size)),
            }
        }
        let quant = types.into_iter().max_by_key(|&(_, b)| b).map(|(t, _)| t).unwrap_or_default();
        let modified = std::fs::metadata(path)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_secs());
        let size = f.file_len();
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in name.bytes().chain(size.to_le_bytes()).chain(modified.to_le_bytes()) {
            h = (h ^ b as u64).wrapping_mul(0x100_0000_01b3);
        }
        ModelCard {
            name: name.to_string(),
            path: path.to_path_buf(),
            size,
            arch: f.architecture().unwrap_or("unknown").to_string(),
            n_params: f.tensors.iter().map(|t| t.n_elements()).sum(),
            quant,
            n_ctx_train: model.config.n_ctx_train,
            modified,
            digest: format!("{h:016x}"),
        }
    }

    /// True if a request's `model` names this model: its name, with or without Ollama's
    /// `:latest` tag, or its file's name. Nothing else is ever looked up.
    pub fn matches(&self, asked: &str) -> bool {
        let asked = asked.strip_suffix(":latest").unwrap_or(asked);
        let file = self.path.file_name().and_then(|s| s.to_str()).unwrap_or("");
        let stem = self.path.file_stem().and_then(|s| s.to_str()).unwrap_or("");
        asked == self.name || asked == file || asked == stem
    }

    /// Parameters the way Ollama shows them: `494.0M`, `1.5B`.
    pub fn parameter_size(&self) -> String {
        let n = self.n_params as f64;
        if n >= 1e9 {
            format!("{:.1}B", n / 1e9)
        } else {
            format!("{:.1}M", n / 1e6)
        }
    }
}

/// The state every handler reads (axum's extractor for it).
pub type Shared = axum::extract::State<Arc<AppState>>;

/// Everything a handler needs.
pub struct AppState {
    pub engine: Handle,
    pub tok: Arc<Tokenizer>,
    /// The chat template, or why the model's would not parse.
    pub template: Result<ChatTemplate, String>,
    pub card: ModelCard,
    pub metrics: metrics::Metrics,
    pub api_key: Option<String>,
    /// The `Host`, `Origin`, content-type, key and admin checks.
    pub access: access::Access,
    /// A request body must arrive whole within this.
    pub body_timeout: std::time::Duration,
    /// Largest request body accepted, in bytes (`Content-Length` past it: 413 before reading).
    pub max_body: usize,
    pub started: Instant,
    pub adapters: Arc<adapters::Adapters>,
    /// The plan's memory numbers (`/ui/memory`).
    pub plan: ui::PlanPicture,
    /// Set once a drain starts ([`replica::drain`]): `/ready` and every `POST` answer 503.
    pub draining: std::sync::atomic::AtomicBool,
    /// How embeddings are pooled ([`embeddings`]).
    pub embedding: embeddings::Embedding,
}

/// Seconds since the epoch.
pub fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// Opens the server on `opts.host:opts.port` for `model` (read from `path`) in a context of
/// `params`, and serves until Ctrl-C or SIGTERM. `attach` runs on the scheduler thread once
/// the context exists (e.g. to make the weights resident as planned, hook a layer streamer and
/// start the pressure monitor, whose lines go to the [`PressureLog`] it is given); what it
/// returns lives as long as the context.
pub fn serve<R: 'static>(
    model: Arc<Model>,
    tok: Arc<Tokenizer>,
    path: &Path,
    params: ContextParams,
    opts: ServeOptions,
    attach: impl FnOnce(&Context, PressureLog) -> Result<R, String> + Send + 'static,
) -> Result<(), ServeError> {
    check_options(&opts)?;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let served = rt.block_on(async move {
        let addr = format!("{}:{}", opts.host, opts.port);
        let listener = tokio::net::TcpListener::bind(&addr)
            .await
            .map_err(|reason| ServeError::Bind { addr: addr.clone(), reason })?;
        let local: SocketAddr = listener.local_addr()?;
        let loopback = local.ip().is_loopback();
        if !loopback && opts.api_key.is_none() {
            eprintln!("snug: warning: listening on {local}, reachable from other machines, without an API key: anyone who can connect may use it (set SNUG_API_KEY)");
        }
        // The model loads on its own thread while the port answers probes.
        let (tx, mut loaded) = tokio::sync::oneshot::channel();
        let (path, o) = (path.to_path_buf(), opts.clone());
        std::thread::spawn(move || {
            replica::test_load_delay();
            let _ = tx.send(open(model, tok, &path, params, &o, attach));
        });
        let mut state = None;
        let until_loaded = async {
            tokio::select! {
                r = &mut loaded => state = Some(r.map_err(|_| ServeError::SchedulerDied)),
                _ = shutdown() => {}
            }
        };
        let loading = replica::loading_router();
        let counts = transport::Counts::default();
        transport::serve(&listener, loading, opts.limits, counts, until_loaded).await?;
        let Some(state) = state else { return Ok(()) };
        let state = state??;
        let access = access::Access::new(
            opts.api_key.as_deref(),
            opts.admin_key.as_deref(),
            opts.allow_admin,
            &opts.host,
            loopback,
            &opts.allowed_origins,
        );
        let state = Arc::new(AppState { access, ..state });
        eprintln!(
            "snug: serving {} on http://{local} — {} parallel sequences, context {} each, queue {}, {} adapters",
            state.card.name,
            state.engine.n_seq,
            state.engine.n_ctx,
            state.engine.queue,
            state.adapters.list().len()
        );
        tokio::spawn(adapters::demote_idle(state.adapters.store.clone()));
        let counts = transport::Counts {
            refused: state.metrics.connections_refused.clone(),
            evicted: state.metrics.connections_evicted.clone(),
        };
        let app = router(state.clone(), opts.max_body);
        let stop = async {
            shutdown().await;
            replica::drain(&state, opts.drain_timeout).await;
        };
        transport::serve(&listener, app, opts.limits, counts, stop).await?;
        // The disk tier's queue is written before the process ends (at most a few seconds).
        let until = Instant::now() + std::time::Duration::from_secs(10);
        let queued = || state.metrics.disk.queued.load(std::sync::atomic::Ordering::Acquire);
        while queued() > 0 && Instant::now() < until {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        eprintln!("snug: stopped");
        Ok(())
    });
    // Blocking work still running (a request being prepared, a pull) must not hold the exit
    // past --drain-timeout: dropping a runtime waits for it without bound.
    rt.shutdown_timeout(std::time::Duration::from_millis(500));
    served
}

/// Every route of a server on `state` ([`routes::table`]); bodies above `max_body` bytes are
/// refused with 413.
pub fn router(state: Arc<AppState>, max_body: usize) -> axum::Router {
    routes::router(state, max_body)
}

/// Everything [`serve`] serves, before it binds: the scheduler running on a context of
/// `params` (with `attach` run on its thread), the adapters, metrics and model card. Its
/// [`AppState::access`] is the default (no key, no Host check); `serve` sets the real one once
/// it knows the bound address. In-process drivers (the end-to-end fuzz target) route requests
/// to it with [`router`].
pub fn open<R: 'static>(
    model: Arc<Model>,
    tok: Arc<Tokenizer>,
    path: &Path,
    params: ContextParams,
    opts: &ServeOptions,
    attach: impl FnOnce(&Context, PressureLog) -> Result<R, String> + Send + 'static,
) -> Result<AppState, ServeError> {
    let card = ModelCard::new(&opts.name, path, &model);
    let embedding = embeddings::Embedding {
        pooling: engine::embed::pooling_for(&model.config, opts.pooling),
        n_embd: model.config.n_embd,
        from_file: model.config.pooling.is_some(),
    };
    let template = match &opts.chat_template {
        Some(src) => ChatTemplate::new(src, &tok),
        None => ChatTemplate::from_gguf(&model.file, &tok),
    }
    .map_err(|e| e.to_string());
    let sched = SchedulerOptions {
        queue: opts.queue,
        prefill_chunk: opts.prefill_chunk,
        draft: opts.draft,
    };
    let counters = scheduler::Counters::default();
    let mut metrics = metrics::Metrics::new(&counters, opts.budget);
    let shed = scheduler::Shed::default();
    let pressure = PressureLog {
        events: metrics.pressure_events.clone(),
        shed: shed.clone(),
        experts: metrics.experts.clone(),
    };
    let disk_stats = metrics.disk.clone();
    let (store_tx, store_rx) = std::sync::mpsc::channel();
    let store_opts = opts.clone();
    let engine = scheduler::spawn_with_shed(tok.clone(), sched, counters, shed, move || {
        let mut ctx = Context::new(model, params);
        if let Some(cfg) = &store_opts.prefix_disk {
            if let Err(e) = ctx.kv.attach_disk(cfg, disk_stats) {
                eprintln!(
                    "snug: warning: the prefix cache's disk tier in {} is off: {e}; prompts are computed as usual",
                    cfg.dir.display()
                );
            }
        }
        let _ = store_tx.send(adapter_store(&mut ctx, &store_opts));
        let keep = attach(&ctx, pressure).map_err(ServeError::Attach)?;
        Ok::<_, ServeError>((ctx, keep))
    })?;
    // Sent before the context's `attach`, which `spawn_with_shed` waited for.
    let store = store_rx.recv().map_err(|_| ServeError::SchedulerDied)?;
    metrics.set_store(store.clone());
    metrics.set_engine(&engine, store.clone(), opts.max_loras);
    let adapters = Arc::new(open_adapters(store, opts)?);
    Ok(AppState {
        engine,
        tok,
        template,
        card,
        metrics,
        api_key: opts.api_key.clone(),
        access: access::Access::default(),
        body_timeout: opts.limits.body_timeout,
        max_body: opts.max_body,
        started: Instant::now(),
        adapters,
        plan: opts.plan.clone(),
        draining: Default::default(),
        embedding,
    })
}

/// Refuses options the server cannot honour: keys a client could not send, administration
/// opened to anyone on a non-loopback address.
fn check_options(opts: &ServeOptions) -> Result<(), ServeError> {
    for (what, key) in [("the API key", &opts.api_key), ("the admin key", &opts.admin_key)] {
        if let Some(k) = key {
            access::check_key(what, k).map_err(ServeError::Options)?;
        }
    }
    Ok(())
}

/// Resolves on Ctrl-C or SIGTERM.
async fn shutdown() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
    }
    eprintln!("snug: shutting down");
}
