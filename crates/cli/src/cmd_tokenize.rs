//! `snug tokenize MODEL (--text T | --file F)` and `snug detokenize MODEL IDS...`: the model's
//! tokenizer on its own, for users and for comparing with llama.cpp (`llama-tokenize`).
//!
//! Cost: one mmap and a vocabulary load (~50 ms for 262k tokens); tensor data is never read.

use anyhow::{bail, Context};
use gguf::GgufFile;
use serde_json::json;
use tokenizer::Tokenizer;

#[derive(clap::Args)]
pub struct TokenizeArgs {
    /// A model alias or a path to a .gguf file.
    pub model: String,
    /// The text to tokenize.
    #[arg(long, conflicts_with = "file")]
    pub text: Option<String>,
    /// Read the text from this file.
    #[arg(long)]
    pub file: Option<std::path::PathBuf>,
    /// Turn special-token text such as `<|im_start|>` into its token (llama.cpp `parse_special`).
    #[arg(long)]
    pub special: bool,
    /// Do not add the model's default BOS/EOS.
    #[arg(long)]
    pub no_bos: bool,
    /// Print JSON: {"ids": [...], "pieces": [...]}.
    #[arg(long)]
    pub json: bool,
    /// Print only the ids, on one line.
    #[arg(long)]
    pub ids: bool,
}

#[derive(clap::Args)]
pub struct DetokenizeArgs {
    /// A model alias or a path to a .gguf file.
    pub model: String,
    /// Token ids (spaces or commas between them; brackets are ignored).
    #[arg(required = true, num_args = 1..)]
    pub ids: Vec<String>,
    /// Leave out control tokens such as `<|im_end|>`.
    #[arg(long)]
    pub no_special: bool,
}

fn load(model: &str) -> anyhow::Result<Tokenizer> {
    let path = hub::resolve(model)?;
    let f = GgufFile::open(&path).with_context(|| format!("reading {}", path.display()))?;
    Tokenizer::from_gguf(&f).with_context(|| format!("loading the tokenizer of {}", path.display()))
}

pub fn run_tokenize(args: TokenizeArgs) -> anyhow::Result<()> {
    let text = match (&args.text, &args.file) {
        (Some(t), None) => t.clone(),
        (None, Some(p)) => {
            std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?
        }
        _ => bail!("give the text with --text TEXT or --file PATH"),
    };
    let tok = load(&args.model)?;
    let ids = tok.encode(&text, !args.no_bos, args.special);
    if args.json {
        let pieces: Vec<String> = ids
            .iter()
            .map(|&id| String::from_utf8_lossy(tok.token_piece(id)).into_owned())
            .collect();
        println!("{}", json!({ "ids": ids, "pieces": pieces, "n_tokens": ids.len() }));
    } else if args.ids {
        let s: Vec<String> = ids.iter().map(|i| i.to_string()).collect();
        println!("[{}]", s.join(", "));
    } else {
        for &id in &ids {
            println!("{id:>7} -> {:?}", String::from_utf8_lossy(tok.token_piece(id)));
        }
        eprintln!("{} tokens", ids.len());
    }
    Ok(())
}

pub fn run_detokenize(args: DetokenizeArgs) -> anyhow::Result<()> {
    let mut ids = Vec::new();
    for arg in &args.ids {
        for part in arg.split(|c: char| c == ',' || c.is_whitespace() || c == '[' || c == ']') {
            if part.is_empty() {
                continue;
            }
            let id: u32 = part.parse().with_context(|| format!("{part:?} is not a token id"))?;
            ids.push(id);
        }
    }
    let tok = load(&args.model)?;
    if let Some(&bad) = ids.iter().find(|&&id| id as usize >= tok.n_vocab()) {
        bail!("token id {bad} is outside the vocabulary (n_vocab = {})", tok.n_vocab());
    }
    let text = tok.detokenize(&ids, false, !args.no_special);
    println!("{}", String::from_utf8_lossy(&text));
    Ok(())
}
