//! How long the next draft may be, from how the last ones fared: a draft kept whole doubles
//! the length (up to [`MAX_DRAFT`]); one kept in part shrinks it to what was kept plus one; a
//! draft of which nothing was kept pauses drafting for 1, 3, 7, … passes (up to
//! [`MAX_PAUSE`]) and starts the next one short. Text with nothing to copy thus costs a few
//! short verification passes per hundred tokens, and a copy is guessed at full length within
//! a few passes. O(1) per pass.

use super::MAX_DRAFT;

/// The length of a first draft, and of the first after a miss.
const START: usize = 4;
/// Most passes drafting pauses for after misses in a row.
pub const MAX_PAUSE: usize = 63;

/// Acceptance-driven draft length for one sequence.
#[derive(Clone, Debug)]
pub struct Gate {
    len: usize,
    /// Passes left without drafting.
    pause: usize,
    /// Drafts in a row of which nothing was kept.
    misses: u32,
}

impl Default for Gate {
    fn default() -> Self {
        Gate { len: START, pause: 0, misses: 0 }
    }
}

impl Gate {
    pub fn new() -> Gate {
        Gate::default()
    }

    /// Guesses to ask for before the next pass, at most `room` (0 while paused). Called once
    /// per pass.
    pub fn want(&mut self, room: usize) -> usize {
        if self.pause > 0 {
            self.pause -= 1;
            return 0;
        }
        self.len.min(room).min(MAX_DRAFT)
    }

    /// A pass verified `drafted` guesses and kept the first `kept`.
    pub fn observe(&mut self, drafted: usize, kept: usize) {
        if drafted == 0 {
            return;
        }
        if kept >= drafted {
            self.len = (self.len * 2).clamp(START, MAX_DRAFT);
            self.misses = 0;
        } else if kept == 0 {
            self.misses = self.misses.saturating_add(1);
            self.pause = ((1usize << self.misses.min(6)) - 1).min(MAX_PAUSE);
            self.len = START;
        } else {
            self.len = (kept + 1).clamp(2, MAX_DRAFT);
            self.misses = 0;
        }
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
            }
            skipped.push(n);
            g.observe(START, 0);
        }
        assert_eq!(skipped, vec![0, 1, 3, 7, 15, 31, 63, 63]);
        // A kept guess ends the run of misses.
        while g.want(100) == 0 {}
        g.observe(START, 2);
        g.observe(3, 0);
        let mut n = 0;
        while g.want(100) == 0 {
            n += 1;
        }
        assert_eq!(n, 1);
    }
}
