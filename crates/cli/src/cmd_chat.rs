//! `snug chat [MODEL]`: an interactive conversation using the model's chat template.
//! `/reset` starts over, `/exit` (or end of input) quits; Ctrl-C stops the current answer only.
//! The conversation stays in the KV cache: each turn only prefills the new messages.

use std::io::{BufRead, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::Context as _;
use clap::Args;
use engine::{GenStats, GenerateParams, Session};
use tokenizer::{ChatMessage, ChatTemplate, Tokenizer};

use crate::common::{attach, open, report, RunArgs, SamplingArgs, DEFAULT_MODEL};
use crate::draft_args::DraftArgs;
use crate::progress::PromptBar;

#[derive(Args, Debug)]
pub struct ChatCmd {
    /// Model alias or .gguf path.
    #[arg(default_value = DEFAULT_MODEL)]
    pub model: String,
    /// A system message to start the conversation with.
    #[arg(long)]
    pub system: Option<String>,
    /// Tokens per answer at most.
    #[arg(long, short = 'n', default_value_t = ANSWER_TOKENS)]
    pub n_predict: usize,
    #[command(flatten)]
    pub run: RunArgs,
    #[command(flatten)]
    pub draft: DraftArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
}

/// Tokens per answer at most unless `-n` says otherwise (`snug chat`, and `snug run` answering
/// as a chat).
pub const ANSWER_TOKENS: usize = 1024;

/// The conversation as the model reads it: `messages` through the template, ending in the
/// generation prompt (the assistant's turn opened), tokenized with special-token text parsed.
pub fn chat_tokens(
    template: &ChatTemplate,
    tok: &Tokenizer,
    messages: &[ChatMessage],
) -> anyhow::Result<Vec<u32>> {
    let prompt = template.render(messages, true)?;
    Ok(tok.encode(&prompt, true, true))
}

/// Generates from `tokens` with the prompt's progress on stderr ([`PromptBar`]) and the answer
/// streamed to stdout, ended by a newline; `on_text` sees each piece and returns false to stop.
/// A closed stdout (e.g. piped into `head`) ends generation quietly.
pub fn stream_answer(
    session: &mut Session,
    tokens: &[u32],
    gen: &GenerateParams,
    mut on_text: impl FnMut(&str) -> bool,
) -> anyhow::Result<GenStats> {
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let bar = PromptBar::start(tokens.len());
    let (_, stats) = session.generate_reporting(
        tokens,
        gen,
        |done, total| bar.update(done, total),
        |text| out.write_all(text.as_bytes()).and_then(|_| out.flush()).is_ok() && on_text(text),
    )?;
    let _ = writeln!(out);
    Ok(stats)
}

pub fn run(cmd: ChatCmd) -> anyhow::Result<()> {
    let sampling = cmd.sampling.params()?;
    let m = open(&cmd.model)?;
    let tok = Arc::clone(&m.tok);
    let template = ChatTemplate::from_gguf(&m.model.file, &tok)?;
    if template.is_fallback() {
        eprintln!("note: {} has no chat template; using a ChatML-style fallback", cmd.model);
    }
    // A conversation may fill the whole context: planned for it, then each turn pins as many
    // layers as the KV cache it can reach leaves room for.
    let (params, planned) = cmd.run.plan(&m.model, 1, None, false, &cmd.draft)?;
    let mut session = Session::new(m.model.clone(), Arc::clone(&tok), params, sampling);
    session.set_drafter(cmd.draft.drafter(&m, &params)?);
    cmd.run.lora.apply(session.context_mut())?;
    let residence = attach(&planned, &m, session.context())?;
    let interrupted = Arc::new(AtomicBool::new(false));
    {
        let flag = Arc::clone(&interrupted);
        ctrlc::set_handler(move || flag.store(true, Ordering::SeqCst))
            .context("installing the Ctrl-C handler")?;
    }
    let gen = GenerateParams { n_predict: cmd.n_predict, ..Default::default() };
    let mut messages: Vec<ChatMessage> =
        cmd.system.iter().map(|s| ChatMessage::new("system", s.clone())).collect();
    let stdin = std::io::stdin();
    let mut line = String::new();
    eprintln!(
        "chatting with {} — /reset to start over, /exit to quit, Ctrl-C stops an answer",
        cmd.model
    );
    loop {
        eprint!("> ");
        let _ = std::io::stderr().flush();
        line.clear();
        interrupted.store(false, Ordering::SeqCst);
        if stdin.lock().read_line(&mut line)? == 0 {
            break; // end of input
        }
        let input = line.trim();
        match input {
            "" => continue,
            "/exit" | "/quit" => break,
            "/reset" => {
                messages.retain(|m| m.role == "system");
                session.reset();
                eprintln!("(conversation reset)");
                continue;
            }
            _ => {}
        }
        messages.push(ChatMessage::new("user", input.to_string()));
        let tokens = chat_tokens(&template, &tok, &messages)?;
        if tokens.len() >= session.n_ctx() {
            messages.pop();
            eprintln!("error: the conversation needs {} tokens but the context holds {}; /reset or restart with a larger --ctx", tokens.len(), session.n_ctx());
            continue;
        }
        if let Some(line) = residence.fit_kv((tokens.len() + cmd.n_predict).min(session.n_ctx())) {
            eprintln!("{line}");
        }
        let mut answer = String::new();
        let stats = stream_answer(&mut session, &tokens, &gen, |text| {
            answer.push_str(text);
            !interrupted.load(Ordering::SeqCst)
        })?;
        messages.push(ChatMessage::new("assistant", answer));
        eprintln!(
            "[prompt {} tok ({} new) {:.1} tok/s | answer {} tok {:.1} tok/s{}]",
            stats.n_prompt,
            stats.n_prompt_computed,
            stats.prompt_tok_s(),
            stats.n_gen,
            stats.gen_tok_s(),
            if interrupted.load(Ordering::SeqCst) { " | interrupted" } else { "" }
        );
    }
    report(&residence, &cmd.run.mem);
    Ok(())
}
