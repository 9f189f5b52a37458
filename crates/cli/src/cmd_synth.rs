//! `snug synth --shape qwen2.5-7b --quant q4_k_m --tokenizer-from MODEL -o FILE`: a random-weight
//! model with a real shape, for speed and memory work where no real model of that size exists
//! (see `hub::synth`). Cost: disk-speed writing by default; `--exact` quantizes every row.

use anyhow::Context;
use hub::synth::{self, Recipe, SynthOptions};

#[derive(clap::Args)]
pub struct SynthArgs {
    /// Model shape (the `tiny-*` ones are for tests). The list is `hub::synth::SHAPES`.
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(synth::SHAPES.map(|s| s.name)))]
    pub shape: String,
    /// Tensor-type recipe: q4_k_m (llama-quantize's mix), q8_0, f16 or f32.
    #[arg(long, default_value = "q4_k_m")]
    pub quant: String,
    /// Copy the tokenizer (and so the vocabulary size) from this model (alias or path). Without
    /// it, a 257-token byte-level vocabulary is made up.
    #[arg(long, value_name = "MODEL")]
    pub tokenizer_from: Option<String>,
    /// Output .gguf file.
    #[arg(short, long, value_name = "FILE")]
    pub output: std::path::PathBuf,
    /// Random seed: the same seed gives the same file.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Threads for generation and quantization.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// Quantize every row of random values (slow) instead of tiling a pool of quantized rows.
    #[arg(long)]
    pub exact: bool,
    /// Standard deviation of the output projection's random values (default 0.02 like every
    /// other matrix, or with --conditioned 4/√width, logits of standard deviation 4). Larger
    /// values peak the next-token distribution, for agreement tests.
    #[arg(long)]
    pub output_std: Option<f32>,
    /// Scale the weights as a trained model's initialisation does (N(0, 1/fan-in), the
    /// residual projections a further 1/√(2·layers), embeddings N(0, 1)), so that a deep file
    /// damps rounding differences instead of amplifying them: for agreement with another engine
    /// at a real shape.
    #[arg(long)]
    pub conditioned: bool,
}

pub fn run(args: SynthArgs) -> anyhow::Result<()> {
    let shape = synth::shape(&args.shape)
        .ok_or_else(|| synth::SynthError::UnknownShape(args.shape.clone()))?;
    let recipe = Recipe::parse(&args.quant).with_context(|| {
        format!("unknown --quant {:?}: use q4_k_m, q8_0, f16 or f32", args.quant)
    })?;
    let tokenizer = match &args.tokenizer_from {
        Some(m) => {
            let path = hub::resolve(m)?;
            Some(
                gguf::GgufFile::open(&path)
                    .with_context(|| format!("reading {}", path.display()))?,
            )
        }
        None => None,
    };
    let opts = SynthOptions {
        recipe,
        seed: args.seed,
        threads: args.threads.max(1),
        exact: args.exact,
        output_std: args.output_std,
        conditioned: args.conditioned,
        quiet: false,
        ..SynthOptions::new(shape)
    };
    let r = synth::synth(&opts, tokenizer.as_ref(), &args.output)?;
    eprintln!(
        "wrote {}: {} tensors, {:.2} B parameters, {:.2} GB, in {:.1} s",
        r.path.display(),
        r.n_tensors,
        r.n_params as f64 / 1e9,
        r.file_bytes as f64 / 1e9,
        r.seconds
    );
    Ok(())
}
