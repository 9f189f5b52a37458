//! `snug serve [MODEL]`: the OpenAI and Ollama HTTP APIs over the continuous-batching scheduler
//! (crate `server`). The KV cache is planned for `--parallel` whole contexts within the memory
//! budget; a plan that does not fit fails here, before anything listens.
//!
//! LoRA adapters: `--lora-dir DIR` serves every `*.gguf` adapter in DIR as `MODEL:STEM` (and
//! lets clients add files of DIR and remove adapters while serving); `--lora FILE[:SCALE]`
//! serves FILE the same way and applies it by default. The plan's adapter share is what the
//! adapter store may keep hot: `--max-loras` times the largest adapter's converted size (f32
//! rows, `4·r·(n_in + n_out)` bytes a matrix, read from the files' headers), or the `--lora`
//! files' sizes if larger.

use clap::Args;
use runtime::RunOptions;

use crate::cmd_ps::{DEFAULT_HOST, DEFAULT_PORT};
use crate::common::{explain, open, RunArgs, DEFAULT_MODEL};

#[derive(Args, Debug)]
pub struct ServeCmd {
    /// Model alias or .gguf path.
    #[arg(default_value = DEFAULT_MODEL)]
    pub model: String,
    /// Address to listen on (loopback by default: other machines cannot connect).
    #[arg(long, default_value = DEFAULT_HOST)]
    pub host: String,
    #[arg(long, default_value_t = DEFAULT_PORT)]
    pub port: u16,
    /// Sequences computed together (each gets a whole context of KV cache).
    #[arg(long, short = 'p', default_value_t = 4)]
    pub parallel: usize,
    /// Requests that may wait for a free sequence; past that, 429 with Retry-After.
    #[arg(long, default_value_t = 16)]
    pub queue: usize,
    /// Require `Authorization: Bearer KEY` (default: $SNUG_API_KEY; unset: no key needed).
    #[arg(long)]
    pub api_key: Option<String>,
    /// Largest request body in bytes.
    #[arg(long, default_value_t = 4 << 20)]
    pub max_body: usize,
    /// Prompt tokens computed per step while other sequences generate (default: sized so a
    /// step costs about two generation steps).
    #[arg(long)]
    pub prefill_chunk: Option<usize>,
    /// The name clients use for the model (default: MODEL as given, or the file's stem).
    #[arg(long)]
    pub name: Option<String>,
    /// A directory of LoRA adapters (`*.gguf`): each is served as MODEL:STEM, and clients may
    /// add more of its files (`POST /v1/adapters`) and remove adapters while serving.
    #[arg(long, value_name = "DIR")]
    pub lora_dir: Option<std::path::PathBuf>,
    /// Adapters kept converted in memory at once (the plan reserves room for this many of the
    /// largest in --lora-dir); others wait on disk and load on their first request. Default 4:
    /// room for 4 rank-16 adapters on all seven projections of a 7B model is ~0.6 GiB.
    #[arg(long, default_value_t = 4)]
    pub max_loras: usize,
    #[command(flatten)]
    pub run: RunArgs,
}

pub fn run(cmd: ServeCmd) -> anyhow::Result<()> {
    if cmd.parallel == 0 {
        anyhow::bail!("--parallel must be at least 1");
    }
    if cmd.run.kv.window.is_some() {
        anyhow::bail!(
            "--window is not supported by snug serve: each sequence keeps its whole context"
        );
    }
    if let Some(d) = &cmd.lora_dir {
        if !d.is_dir() {
            anyhow::bail!("--lora-dir {} is not a directory", d.display());
        }
    }
    let m = open(&cmd.model)?;
    let adapter_bytes = adapter_share(&cmd, &m.model.config)?;
    let (kv_k, kv_v) = cmd.run.kv.types()?;
    let kv_given =
        cmd.run.kv.kv.is_some() || cmd.run.kv.kv_k.is_some() || cmd.run.kv.kv_v.is_some();
    let o = RunOptions {
        n_ctx: cmd.run.ctx,
        n_threads: cmd.run.threads,
        n_ubatch: cmd.run.ubatch,
        kv: kv_given.then_some((kv_k, kv_v)),
        kv_window: None,
        kv_sinks: cmd.run.kv.sinks,
        n_seq: cmd.parallel,
        mem: cmd.run.mem.options(),
        adapter_bytes,
        json_mode: true,
    };
    let (params, planned) = runtime::plan_context(&m.model, &o, 2, None).map_err(explain)?;
    eprintln!("snug: {} sequences, {}", cmd.parallel, planned.summary());
    if cmd.run.mem.verbose {
        eprintln!("{}", planned.choice.prediction.breakdown());
    }
    let name = cmd.name.clone().unwrap_or_else(|| {
        let p = std::path::Path::new(&cmd.model);
        match p.extension() {
            Some(e) if e == "gguf" => {
                p.file_stem().map_or(cmd.model.clone(), |s| s.to_string_lossy().into_owned())
            }
            _ => cmd.model.clone(),
        }
    });
    let opts = server::ServeOptions {
        host: cmd.host,
        port: cmd.port,
        api_key: cmd
            .api_key
            .or_else(|| std::env::var("SNUG_API_KEY").ok())
            .filter(|k| !k.is_empty()),
        max_body: cmd.max_body,
        queue: cmd.queue,
        prefill_chunk: cmd.prefill_chunk,
        name,
        budget: planned.budget.bytes,
        lora_dir: cmd.lora_dir.clone(),
        loras: cmd.run.lora.lora.clone(),
        adapter_budget: usize::try_from(adapter_bytes).unwrap_or(usize::MAX),
        plan: crate::cmd_plan::picture(
            &planned.choice.prediction,
            planned.budget.bytes,
            m.model.file.file_len(),
            planned.request(),
        ),
    };
    let loaded =
        runtime::Loaded { path: m.path.clone(), model: m.model.clone(), tok: m.tok.clone() };
    server::serve(m.model, m.tok, &m.path, params, opts, move |ctx, pressure| {
        planned
            .attach(&loaded, ctx, move |line| pressure.say(line))
            .map_err(|e| format!("{:#}", explain(e)))
    })?;
    Ok(())
}

/// Bytes an adapter takes hot, from its GGUF header (checked against the model, nothing
/// converted): `model::lora::hot_bytes`.
fn hot_bytes(path: &std::path::Path, c: &model::ModelConfig) -> anyhow::Result<usize> {
    let f = gguf::GgufFile::open(path)
        .map_err(|e| anyhow::anyhow!("reading the adapter {}: {e}", path.display()))?;
    model::lora::hot_bytes(&f, c)
        .map_err(|e| anyhow::anyhow!("the adapter {}: {e}", path.display()))
}

/// The plan's adapter share (`model::lora::share_bytes`, whole pool pages included): room for
/// `--max-loras` of the largest adapter in `--lora-dir` (files that are not adapters for this
/// model are left to the server, which skips them), or for the `--lora` files together,
/// whichever is larger.
fn adapter_share(cmd: &ServeCmd, c: &model::ModelConfig) -> anyhow::Result<u64> {
    let mut given = 0usize;
    for (path, _) in &cmd.run.lora.lora {
        given = given.saturating_add(model::lora::share_bytes(c, 1, hot_bytes(path, c)?));
    }
    let mut largest = None;
    if let Some(dir) = &cmd.lora_dir {
        for (_, f) in server::adapters::dir_files(dir)? {
            largest = largest.max(hot_bytes(&f, c).ok());
        }
    }
    let dir = largest.map_or(0, |b| model::lora::share_bytes(c, cmd.max_loras, b));
    Ok(given.max(dir) as u64)
}
