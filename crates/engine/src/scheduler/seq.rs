//! A running job's state in its slot: its sampler, its answer ([`Sequence`]: text, constraints,
//! finish rule), the tokens at its KV positions, and its timings.

use std::time::Instant;

use super::{Finish, FinishReason, Job};
use crate::draft::{Drafter, Gate, Ngram};
use crate::reuse::Splice;
use crate::{Sampler, Sequence};

/// Speculative decoding for one sequence: its drafter, its gate, and the guesses the step in
/// flight verifies (fed after `Seq::next`, at the positions after it).
pub(super) struct Draft {
    pub(super) drafter: Ngram,
    pub(super) gate: Gate,
    pub(super) guesses: Vec<u32>,
}

impl Draft {
    /// A drafter that has read `prompt`.
    pub(super) fn new(prompt: &[u32]) -> Draft {
        let mut drafter = Ngram::new();
        drafter.start(prompt);
        Draft { drafter, gate: Gate::new(), guesses: Vec::new() }
    }
}

/// One running request in a slot.
pub(super) struct Seq {
    pub(super) job: Job,
    pub(super) sampler: Sampler,
    /// The answer's text, constraints (`Request::json`, `Request::tools`) and finish rule.
    pub(super) answer: Sequence,
    /// The prompt, then each sampled token once it is to be fed: the tokens at the KV's
    /// positions, for the prefix cache.
    pub(super) tokens: Vec<u32>,
    /// Positions written to the KV cache.
    pub(super) n_past: usize,
    /// The prompt's tokens the prefix cache held at admission.
    pub(super) n_cached: usize,
    /// How the prompt was spliced onto a recent sequence's tokens for the same text
    /// ([`crate::reuse`]); usage counts the client's prompt as it was tokenized.
    pub(super) splice: Option<Splice>,
    /// The token to feed next once the prompt is read.
    pub(super) next: u32,
    pub(super) submitted: Instant,
    pub(super) admitted: Instant,
    pub(super) first: Option<Instant>,
    /// When the last token was sampled.
    pub(super) last: Option<Instant>,
    /// Speculative decoding, when the server drafts and the request allows it.
    pub(super) draft: Option<Draft>,
    /// Set once the client has its answer and the slot computes the answer's re-tokenized KV
    /// ([`crate::reuse::canonical`]): the events go here (and nowhere), the prompt is the
    /// sequence re-tokenized, and the slot is freed when it is read.
    pub(super) warm: Option<tokio::sync::mpsc::UnboundedReceiver<super::Event>>,
}

impl Seq {
    pub(super) fn prefilling(&self) -> bool {
        self.n_past < self.job.req.prompt.len()
    }

    pub(super) fn finish(&self, reason: FinishReason) -> Finish {
        let now = Instant::now();
        let first = self.first.unwrap_or(now);
        let (n_prompt, n_cached) = match &self.splice {
            Some(sp) => (sp.n_plain, sp.plain_cached(self.n_cached)),
            None => (self.job.req.prompt.len(), self.n_cached),
        };
        Finish {
            reason,
            n_prompt,
            n_cached,
            n_gen: self.answer.n_gen(),
            stop_string: self.answer.stop_string(),
            queued: self.admitted - self.submitted,
            prompt: first - self.admitted,
            generation: now - first,
        }
    }
}
