//! `snug run [MODEL] PROMPT`: continue a prompt, streaming text to stdout, timings on stderr.

use std::io::Write;

use anyhow::Context as _;
use clap::Args;
use engine::{GenerateParams, Session};

use crate::common::{attach, open, report, RunArgs, SamplingArgs, DEFAULT_MODEL};

#[derive(Args, Debug)]
pub struct RunCmd {
    /// [MODEL] PROMPT — MODEL is an alias or a .gguf path (default: qwen2.5-coder-1.5b, pulled
    /// automatically); with --prompt-file, the only positional argument is the model.
    #[arg(num_args = 0..=2, value_name = "MODEL/PROMPT")]
    pub positional: Vec<String>,
    /// Read the prompt from a file.
    #[arg(long, short = 'f')]
    pub prompt_file: Option<std::path::PathBuf>,
    /// Tokens to generate at most.
    #[arg(long, short = 'n', default_value_t = 256)]
    pub n_predict: usize,
    /// Stop when this text appears (repeatable).
    #[arg(long)]
    pub stop: Vec<String>,
    /// Do not stop at end-of-generation tokens.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Treat special-token text in the prompt (e.g. `<|im_start|>`) as plain text.
    #[arg(long)]
    pub no_special: bool,
    #[command(flatten)]
    pub run: RunArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
}

/// Splits `[MODEL] PROMPT` / `[MODEL] --prompt-file F` into (model, prompt).
fn model_and_prompt(cmd: &RunCmd) -> anyhow::Result<(String, String)> {
    let pos = &cmd.positional;
    match (&cmd.prompt_file, pos.len()) {
        (Some(f), n) if n <= 1 => {
            let prompt = std::fs::read_to_string(f)
                .with_context(|| format!("reading the prompt file {}", f.display()))?;
            Ok((pos.first().cloned().unwrap_or_else(|| DEFAULT_MODEL.to_string()), prompt))
        }
        (Some(_), _) => {
            anyhow::bail!("give the prompt either as an argument or with --prompt-file, not both")
        }
        (None, 2) => Ok((pos[0].clone(), pos[1].clone())),
        (None, 1) => Ok((DEFAULT_MODEL.to_string(), pos[0].clone())),
        (None, _) => anyhow::bail!(
            "no prompt: `snug run [MODEL] \"your prompt\"` or `snug run [MODEL] --prompt-file F`"
        ),
    }
}

pub fn run(cmd: RunCmd) -> anyhow::Result<()> {
    let (model_name, prompt) = model_and_prompt(&cmd)?;
    let sampling = cmd.sampling.params()?;
    let m = open(&model_name)?;
    let tokens = m.tok.encode(&prompt, true, !cmd.no_special);
    if tokens.is_empty() {
        anyhow::bail!("the prompt is empty");
    }
    let (params, planned) =
        cmd.run.plan(&m.model, tokens.len() + 1, Some(tokens.len() + cmd.n_predict))?;
    let mut session = Session::new(m.model.clone(), m.tok.clone(), params, sampling);
    let residence = attach(&planned, &m, session.context())?;
    let gen = GenerateParams {
        n_predict: cmd.n_predict,
        stop: cmd.stop.clone(),
        ignore_eos: cmd.ignore_eos,
    };
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let (_, stats) = session.generate(&tokens, &gen, |text| {
        // A closed stdout (e.g. piped into `head`) ends generation quietly.
        out.write_all(text.as_bytes()).and_then(|_| out.flush()).is_ok()
    })?;
    let _ = writeln!(out);
    eprintln!(
        "prompt {} tok, {:.1} tok/s | generated {} tok, {:.2} tok/s | stop: {:?}",
        stats.n_prompt,
        stats.prompt_tok_s(),
        stats.n_gen,
        stats.gen_tok_s(),
        stats.stop
    );
    report(&residence, &cmd.run.mem);
    Ok(())
}
