//! A draft model: a smaller model with the same vocabulary guesses greedily, one token a pass,
//! in its own context. It keeps the tokens it has computed; a new draft first feeds what the
//! sequence gained since (the kept guesses are already there, so usually one token), then
//! guesses. Cost per guess: one decode pass of the draft model (a 0.5B model is a third of a
//! 1.5B pass), so it pays only where most guesses are kept; memory: its weights, its KV cache
//! and its buffers ([`DraftModel::new`]'s `params`, one sequence, one row of logits).

use std::sync::Arc;

use model::{Batch, Context, ContextParams, Model, ModelError};
use tokenizer::Tokenizer;

use super::{Drafter, MAX_DRAFT};
use crate::sampling::greedy;

/// A draft model's context for one sequence.
pub struct DraftModel {
    ctx: Context,
    batch: Batch,
    /// The sequence so far (prompt and kept output).
    toks: Vec<u32>,
    /// Tokens whose keys and values the draft context holds, in order.
    fed: Vec<u32>,
}

impl DraftModel {
    /// A drafter for a model whose tokenizer is `tok`: `draft` (with tokenizer `draft_tok`)
    /// must have the same tokens, or its guesses would name other text. `params` size its
    /// context (one sequence and one row of logits are used whatever they say).
    pub fn new(
        draft: Arc<Model>,
        draft_tok: &Tokenizer,
        tok: &Tokenizer,
        params: ContextParams,
    ) -> Result<Self, ModelError> {
        let n = tok.n_vocab();
        let differs = (0..n as u32).find(|&t| draft_tok.token_piece(t) != tok.token_piece(t));
        if draft_tok.n_vocab() != n || draft.config.n_vocab < n || differs.is_some() {
            let why = match differs {
                Some(t) if draft_tok.n_vocab() == n => format!("token {t} differs"),
                _ => format!("{} tokens against {n}", draft_tok.n_vocab()),
            };
            return Err(ModelError::Unsupported(format!(
                "the draft model's tokenizer is not the model's ({why}): a draft model must share \
                 the tokenizer, e.g. a smaller model of the same family"
            )));
        }
        let params = ContextParams { n_seq_max: 1, n_outputs_max: 1, ..params };
        Ok(DraftModel {
            ctx: Context::new(draft, params),
            batch: Batch::default(),
            toks: Vec::new(),
            fed: Vec::new(),
        })
    }

    /// Makes the context hold `toks`, computing what differs from what it holds, with the
    /// last token's logits.
    fn sync(&mut self) -> Result<(), ModelError> {
        let common = self.fed.iter().zip(&self.toks).take_while(|(a, b)| a == b).count();
        // The last token is computed again when nothing is new, for its logits.
        let mut common = common.min(self.toks.len().saturating_sub(1));
        // A cut deeper than a window keeps behind needs the sequence computed again.
        if self.fed.len() - common > MAX_DRAFT && self.ctx.kv.seq_evicted(0) {
            self.ctx.kv.seq_clear(0);
            common = 0;
        }
        self.ctx.kv.seq_truncate(0, common);
        self.fed.truncate(common);
        let ub = self.ctx.params.n_ubatch.max(1);
        let todo = self.toks.len() - common;
        for (c, chunk) in self.toks[common..].chunks(ub).enumerate() {
            self.batch.clear();
            for (i, &t) in chunk.iter().enumerate() {
                let at = c * ub + i;
                self.batch.push(t, common + at, 0, at + 1 == todo);
            }
            self.ctx.decode(&self.batch)?;
            self.fed.extend_from_slice(chunk);
        }
        Ok(())
    }
}

impl Drafter for DraftModel {
    fn name(&self) -> &'static str {
        "model"
    }

    fn start(&mut self, prompt: &[u32]) {
        self.toks.clear();
        self.toks.extend_from_slice(prompt);
    }

    fn extend(&mut self, toks: &[u32]) {
        self.toks.extend_from_slice(toks);
    }

    fn draft(&mut self, max: usize, out: &mut Vec<u32>) -> Result<(), ModelError> {
        if max == 0 || self.toks.is_empty() {
            return Ok(());
        }
        let n_ctx = self.ctx.params.n_ctx;
        let max = max.min(n_ctx.saturating_sub(self.toks.len()));
        if max == 0 {
            return Ok(());
        }
        self.sync()?;
        for i in 0..max {
            let t = greedy(self.ctx.logits(0).iter().enumerate().map(|(i, &l)| (i as u32, l)));
            out.push(t);
            if i + 1 == max {
                break;
            }
            self.batch.clear();
            self.batch.push(t, self.fed.len(), 0, true);
            self.ctx.decode(&self.batch)?;
            self.fed.push(t);
        }
        Ok(())
    }
}
