//! Incremental detokenization for streaming output: bytes of each token's piece are buffered
//! and only complete UTF-8 is released, so a character split across tokens (emoji, CJK in
//! byte-level BPE, `<0xNN>` byte fallback) is never emitted in halves.
//!
//! Cost: O(piece length) per token; the buffer holds at most 3 pending bytes.

use std::borrow::Borrow;

use crate::Tokenizer;

/// Turns a stream of token ids into text. Holds the tokenizer by any borrow (`&Tokenizer`,
/// `Arc<Tokenizer>`), so a sequence can own its decoder.
///
/// Control tokens (`<|im_end|>`, `<end_of_turn>`) render as nothing unless
/// [`StreamDecoder::with_special`] asks for them, like llama.cpp's server; SentencePiece `▁`
/// renders as a space. The first token's leading space is kept (generation continues a prompt)
/// unless [`StreamDecoder::strip_leading_space`] is set for text that starts a document.
#[derive(Debug)]
pub struct StreamDecoder<T: Borrow<Tokenizer>> {
    tok: T,
    pending: Vec<u8>,
    special: bool,
    strip_space: bool,
}

impl<T: Borrow<Tokenizer>> StreamDecoder<T> {
    pub fn new(tok: T) -> Self {
        StreamDecoder { tok, pending: Vec::new(), special: false, strip_space: false }
    }

    /// Render control tokens as their text.
    pub fn with_special(mut self, special: bool) -> Self {
        self.special = special;
        self
    }

    /// Drop one leading space of the next token (llama.cpp does this for the first token of a
    /// detokenized SentencePiece sequence).
    pub fn strip_leading_space(mut self, strip: bool) -> Self {
        self.strip_space = strip;
        self
    }

    /// Adds one token; returns the text that became complete (possibly empty).
    pub fn push(&mut self, id: u32) -> String {
        let tok = self.tok.borrow();
        let mut piece =
            if !self.special && tok.is_control(id) { &[][..] } else { tok.token_piece(id) };
        if self.strip_space && !piece.is_empty() {
            if piece[0] == b' ' {
                piece = &piece[1..];
            }
            self.strip_space = false;
        }
        self.pending.extend_from_slice(piece);
        self.take_complete()
    }

    /// Everything still buffered, invalid or incomplete bytes as U+FFFD.
    pub fn flush(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }

    /// Bytes waiting for the rest of their character.
    pub fn pending_bytes(&self) -> usize {
        self.pending.len()
    }

    fn take_complete(&mut self) -> String {
        let mut out = String::new();
        let mut start = 0;
        loop {
            match std::str::from_utf8(&self.pending[start..]) {
                Ok(s) => {
                    out.push_str(s);
                    start = self.pending.len();
                    break;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    out.push_str(
                        std::str::from_utf8(&self.pending[start..start + valid]).unwrap_or(""),
                    );
                    start += valid;
                    match e.error_len() {
                        // Bytes that can never start or continue a character.
                        Some(bad) => {
                            out.push('\u{FFFD}');
                            start += bad;
                        }
                        // A character still incomplete at the end: wait for more.
                        None => break,
                    }
                }
            }
        }
        self.pending.drain(..start);
        out
    }
}
