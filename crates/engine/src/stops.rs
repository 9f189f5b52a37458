//! Stop strings: text that ends an answer and is not part of it. [`StopMatcher`] holds back
//! what may begin one until it is sure; its doc says the cost.

use std::collections::HashMap;
use std::sync::Arc;

use aho_corasick::automaton::{Automaton, StateID};
use aho_corasick::nfa::contiguous;
use aho_corasick::{AhoCorasick, Anchored, MatchKind};

/// Stop strings one request may give at most ([`StopMatcher::check`]).
pub const MAX_STOPS: usize = 16;

/// Bytes one stop string may have at most ([`StopMatcher::check`]): the matcher holds back at
/// most one byte less of the answer, and its work per token is bounded by that plus the token.
pub const MAX_STOP_BYTES: usize = 256;

/// Holds back text that might be the start of a stop string until it is sure (each
/// [`crate::Sequence`] keeps one).
///
/// Aho–Corasick automata per request, built once: one is walked a byte at a time across
/// tokens, and its state says both whether a stop string ended in the new text and how much of
/// the text's end could still start one (what is held back: at most the longest stop string
/// less one byte); only when one ended is the held-back text searched once more, for the stop
/// that starts first. So a token costs O(its bytes), or O(its bytes + the longest stop string)
/// when it ends a stop, never O(stop strings × anything).
#[derive(Clone, Debug)]
pub struct StopMatcher {
    /// `None` when there is no non-empty stop string.
    stops: Option<Arc<Stops>>,
    pending: String,
    /// Where [`Stops::walk`] stands after the text pushed so far.
    state: StateID,
    /// The index (in the list given to [`StopMatcher::new`]) of the stop string that ended
    /// the text, once one has.
    matched: Option<usize>,
}

#[derive(Debug)]
struct Stops {
    /// Finds the occurrence that starts first (leftmost; which stop, when several start
    /// there, does not matter: the text before it is what is emitted).
    leftmost: AhoCorasick,
    /// Standard semantics, walked a byte at a time across pushes: its state stands for the
    /// longest end of the text that is a prefix of some stop, and is a match state when a
    /// stop ends there.
    walk: contiguous::NFA,
    /// The length of that prefix for each state a prefix of a stop reaches (others: 0).
    depth: HashMap<StateID, usize>,
    /// Each pattern id's index in the list the matcher was made from (empty ones are left
    /// out of the automata).
    index: Vec<usize>,
}

impl StopMatcher {
    /// Checks stop strings against the engine's limits: at most [`MAX_STOPS`] strings of at most
    /// [`MAX_STOP_BYTES`] bytes each (empty ones are ignored but counted). The error names the
    /// limit.
    pub fn check(stops: &[String]) -> Result<(), String> {
        if stops.len() > MAX_STOPS {
            return Err(format!("stop: at most {MAX_STOPS} stop strings, got {}", stops.len()));
        }
        if let Some(s) = stops.iter().find(|s| s.len() > MAX_STOP_BYTES) {
            return Err(format!(
                "stop: a stop string may have at most {MAX_STOP_BYTES} bytes, got one of {}",
                s.len()
            ));
        }
        Ok(())
    }

    /// A matcher for `stops` within the limits ([`StopMatcher::check`]'s error otherwise).
    pub fn try_new(stops: &[String]) -> Result<Self, String> {
        Self::check(stops)?;
        Ok(Self::new(stops))
    }

    /// A matcher for `stops`, not checked against the limits (a caller that takes stop strings
    /// from a request checks them first, or uses [`StopMatcher::try_new`]): past them it still
    /// matches exactly, but holds back and searches up to the longest stop string per token.
    pub fn new(stops: &[String]) -> Self {
        let (index, pats): (Vec<usize>, Vec<&str>) = (stops.iter().enumerate())
            .filter(|(_, s)| !s.is_empty())
            .map(|(i, s)| (i, s.as_str()))
            .unzip();
        if pats.is_empty() {
            return StopMatcher {
                stops: None,
                pending: String::new(),
                state: StateID::ZERO,
                matched: None,
            };
        }
        // Building fails only past 2^31 states (gigabytes of stop strings).
        let leftmost = AhoCorasick::builder()
            .match_kind(MatchKind::LeftmostFirst)
            .build(&pats)
            .expect("stop strings index");
        let walk = contiguous::NFA::builder()
            .match_kind(MatchKind::Standard)
            .build(&pats)
            .expect("stop strings index");
        // Each prefix of a stop is a state of the trie, shared by the anchored and the
        // unanchored walk: its depth is the prefix's length.
        let mut depth = HashMap::new();
        for p in &pats {
            let mut sid = walk.start_state(Anchored::Yes).expect("anchored walks are supported");
            for (i, &b) in p.as_bytes().iter().enumerate() {
                sid = walk.next_state(Anchored::Yes, sid, b);
                depth.insert(sid, i + 1);
            }
        }
        let state = walk.start_state(Anchored::No).expect("unanchored walks are supported");
        StopMatcher {
            stops: Some(Arc::new(Stops { leftmost, walk, depth, index })),
            pending: String::new(),
            state,
            matched: None,
        }
    }

    /// Adds text; returns what can be emitted now and whether a stop string was found (in which
    /// case the returned text ends right before it).
    pub fn push(&mut self, text: &str) -> (String, bool) {
        let Some(st) = &self.stops else {
            return (text.to_string(), false);
        };
        self.pending.push_str(text);
        // The walk passes a match state exactly when a stop ends in the new text; only then is
        // what is held back searched, for the occurrence that starts first (what came before
        // it was no prefix of a stop).
        let mut ended = false;
        for &b in text.as_bytes() {
            self.state = st.walk.next_state(Anchored::No, self.state, b);
            ended |= st.walk.is_match(self.state);
        }
        if ended {
            if let Some(m) = st.leftmost.find(self.pending.as_str()) {
                let emit = self.pending[..m.start()].to_string();
                self.pending.clear();
                self.matched = st.index.get(m.pattern().as_usize()).copied();
                return (emit, true);
            }
        }
        // Keep the longest end that is a prefix of some stop (it starts a character: so does
        // every stop string).
        let keep = st.depth.get(&self.state).copied().unwrap_or(0).min(self.pending.len());
        let mut cut = self.pending.len() - keep;
        while !self.pending.is_char_boundary(cut) {
            cut -= 1;
        }
        let emit = self.pending[..cut].to_string();
        self.pending.drain(..cut);
        (emit, false)
    }

    /// The index of the stop string that ended the text, if one did (the first to start, as
    /// cut).
    pub fn matched(&self) -> Option<usize> {
        self.matched
    }

    /// Text held back so far (at most the longest stop string less one byte).
    pub fn held(&self) -> usize {
        self.pending.len()
    }

    /// Adds the last text; returns everything left to emit (held-back text included, unless a
    /// stop string is found in it).
    pub fn finish(&mut self, tail: &str) -> String {
        let (mut emit, hit) = self.push(tail);
        if !hit {
            emit.push_str(&std::mem::take(&mut self.pending));
        }
        emit
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    #[test]
    fn the_stop_met_is_named_by_its_index_in_the_list_given() {
        let stops = ["", "END", "5"].map(String::from);
        let mut m = StopMatcher::new(&stops);
        assert_eq!(m.push("1, 2, 3, 4, "), ("1, 2, 3, 4, ".to_string(), false));
        assert_eq!(m.matched(), None);
        assert_eq!(m.push("5, 6"), (String::new(), true));
        assert_eq!(m.matched(), Some(2));
    }

    #[test]
    fn stop_strings_split_across_pieces_are_caught_and_not_emitted() {
        let stops = vec!["</end>".to_string()];
        let mut m = StopMatcher::new(&stops);
        let mut out = String::new();
        let mut hit = false;
        for piece in ["Hello", " wor", "ld</e", "nd> tail"] {
            let (e, h) = m.push(piece);
            out.push_str(&e);
            if h {
                hit = true;
                break;
            }
        }
        assert!(hit);
        assert_eq!(out, "Hello world");
    }

    #[test]
    fn held_back_text_is_released_when_it_stops_matching() {
        let stops = vec!["ab".to_string()];
        let mut m = StopMatcher::new(&stops);
        assert_eq!(m.push("xa"), ("x".to_string(), false));
        assert_eq!(m.push("c"), ("ac".to_string(), false));
        assert_eq!(m.finish("a"), "a");
    }

    #[test]
    fn no_stop_strings_passes_text_through() {
        let mut m = StopMatcher::new(&[]);
        assert_eq!(m.push("abc"), ("abc".to_string(), false));
        let mut m = StopMatcher::new(&["".to_string()]);
        assert_eq!(m.push("abc"), ("abc".to_string(), false));
    }

    /// The matcher before Aho–Corasick, kept as the reference: each stop searched in what is
    /// held back, then each one's longest prefix at the end of it.
    struct Reference {
        stops: Vec<String>,
        pending: String,
    }

    impl Reference {
        fn push(&mut self, text: &str) -> (String, bool) {
            if self.stops.is_empty() {
                return (text.to_string(), false);
            }
            self.pending.push_str(text);
            if let Some(at) = self
                .stops
                .iter()
                .filter(|s| !s.is_empty())
                .filter_map(|s| self.pending.find(s.as_str()))
                .min()
            {
                let emit = self.pending[..at].to_string();
                self.pending.clear();
                return (emit, true);
            }
            let mut keep = 0;
            for s in &self.stops {
                for (i, _) in self.pending.char_indices() {
                    let suffix = &self.pending[i..];
                    if s.starts_with(suffix) {
                        keep = keep.max(suffix.len());
                        break;
                    }
                }
            }
            let cut = self.pending.len() - keep;
            let emit = self.pending[..cut].to_string();
            self.pending.drain(..cut);
            (emit, false)
        }

        fn finish(&mut self, tail: &str) -> String {
            let (mut emit, hit) = self.push(tail);
            if !hit {
                emit.push_str(&std::mem::take(&mut self.pending));
            }
            emit
        }
    }

    /// Random stops and answers over a small alphabet (so stops overlap, nest, share prefixes
    /// and suffixes, and hold multi-byte characters), the answer cut into random pieces: the
    /// same text emitted at every push, the same hit, the same rest at the end.
    #[test]
    fn matches_as_the_reference_did() {
        use crate::sampling::Rng;
        let alphabet = ["a", "b", "ab", "é", "€", "😀", " ", "\n"];
        let mut rng = Rng::new(7);
        let mut pick = |n: usize| (rng.next_u64() % n as u64) as usize;
        for case in 0..3000 {
            let n_stops = pick(5);
            let stops: Vec<String> = (0..n_stops)
                .map(|_| (0..pick(6)).map(|_| alphabet[pick(alphabet.len())]).collect())
                .collect();
            let answer: Vec<&str> = (0..pick(40)).map(|_| alphabet[pick(alphabet.len())]).collect();
            let mut pieces = Vec::new();
            let mut at = 0;
            while at < answer.len() {
                let n = 1 + pick(4).min(answer.len() - at - 1);
                pieces.push(answer[at..at + n].concat());
                at += n;
            }
            let mut new = StopMatcher::new(&stops);
            let mut old = Reference { stops: stops.clone(), pending: String::new() };
            let mut done = false;
            for p in &pieces {
                let (a, b) = (new.push(p), old.push(p));
                assert_eq!(a, b, "case {case}: stops {stops:?}, pieces {pieces:?}, at {p:?}");
                assert!(new.held() < MAX_STOP_BYTES);
                if a.1 {
                    done = true;
                    break;
                }
            }
            if !done {
                assert_eq!(new.finish("a€"), old.finish("a€"), "case {case}: {stops:?} {pieces:?}");
            }
        }
    }

    #[test]
    fn overlapping_stops_and_characters_split_across_pieces() {
        let stops = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        // "bc" ends first but "abcd" starts first: the earliest start wins within one push.
        let mut m = StopMatcher::new(&stops(&["abcd", "bc"]));
        assert_eq!(m.push("xabcd"), ("x".to_string(), true));
        // Pushed a byte at a time "bc" is whole first.
        let mut m = StopMatcher::new(&stops(&["abcd", "bc"]));
        assert_eq!(m.push("xa"), ("x".to_string(), false));
        assert_eq!(m.push("b"), (String::new(), false));
        assert_eq!(m.push("c"), ("a".to_string(), true));
        // A stop of multi-byte characters: its first character held whole, released whole.
        let mut m = StopMatcher::new(&stops(&["€😀"]));
        assert_eq!(m.push("1€"), ("1".to_string(), false));
        assert_eq!(m.push("€"), ("€".to_string(), false));
        assert_eq!(m.push("2"), ("€2".to_string(), false));
        assert_eq!(m.push("€"), (String::new(), false));
        assert_eq!(m.push("😀tail"), (String::new(), true));
    }

    #[test]
    fn limits_are_checked_and_named() {
        let ok: Vec<String> = (0..MAX_STOPS).map(|i| "x".repeat(MAX_STOP_BYTES - i)).collect();
        assert!(StopMatcher::try_new(&ok).is_ok());
        let e = StopMatcher::try_new(&vec!["x".to_string(); MAX_STOPS + 1]).unwrap_err();
        assert!(e.contains(&MAX_STOPS.to_string()) && e.contains("stop"), "{e}");
        let e = StopMatcher::check(&["é".repeat(MAX_STOP_BYTES / 2 + 1)]).unwrap_err();
        assert!(e.contains(&MAX_STOP_BYTES.to_string()) && e.contains("bytes"), "{e}");
    }

    /// 16 stops of 256 bytes that the answer keeps almost matching, and the audit's 400 000
    /// short stops (unchecked `new`): a token's work does not grow with the stops. Before: 43 us
    /// and 72 ms a token (the reference); a generous bound on the time, and the held-back text
    /// bounded by the longest stop.
    #[test]
    fn a_token_costs_the_same_whatever_the_stops() {
        let long: Vec<String> = (0..MAX_STOPS)
            .map(|i| format!("{}{}", "a".repeat(MAX_STOP_BYTES - 1), (b'b' + i as u8) as char))
            .collect();
        let mut m = StopMatcher::try_new(&long).unwrap();
        let n = 20_000;
        let t = Instant::now();
        let mut out = 0;
        for _ in 0..n {
            let (e, hit) = m.push("a");
            assert!(!hit);
            out += e.len();
            assert!(m.held() < MAX_STOP_BYTES);
        }
        assert_eq!(out + m.held(), n);
        let long_per_token = t.elapsed() / n as u32;
        let many: Vec<String> = (0..400_000).map(|i| format!("~{i:06}")).collect();
        let mut m = StopMatcher::new(&many);
        let t = Instant::now();
        for i in 1..=2000 {
            assert!(!m.push(&format!(" {i},")).1);
        }
        let many_per_token = t.elapsed() / 2000;
        assert!(m.push(" ~012345 ").1);
        // Generous: both are a few hundred nanoseconds a token on an idle core.
        assert!(long_per_token.as_micros() < 20, "{long_per_token:?}");
        assert!(many_per_token.as_micros() < 200, "{many_per_token:?}");
    }
}
