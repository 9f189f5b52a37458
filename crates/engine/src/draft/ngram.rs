//! Prompt lookup: the guess is what followed the most recent earlier occurrence of the text's
//! last `n` tokens, for the longest `n` (from [`MAX_N`] down to [`MIN_N`]) that occurred
//! before. An answer that copies its prompt (an edit of a code block, a quote, JSON echoing
//! its input) is then guessed many tokens at a time; where the copy breaks (a renamed
//! variable), shorter suffixes pick it up again a token or two later.
//!
//! A copy that is being followed keeps its place: once the text goes on as a draft's source
//! did, the next draft continues from that source for as long as the two agree, even where
//! the last [`MAX_N`] tokens also occur later (code repeats short runs, such as an indented
//! line's start, and the most recent one is then often the wrong place to copy from).
//!
//! Index: per `n`, a hash map from the hash of `n` tokens to the position just after their
//! latest occurrence, updated as each token arrives ([`MAX_N`] inserts a token), so a lookup is
//! [`MAX_N`] probes whatever the text's length, and a hit is checked against the tokens
//! themselves. Memory: the tokens (4 bytes each) and [`MAX_N`] map entries per token (~16
//! bytes each with the map's slack).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use model::ModelError;

use super::Drafter;

/// Longest suffix looked up.
pub const MAX_N: usize = 4;
/// Shortest suffix looked up: one token, so a copy resumes right after a changed token.
pub const MIN_N: usize = 1;

/// Keys are hashes already: the map's hasher passes them through.
#[derive(Default)]
struct PassThrough(u64);

impl Hasher for PassThrough {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) | b as u64;
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

type Index = HashMap<u64, u32, BuildHasherDefault<PassThrough>>;

/// Hash of a run of tokens (FxHash's mix, then a final multiply so low bits vary).
fn hash(toks: &[u32]) -> u64 {
    let mut h = toks.len() as u64;
    for &t in toks {
        h = (h.rotate_left(5) ^ t as u64).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
    h.wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// A prompt-lookup drafter over one sequence's tokens.
#[derive(Default)]
pub struct Ngram {
    /// Every token of the sequence so far (prompt and kept output), in order.
    toks: Vec<u32>,
    /// `[n - 1]`: hash of `n` tokens → the position just after their latest occurrence that
    /// has at least one token after it.
    index: [Index; MAX_N],
    /// The source being copied: the position whose token the text should hold next, and how
    /// many tokens before it the text and the source agree on.
    follow: Option<(usize, usize)>,
}

impl Ngram {
    pub fn new() -> Ngram {
        Ngram::default()
    }

    /// Guesses for what follows the sequence: the continuation of the longest earlier match
    /// (the followed source, or the longest suffix found), copied forward (a match that runs
    /// into the end of the text continues into the guess itself, so a repeating pattern is
    /// guessed whole).
    fn lookup(&mut self, max: usize, out: &mut Vec<u32>) {
        let len = self.toks.len();
        let found = (MIN_N..=MAX_N.min(len)).rev().find_map(|n| {
            let suffix = &self.toks[len - n..];
            let at = *self.index[n - 1].get(&hash(suffix))? as usize;
            // A hash collision is no match.
            (at >= n && self.toks[at - n..at] == *suffix).then_some((at, n))
        });
        let from = match (self.follow, found) {
            (Some((p, run)), found) if p < len && found.is_none_or(|(_, n)| run >= n) => p,
            (_, Some(found)) => {
                self.follow = Some(found);
                found.0
            }
            _ => return,
        };
        let start = out.len();
        for j in 0..max {
            let src = from + j;
            let t = if src < len { self.toks[src] } else { out[start + src - len] };
            out.push(t);
        }
    }
}

impl Drafter for Ngram {
    fn name(&self) -> &'static str {
        "ngram"
    }

    fn start(&mut self, prompt: &[u32]) {
        self.toks.clear();
        self.index.iter_mut().for_each(Index::clear);
        self.follow = None;
        self.extend(prompt);
    }

    fn extend(&mut self, toks: &[u32]) {
        for &t in toks {
            // The n-grams ending just before `t` now have a token after them.
            let at = self.toks.len();
            self.follow = (self.follow)
                .filter(|&(p, _)| self.toks.get(p) == Some(&t))
                .map(|(p, run)| (p + 1, run + 1));
            for n in 1..=MAX_N.min(at) {
                self.index[n - 1].insert(hash(&self.toks[at - n..at]), at as u32);
            }
            self.toks.push(t);
        }
    }

    fn draft(&mut self, max: usize, out: &mut Vec<u32>) -> Result<(), ModelError> {
        if max > 0 {
            self.lookup(max, out);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drafter(toks: &[u32]) -> Ngram {
        let mut d = Ngram::new();
        d.extend(toks);
        d
    }

    fn guess(d: &mut Ngram, max: usize) -> Vec<u32> {
        let mut out = Vec::new();
        d.draft(max, &mut out).unwrap();
        out
    }

    #[test]
    fn the_longest_earlier_match_gives_its_continuation() {
        // "1 2 3 4 5 6 ... 9 2 3" : the suffix "2 3" last occurred before "4 5 6".
        let mut d = drafter(&[1, 2, 3, 4, 5, 6, 7, 9, 2, 3]);
        assert_eq!(guess(&mut d, 3), vec![4, 5, 6]);
        // A longer suffix wins over a more recent shorter one: "7 3" occurs after "8 3 1"...
        let mut d = drafter(&[5, 7, 3, 1, 1, 1, 8, 3, 9, 9, 5, 7, 3]);
        assert_eq!(guess(&mut d, 2), vec![1, 1]);
    }

    #[test]
    fn the_latest_occurrence_of_a_suffix_is_used() {
        let mut d = drafter(&[4, 10, 4, 11, 4, 12, 4]);
        assert_eq!(guess(&mut d, 1), vec![12]);
    }

    #[test]
    fn a_match_running_into_the_end_repeats_the_pattern() {
        // "a b a b": the suffix "a b" occurred at the start, followed by "a b" and then the guess.
        let mut d = drafter(&[7, 8, 7, 8]);
        assert_eq!(guess(&mut d, 5), vec![7, 8, 7, 8, 7]);
    }

    #[test]
    fn nothing_is_guessed_without_an_earlier_occurrence_or_room() {
        let mut d = drafter(&[1, 2, 3, 4]);
        assert!(guess(&mut d, 8).is_empty());
        let mut d = drafter(&[1, 2, 1]);
        assert!(guess(&mut d, 0).is_empty());
        assert!(guess(&mut Ngram::new(), 4).is_empty());
    }

    #[test]
    fn tokens_arriving_one_by_one_index_like_a_prompt() {
        let toks = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4, 6, 2, 6, 4];
        let mut whole = drafter(&toks);
        let mut one = Ngram::new();
        for t in toks {
            one.extend(&[t]);
        }
        for max in 1..6 {
            assert_eq!(guess(&mut one, max), guess(&mut whole, max));
        }
    }

    #[test]
    fn a_followed_copy_keeps_its_place_where_its_last_tokens_recur_later() {
        // "50 1 2 3 4 60 70" and later "1 2 3 4 80 99": an answer copying from the start has
        // "1 2 3 4" most recently followed by 80, but its source goes on with 60.
        let mut d = drafter(&[50, 1, 2, 3, 4, 60, 70, 1, 2, 3, 4, 80, 99]);
        d.extend(&[50]);
        assert_eq!(guess(&mut d, 4), vec![1, 2, 3, 4]);
        d.extend(&[1, 2, 3, 4]);
        assert_eq!(guess(&mut d, 2), vec![60, 70]);
        // Where the text leaves the source, the lookup takes over again.
        d.extend(&[60, 5]);
        assert!(guess(&mut d, 2).is_empty());
        let mut fresh = drafter(&[50, 1, 2, 3, 4, 60, 70, 1, 2, 3, 4, 80, 99, 50, 1, 2, 3, 4]);
        assert_eq!(guess(&mut fresh, 2), vec![80, 99]);
    }

    #[test]
    fn an_edited_copy_is_picked_up_again_after_the_change() {
        // Prompt: "let x = f ( x ) ;" copied with x renamed to y: after "y", the suffix "y" is
        // new, but one token later ( "=" ) the copy resumes.
        let prompt = [10, 20, 30, 40, 41, 20, 42, 43];
        let mut d = drafter(&prompt);
        d.extend(&[10, 21]); // "let y"
        d.extend(&[30]); // " ="
        assert_eq!(guess(&mut d, 3), vec![40, 41, 20]);
    }
}
