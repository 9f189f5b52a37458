//! The unit of work of the forward pass: tokens from any number of sequences, each carrying its
//! sequence and position, so prefill chunks and many sequences' decode steps share every weight
//! read. Five parallel vectors, reused across calls (`clear` keeps their capacity).

use std::ops::Range;

use crate::kv::{SeqId, BLOCK_TOKENS};

/// Tokens to run, each with its position, sequence and whether its logits (or its final hidden
/// state, for embeddings) are wanted.
#[derive(Clone, Debug, Default)]
pub struct Batch {
    pub tokens: Vec<u32>,
    pub pos: Vec<usize>,
    pub seq: Vec<SeqId>,
    pub logits: Vec<bool>,
    /// The token's final hidden state (after the output norm) is wanted: an embedding's input
    /// ([`crate::Context::hidden`]).
    pub hidden: Vec<bool>,
}

impl Batch {
    /// Heap bytes one token takes in a batch (its entry in each array).
    pub const BYTES_PER_TOKEN: usize = std::mem::size_of::<u32>()
        + std::mem::size_of::<usize>()
        + std::mem::size_of::<SeqId>()
        + 2 * std::mem::size_of::<bool>();

    pub fn clear(&mut self) {
        self.tokens.clear();
        self.pos.clear();
        self.seq.clear();
        self.logits.clear();
        self.hidden.clear();
    }

    pub fn push(&mut self, token: u32, pos: usize, seq: SeqId, logits: bool) {
        self.tokens.push(token);
        self.pos.push(pos);
        self.seq.push(seq);
        self.logits.push(logits);
        self.hidden.push(false);
    }

    /// Pushes a token whose final hidden state, not its logits, is wanted.
    pub fn push_hidden(&mut self, token: u32, pos: usize, seq: SeqId) {
        self.push(token, pos, seq, false);
        if let Some(h) = self.hidden.last_mut() {
            *h = true;
        }
    }

    /// Tokens whose hidden state is wanted.
    pub fn n_hidden(&self) -> usize {
        self.hidden.iter().filter(|&&h| h).count()
    }

    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    pub fn n_outputs(&self) -> usize {
        self.logits.iter().filter(|&&l| l).count()
    }

    /// Appends to `out` the tokens of `b0..b1` (as offsets from `b0`) that lie in whole
    /// [`BLOCK_TOKENS`]-aligned position blocks of one sequence, given in order in that range:
    /// the tokens that run on the prefill panels (`quant::kernels::matmul_multi_panels`). Each
    /// range is one sequence's consecutive positions, a whole number of blocks.
    ///
    /// A panel sums in another order than the row kernels, so this rule is what keeps a
    /// token's result independent of its batch: a block computed whole is computed on the
    /// panel in any batch, and the prefix cache shares only whole blocks. The scheduler cuts
    /// prefill chunks, and [`crate::Context::decode`] its micro-batches, at block boundaries.
    pub fn panel_runs(&self, b0: usize, b1: usize, out: &mut Vec<Range<usize>>) {
        let mut i = b0;
        while i < b1 {
            // The run of consecutive positions of one sequence starting at i.
            let mut j = i + 1;
            while j < b1 && self.seq[j] == self.seq[i] && self.pos[j] == self.pos[j - 1] + 1 {
                j += 1;
            }
            let p0 = self.pos[i];
            let first = p0.next_multiple_of(BLOCK_TOKENS);
            let last = (p0 + (j - i)) / BLOCK_TOKENS * BLOCK_TOKENS;
            if last > first {
                out.push(i - b0 + (first - p0)..i - b0 + (last - p0));
            }
            i = j;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runs(batch: &Batch, b0: usize, b1: usize) -> Vec<Range<usize>> {
        let mut out = Vec::new();
        batch.panel_runs(b0, b1, &mut out);
        out
    }

    #[test]
    fn panel_runs_are_the_whole_aligned_blocks_of_each_sequence() {
        let mut b = Batch::default();
        // Two decode tokens, then sequence 2 from position 40 to 139, then sequence 3 from 0 to 31.
        b.push(7, 300, 0, true);
        b.push(7, 12, 1, true);
        (40..140).for_each(|p| b.push(1, p, 2, p == 139));
        (0..32).for_each(|p| b.push(1, p, 3, p == 31));
        // Positions 64..128 of sequence 2 (batch 26..90) and all of sequence 3 (batch 102..134).
        assert_eq!(runs(&b, 0, b.len()), vec![26..90, 102..134]);
        // Offsets from b0; a range cut inside a block keeps only the whole blocks it holds.
        assert_eq!(runs(&b, 26, 80), vec![0..32]);
        assert_eq!(runs(&b, 2, 2), Vec::<Range<usize>>::new());
    }

    #[test]
    fn a_gap_in_positions_or_a_change_of_sequence_ends_a_run() {
        let mut b = Batch::default();
        (0..20).for_each(|p| b.push(1, p, 0, false));
        (21..64).for_each(|p| b.push(1, p, 0, false));
        (64..96).for_each(|p| b.push(1, p, 1, false));
        // 0..20 and 21..64 hold no whole block together (position 20 is missing); 32..64 is whole.
        assert_eq!(runs(&b, 0, b.len()), vec![31..63, 63..95]);
    }
}
