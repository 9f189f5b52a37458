//! SentencePiece-style BPE (llama.cpp's `llm_tokenizer_spm_session`): start from UTF-8
//! characters and repeatedly merge the adjacent pair whose concatenation is the highest-scoring
//! token; characters that never form a token fall back to `<0xNN>` byte tokens.
//!
//! Cost: O(n log n) per text with a heap over a linked list. Symbols carry their token id, so a
//! candidate pair is first looked up in a small per-call cache keyed by the id pair; only new
//! pairs touch the large vocabulary table (whose lookups are cache misses on 262k tokens).

use std::collections::{BinaryHeap, HashMap};

use crate::fxhash::FxBuild;

/// Marks a symbol that is a single character and not a token: `NOT_TOKEN | code point`.
const NOT_TOKEN: u32 = 1 << 31;

/// What the SPM loop needs from the vocabulary.
pub trait SpmVocab {
    fn lookup(&self, text: &str) -> Option<u32>;
    fn score(&self, id: u32) -> f32;
    /// `<0xNN>` token for a byte, else the one-byte token, else the unknown token.
    fn byte_token(&self, b: u8) -> Option<u32>;
}

#[derive(Clone, Copy)]
struct Sym {
    /// Token id of the symbol's text, or `NOT_TOKEN | char`.
    id: u32,
    start: u32,
    len: u32,
    prev: i32,
    next: i32,
}

struct Bigram {
    score: f32,
    merged: u32,
    left: u32,
    right: u32,
    size: u32,
}

impl PartialEq for Bigram {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o).is_eq()
    }
}
impl Eq for Bigram {}
impl Ord for Bigram {
    /// Highest score first; on ties the leftmost pair.
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        self.score
            .partial_cmp(&o.score)
            .unwrap_or(std::cmp::Ordering::Equal)
            .then(o.left.cmp(&self.left))
    }
}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}

/// Tokenizes `text` (spaces already escaped to `▁`), appending ids to `out`.
pub fn encode(vocab: &dyn SpmVocab, text: &str, out: &mut Vec<u32>) {
    if text.is_empty() {
        return;
    }
    let mut syms: Vec<Sym> = Vec::with_capacity(text.len());
    let mut char_ids: HashMap<char, u32, FxBuild> = HashMap::default();
    let n_chars = text.chars().count();
    for (i, (off, c)) in text.char_indices().enumerate() {
        let id = *char_ids.entry(c).or_insert_with(|| {
            vocab.lookup(c.encode_utf8(&mut [0u8; 4])).unwrap_or(NOT_TOKEN | c as u32)
        });
        syms.push(Sym {
            id,
            start: off as u32,
            len: c.len_utf8() as u32,
            prev: i as i32 - 1,
            next: if i + 1 == n_chars { -1 } else { i as i32 + 1 },
        });
    }
    let mut heap = BinaryHeap::new();
    // (left id, right id) → merged token and its score, or None.
    let mut pairs: HashMap<(u32, u32), Option<(u32, f32)>, FxBuild> = HashMap::default();
    let mut try_add = |syms: &[Sym], heap: &mut BinaryHeap<Bigram>, l: i32, r: i32| {
        if l < 0 || r < 0 {
            return;
        }
        let (a, b) = (syms[l as usize], syms[r as usize]);
        // Adjacent symbols are contiguous in `text`, so the pair's text is one slice.
        debug_assert_eq!(a.start + a.len, b.start);
        let hit = *pairs.entry((a.id, b.id)).or_insert_with(|| {
            vocab
                .lookup(&text[a.start as usize..(b.start + b.len) as usize])
                .map(|id| (id, vocab.score(id)))
        });
        if let Some((merged, score)) = hit {
            heap.push(Bigram {
                score,
                merged,
                left: l as u32,
                right: r as u32,
                size: a.len + b.len,
            });
        }
    };
    for i in 1..syms.len() {
        try_add(&syms, &mut heap, i as i32 - 1, i as i32);
    }
    while let Some(bg) = heap.pop() {
        let (l, r) = (bg.left as usize, bg.right as usize);
        if syms[l].len == 0 || syms[r].len == 0 || syms[l].len + syms[r].len != bg.size {
            continue;
        }
        syms[l].len += syms[r].len;
        syms[l].id = bg.merged;
        syms[r].len = 0;
        syms[l].next = syms[r].next;
        if syms[r].next >= 0 {
            let rn = syms[r].next as usize;
            syms[rn].prev = l as i32;
        }
        let (lp, ln) = (syms[l].prev, syms[l].next);
        try_add(&syms, &mut heap, lp, l as i32);
        try_add(&syms, &mut heap, l as i32, ln);
    }
    let mut i = 0i32;
    while i >= 0 {
        let s = syms[i as usize];
        if s.id & NOT_TOKEN == 0 {
            out.push(s.id);
        } else {
            for &b in &text.as_bytes()[s.start as usize..(s.start + s.len) as usize] {
                if let Some(id) = vocab.byte_token(b) {
                    out.push(id);
                }
            }
        }
        i = s.next;
    }
}
