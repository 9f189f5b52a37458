//! Byte-level BPE merges (llama.cpp's `llm_tokenizer_bpe_session`), on symbol ids.
//!
//! Every merge part and result is interned as a symbol id (vocab ids first, then strings that are
//! not tokens), so a merge is one hash lookup of an id pair. Each word runs the classic
//! lowest-rank-first loop with a binary heap over a linked list of symbols: O(k log k) per word.

use std::collections::{BinaryHeap, HashMap};

use crate::fxhash::FxBuild;
use crate::unicode::byte_to_char_table;

/// Merge table and byte alphabet of a byte-level BPE vocabulary.
#[derive(Debug)]
pub struct Bpe {
    /// (left symbol, right symbol) → (rank, merged symbol).
    merges: HashMap<(u32, u32), (u32, u32), FxBuild>,
    /// Symbol of each byte's GPT-2 stand-in character.
    byte_sym: [u32; 256],
    /// Strings of symbols ≥ n_vocab (merge parts/results that are not tokens).
    extra: Vec<String>,
    n_vocab: u32,
    /// Whole words that are tokens skip the merges (Llama 3).
    pub ignore_merges: bool,
}

impl Bpe {
    /// `merges` are GGUF `tokenizer.ggml.merges` lines ("left right"); `lookup` finds a token id.
    pub fn new<'a>(
        merges: impl ExactSizeIterator<Item = &'a str>,
        n_vocab: u32,
        lookup: &dyn Fn(&str) -> Option<u32>,
        ignore_merges: bool,
    ) -> Bpe {
        let mut extra: Vec<String> = Vec::new();
        let mut extra_ids: HashMap<String, u32, FxBuild> = HashMap::default();
        let mut intern = |s: &str, extra: &mut Vec<String>| -> u32 {
            if let Some(id) = lookup(s) {
                return id;
            }
            if let Some(&id) = extra_ids.get(s) {
                return id;
            }
            let id = n_vocab + extra.len() as u32;
            extra.push(s.to_string());
            extra_ids.insert(s.to_string(), id);
            id
        };
        let chars = byte_to_char_table();
        let mut byte_sym = [0u32; 256];
        for b in 0..256 {
            byte_sym[b] = intern(chars[b].encode_utf8(&mut [0u8; 4]), &mut extra);
        }
        let mut map: HashMap<(u32, u32), (u32, u32), FxBuild> = HashMap::default();
        map.reserve(merges.len());
        let mut merged = String::new();
        for (rank, line) in merges.enumerate() {
            // llama.cpp splits at the first space after the first byte.
            let (a, b) = match line.bytes().skip(1).position(|c| c == b' ') {
                Some(p) => (&line[..p + 1], &line[p + 2..]),
                None => ("", ""),
            };
            merged.clear();
            merged.push_str(a);
            merged.push_str(b);
            let (ia, ib) = (intern(a, &mut extra), intern(b, &mut extra));
            let im = intern(&merged, &mut extra);
            map.entry((ia, ib)).or_insert((rank as u32, im));
        }
        Bpe { merges: map, byte_sym, extra, n_vocab, ignore_merges }
    }

    /// Merges one word (raw bytes) and appends its token ids. `lookup` finds a token id, used for
    /// `ignore_merges` and for symbols that are not tokens (emitted byte by byte, as llama.cpp
    /// does; bytes without a token are dropped).
    pub fn encode_word(
        &self,
        word: &[u8],
        lookup: &dyn Fn(&str) -> Option<u32>,
        scratch: &mut Scratch,
        out: &mut Vec<u32>,
    ) {
        if word.is_empty() {
            return;
        }
        if self.ignore_merges {
            let chars = byte_to_char_table();
            scratch.text.clear();
            scratch.text.extend(word.iter().map(|&b| chars[b as usize]));
            if let Some(id) = lookup(&scratch.text) {
                out.push(id);
                return;
            }
        }
        if word.len() == 1 {
            self.emit(self.byte_sym[word[0] as usize], lookup, out);
            return;
        }
        let syms = &mut scratch.syms;
        syms.clear();
        let n = word.len();
        for (i, &b) in word.iter().enumerate() {
            syms.push(Sym {
                id: self.byte_sym[b as usize],
                prev: i as i32 - 1,
                next: if i + 1 == n { -1 } else { i as i32 + 1 },
                live: true,
            });
        }
        if n <= SMALL_WORD {
            self.merge_small(syms, &mut scratch.ranks);
        } else {
            self.merge_heap(syms, &mut scratch.heap);
        }
        let mut i = 0i32;
        while i >= 0 {
            let s = &syms[i as usize];
            self.emit(s.id, lookup, out);
            i = s.next;
        }
    }

    /// Merges of a short word: the rank of each adjacent pair sits in an array and the next
    /// merge is found by a scan, leftmost lowest rank first — the order the heap gives, without
    /// its pushes. O(n²) compares, n ≤ [`SMALL_WORD`].
    fn merge_small(&self, syms: &mut [Sym], ranks: &mut Vec<(u32, u32)>) {
        let n = syms.len();
        ranks.clear();
        ranks.resize(n, NO_PAIR);
        for i in 0..n - 1 {
            ranks[i] = self.pair(syms[i].id, syms[i + 1].id);
        }
        loop {
            let mut best = NO_PAIR.0;
            let mut at = usize::MAX;
            let mut i = 0i32;
            while i >= 0 {
                let r = ranks[i as usize].0;
                if r < best {
                    best = r;
                    at = i as usize;
                }
                i = syms[i as usize].next;
            }
            if at == usize::MAX {
                break;
            }
            let r = syms[at].next as usize;
            syms[at].id = ranks[at].1;
            syms[r].live = false;
            let rn = syms[r].next;
            syms[at].next = rn;
            ranks[r] = NO_PAIR;
            if rn >= 0 {
                syms[rn as usize].prev = at as i32;
                ranks[at] = self.pair(syms[at].id, syms[rn as usize].id);
            } else {
                ranks[at] = NO_PAIR;
            }
            let lp = syms[at].prev;
            if lp >= 0 {
                ranks[lp as usize] = self.pair(syms[lp as usize].id, syms[at].id);
            }
        }
    }

    #[inline]
    fn pair(&self, a: u32, b: u32) -> (u32, u32) {
        self.merges.get(&(a, b)).copied().unwrap_or(NO_PAIR)
    }

    /// Merges of a long word with a heap of candidate pairs (stale ones skipped on pop).
    fn merge_heap(&self, syms: &mut [Sym], heap: &mut BinaryHeap<Pair>) {
        let n = syms.len();
        heap.clear();
        for i in 1..n {
            self.push_pair(syms, heap, i - 1, i);
        }
        while let Some(Pair { rank: _, left, right, left_id, right_id, merged }) = heap.pop() {
            let (l, r) = (left as usize, right as usize);
            if !syms[l].live
                || !syms[r].live
                || syms[l].id != left_id
                || syms[r].id != right_id
                || syms[l].next != right as i32
            {
                continue;
            }
            syms[l].id = merged;
            syms[r].live = false;
            let rn = syms[r].next;
            syms[l].next = rn;
            if rn >= 0 {
                syms[rn as usize].prev = left as i32;
            }
            let lp = syms[l].prev;
            if lp >= 0 {
                self.push_pair(syms, heap, lp as usize, l);
            }
            if rn >= 0 {
                self.push_pair(syms, heap, l, rn as usize);
            }
        }
    }

    #[inline]
    fn push_pair(&self, syms: &[Sym], heap: &mut BinaryHeap<Pair>, l: usize, r: usize) {
        let (a, b) = (syms[l].id, syms[r].id);
        if let Some(&(rank, merged)) = self.merges.get(&(a, b)) {
            heap.push(Pair {
                rank,
                left: l as u32,
                right: r as u32,
                left_id: a,
                right_id: b,
                merged,
            });
        }
    }

    fn emit(&self, sym: u32, lookup: &dyn Fn(&str) -> Option<u32>, out: &mut Vec<u32>) {
        if sym < self.n_vocab {
            out.push(sym);
            return;
        }
        // Not a token: llama.cpp looks up each byte of the encoded string on its own.
        let s = &self.extra[(sym - self.n_vocab) as usize];
        let mut buf = [0u8; 4];
        for &b in s.as_bytes() {
            if b < 0x80 {
                if let Some(id) = lookup((b as char).encode_utf8(&mut buf)) {
                    out.push(id);
                }
            }
        }
    }
}

/// Words up to this many bytes merge by scanning an array of pair ranks instead of a heap.
const SMALL_WORD: usize = 48;
/// Rank of a pair that does not merge.
const NO_PAIR: (u32, u32) = (u32::MAX, 0);

#[derive(Clone, Copy, Debug)]
struct Sym {
    id: u32,
    prev: i32,
    next: i32,
    live: bool,
}

/// A candidate merge. Ordered so the max-heap pops the lowest rank, then the leftmost pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Pair {
    rank: u32,
    left: u32,
    right: u32,
    left_id: u32,
    right_id: u32,
    merged: u32,
}

impl Ord for Pair {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        o.rank.cmp(&self.rank).then(o.left.cmp(&self.left))
    }
}
impl PartialOrd for Pair {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}

/// Buffers reused across words.
#[derive(Default)]
pub struct Scratch {
    syms: Vec<Sym>,
    ranks: Vec<(u32, u32)>,
    heap: BinaryHeap<Pair>,
    text: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The scan used for short words must merge in exactly the heap's order.
    #[test]
    fn short_word_scan_matches_the_heap_on_random_words() {
        let merges: Vec<String> =
            ["a b", "b a", "a a", "ab a", "aa b", "b b", "ba ab", "aab a", "bb a", "c a", "ca b"]
                .map(String::from)
                .to_vec();
        let mut vocab: HashMap<String, u32> = HashMap::new();
        for s in [
            "a", "b", "c", "ab", "ba", "aa", "aba", "aab", "bb", "baab", "aaba", "bba", "ca", "cab",
        ] {
            let id = vocab.len() as u32;
            vocab.insert(s.to_string(), id);
        }
        let lookup = |s: &str| vocab.get(s).copied();
        let bpe = Bpe::new(merges.iter().map(String::as_str), vocab.len() as u32, &lookup, false);
        let mut seed = 12345u64;
        for _ in 0..2000 {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let len = 2 + (seed >> 59) as usize;
            let word: Vec<u8> =
                (0..len).map(|i| b"abc"[(seed.rotate_left((i * 5) as u32) % 3) as usize]).collect();
            let run = |small: bool| {
                let mut syms: Vec<Sym> = word
                    .iter()
                    .enumerate()
                    .map(|(i, &b)| Sym {
                        id: bpe.byte_sym[b as usize],
                        prev: i as i32 - 1,
                        next: if i + 1 == word.len() { -1 } else { i as i32 + 1 },
                        live: true,
                    })
                    .collect();
                if small {
                    bpe.merge_small(&mut syms, &mut Vec::new());
                } else {
                    bpe.merge_heap(&mut syms, &mut BinaryHeap::new());
                }
                let mut ids = Vec::new();
                let mut i = 0i32;
                while i >= 0 {
                    ids.push(syms[i as usize].id);
                    i = syms[i as usize].next;
                }
                ids
            };
            assert_eq!(run(true), run(false), "{}", String::from_utf8_lossy(&word));
        }
    }
}
