//! Token texts stored once, in a [`gguf::StrArray`] (all of them back to back in one `String`,
//! a span per token), and an open-addressing index from text to id whose slots hold the text's
//! hash and its id — the keys are the texts themselves, never a `String` per token.
//!
//! Cost: the text plus 8 bytes of span per token, and 8 bytes per index slot with 4/3 slots
//! per token (≈ 18.7 bytes a token in all, against ≈ 140 for a `Vec<String>` plus a
//! `HashMap<String, u32>` on qwen2.5's vocabulary). A lookup hashes the text once and compares hashes along a short
//! linear probe (load factor 3/4); only a slot with an equal hash compares text.

use std::hash::Hasher;

use gguf::StrArray;

use crate::fxhash::FxHasher;

/// An empty index slot.
const EMPTY: Slot = Slot { hash: 0, id: u32::MAX };

#[derive(Clone, Copy, Debug)]
struct Slot {
    /// High 32 bits of the text's hash.
    hash: u32,
    /// Token id; `u32::MAX` when the slot is empty.
    id: u32,
}

/// Why [`TokenTexts::push`] refused a text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PushError {
    /// The id that already has this text.
    Duplicate(u32),
    /// The index is full (a slot always stays empty, so probes end) or the text would pass
    /// 4 GiB.
    Full,
}

/// The vocabulary's texts and the index from text to id.
#[derive(Debug)]
pub struct TokenTexts {
    /// Every token's text, in id order.
    texts: StrArray,
    /// `[n + n / 3 + 1]` slots, probed linearly from the hash's home slot.
    slots: Vec<Slot>,
}

fn hash(s: &str) -> u32 {
    let mut h = FxHasher::default();
    h.write(s.as_bytes());
    (h.finish() >> 32) as u32
}

impl TokenTexts {
    /// Room for `n` tokens of `text_bytes` bytes together (`n` < `u32::MAX`).
    pub fn with_capacity(n: usize, text_bytes: usize) -> TokenTexts {
        TokenTexts {
            texts: StrArray::with_capacity(n, text_bytes),
            slots: vec![EMPTY; n + n / 3 + 1],
        }
    }

    /// Appends the next token's text and returns its id. Pushing more than the capacity asked
    /// for works, with longer probes, until the index is full.
    pub fn push(&mut self, s: &str) -> Result<u32, PushError> {
        let id = self.len() as u32;
        if self.len() + 1 >= self.slots.len() {
            return Err(PushError::Full);
        }
        let h = hash(s);
        let i = self.probe(h, s).map_err(PushError::Duplicate)?;
        self.texts.try_push(s).ok_or(PushError::Full)?;
        self.slots[i] = Slot { hash: h, id };
        Ok(id)
    }

    /// Number of tokens.
    pub fn len(&self) -> usize {
        self.texts.len()
    }

    /// Text of token `id`.
    pub fn get(&self, id: u32) -> Option<&str> {
        self.texts.get(id as usize)
    }

    /// The id of a token given its exact text.
    pub fn find(&self, s: &str) -> Option<u32> {
        self.probe(hash(s), s).err()
    }

    /// Texts in id order.
    pub fn iter(&self) -> impl Iterator<Item = &str> + '_ {
        self.texts.iter()
    }

    /// Walks the probe sequence of hash `h`: `Err(id)` of the token whose text is `s`, or
    /// `Ok(i)` of the empty slot where `s` would go (one always stays empty, so the walk ends).
    fn probe(&self, h: u32, s: &str) -> Result<usize, u32> {
        let mut i = self.home(h);
        loop {
            let slot = self.slots[i];
            if slot.id == EMPTY.id {
                return Ok(i);
            }
            if slot.hash == h && self.get(slot.id) == Some(s) {
                return Err(slot.id);
            }
            i = self.next(i);
        }
    }

    /// The slot a hash starts probing at: the hash scaled onto the slot count.
    fn home(&self, h: u32) -> usize {
        ((h as u64 * self.slots.len() as u64) >> 32) as usize
    }

    fn next(&self, i: usize) -> usize {
        if i + 1 == self.slots.len() {
            0
        } else {
            i + 1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_text_finds_its_id_and_others_find_none() {
        let words: Vec<String> = (0..5000).map(|i| format!("w{i}")).collect();
        let mut t = TokenTexts::with_capacity(words.len(), 0);
        for (i, w) in words.iter().enumerate() {
            assert_eq!(t.push(w), Ok(i as u32));
        }
        for (i, w) in words.iter().enumerate() {
            assert_eq!(t.find(w), Some(i as u32));
            assert_eq!(t.get(i as u32), Some(w.as_str()));
        }
        assert_eq!(t.find("w5000"), None);
        assert_eq!(t.find(""), None);
        assert_eq!(t.get(5000), None);
        assert!(t.iter().eq(words.iter().map(String::as_str)));
    }

    #[test]
    fn a_duplicate_text_names_the_first_id() {
        let mut t = TokenTexts::with_capacity(3, 0);
        assert_eq!(t.push("a"), Ok(0));
        assert_eq!(t.push("b"), Ok(1));
        assert_eq!(t.push("a"), Err(PushError::Duplicate(0)));
        assert_eq!(t.len(), 2);
        assert_eq!(t.push(""), Ok(2));
        assert_eq!(t.find(""), Some(2));
        assert_eq!(t.push("c"), Ok(3));
        assert_eq!(t.push("d"), Err(PushError::Full), "5 slots, one kept empty");
        assert_eq!(t.find("d"), None);
    }
}
