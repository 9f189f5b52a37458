//! The schedule the compute and the reader threads share: the streamed stages in compute order,
//! which chunk a reader reads next (and the reader loop that reads it), and which bytes a
//! finished stage releases.
//!
//! Stages are numbered by tickets in compute order across passes, so "ahead of the compute"
//! is a ticket comparison. Readers claim [`CHUNK`]s in ticket order while what they have asked
//! for, counted from the stage computing, stays within the window; a finished stage's ranges are
//! widened to whole page-cache folios where nothing still to be used this pass shares them. Cost:
//! one mutex per claimed chunk on a reader thread; per stage, the compute thread stores its
//! ticket and (while layers stream) takes the mutex once to wake the readers.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};

use super::LayerStages;
use crate::residency::pages::touch_pages;
use crate::residency::READERS;

/// Bytes a reader claims at a time: two huge-page folios, what one read fault brings in.
pub(super) const CHUNK: u64 = 4 << 20;

/// Page-cache folios are at most one huge page (x86-64 and arm64 with 4 KiB pages).
const FOLIO: usize = 2 << 20;

/// Ranges of one stage closer than this are merged: what lies between (norms and biases, read
/// once at load) is dropped with them.
const MERGE_GAP: usize = 64 << 10;

/// The stages, the pinned count and where the compute is; shared with the reader threads.
pub(super) struct Shared {
    /// `[n_layer][per]` stages, each stage's ranges sorted and merged.
    pub(super) layers: Vec<LayerStages>,
    /// Stages per layer.
    per: usize,
    /// `[n_layer][per]` bytes of each stage.
    bytes: Vec<Vec<u64>>,
    /// Layers `0..pinned` stay resident (`Streamer::pinned` reads it here).
    pub(super) pinned: AtomicUsize,
    /// Ticket of the stage computing (or next to compute once one is done): stages are numbered
    /// in compute order across passes, `pass × n_layer × per + il × per + st`.
    pub(super) computing: AtomicU64,
    /// Most streamed bytes the readers may have asked for from the stage computing on.
    window: u64,
    /// The readers' cursor and stop flag; they wait on `wake` for the compute to move on.
    state: Mutex<ReadState>,
    /// Per reader, the ticket whose pages it is touching (`u64::MAX`: none). A stage is dropped
    /// only once no reader is in it, so no page of it is faulted back in after the drop.
    busy: [AtomicU64; READERS],
    wake: Condvar,
}

impl Shared {
    pub(super) fn new(layers: Vec<LayerStages>, pinned: usize, window: u64) -> Shared {
        let per = layers.iter().map(Vec::len).max().unwrap_or(0).max(1);
        let layers: Vec<LayerStages> = layers
            .into_iter()
            .map(|mut l| {
                l.resize(per, Vec::new());
                l.into_iter().map(merged).collect()
            })
            .collect();
        let bytes: Vec<Vec<u64>> = layers
            .iter()
            .map(|l| l.iter().map(|st| st.iter().map(|&(a, b)| (b - a) as u64).sum()).collect())
            .collect();
        let biggest = bytes.iter().flatten().copied().max().unwrap_or(0);
        Shared {
            pinned: AtomicUsize::new(pinned.min(layers.len())),
            layers,
            per,
            bytes,
            computing: AtomicU64::new(0),
            // The readers must be able to hold the stage computing.
            window: window.max(biggest),
            state: Mutex::new(ReadState { t: 0, off: 0, stop: false }),
            busy: std::array::from_fn(|_| AtomicU64::new(u64::MAX)),
            wake: Condvar::new(),
        }
    }

    /// Wakes the readers to look at the compute position and the pinned count again.
    pub(super) fn wake_readers(&self) {
        let _g = self.state.lock().unwrap_or_else(|p| p.into_inner());
        self.wake.notify_all();
    }

    /// Tells the readers to return.
    pub(super) fn stop_readers(&self) {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).stop = true;
        self.wake.notify_all();
    }

    /// Whether a reader is touching pages of ticket `t`.
    pub(super) fn reading(&self, t: u64) -> bool {
        self.busy.iter().any(|b| b.load(Ordering::SeqCst) == t)
    }

    /// Stages in one pass.
    fn n(&self) -> u64 {
        (self.layers.len() * self.per).max(1) as u64
    }

    /// Layer and stage of ticket `t`.
    fn at(&self, t: u64) -> (usize, usize) {
        let l = (t % self.n()) as usize;
        (l / self.per, l % self.per)
    }

    /// The first ticket at or after `from` that is stage `st` of layer `il`.
    pub(super) fn ticket(&self, from: u64, il: usize, st: usize) -> u64 {
        let (n, local) = (self.n(), (il * self.per + st) as u64);
        from + (local + n - from % n) % n
    }

    pub(super) fn streams(&self, il: usize) -> bool {
        il >= self.pinned.load(Ordering::Relaxed)
    }

    /// Bytes the readers read for ticket `t` (none when its layer is pinned).
    fn streamed(&self, t: u64) -> u64 {
        let (il, st) = self.at(t);
        if self.streams(il) {
            self.bytes[il][st]
        } else {
            0
        }
    }

    /// Hands out the next chunk to read, in compute order: ticket and byte range within its
    /// stage (counted over the stage's ranges in order). `None` when the next chunk would take
    /// the bytes read from the stage computing on past the window, or reach a whole pass
    /// ahead (the stage computing again): wait for the compute to move on.
    fn claim(&self, st: &mut ReadState) -> Option<(u64, u64, u64)> {
        let c = self.computing.load(Ordering::Acquire);
        if st.t < c {
            (st.t, st.off) = (c, 0);
        }
        let mut ahead: u64 = (c..st.t).map(|x| self.streamed(x)).sum();
        while st.t < c + self.n() {
            let b = self.streamed(st.t);
            if st.off < b {
                // No sliver under half a chunk left at a stage's end.
                let hi = if b - st.off < CHUNK * 3 / 2 { b } else { st.off + CHUNK };
                if ahead + hi > self.window {
                    return None;
                }
                let lo = std::mem::replace(&mut st.off, hi);
                return Some((st.t, lo, hi));
            }
            ahead += b;
            (st.t, st.off) = (st.t + 1, 0);
        }
        None
    }

    /// A reader: reads the chunks it claims until stopped.
    pub(super) fn run(&self, i: usize, map: &[u8]) {
        loop {
            let (t, lo, hi) = {
                let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
                loop {
                    if st.stop {
                        return;
                    }
                    if let Some(c) = self.claim(&mut st) {
                        break c;
                    }
                    st = self.wake.wait(st).unwrap_or_else(|p| p.into_inner());
                }
            };
            // Busy first, then the compute position (in `read`): a stage finished in between
            // is seen by one of the two sides (see `Streamer::after_stage`).
            self.busy[i].store(t, Ordering::SeqCst);
            self.read(map, t, lo, hi);
            self.busy[i].store(u64::MAX, Ordering::SeqCst);
        }
    }

    /// Faults in bytes `lo..hi` of ticket `t`'s stage, page by page, until done or the compute
    /// has finished the stage.
    fn read(&self, map: &[u8], t: u64, lo: u64, hi: u64) {
        let (il, st) = self.at(t);
        let mut off = 0u64;
        for &(a, b) in &self.layers[il][st] {
            let len = (b - a) as u64;
            let (s, e) = (lo.max(off), hi.min(off + len));
            if s < e {
                let (s, e) = (a + (s - off) as usize, a + (e - off) as usize);
                touch_pages(map, s, e, || self.computing.load(Ordering::SeqCst) > t);
            }
            off += len;
        }
    }

    /// What dropping stage `st` of layer `il` releases: its ranges, each end widened to the
    /// edge of the folio it falls in when the rest of that folio holds no weights still to be
    /// used this pass (only stages computed before it that stream, or the stage itself). The page
    /// cache never evicts a folio only partly inside a drop, so a folio shared by two stages goes
    /// with whichever is dropped second.
    pub(super) fn drop_ranges(
        &self,
        il: usize,
        st: usize,
    ) -> impl Iterator<Item = (usize, usize)> + '_ {
        let order = il * self.per + st;
        // Whether `[lo, hi)` holds nothing of a stage computed after this one or kept resident.
        let free = move |lo: usize, hi: usize| {
            self.layers.iter().enumerate().all(|(l, stages)| {
                stages.iter().enumerate().all(|(s, ranges)| {
                    let done = l * self.per + s < order && self.streams(l);
                    done || (l, s) == (il, st) || ranges.iter().all(|&(a, b)| b <= lo || hi <= a)
                })
            })
        };
        self.layers[il][st].iter().map(move |&(a, b)| {
            let (fa, fb) = (a / FOLIO * FOLIO, b.div_ceil(FOLIO) * FOLIO);
            (if free(fa, a) { fa } else { a }, if free(b, fb) { fb } else { b })
        })
    }

    /// The layer's whole byte span (for locking and dropping a layer at once).
    pub(super) fn layer_span(&self, il: usize) -> (usize, usize) {
        let rs = self.layers[il].iter().flatten();
        let a = rs.clone().map(|r| r.0).min().unwrap_or(0);
        (a, rs.map(|r| r.1).max().unwrap_or(a))
    }
}

/// Where the readers are: the next chunk starts `off` bytes into ticket `t`'s stage.
pub(super) struct ReadState {
    t: u64,
    off: u64,
    stop: bool,
}

/// `ranges` sorted, with those closer than [`MERGE_GAP`] merged.
fn merged(mut ranges: Vec<(usize, usize)>) -> Vec<(usize, usize)> {
    ranges.sort_unstable();
    let mut out: Vec<(usize, usize)> = Vec::with_capacity(ranges.len());
    for (a, b) in ranges {
        match out.last_mut() {
            Some(last) if a <= last.1 + MERGE_GAP => last.1 = last.1.max(b),
            _ => out.push((a, b)),
        }
    }
    out
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    pub(crate) const M: usize = 1 << 20;
    /// Stages per layer in these tests.
    pub(crate) const STAGES: usize = 4;

    /// One claim.
    const C: usize = CHUNK as usize;

    /// `n` layers of stages of 1 MiB, one claim, three and two laid out back to back (plus a
    /// 16 KiB norm between layers), the first stage in two ranges 16 KiB apart (q/k/v with
    /// biases between).
    pub(crate) fn layers(n: usize) -> Vec<LayerStages> {
        let mut off = 0;
        (0..n)
            .map(|_| {
                let mut take = |len: usize| {
                    let r = (off, off + len);
                    off += len;
                    r
                };
                let q = take(M / 2);
                take(16 << 10);
                let kv = take(M / 2);
                let o = take(C);
                let gate_up = take(3 * C);
                let down = take(2 * C);
                take(16 << 10);
                vec![vec![q, kv], vec![o], vec![gate_up], vec![down]]
            })
            .collect()
    }

    #[test]
    fn tickets_follow_compute_order_across_passes() {
        let s = Shared::new(layers(3), 1, 0);
        assert_eq!(s.n(), 12);
        assert_eq!(s.ticket(0, 0, 0), 0);
        assert_eq!(s.ticket(5, 1, 1), 5);
        assert_eq!(s.ticket(6, 1, 1), 17, "a stage already passed is next pass's");
        assert_eq!(s.at(17), (1, 1));
        // Ranges of a stage closer than the merge gap are one.
        assert_eq!(s.layers[0][0], vec![(0, M + (16 << 10))]);
        assert_eq!(s.window, 3 * C as u64, "never below the biggest stage");
    }

    /// Every chunk the readers may claim now, in order.
    fn claims(s: &Shared, st: &mut ReadState) -> Vec<(u64, u64, u64)> {
        std::iter::from_fn(|| s.claim(st)).collect()
    }

    #[test]
    fn readers_claim_chunks_in_compute_order_inside_the_window() {
        let s = Shared::new(layers(4), 2, 6 * C as u64);
        let mut st = ReadState { t: 0, off: 0, stop: false };
        let (q, c) = ((M + (16 << 10)) as u64, C as u64);
        // Compute on layer 0 (pinned): the readers start at layer 2, the first streamed, and
        // stop where the next claim would pass the window (1 MiB + 5 claims taken).
        assert_eq!(
            claims(&s, &mut st),
            vec![(8, 0, q), (9, 0, c), (10, 0, c), (10, c, 2 * c), (10, 2 * c, 3 * c), (11, 0, c)]
        );
        // The first stage done: room for one more claim; the second: for layer 3's first stage.
        s.computing.store(9, Ordering::Relaxed);
        assert_eq!(claims(&s, &mut st), vec![(11, c, 2 * c)]);
        s.computing.store(10, Ordering::Relaxed);
        assert_eq!(claims(&s, &mut st), vec![(12, 0, q)]);
        // Compute past where the readers are (on layer 3's down): they skip to it, and the
        // window wraps past the pinned layers to the next pass's layer 2.
        s.computing.store(15, Ordering::Relaxed);
        assert_eq!(
            claims(&s, &mut st),
            vec![(15, 0, c), (15, c, 2 * c), (24, 0, q), (25, 0, c), (26, 0, c), (26, c, 2 * c)]
        );
        // Never a whole pass ahead, even with room: one streamed layer.
        let s = Shared::new(layers(2), 1, u64::MAX);
        let mut st = ReadState { t: 0, off: 0, stop: false };
        s.computing.store(4, Ordering::Relaxed);
        assert_eq!(
            claims(&s, &mut st),
            vec![
                (4, 0, q),
                (5, 0, c),
                (6, 0, c),
                (6, c, 2 * c),
                (6, 2 * c, 3 * c),
                (7, 0, c),
                (7, c, 2 * c)
            ]
        );
        // No sliver under half a claim is left at a stage's end: the last claim takes it.
        let s = Shared::new(vec![vec![vec![(0, 9 * C / 4)]]], 0, u64::MAX);
        let mut st = ReadState { t: 0, off: 0, stop: false };
        assert_eq!(claims(&s, &mut st), vec![(0, 0, c), (0, c, 9 * c / 4)]);
        // Everything pinned: nothing to read.
        let s = Shared::new(layers(2), 2, u64::MAX);
        assert_eq!(claims(&s, &mut ReadState { t: 0, off: 0, stop: false }), vec![]);
    }

    #[test]
    fn a_drop_takes_folios_shared_only_with_stages_already_done() {
        let s = Shared::new(layers(3), 1, 0);
        let drop = |il: usize, st: usize| s.drop_ranges(il, st).collect::<Vec<_>>();
        // Layer 1 is the first streamed: its first stage's first folio also holds layer 0
        // (pinned), its last folio the next stage (still to come): nothing widened.
        assert_eq!(drop(1, 0), s.layers[1][0]);
        // Over a pass, every folio wholly inside the streamed layers (from the first folio
        // boundary in layer 1 to the end of the file's last folio) is wholly inside one drop,
        // so none stays cached.
        let mut drops = Vec::new();
        for il in 1..3 {
            for st in 0..STAGES {
                drops.extend(s.drop_ranges(il, st));
            }
        }
        let (lo, hi) = (s.layers[1][0][0].0.div_ceil(FOLIO), s.layers[2][3][0].1.div_ceil(FOLIO));
        for k in lo..hi {
            let (a, b) = (k * FOLIO, (k + 1) * FOLIO);
            assert!(drops.iter().any(|&(x, y)| x <= a && b <= y), "folio {k} never dropped whole");
        }
        // Pinning layer 1 too: layer 2's first stage no longer widens into it.
        s.pinned.store(2, Ordering::Relaxed);
        assert_eq!(drop(2, 0)[0].0, s.layers[2][0][0].0);
        // A file in another order (down first, as llama.cpp's quantizer sorts names): stage 0,
        // computed first, lies last. A drop never reaches a stage still to come.
        let l: LayerStages = vec![
            vec![(20 * M + 4096, 21 * M)],
            vec![(19 * M, 20 * M)],
            vec![(9 * M + 4096, 19 * M)],
            vec![(4096, 9 * M)],
        ];
        let s = Shared::new(vec![l], 0, 0);
        let drop = |st: usize| s.drop_ranges(0, st).collect::<Vec<_>>();
        assert_eq!(drop(0), vec![(20 * M, 22 * M)], "its folios hold nothing else");
        assert_eq!(drop(1), vec![(19 * M, 20 * M)], "[18, 19) MiB is stage 2's, still to come");
        assert_eq!(
            drop(2),
            vec![(9 * M + 4096, 20 * M)],
            "up into stage 1 (done), not down into 3"
        );
        assert_eq!(drop(3), vec![(0, 10 * M)], "both neighbours done");
    }
}
