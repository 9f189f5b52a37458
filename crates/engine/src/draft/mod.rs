//! Speculative decoding: a drafter guesses the next few tokens, and one forward pass computes
//! the decode token and the guesses together; the answer keeps the guesses the model itself
//! would have produced and the KV cache is cut back past the first one it would not.
//!
//! Verification is "sample, then compare": the row of logits after each kept token is sampled
//! exactly as plain decoding samples it (same sampler, penalties, constraints, random draws),
//! and the next guess is kept when it equals the token drawn. For a drafter that proposes one
//! token per position (both here do), that is speculative sampling with a point-mass draft: a
//! guess `x` survives with probability `p(x)`, and a rejection leaves a token drawn from `p`
//! without `x`, so every token has its plain-decoding probability. Beyond that, the random
//! draws are consumed one per emitted token as without drafts, and the model's rows are
//! bit-identical whatever shares the pass (`model::attention` splits every token of a small
//! batch as a lone one; matmul rows sum per token), so with a fixed seed the output is byte
//! for byte the output without drafts, at any temperature.
//!
//! Drafters: [`Ngram`] copies what followed the longest earlier occurrence of the text's last
//! few tokens (prompt lookup: free, and right for edits, quotes and echoed JSON), and
//! [`DraftModel`] runs a small model sharing the tokenizer. [`Gate`] sizes each draft from
//! recent acceptance and pauses drafting after misses, so text with nothing to copy pays
//! little.
//!
//! Cost: a verification pass of `1 + k` tokens reads the weights once, like a decode step, and
//! computes `1 + k` rows; it pays when the pass costs less than the tokens it keeps would
//! have cost one by one. The logits of `1 + k` rows ([`MAX_DRAFT`] at most) are the only
//! extra memory (`n_vocab × 4` bytes a row), plus a draft model's weights, cache and buffers.

mod gate;
mod model_drafter;
mod ngram;

pub use gate::Gate;
pub use model_drafter::DraftModel;
pub use ngram::Ngram;

use model::ModelError;

/// Most drafted tokens one pass verifies for one sequence: what the KV cache can cut back
/// exactly ([`model::kv::ROLLBACK_TOKENS`]).
pub const MAX_DRAFT: usize = model::kv::ROLLBACK_TOKENS;

/// Which drafter a run uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DraftKind {
    /// No drafts: one token a pass.
    Off,
    /// Prompt lookup ([`Ngram`]).
    Ngram,
    /// A draft model at this path ([`DraftModel`]).
    Model(std::path::PathBuf),
}

impl DraftKind {
    /// `off`, `ngram`, or a path to a GGUF model.
    pub fn parse(s: &str) -> DraftKind {
        match s {
            "off" | "none" => DraftKind::Off,
            "ngram" => DraftKind::Ngram,
            path => DraftKind::Model(path.into()),
        }
    }

    pub fn is_off(&self) -> bool {
        *self == DraftKind::Off
    }

    /// Guesses a pass may verify beside each step's decode tokens: the extra rows of logits a
    /// context for this drafter needs (and the planner counts).
    pub fn guess_rows(&self) -> usize {
        if self.is_off() {
            0
        } else {
            MAX_DRAFT
        }
    }
}

/// A source of guesses for one sequence.
pub trait Drafter: Send {
    /// The label `/metrics` and reports use (`ngram`, `model`).
    fn name(&self) -> &'static str;

    /// The sequence is now `prompt` (a new answer; what the drafter computed for an earlier
    /// one may be reused as far as it agrees).
    fn start(&mut self, prompt: &[u32]);

    /// Tokens the answer gained: each token kept.
    fn extend(&mut self, toks: &[u32]);

    /// Up to `max` guesses for the tokens after the sequence so far, appended to `out` (none
    /// when it has nothing worth a pass). Errors are the drafter's own and leave no guesses.
    fn draft(&mut self, max: usize, out: &mut Vec<u32>) -> Result<(), ModelError>;
}
