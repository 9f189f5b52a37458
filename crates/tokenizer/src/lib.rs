//! Tokenizers and chat templates from GGUF metadata, matching llama.cpp token for token.
//!
//! [`Tokenizer::from_gguf`] reads the vocabulary once into flat tables (ids, scores, attributes,
//! a detokenized piece per token) and picks the algorithm: byte-level BPE with per-model
//! pre-tokenizer rules (`tokenizer.ggml.model = gpt2`) or SentencePiece-style merges by score
//! (`llama`). Special-token text is split out first (llama.cpp's `tokenizer_st_partition`), from
//! one Aho–Corasick pass over the text, so the cost does not grow with the thousands of special
//! tokens Gemma has ([`Tokenizer::encode`] says how).
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
    strftime, ChatError, ChatMessage, ChatPrompt, ChatTemplate, CHATML_FALLBACK, GEMMA_FALLBACK,
    RENDER_FUEL,
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
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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
    /// Finds the special tokens' texts in a text (pattern `i` is `special_cache[i]`).
    special_ac: Option<aho_corasick::AhoCorasick>,
    /// `[special_cache.len()]`: for each special token, the longest other one whose text is a
    /// proper prefix of its text ([`NO_SPECIAL`] when none), by place in `special_cache`.
    special_prefix: Vec<u32>,
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
    ///
    /// Cost: linear in the text for the special-token split (one Aho–Corasick pass, then
    /// one step per special-token occurrence that may be taken, each in O(log) of their count),
    /// whatever the number of special tokens; then the merges.
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<u32> {
        self.encode_parts(text, add_special, parse_special, &[])
    }

    /// A chat prompt ([`ChatTemplate::render_prompt`]) tokenized with BOS/EOS as
    /// `encode(.., add_special = true, ..)` adds them, the template's own text with special
    /// parsing and the client's strings as text: a content or a tool call's argument that writes
    /// a control token's text (`<|im_start|>`) gets the text's tokens, never the control token.
    /// User-defined tokens (Gemma's whitespace runs) are split out of them as
    /// `parse_special = false` does. It gives exactly `encode(text, true, true)` unless a
    /// control token's text overlaps a client string.
    pub fn encode_chat(&self, prompt: &ChatPrompt) -> Vec<u32> {
        self.encode_parts(&prompt.text, true, true, &prompt.as_text)
    }

    /// The text of a control (or unknown) token that `text` holds, if any: with special parsing
    /// on, that text would become the token. One Aho–Corasick pass.
    pub fn control_text_in(&self, text: &str) -> Option<&str> {
        let ac = self.special_ac.as_ref()?;
        ac.find_overlapping_iter(text).find_map(|m| {
            let id = self.special_cache[m.pattern().as_usize()];
            let control = self.attrs[id as usize] & (attr::CONTROL | attr::UNKNOWN) != 0;
            if m.is_empty() || !control {
                return None;
            }
            self.texts.get(id)
        })
    }

    /// [`Tokenizer::encode`] with special parsing off inside `as_text` (byte ranges of `text`,
    /// sorted and disjoint): a control or unknown token's text is split out only where it
    /// overlaps none of them. Text is not cut at their bounds: the merges run over a fragment
    /// between special tokens as they would without them.
    pub fn encode_parts(
        &self,
        text: &str,
        add_special: bool,
        parse_special: bool,
        as_text: &[std::ops::Range<usize>],
    ) -> Vec<u32> {
        let frags = self.partition_in(text, parse_special, as_text);
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

    /// Splits special-token text out of `text` with the result of llama.cpp's
    /// `tokenizer_st_partition` (for each special token, longest text first then lowest id,
    /// every leftmost non-overlapping occurrence in the text not yet taken becomes that token,
    /// with its lstrip/rstrip whitespace), without its pass per special token over every
    /// fragment. That order takes an occurrence exactly when it overlaps no occurrence taken
    /// before it in the order (rank, start), with the stripped whitespace counted as taken, so:
    ///
    /// - one Aho–Corasick pass gives, for each position, the longest allowed special text that
    ///   starts there (every other one starting there is a prefix of it);
    /// - those candidates are taken from a heap in (rank, start) order; one that overlaps what
    ///   is taken gives way to the next shorter special text that is a prefix of it
    ///   (`special_prefix`), if its start is still free.
    ///
    /// Each position is a candidate once per special text that is a prefix of the longest one
    /// there (a handful, e.g. Gemma's whitespace runs), so the work is linear in the text. When
    /// no two occurrences overlap and none strips whitespace (a chat prompt's markers), all are
    /// taken at once, without the heap.
    #[cfg(test)]
    fn partition(&self, text: &str, parse_special: bool) -> Vec<Frag> {
        self.partition_in(text, parse_special, &[])
    }

    /// [`Tokenizer::partition`], where a control or unknown token is allowed only where it
    /// overlaps none of the ranges `as_text` (sorted, disjoint).
    fn partition_in(
        &self,
        text: &str,
        parse_special: bool,
        as_text: &[std::ops::Range<usize>],
    ) -> Vec<Frag> {
        use std::cmp::Reverse;
        let n = text.len();
        if n == 0 {
            return Vec::new();
        }
        let Some(ac) = &self.special_ac else {
            return vec![Frag::Text(0, n)];
        };
        let len = |rank: u32| self.texts.get(self.special_cache[rank as usize]).map_or(0, str::len);
        let allowed = |rank: u32, at: usize| {
            let id = self.special_cache[rank as usize];
            if self.attrs[id as usize] & (attr::CONTROL | attr::UNKNOWN) == 0 {
                return true;
            }
            let end = at + len(rank);
            let i = as_text.partition_point(|r| r.end <= at);
            parse_special && as_text.get(i).is_none_or(|r| r.start >= end)
        };
        // The longest allowed special text starting at each position (the smallest rank: at one
        // start a longer text ranks first); allocated at the first occurrence.
        let mut best: Vec<u32> = Vec::new();
        for m in ac.find_overlapping_iter(text) {
            let rank = m.pattern().as_u32();
            if m.is_empty() || !allowed(rank, m.start()) {
                continue;
            }
            if best.is_empty() {
                best = vec![NO_SPECIAL; n];
            }
            let b = &mut best[m.start()];
            *b = (*b).min(rank);
        }
        if best.is_empty() {
            return vec![Frag::Text(0, n)];
        }
        // The usual case: occurrences that do not overlap and strip nothing are all taken.
        let strips = |rank: u32| {
            self.attrs[self.special_cache[rank as usize] as usize] & (attr::LSTRIP | attr::RSTRIP)
                != 0
        };
        let mut end = 0;
        let disjoint =
            best.iter().enumerate().filter(|&(_, &r)| r != NO_SPECIAL).all(|(at, &r)| {
                let ok = at >= end && !strips(r);
                end = at + len(r);
                ok
            });
        if disjoint {
            let mut frags = Vec::new();
            let mut at = 0;
            for (from, &r) in best.iter().enumerate().filter(|&(_, &r)| r != NO_SPECIAL) {
                if from > at {
                    frags.push(Frag::Text(at, from - at));
                }
                frags.push(Frag::Token(self.special_cache[r as usize]));
                at = from + len(r);
            }
            if at < n {
                frags.push(Frag::Text(at, n - at));
            }
            return frags;
        }
        let mut heap: std::collections::BinaryHeap<Reverse<(u32, usize)>> = best
            .iter()
            .enumerate()
            .filter(|&(_, &r)| r != NO_SPECIAL)
            .map(|(at, &r)| Reverse((r, at)))
            .collect();
        drop(best);
        let bytes = text.as_bytes();
        let mut taken = Taken::new(n);
        // (first byte taken, end of what is taken, token), in the order they are taken.
        let mut tokens: Vec<(usize, usize, u32)> = Vec::new();
        while let Some(Reverse((rank, at))) = heap.pop() {
            if taken.get(at) {
                continue;
            }
            let id = self.special_cache[rank as usize];
            let end = at + len(rank);
            if taken.any(at, end) {
                let mut p = self.special_prefix[rank as usize];
                while p != NO_SPECIAL && !allowed(p, at) {
                    p = self.special_prefix[p as usize];
                }
                if p != NO_SPECIAL {
                    heap.push(Reverse((p, at)));
                }
                continue;
            }
            let a = self.attrs[id as usize];
            let (mut from, mut to) = (at, end);
            if a & attr::LSTRIP != 0 {
                while from > 0 && !taken.get(from - 1) && is_c_space(bytes[from - 1]) {
                    from -= 1;
                }
            }
            if a & attr::RSTRIP != 0 {
                while to < n && !taken.get(to) && is_c_space(bytes[to]) {
                    to += 1;
                }
            }
            taken.set(from, to);
            tokens.push((from, to, id));
        }
        tokens.sort_unstable();
        let mut frags = Vec::with_capacity(2 * tokens.len() + 1);
        let mut at = 0;
        for (from, to, id) in tokens {
            if from > at {
                frags.push(Frag::Text(at, from - at));
            }
            frags.push(Frag::Token(id));
            at = to;
        }
        if at < n {
            frags.push(Frag::Text(at, n - at));
        }
        frags
    }

    /// llama.cpp's `tokenizer_st_partition` as written: a pass over every fragment per special
    /// token present (the reference [`Tokenizer::partition`] is tested against).
    #[cfg(test)]
    fn partition_reference(&self, text: &str, parse_special: bool) -> Vec<Frag> {
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

/// No special token (in `special_prefix`, and per position while partitioning).
pub(crate) const NO_SPECIAL: u32 = u32::MAX;

/// Bytes of a text already taken by a special token (or the whitespace it strips): a bit each.
struct Taken(Vec<u64>);

impl Taken {
    fn new(n: usize) -> Taken {
        Taken(vec![0; n.div_ceil(64)])
    }

    fn get(&self, i: usize) -> bool {
        self.0[i / 64] >> (i % 64) & 1 == 1
    }

    /// Whether any byte of `from..to` is taken.
    fn any(&self, from: usize, to: usize) -> bool {
        let mut i = from;
        while i < to {
            let (w, b) = (i / 64, i % 64);
            let width = (to - i).min(64 - b);
            let mask = if width == 64 { u64::MAX } else { ((1u64 << width) - 1) << b };
            if self.0[w] & mask != 0 {
                return true;
            }
            i += width;
        }
        false
    }

    fn set(&mut self, from: usize, to: usize) {
        for i in from..to {
            self.0[i / 64] |= 1 << (i % 64);
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::{Path, PathBuf};

    fn load(path: &Path) -> Tokenizer {
        let f = gguf::GgufFile::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        Tokenizer::from_gguf(&f).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    /// Every vocabulary at hand: the tiny test models, the fuzz fixtures (all of qwen2.5's and
    /// gemma3's special tokens) and the real models when fetched.
    fn vocabularies() -> Vec<(String, Tokenizer)> {
        let ws = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
        let mut paths: Vec<PathBuf> = ["llama", "qwen2", "gemma2", "gemma3", "phi3"]
            .iter()
            .map(|a| ws.join(format!("testdata/refdata/tiny/tiny-{a}.gguf")))
            .chain(
                ["bpe-qwen2.5-coder.gguf", "spm-gemma3.gguf"]
                    .iter()
                    .map(|f| ws.join("fuzz/fixtures").join(f)),
            )
            .collect();
        for alias in ["gemma3-270m", "qwen2.5-coder-0.5b"] {
            let p = hub::model_path(alias);
            if p.is_file() {
                paths.push(p);
            }
        }
        let mut v: Vec<(String, Tokenizer)> = paths
            .into_iter()
            .map(|p| (p.file_name().unwrap().to_string_lossy().into_owned(), load(&p)))
            .collect();
        v.push(("synthetic".into(), synthetic()));
        v
    }

    /// A SentencePiece vocabulary of special texts that overlap every way real ones do not: a
    /// shorter one ending where a longer one starts (`ab`|`bcd`|`cdefg`), nested prefixes
    /// (`aa` in `aaa`), whitespace runs, control and user-defined mixed.
    fn synthetic() -> Tokenizer {
        let tokens: [(&str, i32); 21] = [
            ("<unk>", 2),
            ("<s>", 3),
            ("</s>", 3),
            ("ab", 4),
            ("bcd", 4),
            ("cdefg", 4),
            ("abc", 3),
            ("aa", 4),
            ("aaa", 3),
            ("xy", 4),
            ("yzz", 4),
            ("zzq", 3),
            ("  ", 4),
            ("   ", 4),
            ("\n\n", 4),
            ("<c>", 3),
            ("c>x", 4),
            ("x<c", 4),
            ("<c>x<c", 3),
            ("a", 1),
            ("b", 1),
        ];
        let mut b = b"GGUF".to_vec();
        b.extend(3u32.to_le_bytes());
        b.extend(0u64.to_le_bytes());
        b.extend(3u64.to_le_bytes());
        let text = |b: &mut Vec<u8>, s: &str| {
            b.extend((s.len() as u64).to_le_bytes());
            b.extend(s.as_bytes());
        };
        text(&mut b, "tokenizer.ggml.model");
        b.extend(8u32.to_le_bytes());
        text(&mut b, "llama");
        text(&mut b, "tokenizer.ggml.tokens");
        b.extend(9u32.to_le_bytes());
        b.extend(8u32.to_le_bytes());
        b.extend((tokens.len() as u64).to_le_bytes());
        for (t, _) in tokens {
            text(&mut b, t);
        }
        text(&mut b, "tokenizer.ggml.token_type");
        b.extend(9u32.to_le_bytes());
        b.extend(5u32.to_le_bytes());
        b.extend((tokens.len() as u64).to_le_bytes());
        for (_, ty) in tokens {
            b.extend(ty.to_le_bytes());
        }
        while !b.len().is_multiple_of(32) {
            b.push(0);
        }
        let f = gguf::GgufFile::from_bytes(b).expect("synthetic GGUF");
        Tokenizer::from_gguf(&f).expect("synthetic vocabulary")
    }

    struct Rand(u64);

    impl Rand {
        fn below(&mut self, n: usize) -> usize {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            (self.0 % n.max(1) as u64) as usize
        }
    }

    /// Texts made of special texts (whole, or a prefix or suffix of one), whitespace runs and
    /// other characters, so special texts overlap, nest and touch whitespace every which way.
    fn texts(tok: &Tokenizer, seed: u64, count: usize) -> Vec<String> {
        let mut r = Rand(seed);
        let specials: Vec<&str> =
            tok.special_cache.iter().map(|&id| tok.texts.get(id).unwrap_or_default()).collect();
        // Those that have a special prefix or are one, more often.
        let nested: Vec<&str> = (0..specials.len())
            .filter(|&i| tok.special_prefix[i] != NO_SPECIAL)
            .flat_map(|i| [specials[i], specials[tok.special_prefix[i] as usize]])
            .collect();
        let other = [
            " ", "  ", "   ", "\n", "\n\n", "\t", " \n", "a", "b", "c", "x", "z", "é", "<", ">",
            "|", "_",
        ];
        (0..count)
            .map(|_| {
                let mut t = String::new();
                for _ in 0..r.below(12) {
                    let pick = |r: &mut Rand, v: &[&str]| v[r.below(v.len())].to_string();
                    let s = match r.below(6) {
                        0 | 1 if !specials.is_empty() => pick(&mut r, &specials),
                        2 if !nested.is_empty() => pick(&mut r, &nested),
                        3 if !specials.is_empty() => {
                            let s = pick(&mut r, &specials);
                            let cut = r.below(s.len() + 1);
                            let cut = (0..=cut).rev().find(|&c| s.is_char_boundary(c)).unwrap();
                            if r.below(2) == 0 {
                                s[..cut].to_string()
                            } else {
                                s[cut..].to_string()
                            }
                        }
                        _ => pick(&mut r, &other),
                    };
                    t.push_str(&s);
                }
                t
            })
            .collect()
    }

    /// The one-pass partition gives llama.cpp's partition, as the pass per special token wrote
    /// it, on every vocabulary at hand, with and without special parsing, and with lstrip and
    /// rstrip on special tokens (phi-3 has rstrip; lstrip is forced here on a copy).
    #[test]
    fn one_pass_partition_matches_the_pass_per_special_token() {
        for (name, mut tok) in vocabularies() {
            for round in 0..2 {
                if round == 1 {
                    // Strip attributes on every other special token.
                    for (i, &id) in tok.special_cache.clone().iter().enumerate() {
                        tok.attrs[id as usize] |=
                            if i % 2 == 0 { attr::LSTRIP } else { attr::RSTRIP };
                    }
                }
                for (k, text) in texts(&tok, 0x5eed + round, 3000).iter().enumerate() {
                    for parse in [false, true] {
                        let want = tok.partition_reference(text, parse);
                        let got = tok.partition(text, parse);
                        assert_eq!(
                            got, want,
                            "{name} round {round} text {k} {text:?} parse {parse}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn taken_bits_answer_ranges() {
        let mut t = Taken::new(200);
        t.set(70, 75);
        t.set(130, 131);
        for (from, to, any) in [
            (0, 70, false),
            (0, 71, true),
            (75, 130, false),
            (74, 80, true),
            (60, 200, true),
            (131, 200, false),
            (129, 131, true),
            (64, 64, false),
        ] {
            assert_eq!(t.any(from, to), any, "{from}..{to}");
        }
        assert!(t.get(70) && t.get(74) && !t.get(75) && !t.get(69));
    }
}
