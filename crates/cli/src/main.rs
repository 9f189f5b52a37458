//! The `snug` binary: a thin layer that parses flags into typed configs and calls the library
//! crates. One module per verb.

mod cmd_inspect;
mod cmd_pull;
mod cmd_synth;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "snug", version, about = "Run GGUF language models on small CPU machines, within their memory")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Fetch a known model into the cache ($SNUG_HOME, default ~/.cache/snug).
    Pull(cmd_pull::PullArgs),
    /// Show what a GGUF file holds: hyper-parameters, tokenizer, tensors, totals per type.
    Inspect(cmd_inspect::InspectArgs),
    /// Write a random-weight model with a real shape (qwen2.5-7b, llama-3.1-8b, ...) for benchmarks.
    Synth(cmd_synth::SynthArgs),
}

fn main() {
    let cli = Cli::parse();
    let result: anyhow::Result<()> = match cli.command {
        Command::Pull(a) => cmd_pull::run(a),
        Command::Inspect(a) => cmd_inspect::run(a),
        Command::Synth(a) => cmd_synth::run(a),
    };
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
