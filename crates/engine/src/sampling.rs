//! Token sampling: penalties, then greedy or temperature with top-k / top-p / min-p, from a
//! seeded RNG (same seed, same text). All buffers are sized once for the vocabulary, so
//! sampling a token allocates nothing; the only buffer that grows is the penalties' window of
//! recent tokens, one id per token the sampler is given, up to `repeat_last_n`. No setting
//! sizes an allocation or a loop by itself: [`SamplerParams::validate`] bounds `repeat_last_n`
//! by [`MAX_REPEAT_LAST_N`], `top_k` only ever selects among the vocabulary, and the rest are
//! numbers the arithmetic reads.

/// `repeat_last_n` at most (other than [`REPEAT_LAST_N_WHOLE_CONTEXT`]): 2^20 tokens, more
/// than any context snug runs, so it never limits a window that fits a sequence.
pub const MAX_REPEAT_LAST_N: usize = 1 << 20;

/// `repeat_last_n` meaning "the whole context" (Ollama's and llama.cpp's `-1`): the penalties
/// look at every token the sampler has been given (for a sequence, its context: prompt and
/// answer so far), at most [`MAX_REPEAT_LAST_N`].
pub const REPEAT_LAST_N_WHOLE_CONTEXT: usize = usize::MAX;

/// Sampling settings; the defaults are llama.cpp's.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplerParams {
    /// 0 (or below) means greedy.
    pub temperature: f32,
    /// 0 disables.
    pub top_k: usize,
    /// 1.0 disables.
    pub top_p: f32,
    /// 0.0 disables.
    pub min_p: f32,
    /// 1.0 disables. Divides positive logits (multiplies negative ones) of recent tokens.
    pub repeat_penalty: f32,
    /// How many recent tokens the penalties look at: 0 none, at most [`MAX_REPEAT_LAST_N`], or
    /// [`REPEAT_LAST_N_WHOLE_CONTEXT`].
    pub repeat_last_n: usize,
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    pub seed: u64,
}

impl Default for SamplerParams {
    fn default() -> Self {
        SamplerParams {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: 0x5eed,
        }
    }
}

impl SamplerParams {
    pub fn greedy() -> Self {
        SamplerParams { temperature: 0.0, ..Default::default() }
    }

    pub fn validate(&self) -> Result<(), String> {
        if !self.temperature.is_finite() {
            return Err(format!("temperature must be a finite number, got {}", self.temperature));
        }
        if !(0.0..=1.0).contains(&self.top_p) {
            return Err(format!("top_p must be in [0, 1], got {}", self.top_p));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(format!("min_p must be in [0, 1], got {}", self.min_p));
        }
        if !(self.repeat_penalty.is_finite() && self.repeat_penalty > 0.0) {
            return Err(format!(
                "repeat_penalty must be a positive number, got {}",
                self.repeat_penalty
            ));
        }
        if !self.presence_penalty.is_finite() || !self.frequency_penalty.is_finite() {
            return Err("presence and frequency penalties must be finite numbers".into());
        }
        if self.repeat_last_n > MAX_REPEAT_LAST_N
            && self.repeat_last_n != REPEAT_LAST_N_WHOLE_CONTEXT
        {
            return Err(format!(
                "repeat_last_n must be at most {MAX_REPEAT_LAST_N} (or the whole context), got {}",
                self.repeat_last_n
            ));
        }
        Ok(())
    }

    /// The window of recent tokens the penalties look at, in tokens ([`MAX_REPEAT_LAST_N`] at
    /// most, whatever the settings say).
    pub fn repeat_window(&self) -> usize {
        self.repeat_last_n.min(MAX_REPEAT_LAST_N)
    }
}

/// Recent-token slots a sampler reserves when it is made (1 KiB): the default window (64) and
/// the usual ones fit without a reallocation while decoding.
const RECENT_RESERVED: usize = 256;

/// Greedy: the highest logit, the lowest id on ties (as llama.cpp); token 0 for no candidates.
pub(crate) fn greedy(cand: impl Iterator<Item = (u32, f32)>) -> u32 {
    let mut best = (0, f32::NEG_INFINITY);
    for c in cand {
        if c.1 > best.1 {
            best = c;
        }
    }
    best.0
}

/// xoshiro256** seeded through splitmix64: small, fast and identical on every platform.
#[derive(Clone, Debug)]
pub struct Rng([u64; 4]);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        let mut z = seed;
        let mut next = || {
            z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut x = z;
            x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            x ^ (x >> 31)
        };
        Rng([next(), next(), next(), next()])
    }

    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.0;
        let result = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// Uniform in [0, 1).
    pub fn next_f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }
}

pub struct Sampler {
    pub params: SamplerParams,
    rng: Rng,
    /// (token, logit) candidates, [n_vocab]
    cand: Vec<(u32, f32)>,
    /// Recent tokens, newest last (at most [`SamplerParams::repeat_window`]); grows with the
    /// tokens given, never sized from the settings.
    recent: std::collections::VecDeque<u32>,
    /// Occurrences of each token among `recent`, [n_vocab]
    counts: Vec<u32>,
}

impl Sampler {
    /// Heap a sampler holds for a vocabulary of `n_vocab`: the candidate and count arrays.
    pub fn heap_bytes(n_vocab: usize) -> usize {
        n_vocab.saturating_mul(std::mem::size_of::<(u32, f32)>() + std::mem::size_of::<u32>())
    }

    pub fn new(params: SamplerParams, n_vocab: usize) -> Sampler {
        Sampler {
            rng: Rng::new(params.seed),
            cand: Vec::with_capacity(n_vocab),
            // Room for the usual windows up front, so that decoding allocates nothing per token;
            // a longer window grows as tokens come, never sized by the request's number.
            recent: std::collections::VecDeque::with_capacity(
                params.repeat_window().min(RECENT_RESERVED),
            ),
            counts: vec![0; n_vocab],
            params,
        }
    }

    /// Forgets the token history (a new conversation) and reseeds.
    pub fn reset(&mut self) {
        self.rng = Rng::new(self.params.seed);
        self.recent.clear();
        self.counts.iter_mut().for_each(|c| *c = 0);
    }

    /// Records a token (prompt or generated) for the repetition penalties.
    pub fn accept(&mut self, token: u32) {
        let window = self.params.repeat_window();
        if window == 0 || token as usize >= self.counts.len() {
            return;
        }
        if self.recent.len() >= window {
            if let Some(old) = self.recent.pop_front() {
                self.counts[old as usize] -= 1;
            }
        }
        self.recent.push_back(token);
        self.counts[token as usize] += 1;
    }

    fn penalties_active(&self) -> bool {
        let p = &self.params;
        p.repeat_penalty != 1.0 || p.presence_penalty != 0.0 || p.frequency_penalty != 0.0
    }

    /// Picks the next token from `logits` (`n_vocab` values).
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        let p = self.params.clone();
        if p.temperature <= 0.0 && !self.penalties_active() {
            // Greedy on the row itself: no copy of the candidates (a verification pass draws
            // several rows a pass).
            return greedy(logits.iter().enumerate().map(|(i, &l)| (i as u32, l)));
        }
        self.cand.clear();
        self.cand.extend(logits.iter().enumerate().map(|(i, &l)| (i as u32, l)));
        if self.penalties_active() {
            for (tok, l) in self.cand.iter_mut() {
                let n = self.counts[*tok as usize];
                if n == 0 {
                    continue;
                }
                if *l > 0.0 {
                    *l /= p.repeat_penalty;
                } else {
                    *l *= p.repeat_penalty;
                }
                *l -= n as f32 * p.frequency_penalty + p.presence_penalty;
            }
        }
        if p.temperature <= 0.0 {
            return greedy(self.cand.iter().copied());
        }
        // top-k: partial sort the k best to the front.
        let by_logit_desc =
            |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        let k = if p.top_k == 0 { self.cand.len() } else { p.top_k.min(self.cand.len()) };
        if k < self.cand.len() {
            self.cand.select_nth_unstable_by(k - 1, by_logit_desc);
            self.cand.truncate(k);
        }
        self.cand.sort_unstable_by(by_logit_desc);
        // softmax with temperature
        let max = self.cand[0].1;
        let mut sum = 0.0f32;
        for c in self.cand.iter_mut() {
            c.1 = ((c.1 - max) / p.temperature).exp();
            sum += c.1;
        }
        // Extreme (finite) settings can leave no distribution (an infinite logit after a tiny
        // repeat_penalty, every logit at -inf after a huge frequency_penalty): the best candidate.
        if !(sum > 0.0 && sum.is_finite()) {
            return self.cand[0].0;
        }
        for c in self.cand.iter_mut() {
            c.1 /= sum;
        }
        // min-p: drop tokens below min_p × the best probability.
        if p.min_p > 0.0 {
            let floor = self.cand[0].1 * p.min_p;
            let keep = self.cand.iter().take_while(|c| c.1 >= floor).count().max(1);
            self.cand.truncate(keep);
        }
        // top-p: smallest prefix whose mass reaches top_p.
        if p.top_p < 1.0 {
            let mut acc = 0.0;
            let mut keep = self.cand.len();
            for (i, c) in self.cand.iter().enumerate() {
                acc += c.1;
                if acc >= p.top_p {
                    keep = i + 1;
                    break;
                }
            }
            self.cand.truncate(keep);
        }
        let total: f32 = self.cand.iter().map(|c| c.1).sum();
        let mut r = self.rng.next_f32() * total;
        for c in &self.cand {
            r -= c.1;
            if r <= 0.0 {
                return c.0;
            }
        }
        self.cand[self.cand.len() - 1].0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_picks_the_argmax_and_lowest_id_on_ties() {
        let mut s = Sampler::new(SamplerParams::greedy(), 4);
        assert_eq!(s.sample(&[0.0, 3.0, 1.0, 3.0]), 1);
    }

    #[test]
    fn same_seed_same_tokens_different_seed_differs() {
        let logits: Vec<f32> = (0..100).map(|i| ((i * 37) % 11) as f32 * 0.3).collect();
        let params = SamplerParams {
            temperature: 1.5,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            ..Default::default()
        };
        let run = |seed| {
            let mut s = Sampler::new(SamplerParams { seed, ..params.clone() }, 100);
            (0..50).map(|_| s.sample(&logits)).collect::<Vec<_>>()
        };
        assert_eq!(run(1), run(1));
        assert_ne!(run(1), run(2));
    }

    #[test]
    fn top_k_one_is_greedy() {
        let mut s =
            Sampler::new(SamplerParams { top_k: 1, temperature: 5.0, ..Default::default() }, 5);
        for _ in 0..20 {
            assert_eq!(s.sample(&[0.1, 0.2, 2.0, 0.3, 1.9]), 2);
        }
    }

    #[test]
    fn min_p_removes_unlikely_tokens() {
        let mut s = Sampler::new(
            SamplerParams {
                top_k: 0,
                top_p: 1.0,
                min_p: 0.5,
                temperature: 1.0,
                ..Default::default()
            },
            3,
        );
        for _ in 0..50 {
            assert_ne!(s.sample(&[5.0, 4.9, -3.0]), 2);
        }
    }

    #[test]
    fn repetition_penalty_steers_greedy_away_from_recent_tokens() {
        let mut s =
            Sampler::new(SamplerParams { repeat_penalty: 2.0, ..SamplerParams::greedy() }, 3);
        s.accept(0);
        assert_eq!(s.sample(&[2.0, 1.5, 0.0]), 1);
        s.reset();
        assert_eq!(s.sample(&[2.0, 1.5, 0.0]), 0);
    }

    /// The audit's H2: `repeat_last_n` of 2^63 - 1 made `Sampler::new` ask for a capacity
    /// overflow (a panic on the scheduler thread), 2^40 for 4 TiB (an abort). Now validate
    /// refuses what is past the bound, the whole-context value is accepted, and the window
    /// grows only with the tokens given.
    #[test]
    fn repeat_last_n_is_bounded_and_never_sizes_an_allocation() {
        let with = |n| SamplerParams { repeat_last_n: n, ..SamplerParams::default() };
        for n in [i64::MAX as usize, 1 << 40, MAX_REPEAT_LAST_N + 1] {
            let e = with(n).validate().unwrap_err();
            assert!(e.contains("repeat_last_n"), "{e}");
        }
        for n in [0, 64, MAX_REPEAT_LAST_N, REPEAT_LAST_N_WHOLE_CONTEXT] {
            assert!(with(n).validate().is_ok(), "{n}");
        }
        // Even unvalidated, a huge window reserves only the fixed few slots up front.
        for n in [i64::MAX as usize, usize::MAX] {
            let mut s = Sampler::new(SamplerParams { repeat_penalty: 2.0, ..with(n) }, 3);
            assert!(s.recent.capacity() <= 2 * RECENT_RESERVED, "{}", s.recent.capacity());
            for t in [0, 0, 1] {
                s.accept(t);
            }
            assert!(s.recent.capacity() <= 2 * RECENT_RESERVED);
            assert_eq!(s.counts[..2], [2, 1]);
        }
        // The whole context: every token given stays in the window.
        let mut s = Sampler::new(
            SamplerParams { repeat_penalty: 2.0, ..with(REPEAT_LAST_N_WHOLE_CONTEXT) },
            2,
        );
        for _ in 0..1000 {
            s.accept(1);
        }
        assert_eq!(s.counts[1], 1000);
        // A window of 2 keeps the last two.
        let mut s = Sampler::new(SamplerParams { repeat_penalty: 2.0, ..with(2) }, 3);
        for t in [0, 1, 2] {
            s.accept(t);
        }
        assert_eq!(s.counts, [0, 1, 1]);
    }

    /// Finite settings at their extremes leave no distribution to sample from; the sampler
    /// then picks the best candidate rather than whatever the NaNs leave.
    #[test]
    fn extreme_penalties_pick_the_best_candidate() {
        let mut s = Sampler::new(
            SamplerParams {
                repeat_penalty: 1e-45,
                temperature: 1.0,
                top_k: 0,
                top_p: 1.0,
                min_p: 0.0,
                ..SamplerParams::default()
            },
            3,
        );
        s.accept(1);
        // Token 1's logit becomes +inf: it is the only sensible pick.
        for _ in 0..10 {
            assert_eq!(s.sample(&[0.5, 1.0, 0.2]), 1);
        }
    }

    #[test]
    fn frequency_penalty_grows_with_count() {
        let mut s =
            Sampler::new(SamplerParams { frequency_penalty: 0.4, ..SamplerParams::greedy() }, 2);
        assert_eq!(s.sample(&[1.0, 0.5]), 0);
        s.accept(0);
        assert_eq!(s.sample(&[1.0, 0.5]), 0, "one occurrence: 1.0 - 0.4 = 0.6 still wins");
        s.accept(0);
        assert_eq!(s.sample(&[1.0, 0.5]), 1, "two occurrences: 1.0 - 0.8 = 0.2 loses");
    }
}
