//! `snug serve [MODEL]`: the OpenAI and Ollama HTTP APIs over the continuous-batching scheduler
//! (crate `server`). The KV cache is planned for `--parallel` whole contexts within the memory
//! budget; a plan that does not fit fails here, before anything listens.

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
    if !cmd.run.lora.lora.is_empty() {
        anyhow::bail!("--lora is not supported by snug serve yet: per-request adapters are coming");
    }
    let m = open(&cmd.model)?;
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
        adapter_bytes: 0,
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
