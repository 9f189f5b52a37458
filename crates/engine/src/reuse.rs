//! Prompt reuse by text (issue 48): the prefix cache hits through the previous answer although
//! a model's answer is rarely the tokens the next prompt's tokenization gives for its text.
//!
//! Qwen writes a call's markup `<tool_call>` under the call grammar as the pieces `<`, `tool`,
//! `_call`, `>`, which the template renders back as its one added token; a sampled split of a
//! word may not be the canonical BPE split. The prefix cache keys blocks by tokens, so turn N+1
//! missed from the first such token on. Two parts, both in the scheduler:
//!
//! - **The answer read again in the prompt's tokens** ([`canonical`]): when an answer's tokens
//!   are not those its text tokenizes to, its slot, once the client has its answer, computes
//!   the KV of the re-tokenized answer from the first token that differs (the answer's length
//!   at most: a few dozen tokens for a call, computed while the client runs its tool) and
//!   offers it to the prefix cache. The next turn then finds the answer as its own
//!   tokenization spells it, so the model reads exactly the prompt it would read without any
//!   cache. (Showing the model its own pieces instead changes what it does: given its previous
//!   call's markup in pieces, qwen2.5-coder-1.5b calls its tool again where it answered;
//!   measured with the openai-agents test.)
//! - **Splicing** ([`splice`]): past the longest common token prefix `L` of a new prompt `P`
//!   and a kept sequence `S`, the furthest token boundaries `k` of `S` and `m` of `P` where
//!   `S[L..k]` and `P[L..m]` have byte-identical text; the prompt becomes `S[..k] ++ P[m..]`
//!   when the cache then holds more of it. It catches what the re-tokenized answer does not:
//!   text split differently where the answer meets the rest of the prompt.
//!
//! What may be substituted: ordinary tokens compare by their decoded bytes; control tokens
//! (`<|im_end|>`, `<|im_start|>`), user-defined (added) tokens such as `<tool_call>`, and any
//! token whose text is empty match only the same token id, never text that spells them, so
//! client text spelling a control token stays text (docs/SECURITY.md, issue 52 M1) and the
//! structure the template wrote is kept token for token. A substitution only ever replaces
//! tokens by tokens of the same bytes.
//!
//! Usage stays in the plain tokenization's units ([`Splice::plain_cached`]): a request's
//! prompt counts `P`'s tokens (what `count_tokens` answers), and its cached tokens are those of
//! `P` whose text the cache held — the cached tokens of the spliced prompt mapped back through
//! the aligned boundaries.
//!
//! [`Recent`] keeps the last [`Recent::SEQS`] finished sequences' tokens (prompt and answer,
//! the answer re-tokenized when it was computed again), each under its adapter set's prefix-cache salt, so one
//! adapter's sequences never splice another's. Cost: memory [`Recent::heap_bytes`] (4 bytes a
//! token, at most the context per sequence); per admitted prompt, a common-prefix scan against
//! each stored sequence of its salt and a byte comparison from the divergence point only.

use std::collections::VecDeque;

use tokenizer::Tokenizer;

/// What a token is to the text comparison.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Piece<'a> {
    /// Compared by its decoded bytes (never empty).
    Text(&'a [u8]),
    /// Matches only the same id: control and unknown tokens, and tokens with no text.
    Exact(u32),
}

/// Token `id` as [`splice`] compares it under `tok`: control, unknown and user-defined (added)
/// tokens, and tokens with no text, match only themselves.
pub fn piece_of(tok: &Tokenizer, id: u32) -> Piece<'_> {
    let bytes = tok.token_piece(id);
    let exact = tokenizer::attr::CONTROL | tokenizer::attr::UNKNOWN | tokenizer::attr::USER_DEFINED;
    if tok.token_attr(id) & exact != 0 || bytes.is_empty() {
        Piece::Exact(id)
    } else {
        Piece::Text(bytes)
    }
}

/// A finished sequence (`tokens`: `n_prompt` prompt tokens, then its answer) with its answer
/// tokenized again from its text as a prompt would tokenize it, run by run between the tokens
/// that are not text ([`Piece::Exact`], kept as they are); text spelling a control token stays
/// text. `None` when that changes nothing, when a run is not whole UTF-8, or when the
/// vocabulary adds a space before a text (SentencePiece: a run alone would not tokenize as it
/// does inside the prompt).
pub fn canonical(tok: &Tokenizer, tokens: &[u32], n_prompt: usize) -> Option<Vec<u32>> {
    if tok.add_space_prefix() || n_prompt >= tokens.len() {
        return None;
    }
    let mut out = tokens[..n_prompt].to_vec();
    let mut run = Vec::new();
    let flush = |run: &mut Vec<u8>, out: &mut Vec<u32>| -> Option<()> {
        if !run.is_empty() {
            out.extend(tok.encode(std::str::from_utf8(run).ok()?, false, false));
            run.clear();
        }
        Some(())
    };
    for &t in &tokens[n_prompt..] {
        match piece_of(tok, t) {
            Piece::Text(b) => run.extend_from_slice(b),
            Piece::Exact(_) => {
                flush(&mut run, &mut out)?;
                out.push(t);
            }
        }
    }
    flush(&mut run, &mut out)?;
    (out != tokens).then_some(out)
}

/// A new prompt spliced onto a stored sequence: `S[..k] ++ P[m..]`, with `S[l..k]` and
/// `P[l..m]` the same text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Splice {
    /// The longest common token prefix of `P` and `S`.
    pub l: usize,
    pub k: usize,
    pub m: usize,
    /// The plain prompt's length, `P.len()`.
    pub n_plain: usize,
    /// The boundaries `(i, j)` from `(l, l)` to `(k, m)`, increasing, where `S[..i]` and
    /// `P[..j]` end on the same text.
    marks: Vec<(usize, usize)>,
}

impl Splice {
    /// The spliced prompt, `S[..k] ++ P[m..]`.
    pub fn prompt(&self, s: &[u32], p: &[u32]) -> Vec<u32> {
        let mut t = Vec::with_capacity(self.k + p.len() - self.m);
        t.extend_from_slice(&s[..self.k]);
        t.extend_from_slice(&p[self.m..]);
        t
    }

    /// Of the plain prompt `P`, the tokens whose text the first `h` tokens of the spliced
    /// prompt hold: `h` up to `l`, `m + (h − k)` from `k` on, and in between the last aligned
    /// boundary at or before `h` (a token of `P` that is only partly held is not counted).
    pub fn plain_cached(&self, h: usize) -> usize {
        if h >= self.k {
            return self.m + (h - self.k);
        }
        if h <= self.l {
            return h;
        }
        let at = self.marks.partition_point(|&(i, _)| i <= h);
        self.marks[at.saturating_sub(1)].1
    }
}

/// Where the new prompt `p` can take `s`'s tokens for the same text (module docs), or `None`
/// when it cannot go past their common token prefix (or `p` already is a prefix of `s`).
pub fn splice<'a>(p: &[u32], s: &[u32], piece: impl Fn(u32) -> Piece<'a>) -> Option<Splice> {
    let l = p.iter().zip(s).take_while(|(a, b)| a == b).count();
    if l == p.len() || l == s.len() {
        return None;
    }
    let (mut i, mut j) = (l, l);
    // Bytes of `s[i]` and `p[j]` already matched (both 0: a common boundary).
    let (mut oi, mut oj) = (0usize, 0usize);
    let mut marks = vec![(l, l)];
    while i < s.len() && j < p.len() {
        match (piece(s[i]), piece(p[j])) {
            (Piece::Exact(a), Piece::Exact(b)) if a == b && oi == 0 && oj == 0 => {
                (i, j) = (i + 1, j + 1);
            }
            (Piece::Text(a), Piece::Text(b)) => {
                let (ra, rb) = (&a[oi..], &b[oj..]);
                let n = ra.len().min(rb.len());
                if ra[..n] != rb[..n] {
                    break;
                }
                (oi, oj) = (oi + n, oj + n);
                if oi == a.len() {
                    (i, oi) = (i + 1, 0);
                }
                if oj == b.len() {
                    (j, oj) = (j + 1, 0);
                }
            }
            _ => break,
        }
        if oi == 0 && oj == 0 {
            marks.push((i, j));
        }
    }
    let &(k, m) = marks.last()?;
    (k > l).then_some(Splice { l, k, m, n_plain: p.len(), marks })
}

/// The last finished sequences' tokens, each under its adapter set's salt (module docs).
#[derive(Debug, Default)]
pub struct Recent {
    /// (salt, the tokens at the sequence's KV positions), most recent first.
    seqs: VecDeque<(u64, Vec<u32>)>,
}

impl Recent {
    /// Sequences kept at most: a few conversations served in turn by one slot, or one each by a
    /// few slots.
    pub const SEQS: usize = 8;

    /// Heap bytes at most for a context of `n_ctx` positions (each sequence holds at most
    /// `n_ctx` tokens of 4 bytes, stored at their exact length).
    pub fn heap_bytes(n_ctx: usize) -> usize {
        let each = n_ctx.saturating_mul(4).saturating_add(std::mem::size_of::<(u64, Vec<u32>)>());
        each.saturating_mul(Self::SEQS)
    }

    /// Keeps `tokens` under `salt`, dropping the oldest past [`Recent::SEQS`] and any kept
    /// sequence of the same salt that `tokens` extends (a conversation's earlier turns).
    pub fn remember(&mut self, salt: u64, tokens: &[u32]) {
        if tokens.is_empty() {
            return;
        }
        self.seqs.retain(|(s, t)| *s != salt || !tokens.starts_with(t));
        self.seqs.push_front((salt, tokens.to_vec()));
        self.seqs.truncate(Self::SEQS);
    }

    /// Forgets every sequence (the prefix cache was shed: nothing they would reach is cached).
    pub fn clear(&mut self) {
        self.seqs = VecDeque::new();
    }

    /// The splice of `prompt` under `salt` that reaches furthest into it, with the kept
    /// sequence it splices onto (the most recent of equals).
    pub fn best<'a>(
        &self,
        salt: u64,
        prompt: &[u32],
        piece: impl Fn(u32) -> Piece<'a> + Copy,
    ) -> Option<(Splice, &[u32])> {
        let mut best: Option<(Splice, &[u32])> = None;
        for (_, s) in self.seqs.iter().filter(|(s, _)| *s == salt) {
            if let Some(sp) = splice(prompt, s, piece) {
                if best.as_ref().is_none_or(|(b, _)| sp.m > b.m) {
                    best = Some((sp, s));
                }
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A made-up vocabulary: 0-9 text pieces, 100 and 101 control tokens, 102 an ordinary token
    /// spelling `<tc>` as one piece (a merge), 103 a token with no text.
    fn piece(id: u32) -> Piece<'static> {
        const TEXT: [&str; 10] = ["<", "tc", ">", "<tc>", "ab", "a", "b", "c", "<|end|>", "x"];
        match id {
            0..=9 => Piece::Text(TEXT[id as usize].as_bytes()),
            102 => Piece::Text(b"<tc>"),
            100 | 101 | 103 => Piece::Exact(id),
            _ => unreachable!("not in the made-up vocabulary"),
        }
    }

    #[test]
    fn a_non_canonical_split_is_taken_for_the_same_text() {
        // S: prompt [9], answer `<` `tc` `>` `a` `b`, then end. P: the same text as one added
        // token and `ab`, the end control token, then new text.
        let s = [9, 0, 1, 2, 5, 6, 100];
        let p = [9, 102, 4, 100, 101, 7];
        let sp = splice(&p, &s, piece).expect("a splice");
        assert_eq!((sp.l, sp.k, sp.m), (1, 7, 4));
        assert_eq!(sp.prompt(&s, &p), vec![9, 0, 1, 2, 5, 6, 100, 101, 7]);
        // Cached counts map back to the plain prompt's tokens.
        assert_eq!(sp.plain_cached(1), 1);
        assert_eq!(sp.plain_cached(3), 1, "`<tc>` only partly held is not counted");
        assert_eq!(sp.plain_cached(4), 2);
        assert_eq!(sp.plain_cached(5), 2, "`ab` only partly held is not counted");
        assert_eq!(sp.plain_cached(6), 3);
        assert_eq!(sp.plain_cached(8), 5);
    }

    #[test]
    fn a_control_token_never_matches_text_that_spells_it() {
        // S ends its answer with the control token; P holds the same spelling as text.
        let s = [9, 5, 100, 7];
        let p = [9, 6, 8, 7];
        assert_eq!(splice(&p, &s, piece), None, "diverges at once");
        let p = [9, 5, 8, 7];
        assert_eq!(splice(&p, &s, piece), None, "`<|end|>` as text is not the control token");
        // The other way round: text in S, the control token in P.
        let (s, p) = ([9, 0, 8, 7], [9, 0, 100, 7]);
        assert_eq!(splice(&p, &s, piece), None);
        // The same text split differently, then the same control token: taken through it.
        let (s, p) = ([9, 5, 6, 100], [9, 4, 100]);
        let sp = splice(&p, &s, piece).expect("the same text and control token");
        assert_eq!((sp.k, sp.m), (4, 3));
        // A control token met while the other side is mid-piece stops the splice.
        let (s, p) = ([9, 4, 100], [9, 5, 100]);
        assert_eq!(splice(&p, &s, piece), None, "`a` then the control token against `ab`");
    }

    #[test]
    fn divergent_text_stops_the_splice_at_the_last_common_boundary() {
        // `<` `tc` `>` `a` `c` against `<tc>` `ab`: the same text up to `<tc>a`, where `ab` is
        // one token of P, so the splice ends after `<tc>`.
        let s = [9, 0, 1, 2, 5, 7];
        let p = [9, 102, 4, 7];
        let sp = splice(&p, &s, piece).expect("a splice");
        assert_eq!((sp.k, sp.m), (4, 2));
        assert_eq!(sp.prompt(&s, &p), vec![9, 0, 1, 2, 4, 7]);
        // Text that differs at once: nothing to splice.
        assert_eq!(splice(&[9, 7], &[9, 5], piece), None);
        // A prompt that is a prefix of S: the prefix cache alone serves it.
        assert_eq!(splice(&[9, 0], &[9, 0, 1], piece), None);
    }

    #[test]
    fn a_token_with_no_text_is_matched_only_by_itself() {
        let (s, p) = ([9, 103, 5], [9, 5]);
        assert_eq!(splice(&p, &s, piece), None);
        let (s, p) = ([9, 0, 1, 2, 103, 5], [9, 3, 103, 5]);
        let sp = splice(&p, &s, piece).expect("a splice");
        assert_eq!((sp.k, sp.m), (6, 4));
    }

    #[test]
    fn recent_keeps_salts_apart_and_drops_earlier_turns() {
        let mut r = Recent::default();
        r.remember(1, &[9, 0, 1]);
        r.remember(1, &[9, 0, 1, 2, 5]);
        r.remember(2, &[9, 0, 1, 2, 5, 6]);
        assert_eq!(r.seqs.len(), 2, "the turn the next one extends is dropped");
        let p = [9, 102, 4, 7];
        let (sp, s) = r.best(1, &p, piece).expect("salt 1 splices");
        assert_eq!((sp.k, sp.m, s.len()), (4, 2, 5));
        let (sp, _) = r.best(2, &p, piece).expect("salt 2 splices its own");
        assert_eq!((sp.k, sp.m), (6, 3));
        assert!(r.best(3, &p, piece).is_none(), "no sequence under another salt");
        for n in 0..20 {
            r.remember(1, &[n]);
        }
        assert_eq!(r.seqs.len(), Recent::SEQS);
        r.clear();
        assert!(r.best(1, &p, piece).is_none());
    }
}
