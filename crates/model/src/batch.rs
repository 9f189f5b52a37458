//! The unit of work of the forward pass: tokens from any number of sequences, each carrying its
//! sequence and position, so prefill chunks and many sequences' decode steps share every weight
//! read. Five parallel vectors, reused across calls (`clear` keeps their capacity).

use crate::kv::SeqId;

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
}
