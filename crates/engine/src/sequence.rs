//! One answer's finish rule and text, shared by the CLI's [`crate::Session`] and the server's
//! scheduler: [`Sequence::accept`] takes each sampled token and says what text it settles and
//! whether the answer is done, and [`Sequence::flush`] gives what was held back at the end.
//!
//! The rule, in order: an end-of-generation token ends the answer (unless ignored) and adds no
//! text; otherwise the token's text goes through the stop strings ([`StopMatcher`]), which hold
//! back what may begin one; a stop string ends it (its text and what was held are dropped); a
//! constraint that is complete ends it (JSON mode's object closed, the tool calls written);
//! then the token limit; then a full context. [`Sequence::sample`] draws the token under the
//! constraints (JSON mode, the tool grammar while it constrains); the caller owns the logits
//! and the [`Sampler`].
//!
//! Cost per token: the detokenizer's and the stop matcher's (O(the token's bytes), see
//! [`StopMatcher`]) and one byte step per constraint; a constrained draw adds one pass over the
//! vocabulary ([`JsonVocab`], [`ToolMask::apply`]) on a copy of the row in [`Masks`].

use std::sync::Arc;

use tokenizer::{StreamDecoder, Tokenizer};

use crate::json::{JsonMask, JsonVocab};
use crate::sampling::Sampler;
use crate::stops::StopMatcher;
use crate::tools::ToolMask;

/// Why an answer ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    /// An end-of-generation token.
    Eog,
    /// A stop string.
    StopString,
    /// The constraint is complete: the JSON value closed, or the tool calls were written.
    Complete,
    /// The token limit.
    Length,
    /// The context cannot take the token.
    ContextFull,
}

/// What one accepted token settles.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    /// Text now certain not to be part of a stop string (may be empty).
    pub text: String,
    /// Set when the answer is done with this token.
    pub finish: Option<Finish>,
}

/// What constrained draws reuse: the vocabulary's table for the JSON checker (built at the
/// first constrained draw, `JsonVocab::heap_bytes`) and a row of logits to mask. One per
/// sampling thread, shared by every sequence of one tokenizer.
#[derive(Default)]
pub struct Masks {
    vocab: Option<JsonVocab>,
    row: Vec<f32>,
}

impl Masks {
    fn vocab(&mut self, tk: &Tokenizer, n: usize) -> &mut JsonVocab {
        if self.vocab.as_ref().is_some_and(|v| v.len() != n) {
            self.vocab = None;
        }
        self.vocab.get_or_insert_with(|| JsonVocab::new(n, |t| json_piece(tk, t), |t| tk.is_eog(t)))
    }
}

/// A token's text as JSON may take it: control tokens have none (the masks refuse empty pieces).
fn json_piece(tk: &Tokenizer, t: u32) -> &[u8] {
    if tk.is_control(t) {
        &[]
    } else {
        tk.token_piece(t)
    }
}

/// `tok`, or the best token `masked` allows when `tok` is refused: only the sampler's
/// last-candidate fallback (float rounding in its draw without min-p) can land on one.
fn allowed(masked: &[f32], tok: u32) -> u32 {
    if masked[tok as usize] > f32::NEG_INFINITY {
        return tok;
    }
    (0..masked.len()).max_by(|&a, &b| masked[a].total_cmp(&masked[b])).map_or(tok, |t| t as u32)
}

/// One answer in progress: its text state, its constraints and its finish rule.
pub struct Sequence {
    tok: Arc<Tokenizer>,
    decoder: StreamDecoder<Arc<Tokenizer>>,
    stops: StopMatcher,
    /// JSON mode's state (the caller masks logits with it before sampling).
    pub json: Option<JsonMask>,
    /// The tool-call grammar's state (likewise).
    pub tools: Option<ToolMask>,
    max_tokens: usize,
    ignore_eos: bool,
    n_gen: usize,
    /// A stop string ended the answer: nothing held back comes out.
    stop_hit: bool,
}

impl Sequence {
    /// An answer of at most `max_tokens` tokens that ends at `stops`. `special`: control
    /// tokens' text is part of the answer (a tool call's markup may be control tokens).
    pub fn new(tok: Arc<Tokenizer>, stops: StopMatcher, max_tokens: usize, special: bool) -> Self {
        Sequence {
            decoder: StreamDecoder::new(Arc::clone(&tok)).with_special(special),
            tok,
            stops,
            json: None,
            tools: None,
            max_tokens,
            ignore_eos: false,
            n_gen: 0,
            stop_hit: false,
        }
    }

    /// End-of-generation tokens are text like any other (benchmarks, `--ignore-eos`).
    pub fn ignoring_eos(mut self, ignore: bool) -> Self {
        self.ignore_eos = ignore;
        self
    }

    /// Constrained by JSON mode or a tool grammar (either may be absent).
    pub fn constrained(mut self, json: Option<JsonMask>, tools: Option<ToolMask>) -> Self {
        self.json = json;
        self.tools = tools;
        self
    }

    /// Tokens the limit still allows.
    pub fn tokens_left(&self) -> usize {
        self.max_tokens.saturating_sub(self.n_gen)
    }

    /// Tokens accepted into the answer (end-of-generation tokens not counted).
    pub fn n_gen(&self) -> usize {
        self.n_gen
    }

    /// Whether `tok` ends the answer as an end-of-generation token.
    pub fn is_end(&self, tok: u32) -> bool {
        !self.ignore_eos && self.tok.is_eog(tok)
    }

    /// Draws the next token from `logits` with `sampler`, under the answer's constraints;
    /// `None` when no token the vocabulary holds continues them (the answer ends rather than
    /// break its format). The sampler is not told of the token: [`Sequence::accept`] is.
    pub fn sample(&self, sampler: &mut Sampler, logits: &[f32], masks: &mut Masks) -> Option<u32> {
        let tk = &*self.tok;
        if let Some(tools) = self.tools.as_ref().filter(|t| t.constrains()) {
            masks.vocab(tk, logits.len());
            let (Some(vocab), row) = (&masks.vocab, &mut masks.row) else { return None };
            row.clear();
            row.extend_from_slice(logits);
            let raw = |t| tk.token_piece(t);
            if !tools.apply(row, vocab, raw, |t| json_piece(tk, t), |t| tk.is_eog(t)) {
                return None;
            }
            return Some(allowed(row, sampler.sample(row)));
        }
        let Some(json) = &self.json else { return Some(sampler.sample(logits)) };
        let vocab = masks.vocab(tk, logits.len());
        let masked = vocab.masked(logits, json, |t| json_piece(tk, t))?;
        Some(allowed(masked, sampler.sample(masked)))
    }

    /// Takes the sampled token `tok`. `room`: whether the context can still take it (a
    /// sequence that will feed it needs one more position); without room the answer ends
    /// after its text.
    pub fn accept(&mut self, tok: u32, room: bool) -> Step {
        if self.is_end(tok) {
            return Step { text: String::new(), finish: Some(Finish::Eog) };
        }
        let piece = self.tok.token_piece(tok);
        if let Some(json) = &mut self.json {
            json.accept(piece);
        }
        if let Some(tools) = &mut self.tools {
            tools.accept(piece);
        }
        self.n_gen += 1;
        let text = self.decoder.push(tok);
        let (text, hit) = self.stops.push(&text);
        let finish = if hit {
            self.stop_hit = true;
            Some(Finish::StopString)
        } else if self.json.as_ref().is_some_and(JsonMask::is_complete)
            || self.tools.as_ref().is_some_and(ToolMask::is_complete)
        {
            Some(Finish::Complete)
        } else if self.n_gen >= self.max_tokens {
            Some(Finish::Length)
        } else if !room {
            Some(Finish::ContextFull)
        } else {
            None
        };
        Step { text, finish }
    }

    /// The index of the stop string that ended the answer (in the request's list), if one did.
    pub fn stop_string(&self) -> Option<usize> {
        self.stops.matched()
    }

    /// The text held back (a possible stop string's start, an unfinished character), once the
    /// answer has ended: empty if a stop string ended it.
    pub fn flush(&mut self) -> String {
        if self.stop_hit {
            return String::new();
        }
        self.stops.finish(&self.decoder.flush())
    }
}
