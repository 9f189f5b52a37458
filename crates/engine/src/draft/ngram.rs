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
//! An edit is learned as it is seen: where the text leaves its source (`total` written as
//! `running_sum`) and comes back to it a few tokens on (agreeing on [`RESYNC`] tokens again
//! within [`MAX_FROM`] source tokens of where it left), the source tokens skipped and the
//! tokens written instead are kept as a substitution, and later copies of that source apply
//! it. A rename is then drafted right from its second occurrence on, so drafts run whole
//! through the renamed lines instead of breaking at each use of the name. Any number of
//! substitutions (up to [`MAX_SUBS`]), of any token lengths, hold at once; one the text
//! contradicts (copying the old tokens where it applied) is dropped, and none applies to text
//! written after it was learned (that text already carries it).
//!
//! Index: per `n`, a hash map from the hash of `n` tokens to the position just after their
//! latest occurrence, updated as each token arrives ([`MAX_N`] inserts a token), so a lookup is
//! [`MAX_N`] probes whatever the text's length, and a hit is checked against the tokens
//! themselves. Memory: the tokens (4 bytes each) and [`MAX_N`] map entries per token (17 bytes
//! a bucket, up to twice the entries in buckets): [`Ngram::heap_bytes`], which the planner
//! counts per drafting sequence.

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

/// Most source tokens a learned substitution replaces.
const MAX_FROM: usize = 8;
/// Most tokens a learned substitution writes instead.
const MAX_TO: usize = 16;
/// Tokens the text must agree with its source on again for the change before them to be
/// learned as a substitution.
const RESYNC: usize = 2;
/// Tokens a copy must have agreed on before a departure from it may be learned from.
const MIN_RUN: usize = 2;
/// A copy followed this long is taken to come back after one changed source token as soon as
/// the text writes the source's next token.
const LONG_RUN: usize = 8;
/// Substitutions kept (the oldest slot is reused past this).
const MAX_SUBS: usize = 32;
/// Departures from the source waiting for the text to come back to it.
const MAX_DEPARTURES: usize = 4;

/// A change the text made to the text it copies: where the source holds `from`, the text wrote
/// `to`. It applies to source positions before `before` (the text written after it was learned
/// already carries the change, and may even hold `from` inside `to`).
#[derive(Clone, Debug)]
struct Sub {
    from: Vec<u32>,
    to: Vec<u32>,
    before: usize,
    /// The text copied `from` unchanged where this applied: it is no longer used.
    dead: bool,
}

/// A place in the source as the text copies it, substitutions applied: the next source
/// position, and inside a substitution being written, its slot and how many of its tokens
/// were written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Cursor {
    at: usize,
    sub: Option<(usize, usize)>,
}

impl Cursor {
    fn at(at: usize) -> Cursor {
        Cursor { at, sub: None }
    }
}

/// The copy being followed: where the source goes on, and how many tokens the text and it
/// agree on.
#[derive(Clone, Copy, Debug)]
struct Follow {
    cursor: Cursor,
    run: usize,
}

/// Where the text stopped copying its source: the source position of the first token not
/// copied, the text position of the first token written instead, and the run agreed on before.
#[derive(Clone, Copy, Debug)]
struct Departure {
    src: usize,
    out: usize,
    run: usize,
}

/// A prompt-lookup drafter over one sequence's tokens.
#[derive(Default)]
pub struct Ngram {
    /// Every token of the sequence so far (prompt and kept output), in order.
    toks: Vec<u32>,
    /// `[n - 1]`: hash of `n` tokens → the position just after their latest occurrence that
    /// has at least one token after it.
    index: [Index; MAX_N],
    /// The source being copied.
    follow: Option<Follow>,
    /// Recent departures from a followed source, not yet rejoined (oldest first).
    departures: Vec<Departure>,
    /// Learned substitutions; the latest learned wins where several apply.
    subs: Vec<Sub>,
    /// The slot the next substitution takes once `subs` is full.
    next_slot: usize,
}

impl Ngram {
    pub fn new() -> Ngram {
        Ngram::default()
    }

    /// Heap a drafter over a sequence of at most `n_tokens` tokens holds at most, for the
    /// planner: the tokens (a vector grown by doubling), [`MAX_N`] index maps of at most
    /// `n_tokens` entries each (hashbrown: a power of two of buckets, at most 7/8 full, each a
    /// 16-byte entry and a control byte, plus one group of control bytes), and the
    /// substitutions and departures at their caps.
    pub fn heap_bytes(n_tokens: usize) -> usize {
        let n = n_tokens.max(1);
        let buckets = match n {
            0..4 => 4,
            4..8 => 8,
            _ => (n.saturating_mul(8) / 7).next_power_of_two(),
        };
        let map = buckets.saturating_mul(std::mem::size_of::<(u64, u32)>() + 1) + 16;
        let toks = n.next_power_of_two().max(4) * std::mem::size_of::<u32>();
        let sub = std::mem::size_of::<Sub>() + (MAX_FROM + MAX_TO) * std::mem::size_of::<u32>();
        let departures =
            (MAX_DEPARTURES + 1).next_power_of_two() * std::mem::size_of::<Departure>();
        MAX_N.saturating_mul(map).saturating_add(toks) + MAX_SUBS * sub + departures
    }

    /// The live substitution that applies at source position `at`, the latest learned first.
    fn sub_at(&self, at: usize) -> Option<usize> {
        let n = self.subs.len();
        (0..n).map(|k| (self.next_slot + n - 1 - k) % n).find(|&i| {
            let s = &self.subs[i];
            !s.dead && at + s.from.len() <= s.before && self.toks[at..].starts_with(&s.from)
        })
    }

    /// The next token of the copy at `c` and the cursor after it; positions past the text read
    /// `ahead` (a draft continuing it). `None` past both.
    fn next(&self, c: Cursor, ahead: &[u32]) -> Option<(u32, Cursor)> {
        let mut at = c.at;
        if let Some((i, off)) = c.sub {
            let to = &self.subs[i].to;
            let done = off + 1 == to.len();
            return Some((to[off], Cursor { at, sub: (!done).then_some((i, off + 1)) }));
        }
        // Deletions (an empty `to`) skip their source; each skips at least one token.
        while let Some(i) = self.sub_at(at) {
            let s = &self.subs[i];
            at += s.from.len();
            if let Some(&t) = s.to.first() {
                let sub = (s.to.len() > 1).then_some((i, 1));
                return Some((t, Cursor { at, sub }));
            }
        }
        let t = match self.toks.get(at) {
            Some(&t) => t,
            None => *ahead.get(at - self.toks.len())?,
        };
        Some((t, Cursor::at(at + 1)))
    }

    /// Where the unit of the copy at `c` (a source token, or a substitution) starts, in the
    /// source and in the text (`at`: the text position of the token now arriving), and the
    /// substitution it is.
    fn unit(&self, c: Cursor, at: usize) -> (usize, usize, Option<usize>) {
        match c.sub {
            Some((i, off)) => (c.at - self.subs[i].from.len(), at - off, Some(i)),
            None => (c.at, at, self.sub_at(c.at)),
        }
    }

    /// The followed copy's account of token `t` arriving at text position `at` (not yet in
    /// `toks`): the copy goes on, leaves a substitution the text did not make, or departs.
    fn follow_token(&mut self, t: u32, at: usize) {
        let Some(f) = self.follow.take() else { return };
        if let Some((g, cursor)) = self.next(f.cursor, &[]) {
            if g == t {
                self.follow = Some(Follow { cursor, run: f.run + 1 });
                return;
            }
        }
        let (src, out, sub) = self.unit(f.cursor, at);
        if let Some(i) = sub {
            // The text copied the source unchanged where a substitution applied: drop it.
            let n = at - out;
            let same = self
                .toks
                .get(src..=src + n)
                .is_some_and(|s| s[..n] == self.toks[out..] && s[n] == t);
            if same {
                self.subs[i].dead = true;
                self.follow = Some(Follow { cursor: Cursor::at(src + n + 1), run: f.run + 1 });
                return;
            }
        }
        let run = f.run.saturating_sub(at - out);
        if src < out && run >= MIN_RUN {
            if self.departures.len() == MAX_DEPARTURES {
                self.departures.remove(0);
            }
            self.departures.push(Departure { src, out, run });
        }
    }

    /// After a token arrived: a departure whose source the text has come back to (its last
    /// [`RESYNC`] tokens are the source's a few tokens on; one token, when it is the one right
    /// after a single source token replaced in a long copy) is learned as a substitution, and
    /// the copy is followed from there.
    fn rejoin(&mut self) {
        let len = self.toks.len();
        self.departures.retain(|d| len <= d.out + MAX_TO + RESYNC);
        let found = self.departures.iter().rev().find_map(|d| {
            (1..=MAX_FROM).find_map(|k| {
                let m = if k == 1 && d.run >= LONG_RUN { 1 } else { RESYNC };
                let j = d.src + k;
                let written = len.checked_sub(m)?.checked_sub(d.out)?;
                (j + m <= d.out && self.toks[j..j + m] == self.toks[len - m..])
                    .then_some((*d, j, m, written))
            })
        });
        let Some((d, j, m, written)) = found else { return };
        self.departures.clear();
        let mut from = self.toks[d.src..j].to_vec();
        let mut to = self.toks[d.out..d.out + written].to_vec();
        // What both end with is copied, not changed.
        while from.len() > 1 && from.last() == to.last() {
            from.pop();
            to.pop();
        }
        if to.len() <= MAX_TO && from != to {
            let sub = Sub { from, to, before: d.out, dead: false };
            if self.subs.len() < MAX_SUBS {
                self.subs.push(sub);
                self.next_slot = self.subs.len() % MAX_SUBS;
            } else {
                self.subs[self.next_slot] = sub;
                self.next_slot = (self.next_slot + 1) % MAX_SUBS;
            }
        }
        self.follow = Some(Follow { cursor: Cursor::at(j + m), run: d.run + m });
    }

    /// Where the text most likely comes back to its source after the latest departure: after
    /// the text's last token, where the source holds that token up to [`MAX_FROM`] tokens past
    /// where the text left it; else, where that token ends what a learned substitution writes
    /// (the same change in another spelling: `(total` written `(r` `unning` `_sum`), as many
    /// source tokens past it as that substitution replaces.
    fn rejoining(&self) -> Option<Follow> {
        let d = self.departures.last()?;
        let &t = self.toks.last()?;
        let j = (d.src + 1..=d.src + MAX_FROM)
            .take_while(|&j| j < d.out)
            .find(|&j| self.toks[j] == t)
            .map(|j| j + 1)
            .or_else(|| {
                let s = self.subs.iter().find(|s| !s.dead && s.to.last() == Some(&t))?;
                (self.toks.len() > d.out + 1).then_some(d.src + s.from.len())
            })?;
        Some(Follow { cursor: Cursor::at(j), run: 1 })
    }

    /// Guesses for what follows the sequence: the continuation of the longest earlier match
    /// (the followed source, or the longest suffix found), copied forward with the learned
    /// substitutions (a match that runs into the end of the text continues into the guess
    /// itself, so a repeating pattern is guessed whole).
    fn lookup(&mut self, max: usize, out: &mut Vec<u32>) {
        let len = self.toks.len();
        let found = (MIN_N..=MAX_N.min(len)).rev().find_map(|n| {
            let suffix = &self.toks[len - n..];
            let at = *self.index[n - 1].get(&hash(suffix))? as usize;
            // A hash collision is no match.
            (at >= n && self.toks[at - n..at] == *suffix).then_some((at, n))
        });
        let follow = self.follow.filter(|f| f.cursor.at < len);
        let found = found.map(|(at, n)| Follow { cursor: Cursor::at(at), run: n });
        let mut best = match (follow, found) {
            (Some(f), Some(g)) if g.run > f.run => Some(g),
            (f, g) => f.or(g),
        };
        // Just after a departure, a token the source holds a little past where the text left
        // it most likely ends the change: copy on from there rather than from a short match.
        if best.is_none_or(|b| b.run <= RESYNC) {
            best = self.rejoining().or(best);
        }
        let Some(best) = best else { return };
        self.follow = Some(best);
        let mut c = best.cursor;
        let start = out.len();
        for _ in 0..max {
            let Some((t, next)) = self.next(c, &out[start..]) else { break };
            out.push(t);
            c = next;
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
        self.departures.clear();
        self.subs.clear();
        self.next_slot = 0;
        self.extend(prompt);
    }

    fn extend(&mut self, toks: &[u32]) {
        for &t in toks {
            // The n-grams ending just before `t` now have a token after them.
            let at = self.toks.len();
            self.follow_token(t, at);
            for n in 1..=MAX_N.min(at) {
                self.index[n - 1].insert(hash(&self.toks[at - n..at]), at as u32);
            }
            self.toks.push(t);
            if !self.departures.is_empty() {
                self.rejoin();
            }
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

    /// What `d` holds on the heap, from the capacities its vectors and maps report (a
    /// hashbrown map of capacity c has c + 1 buckets below 8, else c / 7 × 8).
    fn held(d: &Ngram) -> usize {
        let map = |m: &Index| {
            let c = m.capacity();
            let buckets = if c < 7 { c + 1 } else { c / 7 * 8 };
            if c == 0 {
                0
            } else {
                buckets * (std::mem::size_of::<(u64, u32)>() + 1) + 16
            }
        };
        d.toks.capacity() * 4 + d.index.iter().map(map).sum::<usize>()
    }

    #[test]
    fn the_heap_the_planner_counts_bounds_what_the_index_holds() {
        for n in [1usize, 7, 100, 513, 4096] {
            // Distinct tokens: every n-gram is new, so every map takes an entry per token.
            let toks: Vec<u32> = (0..n as u32).collect();
            let mut d = Ngram::new();
            d.start(&toks[..n / 2]);
            d.extend(&toks[n / 2..]);
            let (h, bound) = (held(&d), Ngram::heap_bytes(n));
            assert!(h <= bound, "{n} tokens: {h} held, {bound} counted");
            assert!(
                h * 2 >= bound.saturating_sub(64 << 10),
                "{n} tokens: {h} held, {bound} counted"
            );
        }
    }

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

    /// Writes `toks` one by one, drafting before each as a session does (drafts set the copy
    /// followed).
    fn write(d: &mut Ngram, toks: &[u32]) {
        for &t in toks {
            guess(d, 4);
            d.extend(&[t]);
        }
    }

    // A code block `1 2 3 X 4 5 6 X 7 8 9 X 11 12` after an instruction (100) and before its
    // end (101), with X = 10.
    const BLOCK: [u32; 16] = [100, 1, 2, 3, 10, 4, 5, 6, 10, 7, 8, 9, 10, 11, 12, 101];

    #[test]
    fn a_rename_seen_once_is_drafted_in_later_copies() {
        // The answer renames 10 to the two tokens 20 21. Once it has written the first one and
        // come back to the source for two tokens, drafts carry the new name.
        let mut d = drafter(&BLOCK);
        write(&mut d, &[1, 2, 3, 20, 21, 4, 5]);
        assert_eq!(guess(&mut d, 5), vec![6, 20, 21, 7, 8]);
        write(&mut d, &[6, 20, 21, 7, 8, 9]);
        assert_eq!(guess(&mut d, 5), vec![20, 21, 11, 12, 101]);
        // A copy found by lookup, not followed, takes it too.
        let mut d = drafter(&BLOCK);
        write(&mut d, &[1, 2, 3, 20, 21, 4, 5, 6, 20, 21, 7]);
        d.follow = None;
        assert_eq!(guess(&mut d, 4), vec![8, 9, 20, 21]);
    }

    #[test]
    fn several_renames_of_different_lengths_are_learned() {
        // Source: `1 2 3 X 4 5 Y Z 6 7 8 X 9 Y Z 11 12 X`; the answer writes X (10) as 20 21 22
        // and the two tokens Y Z (30 31) as 40.
        let prompt = [100, 1, 2, 3, 10, 4, 5, 30, 31, 6, 7, 8, 10, 9, 30, 31, 11, 12, 10, 101];
        let mut d = drafter(&prompt);
        write(&mut d, &[1, 2, 3, 20, 21, 22, 4, 5, 40, 6, 7]);
        assert_eq!(guess(&mut d, 8), vec![8, 20, 21, 22, 9, 40, 11, 12]);
        write(&mut d, &[8, 20, 21, 22, 9, 40, 11]);
        assert_eq!(guess(&mut d, 5), vec![12, 20, 21, 22, 101]);
    }

    #[test]
    fn a_substitution_the_text_does_not_make_is_dropped() {
        // Renamed once, then the answer copies X unchanged: later copies draft X again.
        let mut d = drafter(&BLOCK);
        write(&mut d, &[1, 2, 3, 20, 21, 4, 5, 6]);
        assert_eq!(guess(&mut d, 2), vec![20, 21]);
        write(&mut d, &[10, 7, 8, 9]);
        assert_eq!(guess(&mut d, 3), vec![10, 11, 12]);
    }

    #[test]
    fn the_text_written_after_a_rename_is_copied_as_it_is() {
        // A rename whose new name holds the old one (10 → 10 20): a later copy of the answer's
        // own text, which already carries it, is not renamed twice.
        let prompt = [100, 1, 2, 10, 3, 4, 5, 101];
        let mut d = drafter(&prompt);
        write(&mut d, &[1, 2, 10, 20, 3, 4, 5, 102, 1, 2]);
        assert_eq!(guess(&mut d, 3), vec![10, 20, 3]);
    }

    #[test]
    fn after_a_changed_token_the_copy_resumes_past_it() {
        // Source `1 … 9 X = 12 13 14 X = 60 61`: the answer writes Y (20) for X and then `=`;
        // the latest `=` is followed by 60, but the copy goes on with 12.
        let prompt = [100, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 10, 11, 60, 61, 101];
        let mut d = drafter(&prompt);
        write(&mut d, &[1, 2, 3, 4, 5, 6, 7, 8, 9, 20, 11]);
        assert_eq!(guess(&mut d, 3), vec![12, 13, 14]);
        // After a long copy, one token of the source after the change has it learned: the
        // next X is drafted as Y.
        d.extend(&[12]);
        assert_eq!(guess(&mut d, 4), vec![13, 14, 20, 11]);
        // After a short copy, the draft resumes past the change all the same.
        let mut d = drafter(&prompt);
        write(&mut d, &[7, 8, 9, 20, 11]);
        assert_eq!(guess(&mut d, 3), vec![12, 13, 14]);
    }
}
