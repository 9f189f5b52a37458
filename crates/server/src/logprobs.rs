//! Log-probabilities of generated tokens (OpenAI's `logprobs`, `top_logprobs`).
//!
//! What is reported (computed by [`engine::logprobs`]): the log-softmax of the model's raw logits over the whole vocabulary, for
//! the sampled token and the `top` most likely ones — the distribution the model gave, before
//! temperature, penalties, top-k/p or min-p shaped what was sampled from. That is what
//! `llama-server` reports by default (`post_sampling_probs: false`: a softmax over the raw
//! logits) and what OpenAI documents ("the log probability of this token"); a token the sampler
//! picked from a shaped distribution may therefore not be the top-1 here, and its logprob says
//! how likely the model itself found it.
//!
//! Shapes: chat completions get `logprobs.content[] = {token, logprob, bytes, top_logprobs[]}`;
//! legacy completions get `{tokens, token_logprobs, top_logprobs: [{token: logprob}],
//! text_offset}` with offsets in characters of the generated text (the prompt is not echoed).
//! Streamed chunks carry the tokens sampled since the previous chunk (a token whose text is held
//! back for a possible stop string or an unfinished UTF-8 character is reported with the chunk
//! before its text), so the streamed lists concatenate to the non-streamed one.
//!
//! The numbers are [`engine::logprobs`]' (the CLI's `--logprobs` reports the same); this
//! module renders them in each route's shape.

use std::sync::Arc;

use engine::logprobs::{TokenLogprob, MAX_TOP};

use serde_json::{json, Map, Value};
use tokenizer::Tokenizer;

use crate::responses::openai::{ChatLogprobs, LegacyLogprobs, TokenLogprob as Entry, TopLogprob};
use tokio::sync::mpsc::UnboundedReceiver;

/// A token's text (invalid UTF-8 replaced) and its bytes.
fn piece(tok: &Tokenizer, id: u32) -> (String, &[u8]) {
    let b = tok.token_piece(id);
    (String::from_utf8_lossy(b).into_owned(), b)
}

/// A chat choice's `logprobs` for `tokens`: `{content: [...], refusal: null}`.
pub fn chat(tok: &Tokenizer, tokens: &[TokenLogprob]) -> ChatLogprobs {
    let content = tokens
        .iter()
        .map(|t| {
            let (text, bytes) = piece(tok, t.token);
            let token =
                TopLogprob { token: text, logprob: t.logprob as f64, bytes: bytes.to_vec() };
            let top_logprobs = t
                .top
                .iter()
                .map(|&(id, lp)| {
                    let (token, bytes) = piece(tok, id);
                    TopLogprob { token, logprob: lp as f64, bytes: bytes.to_vec() }
                })
                .collect();
            Entry { token, top_logprobs }
        })
        .collect();
    ChatLogprobs { content, refusal: None }
}

/// Legacy completion `logprobs`, keeping the text offset across streamed chunks.
#[derive(Debug, Default)]
pub struct Legacy {
    /// Characters of generated text before the next token.
    offset: usize,
}

impl Legacy {
    /// `{tokens, token_logprobs, top_logprobs, text_offset}` for the next `tokens`.
    pub fn render(&mut self, tok: &Tokenizer, tokens: &[TokenLogprob]) -> LegacyLogprobs {
        let mut out = LegacyLogprobs {
            tokens: Vec::new(),
            token_logprobs: Vec::new(),
            top_logprobs: Vec::new(),
            text_offset: Vec::new(),
        };
        for t in tokens {
            let (text, bytes) = piece(tok, t.token);
            out.text_offset.push(self.offset);
            // Characters start at every byte that is not a UTF-8 continuation byte.
            self.offset += bytes.iter().filter(|&&b| b & 0xC0 != 0x80).count();
            out.tokens.push(text);
            out.token_logprobs.push(t.logprob as f64);
            let top: Map<String, Value> =
                t.top.iter().map(|&(id, lp)| (piece(tok, id).0, json!(lp))).collect();
            out.top_logprobs.push(top);
        }
        out
    }
}

/// The alternatives asked per token when log-probabilities are asked for (`on`), checked:
/// `top` (named `field` in the request) at most [`MAX_TOP`], and only with `on`.
pub fn asked(on: bool, top: Option<u32>, field: &str) -> Result<Option<usize>, String> {
    match top {
        Some(n) if n as usize > MAX_TOP => {
            Err(format!("{field} is {n}; at most {MAX_TOP} alternatives per token are returned"))
        }
        Some(_) if !on => Err(format!("{field} needs logprobs: true")),
        _ => Ok(on.then(|| top.unwrap_or(0) as usize)),
    }
}

/// A job's log-probabilities as they arrive, rendered in its route's shape.
pub struct Rendering {
    rx: UnboundedReceiver<TokenLogprob>,
    tok: Arc<Tokenizer>,
    /// The text offset of the legacy shape.
    legacy: Legacy,
}

impl Rendering {
    pub fn new(rx: UnboundedReceiver<TokenLogprob>, tok: Arc<Tokenizer>) -> Rendering {
        Rendering { rx, tok, legacy: Legacy::default() }
    }

    /// Every entry received since the last call (all of them once the job's `Done` arrived:
    /// entries are sent before the text they belong to).
    fn received(&mut self) -> Vec<TokenLogprob> {
        let mut got = Vec::new();
        while let Ok(t) = self.rx.try_recv() {
            got.push(t);
        }
        got
    }

    /// The entries since the last call in chat's shape.
    pub fn chat(&mut self) -> ChatLogprobs {
        let got = self.received();
        chat(&self.tok, &got)
    }

    /// The entries since the last call in the legacy completion's shape.
    pub fn legacy(&mut self) -> LegacyLogprobs {
        let got = self.received();
        self.legacy.render(&self.tok, &got)
    }
}

/// [`Rendering::chat`], or null when log-probabilities were not asked for.
pub fn take_chat(r: &mut Option<Rendering>) -> Option<ChatLogprobs> {
    r.as_mut().map(Rendering::chat)
}

/// [`Rendering::legacy`], or null when log-probabilities were not asked for.
pub fn take_legacy(r: &mut Option<Rendering>) -> Option<LegacyLogprobs> {
    r.as_mut().map(Rendering::legacy)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logprobs_are_a_log_softmax_and_the_top_list_is_sorted() {
        let logits = [1.0f32, 3.0, 2.0, 3.0, -1.0];
        let t = TokenLogprob::from_logits(&logits, 2, 3);
        let z: f32 = logits.iter().map(|l| l.exp()).sum();
        assert!((t.logprob - (2.0 - z.ln())).abs() < 1e-5, "{t:?}");
        assert_eq!(t.top.iter().map(|p| p.0).collect::<Vec<_>>(), vec![1, 3, 2]);
        assert!(t.top.windows(2).all(|w| w[0].1 >= w[1].1));
        let total: f32 = t.top.iter().map(|p| p.1.exp()).sum();
        assert!(total <= 1.0 && t.top.iter().all(|p| p.1 <= 0.0));
        // No alternatives asked; more asked than the vocabulary has.
        assert!(TokenLogprob::from_logits(&logits, 0, 0).top.is_empty());
        assert_eq!(TokenLogprob::from_logits(&logits, 0, 99).top.len(), 5);
    }

    #[test]
    fn the_asked_number_is_checked() {
        assert_eq!(asked(false, None, "top_logprobs"), Ok(None));
        assert_eq!(asked(true, None, "top_logprobs"), Ok(Some(0)));
        assert_eq!(asked(true, Some(20), "top_logprobs"), Ok(Some(20)));
        let e = asked(true, Some(21), "top_logprobs").unwrap_err();
        assert!(e.contains("at most 20"), "{e}");
        let e = asked(false, Some(2), "top_logprobs").unwrap_err();
        assert!(e.contains("logprobs: true"), "{e}");
    }
}
