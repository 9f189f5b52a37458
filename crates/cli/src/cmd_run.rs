//! `snug run [MODEL] [PROMPT]`: answer a prompt, streaming text to stdout, timings on stderr —
//! what `ollama run` does.
//!
//! On a model with a chat template the prompt is one user message: the template renders it with
//! the generation prompt, and the answer ends at the template's end-of-turn token. `--raw` (and a
//! model without a template, said once on stderr) continues the prompt as plain text instead.
//! Without a prompt, stdin that is a terminal opens `snug chat` (the same loop, not a copy);
//! stdin that is not (`echo hi | snug run MODEL`) is read whole as the prompt.
//!
//! One positional argument is the model when it names one (a known alias, an existing file or a
//! `.gguf` path) and the prompt for the default model otherwise, so both `snug run MODEL` and
//! `snug run "a prompt"` mean what they say. A model name and a prompt that is itself an alias
//! are told apart by giving both.

use std::io::{IsTerminal, Read};

use anyhow::Context as _;
use clap::Args;
use engine::{GenerateParams, JsonFormat, Session};
use tokenizer::{ChatMessage, ChatTemplate};

use crate::cmd_chat::{self, ChatCmd};
use crate::common::{attach, open, report, RunArgs, SamplingArgs, DEFAULT_MODEL};
use crate::draft_args::DraftArgs;

/// Tokens a plain (`--raw`) continuation generates at most unless `-n` says otherwise.
const RAW_TOKENS: usize = 256;

#[derive(Args, Debug)]
pub struct RunCmd {
    /// [MODEL] [PROMPT] — MODEL is an alias or a .gguf path (default: qwen2.5-coder-1.5b, pulled
    /// automatically); without a prompt, the chat opens (or stdin is the prompt when it is not a
    /// terminal); with --prompt-file, the only positional argument is the model.
    #[arg(num_args = 0..=2, value_name = "MODEL/PROMPT")]
    pub positional: Vec<String>,
    /// Read the prompt from a file.
    #[arg(long, short = 'f')]
    pub prompt_file: Option<std::path::PathBuf>,
    /// Continue the prompt as plain text instead of answering it through the chat template.
    #[arg(long)]
    pub raw: bool,
    /// Tokens to generate at most (default: 1024 for an answer, 256 with --raw).
    #[arg(long, short = 'n')]
    pub n_predict: Option<usize>,
    /// Stop when this text appears (repeatable).
    #[arg(long)]
    pub stop: Vec<String>,
    /// Do not stop at end-of-generation tokens.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Offer the tools in this JSON file (a list of OpenAI tool objects, or `{"tools": [...]}`)
    /// to the model through its chat template, and print the calls it makes (parsed in the
    /// template's call format; the CLI does not constrain them as the server does).
    #[arg(long, value_name = "FILE.json")]
    pub tools: Option<std::path::PathBuf>,
    /// Constrain the answer to JSON: `json` for one JSON object, or a file holding a JSON
    /// schema the answer must be a value of (as the server's `response_format` and `format`).
    #[arg(long, value_name = "json|SCHEMA.json")]
    pub format: Option<String>,
    /// Print each answer token's log-probability and its N most likely alternatives (0 to 20)
    /// on stderr after the answer: the model's own distribution, before sampling shaped it.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(0..=20))]
    pub logprobs: Option<u16>,
    /// Treat special-token text in the prompt (e.g. `<|im_start|>`) as plain text (with --raw;
    /// the chat template's own special tokens are always parsed).
    #[arg(long)]
    pub no_special: bool,
    #[command(flatten)]
    pub run: RunArgs,
    #[command(flatten)]
    pub draft: DraftArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
}

/// The tools of a `--tools` file: a list of OpenAI tool objects, or an object with `tools`.
fn read_tools(path: &std::path::Path) -> anyhow::Result<Vec<serde_json::Value>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the tools file {}", path.display()))?;
    let v: serde_json::Value = serde_json::from_str(&text)
        .with_context(|| format!("the tools file {} is not JSON", path.display()))?;
    let list = match v {
        serde_json::Value::Array(l) => l,
        serde_json::Value::Object(mut o) => match o.remove("tools") {
            Some(serde_json::Value::Array(l)) => l,
            _ => anyhow::bail!(
                "{}: expected a list of tools or {{\"tools\": [...]}}",
                path.display()
            ),
        },
        _ => anyhow::bail!("{}: expected a list of tools or {{\"tools\": [...]}}", path.display()),
    };
    for (i, t) in list.iter().enumerate() {
        if t.pointer("/function/name").and_then(|n| n.as_str()).is_none() {
            anyhow::bail!("{}: tools[{i}] has no function.name", path.display());
        }
    }
    Ok(list)
}

/// `--format`: `json`, or a schema file compiled by the same checker the server uses.
fn json_format(arg: &str) -> anyhow::Result<JsonFormat> {
    if arg == "json" {
        return Ok(JsonFormat::Object);
    }
    let path = std::path::Path::new(arg);
    let text = std::fs::read_to_string(path).with_context(|| {
        format!("--format is `json` or a JSON schema file; reading {}", path.display())
    })?;
    let v: serde_json::Value = serde_json::from_str(&text)
        .with_context(|| format!("the schema file {} is not JSON", path.display()))?;
    let schema = engine::json_schema::Schema::compile(&v)
        .map_err(|e| anyhow::anyhow!("the schema in {} cannot be enforced: {e}", path.display()))?;
    Ok(JsonFormat::Schema(std::sync::Arc::new(schema)))
}

/// One `--logprobs` line: the token's log-probability and text, then the alternatives.
fn logprob_line(tok: &tokenizer::Tokenizer, t: &engine::logprobs::TokenLogprob) -> String {
    let text = |id: u32| format!("{:?}", String::from_utf8_lossy(tok.token_piece(id)));
    let mut line = format!("{:>9.4} {}", t.logprob, text(t.token));
    if !t.top.is_empty() {
        let alts: Vec<String> =
            t.top.iter().map(|&(id, lp)| format!("{} {lp:.4}", text(id))).collect();
        line += &format!("  | {}", alts.join(", "));
    }
    line
}

/// Whether a lone positional argument names a model rather than being a prompt.
fn names_model(arg: &str) -> bool {
    hub::spec(arg).is_some() || arg.ends_with(".gguf") || std::path::Path::new(arg).is_file()
}

/// Splits `[MODEL] [PROMPT]` / `[MODEL] --prompt-file F` into the model and the prompt, if one
/// was given (a file, an argument, or stdin that is not a terminal).
fn model_and_prompt(cmd: &RunCmd) -> anyhow::Result<(String, Option<String>)> {
    let pos = &cmd.positional;
    let (model, prompt) = match (&cmd.prompt_file, pos.len()) {
        (Some(f), n) if n <= 1 => {
            let prompt = std::fs::read_to_string(f)
                .with_context(|| format!("reading the prompt file {}", f.display()))?;
            (pos.first().cloned(), Some(prompt))
        }
        (Some(_), _) => {
            anyhow::bail!("give the prompt either as an argument or with --prompt-file, not both")
        }
        (None, 2) => (Some(pos[0].clone()), Some(pos[1].clone())),
        (None, 1) if names_model(&pos[0]) => (Some(pos[0].clone()), None),
        (None, 1) => (None, Some(pos[0].clone())),
        (None, _) => (None, None),
    };
    let model = model.unwrap_or_else(|| DEFAULT_MODEL.to_string());
    if prompt.is_some() || std::io::stdin().is_terminal() {
        return Ok((model, prompt));
    }
    let mut piped = String::new();
    std::io::stdin().read_to_string(&mut piped).context("reading the prompt from stdin")?;
    if piped.trim().is_empty() {
        anyhow::bail!(
            "no prompt: stdin was empty. `snug run [MODEL] \"your prompt\"`, \
             `snug run [MODEL] --prompt-file F`, or `snug run [MODEL]` at a terminal to chat"
        );
    }
    Ok((model, Some(piped)))
}

pub fn run(cmd: RunCmd) -> anyhow::Result<()> {
    let (model_name, prompt) = model_and_prompt(&cmd)?;
    let Some(prompt) = prompt else {
        if cmd.raw {
            anyhow::bail!(
                "--raw continues a prompt: give one (`snug run MODEL --raw \"text\"`, \
                 --prompt-file F, or on stdin)"
            );
        }
        return cmd_chat::run(ChatCmd {
            model: model_name,
            system: None,
            n_predict: cmd.n_predict.unwrap_or(cmd_chat::ANSWER_TOKENS),
            run: cmd.run,
            draft: cmd.draft,
            sampling: cmd.sampling,
        });
    };
    let sampling = cmd.sampling.params()?;
    let tools = cmd.tools.as_deref().map(read_tools).transpose()?;
    if tools.is_some() && cmd.raw {
        anyhow::bail!("--tools goes through the chat template: leave out --raw");
    }
    let format = cmd.format.as_deref().map(json_format).transpose()?;
    if format.is_some() && tools.is_some() {
        anyhow::bail!("--format and --tools cannot go together: give one of them");
    }
    let mut calls = None;
    let m = open(&model_name)?;
    let template =
        if cmd.raw { None } else { Some(ChatTemplate::from_gguf(&m.model.file, &m.tok)?) };
    let (tokens, n_predict) = match template.filter(|t| !t.is_fallback()) {
        Some(t) => {
            // Like a chat line, the message is the text without its surrounding whitespace (a
            // prompt piped in ends in a newline).
            let user = [ChatMessage::new("user", prompt.trim().to_string())];
            let tokens = match &tools {
                None => cmd_chat::chat_tokens(&t, &m.tok, &user)?,
                Some(list) => {
                    let format = engine::tools::Format::detect(t.source()).with_context(|| {
                        format!("{model_name}'s chat template writes tool calls in no format snug parses (Hermes <tool_call>, Llama 3 JSON, Mistral [TOOL_CALLS])")
                    })?;
                    let names: Vec<String> = list
                        .iter()
                        .filter_map(|x| x.pointer("/function/name")?.as_str().map(String::from))
                        .collect();
                    calls = Some((format, names));
                    m.tok.encode_chat(&t.render_prompt(&m.tok, &user, list, true)?)
                }
            };
            (tokens, cmd.n_predict.unwrap_or(cmd_chat::ANSWER_TOKENS))
        }
        None => {
            if !cmd.raw {
                eprintln!(
                    "note: {model_name} has no chat template; continuing the prompt as plain text"
                );
            }
            (m.tok.encode(&prompt, true, !cmd.no_special), cmd.n_predict.unwrap_or(RAW_TOKENS))
        }
    };
    if tokens.is_empty() {
        anyhow::bail!("the prompt is empty");
    }
    let (params, planned) = cmd.run.plan(
        &m.model,
        tokens.len() + 1,
        Some(tokens.len() + n_predict),
        format.is_some(),
        &cmd.draft,
    )?;
    let mut session = Session::new(m.model.clone(), m.tok.clone(), params, sampling);
    session.set_drafter(cmd.draft.drafter(&m, &params)?);
    cmd.run.lora.apply(session.context_mut())?;
    let residence = attach(&planned, &m, session.context())?;
    let gen = GenerateParams {
        n_predict,
        stop: cmd.stop.clone(),
        ignore_eos: cmd.ignore_eos,
        format,
        logprobs: cmd.logprobs.map(usize::from),
    };
    let mut text = String::new();
    let stats = cmd_chat::stream_answer(&mut session, &tokens, &gen, |t| {
        text.push_str(t);
        true
    })?;
    if let Some((format, names)) = calls {
        let o = engine::tools::ParsedOutput::parse(
            &text,
            Some(format),
            &names,
            engine::tools::Reasoning::Off,
        );
        if o.calls.is_empty() {
            println!("(no tool call)");
        }
        for c in &o.calls {
            println!("tool call: {} {}", c.name, c.arguments);
        }
    }
    for t in &stats.logprobs {
        eprintln!("{}", logprob_line(&m.tok, t));
    }
    let drafts = if stats.drafted > 0 {
        format!(
            " | drafted {}, kept {} ({:.1} tok/pass)",
            stats.drafted,
            stats.kept,
            stats.n_gen as f64 / stats.passes.max(1) as f64
        )
    } else {
        String::new()
    };
    eprintln!(
        "prompt {} tok, {:.1} tok/s | generated {} tok, {:.2} tok/s{drafts} | stop: {:?}",
        stats.n_prompt,
        stats.prompt_tok_s(),
        stats.n_gen,
        stats.gen_tok_s(),
        stats.stop
    );
    report(&residence, &cmd.run.mem);
    Ok(())
}
