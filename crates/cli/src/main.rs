//! The `snug` binary: a thin layer that parses flags into typed configs and calls the library
//! crates. One module per verb.

#![forbid(unsafe_code)]

mod advice;
mod cmd_bench;
mod cmd_cache;
mod cmd_chat;
mod cmd_embed;
mod cmd_eval;
mod cmd_inspect;
mod cmd_list;
mod cmd_perplexity;
mod cmd_plan;
mod cmd_ps;
mod cmd_pull;
mod cmd_run;
mod cmd_serve;
mod cmd_synth;
mod cmd_tokenize;
mod common;
mod draft_args;
mod kv_args;
mod mem_args;
mod progress;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "snug",
    version,
    about = "Run GGUF language models on small CPU machines, within their memory"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Fetch a known model into the cache ($SNUG_HOME, default ~/.cache/snug).
    Pull(cmd_pull::PullArgs),
    /// The models in the cache: name, id, size, modified.
    List(cmd_list::ListArgs),
    /// What a running `snug serve` holds (asks its /api/ps).
    Ps(cmd_ps::PsArgs),
    /// Show what a GGUF file holds: hyper-parameters, tokenizer, tensors, totals per type.
    Inspect(cmd_inspect::InspectArgs),
    /// Write a random-weight model with a real shape (qwen2.5-7b, llama-3.1-8b, ...) for benchmarks.
    Synth(cmd_synth::SynthArgs),
    /// Predict peak memory from the GGUF header; the table of contexts × KV precisions that fit.
    Plan(cmd_plan::PlanArgs),
    /// Answer a prompt through the chat template (--raw: continue it), streaming the text; with
    /// no prompt, chat.
    Run(cmd_run::RunCmd),
    /// Talk with a model using its chat template.
    Chat(cmd_chat::ChatCmd),
    /// Serve the OpenAI and Ollama HTTP APIs, many conversations at once.
    Serve(cmd_serve::ServeCmd),
    /// Measure prompt and generation speed, and decode bandwidth against the machine's.
    Bench(cmd_bench::BenchCmd),
    /// Perplexity of a text file (llama-perplexity's method: second half of each chunk).
    Perplexity(cmd_perplexity::PerplexityCmd),
    /// Score a prompt and a greedy or forced continuation; JSON like llama.cpp reference dumps.
    Eval(cmd_eval::EvalCmd),
    /// Print each text's embedding as a JSON array (pooled, L2-normalised).
    Embed(cmd_embed::EmbedCmd),
    /// Print the token ids (and pieces) of a text, like llama.cpp's llama-tokenize.
    Tokenize(cmd_tokenize::TokenizeArgs),
    /// Print the text of token ids.
    Detokenize(cmd_tokenize::DetokenizeArgs),
    /// The prefix cache's blocks on disk: `ls` lists them, `clear` deletes them.
    Cache(cmd_cache::CacheArgs),
}

fn main() {
    let cli = Cli::parse();
    let result: anyhow::Result<()> = match cli.command {
        Command::Pull(a) => cmd_pull::run(a),
        Command::List(a) => cmd_list::run(a),
        Command::Ps(a) => cmd_ps::run(a),
        Command::Inspect(a) => cmd_inspect::run(a),
        Command::Synth(a) => cmd_synth::run(a),
        Command::Plan(a) => cmd_plan::run(a),
        Command::Run(a) => cmd_run::run(a),
        Command::Chat(a) => cmd_chat::run(a),
        Command::Serve(a) => cmd_serve::run(a),
        Command::Bench(a) => cmd_bench::run(a),
        Command::Perplexity(a) => cmd_perplexity::run(a),
        Command::Eval(a) => cmd_eval::run(a),
        Command::Embed(a) => cmd_embed::run(a),
        Command::Tokenize(a) => cmd_tokenize::run_tokenize(a),
        Command::Detokenize(a) => cmd_tokenize::run_detokenize(a),
        Command::Cache(a) => cmd_cache::run(a),
    };
    if let Err(e) = result {
        match advice::hint(&e) {
            Some(h) => eprintln!("error: {e:#}; {h}"),
            None => eprintln!("error: {e:#}"),
        }
        std::process::exit(1);
    }
}
