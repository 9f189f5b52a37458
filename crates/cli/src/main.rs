//! The `snug` binary: a thin layer that parses flags into typed configs and calls the library
//! crates. One module per verb.

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "snug", version, about = "Run GGUF language models on small CPU machines, within their memory")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
}

fn main() {
    let cli = Cli::parse();
    let result: anyhow::Result<()> = match cli.command {
    };
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
