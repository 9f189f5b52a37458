//! Tokenizers and chat templates from GGUF metadata, matching llama.cpp token for token.
//!
//! [`Tokenizer::from_gguf`] reads the vocabulary once into flat tables (ids, scores, attributes,
//! a detokenized piece per token) and picks the algorithm: byte-level BPE with per-model
//! pre-tokenizer rules (`tokenizer.ggml.model = gpt2`) or SentencePiece-style merges by score
//! (`llama`). Special-token text is split out first (llama.cpp's `tokenizer_st_partition`), with
//! an Aho–Corasick pass so the cost does not grow with the thousands of special tokens Gemma has.
//! [`StreamDecoder`] turns generated ids into complete UTF-8 text; [`ChatTemplate`] renders
//! `tokenizer.chat_template` with minijinja.

#![forbid(unsafe_code)]

mod bpe;
mod chat;
mod fxhash;
mod pretok;
mod spm;
mod stream;
mod texts;
mod unicode;
mod vocab;

pub use chat::{
    strftime, ChatError, ChatMessage, ChatTemplate, CHATML_FALLBACK, GEMMA_FALLBACK, RENDER_FUEL,
};
pub use pretok::PreType;
pub use stream::StreamDecoder;
pub use vocab::{attr, SpecialIds, TokenType};

use pretok::PreTokenizer;
use texts::TokenTexts;

/// What went wrong reading a tokenizer from GGUF metadata.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("the GGUF file has no `tokenizer.ggml.model`: it carries no vocabulary; use a GGUF converted with its tokenizer")]
    MissingModel,
    #[error("unsupported tokenizer.ggml.model {0:?}: snug supports \"gpt2\" (byte-level BPE) and \"llama\" (SentencePiece)")]
    UnknownModel(String),
    #[error("unknown tokenizer.ggml.pre {name:?}: snug does not know this pre-tokenizer's split rules; known: {}", pretok::KNOWN_PRE)]
    UnknownPre { name: String },
    #[error("metadata key `{key}` is missing or malformed: {what}")]
    BadKey { key: &'static str, what: String },
    #[error("duplicate token in vocabulary: {text:?} has ids {first} and {second}; the GGUF vocabulary is corrupt")]
    DuplicateToken { text: String, first: u32, second: u32 },
    #[error("`{flag}` is true but `{id_key}` is not set; the GGUF metadata is inconsistent")]
    MissingSpecial { flag: &'static str, id_key: &'static str },
    #[error("pre-tokenizer regex {pattern:?} failed to compile: {message}")]
    Regex { pattern: String, message: String },
}

/// Which merge algorithm the vocabulary uses.
#[derive(Debug)]
// One per tokenizer: the size of the BPE variant's tables costs nothing here.
#[allow(clippy::large_enum_variant)]
enum Algo {
    /// Byte-level BPE with a pre-tokenizer.
    Bpe { bpe: bpe::Bpe, pre: PreTokenizer },
    /// SentencePiece-style merges by score.
    Spm,
}

/// A piece of input after special-token partitioning.
#[derive(Clone, Copy, Debug)]
enum Frag {
    Text(usize, usize),
    Token(u32),
}

/// A tokenizer read from GGUF metadata. Immutable and `Sync`: share it behind an `Arc`.
#[derive(Debug)]
pub struct Tokenizer {
    algo: Algo,
    /// `[n_vocab]` token texts as stored in the GGUF, and the index from text to id.
    texts: TokenTexts,
    /// `[n_vocab]` SentencePiece scores; empty when the vocabulary has none (all 0, BPE).
    scores: Vec<f32>,
    /// `[n_vocab]` llama.cpp token attributes, see [`attr`].
    attrs: Vec<u16>,
    /// Detokenized bytes of every token (special tokens rendered), concatenated; `piece_off` has
    /// `n_vocab + 1` offsets into it.
    pieces: Vec<u8>,
    piece_off: Vec<u32>,
    special: SpecialIds,
    /// Sorted ids that end generation.
    eog: Vec<u32>,
    /// Special tokens split out of text, longest text first (llama.cpp's order).
    special_cache: Vec<u32>,
    /// Finds which special tokens occur at all, so partitioning skips the rest.
    special_ac: Option<aho_corasick::AhoCorasick>,
    add_bos: bool,
    add_eos: bool,
    add_space_prefix: bool,
    clean_spaces: bool,
    model: String,
    pre_name: String,
}

impl Tokenizer {
    /// Reads the vocabulary and its rules from `tokenizer.ggml.*` metadata.
    ///
    /// Fails with a message naming the problem for an unknown `tokenizer.ggml.model` or
    /// `tokenizer.ggml.pre`, a missing or malformed token list, or inconsistent special ids.
    pub fn from_gguf(f: &gguf::GgufFile) -> Result<Tokenizer, TokenizerError> {
        vocab::load(f)
    }

    /// Number of tokens in the vocabulary.
    pub fn n_vocab(&self) -> usize {
        self.texts.len()
    }

    /// `tokenizer.ggml.model` (`gpt2` or `llama`).
    pub fn model(&self) -> &str {
        &self.model
    }

    /// `tokenizer.ggml.pre` as stored (empty when absent).
    pub fn pre(&self) -> &str {
        &self.pre_name
    }

    /// Tokenizes `text` like llama.cpp's `llama_tokenize`.
    ///
    /// `add_special` adds the model's default BOS/EOS (per `add_bos_token`/`add_eos_token`);
    /// `parse_special` lets text such as `<|im_start|>` become its control token. User-defined
    /// tokens (e.g. Gemma's whitespace runs) are always matched first, as llama.cpp does.
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<u32> {
        let frags = self.partition(text, parse_special);
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_special && self.add_bos {
            if let Some(bos) = self.special.bos {
                out.push(bos);
            }
        }
        match &self.algo {
            Algo::Spm => {
                let mut is_prev_special = true;
                let mut buf = String::new();
                for frag in frags {
                    match frag {
                        Frag::Text(off, len) => {
                            buf.clear();
                            if self.add_space_prefix && is_prev_special {
                                buf.push('▁');
                            }
                            for c in text[off..off + len].chars() {
                                if c == ' ' {
                                    buf.push('▁');
                                } else {
                                    buf.push(c);
                                }
                            }
                            spm::encode(self, &buf, &mut out);
                            is_prev_special = false;
                        }
                        Frag::Token(id) => {
                            out.push(id);
                            is_prev_special = true;
                        }
                    }
                }
            }
            Algo::Bpe { bpe, pre } => {
                let mut words = Vec::new();
                let mut scratch = bpe::Scratch::default();
                let lookup = |s: &str| self.texts.find(s);
                for frag in frags {
                    match frag {
                        Frag::Text(off, len) => {
                            let t = &text[off..off + len];
                            words.clear();
                            pre.split(t, &mut words);
                            for w in &words {
                                bpe.encode_word(
                                    &t.as_bytes()[w.clone()],
                                    &lookup,
                                    &mut scratch,
                                    &mut out,
                                );
                            }
                        }
                        Frag::Token(id) => out.push(id),
                    }
                }
            }
        }
        if add_special && self.add_eos {
            if let Some(eos) = self.special.eos {
                out.push(eos);
            }
        }
        out
    }

    /// Splits special-token text out of `text` (llama.cpp's `tokenizer_st_partition`): for each
    /// special token, longest first, every leftmost non-overlapping occurrence in the remaining
    /// text becomes that token.
    fn partition(&self, text: &str, parse_special: bool) -> Vec<Frag> {
        let mut frags = Vec::new();
        if text.is_empty() {
            return frags;
        }
        frags.push(Frag::Text(0, text.len()));
        let Some(ac) = &self.special_ac else {
            return frags;
        };
        let mut present = vec![false; self.special_cache.len()];
        let mut any = false;
        for m in ac.find_overlapping_iter(text) {
            present[m.pattern().as_usize()] = true;
            any = true;
        }
        if !any {
            return frags;
        }
        let bytes = text.as_bytes();
        let mut next = Vec::new();
        for (i, &id) in self.special_cache.iter().enumerate() {
            if !present[i] {
                continue;
            }
            let a = self.attrs[id as usize];
            if !parse_special && a & (attr::CONTROL | attr::UNKNOWN) != 0 {
                continue;
            }
            let tok = self.texts.get(id).unwrap_or_default();
            next.clear();
            for &frag in &frags {
                let Frag::Text(off, len) = frag else {
                    next.push(frag);
                    continue;
                };
                let (mut base, mut blen) = (off, len);
                loop {
                    let Some(rel) = text[base..base + blen].find(tok) else {
                        if blen > 0 {
                            next.push(Frag::Text(base, blen));
                        }
                        break;
                    };
                    let m = base + rel;
                    let mut left = m - base;
                    if a & attr::LSTRIP != 0 {
                        while left > 0 && is_c_space(bytes[base + left - 1]) {
                            left -= 1;
                        }
                    }
                    if left > 0 {
                        next.push(Frag::Text(base, left));
                    }
                    next.push(Frag::Token(id));
                    let right = m + tok.len();
                    if right >= base + blen {
                        break;
                    }
                    let (mut roff, mut rlen) = (right, base + blen - right);
                    if a & attr::RSTRIP != 0 {
                        while rlen > 0 && is_c_space(bytes[roff]) {
                            roff += 1;
                            rlen -= 1;
                        }
                    }
                    base = roff;
                    blen = rlen;
                }
            }
            std::mem::swap(&mut frags, &mut next);
        }
        frags
    }

    /// The detokenized bytes of one token, special tokens rendered as their text (llama.cpp's
    /// `llama_token_to_piece(..., special = true)`). Empty for an id outside the vocabulary.
    pub fn token_piece(&self, id: u32) -> &[u8] {
        let i = id as usize;
        if i + 1 >= self.piece_off.len() {
            return &[];
        }
        &self.pieces[self.piece_off[i] as usize..self.piece_off[i + 1] as usize]
    }

    /// The token's text as stored in the vocabulary (`Ġhello`, `▁hello`, `<|im_end|>`).
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.texts.get(id)
    }

    /// The id of a token given its exact vocabulary text.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.texts.find(text)
    }

    /// llama.cpp attribute bits of a token (see [`attr`]); 0 for an id outside the vocabulary.
    pub fn token_attr(&self, id: u32) -> u16 {
        self.attrs.get(id as usize).copied().unwrap_or(0)
    }

    /// True for control and unknown tokens, which render as nothing unless asked.
    pub fn is_control(&self, id: u32) -> bool {
        self.token_attr(id) & (attr::CONTROL | attr::UNKNOWN) != 0
    }

    /// Text of `ids` (llama.cpp's `llama_detokenize(remove_special = false,
    /// unparse_special = true)`), invalid UTF-8 replaced by U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> String {
        String::from_utf8_lossy(&self.detokenize(ids, false, true)).into_owned()
    }

    /// llama.cpp's `llama_detokenize`: drops the model's BOS/EOS when `remove_special`, renders
    /// control tokens only when `unparse_special`, strips the SentencePiece prefix space of the
    /// first token, and applies `clean_up_tokenization_spaces` where the vocabulary asks for it.
    pub fn detokenize(&self, ids: &[u32], remove_special: bool, unparse_special: bool) -> Vec<u8> {
        let mut ids = ids;
        let mut remove_space = self.add_space_prefix;
        if remove_special && self.add_bos && !ids.is_empty() && Some(ids[0]) == self.special.bos {
            remove_space = false;
            ids = &ids[1..];
        }
        if remove_special
            && self.add_eos
            && !ids.is_empty()
            && Some(ids[ids.len() - 1]) == self.special.eos
        {
            ids = &ids[..ids.len() - 1];
        }
        let mut text = Vec::with_capacity(ids.len() * 4);
        for &id in ids {
            let mut piece = if !unparse_special && self.is_control(id) {
                &[][..]
            } else {
                self.token_piece(id)
            };
            if remove_space && piece.first() == Some(&b' ') {
                piece = &piece[1..];
            }
            remove_space = false;
            text.extend_from_slice(piece);
        }
        if self.clean_spaces {
            clean_up_spaces(&mut text);
        }
        text
    }

    /// Beginning-of-sequence token, if the vocabulary has one.
    pub fn bos(&self) -> Option<u32> {
        self.special.bos
    }

    /// End-of-sequence token.
    pub fn eos(&self) -> Option<u32> {
        self.special.eos
    }

    /// End-of-turn token (`<|im_end|>`, `<end_of_turn>`, `<|eot_id|>`...), from metadata or
    /// found by its text as llama.cpp does.
    pub fn eot(&self) -> Option<u32> {
        self.special.eot
    }

    /// All special ids read from metadata or detected by text.
    pub fn special_ids(&self) -> &SpecialIds {
        &self.special
    }

    /// True for tokens that end generation: EOS, EOT, EOM and llama.cpp's text-detected set
    /// (`<|im_end|>`, `<|endoftext|>`, `<end_of_turn>`, `<|eot_id|>`, FIM pad/repo/sep...).
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.binary_search(&id).is_ok()
    }

    /// The end-of-generation ids, sorted.
    pub fn eog_ids(&self) -> &[u32] {
        &self.eog
    }

    /// Whether `encode(.., add_special = true, ..)` prepends BOS.
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// Whether `encode(.., add_special = true, ..)` appends EOS.
    pub fn add_eos(&self) -> bool {
        self.add_eos
    }

    /// Whether SentencePiece text gets a leading space (and detokenizing strips it).
    pub fn add_space_prefix(&self) -> bool {
        self.add_space_prefix
    }
}

impl spm::SpmVocab for Tokenizer {
    fn lookup(&self, text: &str) -> Option<u32> {
        self.texts.find(text)
    }
    fn score(&self, id: u32) -> f32 {
        self.scores.get(id as usize).copied().unwrap_or(0.0)
    }
    fn byte_token(&self, b: u8) -> Option<u32> {
        const HEX: &[u8; 16] = b"0123456789ABCDEF";
        let name = [b'<', b'0', b'x', HEX[(b >> 4) as usize], HEX[(b & 15) as usize], b'>'];
        let name = std::str::from_utf8(&name).unwrap_or("");
        if let Some(id) = self.texts.find(name) {
            return Some(id);
        }
        if b < 0x80 {
            if let Some(id) = self.texts.find((b as char).encode_utf8(&mut [0u8; 4])) {
                return Some(id);
            }
        }
        // llama.cpp would throw here; the unknown token is the honest stand-in.
        self.special.unk
    }
}

/// C `isspace` in the "C" locale.
fn is_c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0B | 0x0C | b'\r')
}

/// llama.cpp's `clean_spaces` passes: ` ?`→`?` (also `!.,`), ` ' `→`'`, ` 's`/` 'm`/` 're`/` 've`.
fn clean_up_spaces(text: &mut Vec<u8>) {
    if text.is_empty() {
        return;
    }
    // first pass: " ?", " !", " .", " ,"
    let n = text.len();
    let mut total = 1;
    for i in 1..n {
        let x = text[i];
        if text[i - 1] == b' ' && matches!(x, b'?' | b'!' | b'.' | b',') {
            total -= 1;
        }
        text[total] = x;
        total += 1;
    }
    text.truncate(total);
    // second pass: single apostrophe between spaces
    let n = text.len();
    let mut total = 1;
    let mut i = 1;
    while i < n {
        let x = text[i];
        if x == b'\'' && i + 1 < n && text[i - 1] == b' ' && text[i + 1] == b' ' {
            total -= 1;
            i += 1;
            text[i] = 0;
        }
        text[total] = x;
        total += 1;
        i += 1;
    }
    text.truncate(total);
    // third pass: contractions
    let n = text.len();
    let mut total = 1;
    for i in 1..n {
        let x = text[i];
        if text[i - 1] == b' ' && x == b'\'' && i + 1 < n {
            let x1 = text[i + 1];
            if x1 == b's' || x1 == b'm' {
                total -= 1;
            } else if i + 2 < n {
                let x2 = text[i + 2];
                if (x1 == b'r' || x1 == b'v') && x2 == b'e' {
                    total -= 1;
                }
            }
        }
        text[total] = x;
        total += 1;
    }
    text.truncate(total);
}
