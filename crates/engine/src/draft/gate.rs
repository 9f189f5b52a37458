//! How many guesses the next pass verifies, from how guesses fared and what passes cost.
//!
//! Two rules, the shorter wins:
//! - **Run length.** A draft kept whole doubles the length (up to [`MAX_DRAFT`]); one kept in
//!   part shrinks it to what was kept plus one; a draft of which nothing was kept pauses
//!   drafting for 1, 3, 7, … passes (up to [`MAX_PAUSE`]) and starts the next one short. Text
//!   with nothing to copy thus costs a few short passes per hundred tokens.
//! - **Cost.** Passes are timed by size (a running mean per number of guesses, sizes not yet
//!   timed estimated from their neighbours). With `α` the share of guesses kept (a running
//!   mean of kept over tried), a pass of `L` guesses yields `1 + α + … + α^L` tokens on
//!   average, and `L` is the length that maximises tokens per second. Where reading the
//!   weights dominates (a model streamed from disk) drafts run long; where computing rows does
//!   (past the few tokens a weight read carries for free), they stay short or stop.
//!
//! O([`MAX_DRAFT`]) per pass.

use super::MAX_DRAFT;

/// The length of a first draft, and of the first after a miss.
const START: usize = 4;
/// Most passes drafting pauses for after misses in a row.
pub const MAX_PAUSE: usize = 63;
/// Weight of the past in the running means (per pass).
const DECAY: f64 = 0.8;

/// Running means of what passes cost, by their number of guesses: the cost of a pass is not
/// linear in its tokens (a few tokens ride on the weights' read for free, past that each one
/// costs its compute), so each size keeps its own mean. A size not yet timed is estimated from
/// its nearest timed neighbours (linearly between them, or along the last two past the end).
#[derive(Clone, Debug, Default)]
struct Cost {
    /// `[guesses]`: mean seconds of a pass of `1 + guesses` tokens, once timed.
    secs: [Option<f64>; MAX_DRAFT + 1],
}

impl Cost {
    fn observe(&mut self, guesses: usize, secs: f64) {
        if let Some(m) = self.secs.get_mut(guesses) {
            *m = Some(m.map_or(secs, |o| DECAY * o + (1.0 - DECAY) * secs));
        }
    }

    /// The first size of `sizes` that was timed, and its mean.
    fn first_timed(&self, mut sizes: impl Iterator<Item = usize>) -> Option<(usize, f64)> {
        sizes.find_map(|i| self.secs[i].map(|t| (i, t)))
    }

    /// Seconds of a pass with `l` guesses, timed or estimated (`None`: too little is known).
    fn estimate(&self, l: usize) -> Option<f64> {
        if let Some(t) = self.secs[l] {
            return Some(t);
        }
        let below = self.first_timed((0..l).rev());
        let above = self.first_timed(l + 1..=MAX_DRAFT);
        let at = |(i0, t0): (usize, f64), (i1, t1): (usize, f64)| {
            t0 + (t1 - t0) * (l as f64 - i0 as f64) / (i1 as f64 - i0 as f64)
        };
        match (below, above) {
            (Some(lo), Some(hi)) => Some(at(lo, hi)),
            // Past the longest timed pass: along the slope of the two longest.
            (Some(hi), None) => self.first_timed((0..hi.0).rev()).map(|lo| at(lo, hi).max(hi.1)),
            _ => None,
        }
    }

    /// The length in `0..=room` with the most tokens per second at keep rate `alpha`; lengths
    /// whose cost is not known yet are taken as worth trying (`room` when the lone pass is not).
    fn best(&self, alpha: f64, room: usize) -> usize {
        let Some(a) = self.estimate(0) else { return room };
        let (mut best, mut best_rate) = (0, 1.0 / a.max(1e-9));
        let (mut tokens, mut p) = (1.0, 1.0);
        for l in 1..=room {
            p *= alpha;
            tokens += p;
            let Some(t) = self.estimate(l) else { return room.max(best) };
            let rate = tokens / t.max(1e-9);
            if rate > best_rate {
                (best, best_rate) = (l, rate);
            }
        }
        best
    }
}

/// Acceptance- and cost-driven draft length for one sequence.
#[derive(Clone, Debug)]
pub struct Gate {
    len: usize,
    /// Passes left without drafting.
    pause: usize,
    /// Drafts in a row of which nothing was kept.
    misses: u32,
    /// The pause ending was ordered by the cost rule: the next draft is a short probe, since
    /// the keep rate only moves when guesses are tried.
    probe: bool,
    /// Running sums of guesses kept and guesses tried (a tried guess is kept, or the first
    /// rejected one).
    kept: f64,
    tried: f64,
    cost: Cost,
}

impl Default for Gate {
    fn default() -> Self {
        Gate {
            len: START,
            pause: 0,
            misses: 0,
            probe: false,
            kept: 0.0,
            tried: 0.0,
            cost: Cost::default(),
        }
    }
}

impl Gate {
    pub fn new() -> Gate {
        Gate::default()
    }

    /// The share of tried guesses kept lately (1/2 before any).
    pub fn keep_rate(&self) -> f64 {
        if self.tried > 0.0 {
            (self.kept / self.tried).min(0.99)
        } else {
            0.5
        }
    }

    /// Guesses to ask for before the next pass, at most `room` (0 while paused, or when no
    /// length pays). Called once per pass.
    pub fn want(&mut self, room: usize) -> usize {
        if self.pause > 0 {
            self.pause -= 1;
            return 0;
        }
        let room = room.min(MAX_DRAFT);
        if std::mem::take(&mut self.probe) {
            return START.min(room);
        }
        let n = self.len.min(self.cost.best(self.keep_rate(), room));
        if n == 0 && room > 0 {
            // Drafting does not pay at this keep rate: probe again after a pause, as after a miss.
            self.miss();
            self.probe = true;
        }
        n
    }

    /// A pass verified `drafted` guesses and kept the first `kept`.
    pub fn observe(&mut self, drafted: usize, kept: usize) {
        if drafted == 0 {
            return;
        }
        self.kept = DECAY * self.kept + kept as f64;
        self.tried = DECAY * self.tried + (kept + usize::from(kept < drafted)) as f64;
        if kept >= drafted {
            self.len = (self.len * 2).clamp(START, MAX_DRAFT);
            self.misses = 0;
        } else if kept == 0 {
            self.miss();
        } else {
            self.len = (kept + 1).clamp(2, MAX_DRAFT);
            self.misses = 0;
        }
    }

    /// A pass of `1 + guesses` tokens took `secs`.
    pub fn timed(&mut self, guesses: usize, secs: f64) {
        self.cost.observe(guesses, secs);
    }

    fn miss(&mut self) {
        self.misses = self.misses.saturating_add(1);
        self.pause = ((1usize << self.misses.min(6)) - 1).min(MAX_PAUSE);
        self.len = START;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drafts_kept_whole_grow_to_the_cap() {
        let mut g = Gate::new();
        let mut lens = Vec::new();
        for _ in 0..5 {
            let n = g.want(100);
            lens.push(n);
            g.observe(n, n);
        }
        assert_eq!(lens, vec![START, 2 * START, 4 * START, MAX_DRAFT, MAX_DRAFT]);
        assert_eq!(g.want(3), 3, "the room caps a draft");
    }

    #[test]
    fn a_partial_draft_shrinks_to_what_was_kept() {
        let mut g = Gate::new();
        g.observe(4, 4);
        g.observe(8, 5);
        assert_eq!(g.want(100), 6);
        g.observe(6, 1);
        assert_eq!(g.want(100), 2);
    }

    #[test]
    fn misses_in_a_row_pause_drafting_longer_each_time() {
        let mut g = Gate::new();
        let mut skipped = Vec::new();
        for _ in 0..8 {
            let mut n = 0;
            while g.want(100) == 0 {
                n += 1;
                assert!(n <= MAX_PAUSE, "paused past MAX_PAUSE");
            }
            skipped.push(n);
            g.observe(START, 0);
        }
        assert_eq!(skipped, vec![0, 1, 3, 7, 15, 31, 63, 63]);
        // A kept guess ends the run of misses.
        for _ in 0..=MAX_PAUSE {
            if g.want(100) > 0 {
                break;
            }
        }
        g.observe(START, 2);
        g.observe(3, 0);
        let mut n = 0;
        while g.want(100) == 0 {
            n += 1;
            assert!(n < 10, "the pause after one miss is one pass");
        }
        assert_eq!(n, 1);
    }

    /// A gate that has seen passes cost `a + b·guesses` and guesses kept at rate ~`alpha`.
    fn trained(a: f64, b: f64, alpha: f64) -> Gate {
        let mut g = Gate::new();
        g.timed(0, a);
        g.timed(8, a + 8.0 * b);
        g.timed(12, a + 12.0 * b);
        // 100 guesses tried: kept runs ending in one rejection each.
        let run = (alpha / (1.0 - alpha)).round() as usize;
        for _ in 0..20 {
            g.observe(run + 1, run);
        }
        g.len = MAX_DRAFT;
        g
    }

    #[test]
    fn drafts_run_long_when_reading_the_weights_dominates() {
        // A streamed model: a pass costs 300 ms, a guess 5 ms more; 90% of guesses kept.
        let mut g = trained(0.3, 0.005, 0.9);
        assert_eq!(g.want(100), MAX_DRAFT);
        // At 80% kept the sixteenth guess no longer pays for itself.
        let mut g = trained(0.3, 0.005, 0.8);
        assert_eq!(g.want(100), 12);
    }

    #[test]
    fn drafts_stop_when_guesses_cost_as_much_as_passes() {
        // Computing a guess costs 90% of a lone pass: at a keep rate of 1/2 nothing pays.
        let mut g = trained(0.024, 0.0216, 0.5);
        assert!((g.keep_rate() - 0.5).abs() < 0.05, "{}", g.keep_rate());
        assert_eq!(g.want(100), 0);
        // ... and a short draft probes the keep rate again after a pause.
        let mut n = 1;
        while g.want(100) == 0 {
            n += 1;
            assert!(n <= MAX_PAUSE + 1, "no probe after {n} passes");
        }
        assert!(n > 1, "{n}");
    }

    #[test]
    fn a_pass_that_turns_compute_bound_keeps_drafts_below_the_turn() {
        // Measured on qwen2.5-coder-1.5b: up to 4 tokens ride on one read of the weights (45 ms,
        // 52 ms at 4), past that each token costs 13 ms. At 90% kept, 3 guesses pay best.
        let mut g = Gate::new();
        for (l, ms) in [(0, 45.0), (1, 46.0), (3, 52.0), (7, 104.0), (15, 193.0)] {
            g.timed(l, ms / 1000.0);
        }
        for _ in 0..20 {
            g.observe(10, 9);
        }
        g.len = MAX_DRAFT;
        assert_eq!(g.want(100), 3);
    }

    #[test]
    fn an_untimed_size_is_estimated_from_its_neighbours() {
        let mut c = Cost::default();
        assert_eq!(c.estimate(0), None);
        c.observe(0, 1.0);
        assert_eq!(c.estimate(3), None, "one timed size gives no slope");
        c.observe(4, 2.0);
        assert_eq!(c.estimate(2), Some(1.5));
        assert_eq!(c.estimate(8), Some(3.0));
        assert_eq!(c.estimate(4), Some(2.0));
    }

    #[test]
    fn a_cheap_guess_with_a_high_keep_rate_drafts_several() {
        // A lone pass 24 ms, a guess 7 ms, 90% kept: about 4-6 guesses pay best.
        let mut g = trained(0.024, 0.007, 0.9);
        let n = g.want(100);
        assert!((3..=8).contains(&n), "{n}");
    }
}
