//! `--draft ngram|off|MODEL`: speculative decoding for `run` and `chat` (`engine::draft`).
//! A draft model is opened once, counted in the memory plan (`runtime::plan::draft_bytes`) and
//! given a context of the model's length beside the model's.

use std::sync::{Arc, OnceLock};

use anyhow::Context as _;
use clap::Args;
use engine::draft::{DraftKind, DraftModel, Drafter, Ngram};
use model::ContextParams;
use runtime::plan::{self, ModelFacts};
use runtime::Loaded;

#[derive(Args, Clone, Debug)]
pub struct DraftArgs {
    /// Speculative decoding: `ngram` guesses the next tokens from the prompt and the answer so
    /// far (prompt lookup; pays on edits and quotes, pauses itself elsewhere); a smaller model
    /// of the same tokenizer (alias or .gguf path) guesses with that model; `off` computes one
    /// token a pass. The answer is the same either way.
    #[arg(long, value_name = "ngram|off|MODEL", default_value = "ngram")]
    pub draft: String,
    #[arg(skip)]
    loaded: OnceLock<DraftLoaded>,
}

/// The draft model, once opened (Debug for the flags' derive).
#[derive(Clone, Default)]
struct DraftLoaded(Option<Arc<Loaded>>);

impl std::fmt::Debug for DraftLoaded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() { "draft model" } else { "no draft model" })
    }
}

impl DraftArgs {
    /// No drafting (verbs without the flag).
    pub fn off() -> DraftArgs {
        DraftArgs { draft: "off".into(), loaded: OnceLock::new() }
    }

    pub fn kind(&self) -> DraftKind {
        DraftKind::parse(&self.draft)
    }

    /// Drafted tokens a pass may verify (the extra rows of logits the plan counts).
    pub fn tokens(&self) -> usize {
        self.kind().guess_rows()
    }

    /// The draft model, opened on the first call (`None` unless `--draft` names a model).
    fn model(&self) -> anyhow::Result<Option<Arc<Loaded>>> {
        if let Some(l) = self.loaded.get() {
            return Ok(l.0.clone());
        }
        let loaded = match self.kind() {
            DraftKind::Model(path) => {
                let name = path.to_string_lossy();
                let m = runtime::open(&name)
                    .with_context(|| format!("opening the draft model {name}"))?;
                Some(Arc::new(m))
            }
            _ => None,
        };
        Ok(self.loaded.get_or_init(|| DraftLoaded(loaded)).0.clone())
    }

    /// What the draft model costs beside the model for a context of `n_ctx` (0 without one).
    pub fn bytes(&self, n_ctx: usize, n_ubatch: usize, n_threads: usize) -> anyhow::Result<u64> {
        Ok(match self.model()? {
            Some(d) => {
                let c = &d.model.config;
                let facts = ModelFacts::from_gguf(&d.model.file, c);
                plan::draft_bytes(c, &facts, n_ctx, n_ubatch, n_threads)
            }
            None => 0,
        })
    }

    /// The drafter for a session of `m` whose context is sized by `params`.
    pub fn drafter(
        &self,
        m: &Loaded,
        params: &ContextParams,
    ) -> anyhow::Result<Option<Box<dyn Drafter>>> {
        Ok(match self.kind() {
            DraftKind::Off => None,
            DraftKind::Ngram => Some(Box::new(Ngram::new())),
            DraftKind::Model(_) => {
                let Some(d) = self.model()? else { anyhow::bail!("no draft model was opened") };
                let dm = DraftModel::new(Arc::clone(&d.model), &d.tok, &m.tok, *params)
                    .map_err(anyhow::Error::msg)?;
                eprintln!("snug: drafting with {}", d.path.display());
                Some(Box::new(dm))
            }
        })
    }
}
