//! The plan of one scheduler step, as plain data: which running sequences get how many tokens
//! of the one forward pass. A pure function of the sequences' progress and the token budget,
//! so it is tested without a model; the scheduler runs the plan and applies its results.
//!
//! The rule: every sequence that is past its prompt decodes one token (decoding is never held
//! back). The prompts still being read share what is left of the budget in the order the
//! sequences were admitted: the first takes what it needs up to the budget, the next the rest,
//! and so on, so an earlier prompt is never overtaken and a long one cannot starve the
//! decoding streams. With no sequence decoding, the budget is a whole micro-batch; beside
//! decoding it is the chunk [`ChunkSizer`] measures to cost about one decode step.
//!
//! Cost: O(sequences) per step.

/// A running sequence's progress, as the planner reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Progress {
    /// Tokens of its prompt.
    pub prompt: usize,
    /// Positions already in the KV cache (a prefix-cache hit counts).
    pub n_past: usize,
}

impl Progress {
    /// Still reading its prompt.
    pub fn prefilling(&self) -> bool {
        self.n_past < self.prompt
    }
}

/// How the prefill budget is cut.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
    /// Tokens a step may prefill when nothing decodes (the micro-batch).
    pub idle: usize,
    /// Tokens a step may prefill beside decoding.
    pub beside_decode: usize,
}

/// Tokens each sequence computes this step, in the order given: 1 for a decoding sequence,
/// the prompt tokens it reads (possibly 0) for a prefilling one.
pub fn plan(seqs: &[Progress], budget: Budget) -> Vec<usize> {
    let mut out = Vec::with_capacity(seqs.len());
    plan_into(seqs, budget, &mut out);
    out
}

/// [`plan`] into `out` (cleared first), for a caller that reuses it step after step.
pub fn plan_into(seqs: &[Progress], budget: Budget, out: &mut Vec<usize>) {
    out.clear();
    let decoding = seqs.iter().any(|s| !s.prefilling());
    let mut left = if decoding { budget.beside_decode } else { budget.idle };
    out.extend(seqs.iter().map(|s| {
        if !s.prefilling() {
            return 1;
        }
        let rest = s.prompt - s.n_past;
        let n = rest.min(left);
        left = left.saturating_sub(n);
        n
    }));
}

/// Prefill chunk size while others decode: the number of prompt tokens that cost about one
/// decode-only step, from exponential averages of both (at least [`ChunkSizer::MIN`]).
#[derive(Clone, Debug, Default)]
pub struct ChunkSizer {
    /// Seconds of a decode-only step.
    decode_step: f64,
    /// Extra seconds per prefill token in a mixed step.
    per_token: f64,
}

impl ChunkSizer {
    /// A floor that keeps prompts moving. It is low on purpose: on 2 busy vCPUs a prompt token
    /// cost 75 ms beside a 250 ms decode step, and a floor of 16 made those steps 6× slower
    /// (BENCHMARKS.md, `snug serve` under a long prompt).
    pub const MIN: usize = 4;
    const ALPHA: f64 = 0.2;

    /// A step of `secs` that decoded `n_decode` tokens and prefilled `n_prefill`.
    pub fn observe(&mut self, secs: f64, n_decode: usize, n_prefill: usize) {
        let avg =
            |old: f64, new: f64| if old == 0.0 { new } else { old + Self::ALPHA * (new - old) };
        if n_prefill == 0 && n_decode > 0 {
            self.decode_step = avg(self.decode_step, secs);
        } else if n_prefill > 0 && n_decode > 0 && self.decode_step > 0.0 {
            let extra = (secs - self.decode_step).max(0.0) / n_prefill as f64;
            self.per_token = avg(self.per_token, extra);
        } else if n_prefill > 0 {
            self.per_token = avg(self.per_token, secs / n_prefill as f64);
        }
    }

    /// The chunk for a micro-batch of `ubatch` tokens.
    pub fn chunk(&self, ubatch: usize) -> usize {
        if self.per_token <= 0.0 || self.decode_step <= 0.0 {
            return Self::MIN.max(ubatch / 8).min(ubatch);
        }
        ((self.decode_step / self.per_token) as usize).clamp(Self::MIN, ubatch.max(Self::MIN))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FREE: Budget = Budget { idle: 512, beside_decode: 8 };

    fn decoding(n_past: usize) -> Progress {
        Progress { prompt: 10, n_past: n_past.max(10) }
    }

    fn reading(prompt: usize, n_past: usize) -> Progress {
        Progress { prompt, n_past }
    }

    #[test]
    fn decoding_sequences_always_get_their_token() {
        // However little budget is left, however many prompts wait.
        let seqs = [reading(1000, 0), decoding(40), reading(50, 0), decoding(12)];
        let zero = Budget { beside_decode: 0, ..FREE };
        assert_eq!(plan(&seqs, zero), vec![0, 1, 0, 1]);
        assert_eq!(plan(&seqs, FREE), vec![8, 1, 0, 1]);
    }

    #[test]
    fn a_prompt_alone_takes_a_whole_micro_batch_and_beside_decoding_the_chunk() {
        assert_eq!(plan(&[reading(2000, 0)], FREE), vec![512]);
        assert_eq!(plan(&[reading(2000, 512)], FREE), vec![512]);
        assert_eq!(plan(&[reading(2000, 1536)], FREE), vec![464]);
        assert_eq!(plan(&[reading(2000, 0), decoding(5)], FREE), vec![8, 1]);
    }

    #[test]
    fn prompts_share_the_budget_in_admission_order() {
        // The first takes what it needs, the next the rest; a later one is not served first.
        let seqs = [reading(3, 0), reading(100, 0), reading(100, 0), decoding(7)];
        assert_eq!(plan(&seqs, FREE), vec![3, 5, 0, 1]);
        // Once the first is read, the second gets the whole chunk.
        let seqs = [decoding(3), reading(100, 5), reading(100, 0), decoding(7)];
        assert_eq!(plan(&seqs, FREE), vec![1, 8, 0, 1]);
    }

    #[test]
    fn a_cancelled_prompt_leaves_its_share_to_the_next() {
        // Two prompts mid-read; the first one's client leaves and the scheduler drops it: the
        // plan of the next step is the plan without it.
        let before = [reading(100, 16), reading(100, 0), decoding(1)];
        assert_eq!(plan(&before, FREE), vec![8, 0, 1]);
        let after = [reading(100, 0), decoding(1)];
        assert_eq!(plan(&after, FREE), vec![8, 1]);
    }

    #[test]
    fn the_chunk_tracks_what_a_prompt_token_costs_beside_a_decode_step() {
        let mut c = ChunkSizer::default();
        // Nothing measured yet: an eighth of the micro-batch.
        assert_eq!(c.chunk(512), 64);
        c.observe(0.125, 4, 0);
        // A step with 16 prompt tokens took 0.125 s more: 16 tokens cost a decode step.
        c.observe(0.25, 4, 16);
        assert_eq!(c.chunk(512), 16);
        // Never below the floor, never above the micro-batch.
        c.observe(10.0, 4, 16);
        assert_eq!(c.chunk(512), ChunkSizer::MIN);
        let mut fast = ChunkSizer::default();
        fast.observe(1.0, 4, 0);
        fast.observe(1.0 + 1e-6, 4, 1);
        assert_eq!(fast.chunk(64), 64);
    }
}
