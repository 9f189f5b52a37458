//! Attention over the paged KV cache, block by block with an online softmax.
//!
//! Work items are (tile of up to [`TILE_TOKENS`] batch tokens, KV head): the `group` query heads
//! of every token of the tile that share a KV head are its rows, so one 32-token key block is
//! dequantized once (into an f32 `[32][head_dim]` tile) for all of them. Each row keeps a running
//! max `m`, sum `l` and unnormalised output `o` (flash-attention style): per block, scores for
//! the 32 keys (one kernel call), a vectorized `exp`, and the block's weighted values added in
//! one pass. When a lone decode token would leave threads idle (fewer KV heads than twice the
//! threads), an item's key blocks are split across threads and the partial `(m, l, o)` merged
//! at the end (split-K). The split count is a property of the model and the thread count, not of
//! the batch: every token of a batch of at most [`SPLIT_TOKENS`] single-token items is split as a
//! lone decode token would be, so a token's output is bit-identical whether it is decoded alone,
//! beside other sequences' decode tokens, or verified together with drafted tokens
//! (speculative decoding relies on it). All scratch is the caller's per-thread buffer ([`scratch_floats`]). The per-block
//! arithmetic (scores, `exp`, weighted values) is the [`tiles`] kernels'; this file is the
//! blocking, masking and bookkeeping around them.

pub mod tiles;

use quant::threads::ThreadPool;

use crate::batch::Batch;
use crate::config::ModelConfig;
use crate::kv::{KvCache, LayerWindow, BLOCK_TOKENS as B};
use crate::par::SendPtr;
use tiles::kernels;

/// Most batch tokens (of one sequence) whose query rows share each loaded key block.
pub const TILE_TOKENS: usize = 8;

/// Rows of one item: every query head of the tile's tokens that reads one KV head.
fn max_rows(c: &ModelConfig) -> usize {
    TILE_TOKENS * (c.n_head / c.n_head_kv)
}

/// Floats of one thread's scratch: key tile, value tile, per-channel scales and mins, and per
/// row 32 scores, `m`, `l` and an output row.
fn thread_floats(c: &ModelConfig) -> usize {
    let (hd, hdv) = (c.head_dim, c.head_dim_v);
    B * hd + B * hdv + 2 * hd + max_rows(c) * (B + 2 + hdv)
}

/// Most split-K tasks per thread a lone decode token makes (see [`n_splits`]).
const SPLIT_TASKS_PER_THREAD: usize = 4;

/// Most batch tokens whose items are split: a batch this small runs one token per item, and
/// every token is split like a lone decode token. Covers a verification pass (a decode token and
/// its drafts) and a few sequences decoding together.
pub const SPLIT_TOKENS: usize = 32;

/// Floats of split-K partials: `[tasks][group][m, l, o (head_dim_v)]`, for [`SPLIT_TOKENS`]
/// tokens of `n_head_kv` items each split [`n_splits`] ways (none when a lone token is not split).
fn split_floats(c: &ModelConfig, n_threads: usize) -> usize {
    let s = n_splits(c.n_head_kv, n_threads.max(1), 1);
    if s == 1 {
        return 0;
    }
    SPLIT_TOKENS * c.n_head_kv * s * (c.n_head / c.n_head_kv) * (c.head_dim_v + 2)
}

/// Floats of attention scratch a context with `n_threads` threads needs (the memory planner
/// counts it through `forward::ScratchSizes`).
pub fn scratch_floats(c: &ModelConfig, n_threads: usize) -> usize {
    let nth = n_threads.max(1);
    nth * thread_floats(c) + split_floats(c, nth)
}

/// Splits per item: 1, unless there are fewer items than threads × 2 (single tokens only), then
/// enough that every thread gets the same number of tasks, at most
/// [`SPLIT_TASKS_PER_THREAD`] × threads tasks in all.
fn n_splits(items: usize, nth: usize, tile: usize) -> usize {
    if tile != 1 || items >= 2 * nth || nth == 1 {
        return 1;
    }
    fn gcd(a: usize, b: usize) -> usize {
        if b == 0 {
            a
        } else {
            gcd(b, a % b)
        }
    }
    (nth / gcd(items, nth)).min(SPLIT_TASKS_PER_THREAD * nth / items).max(1)
}

/// Causal attention of `n` batch tokens (from `b0`) against their sequences' cached keys and
/// values of layer `il`, over the layer's window (sinks + the last `window` positions). `q`:
/// `[n][n_head × head_dim]` (roped), `out`: `[n][n_head × head_dim_v]`; with rotated values the
/// output is rotated back. A token whose sequence holds nothing gets zeros.
#[allow(clippy::too_many_arguments)]
pub fn attention(
    pool: &ThreadPool,
    c: &ModelConfig,
    kv: &KvCache,
    il: usize,
    batch: &Batch,
    b0: usize,
    n: usize,
    q: &[f32],
    out: &mut [f32],
    tmp: &mut [f32],
) {
    let nth = pool.n_threads().max(1);
    let (nkv, hdv) = (c.n_head_kv, c.head_dim_v);
    let group = c.n_head / nkv;
    let out_w = c.n_head * hdv;
    assert!(tmp.len() >= scratch_floats(c, nth), "attention scratch too small");
    assert!(out.len() >= n * out_w && q.len() >= n * c.q_dim());
    let tile = (n / (nth * 8)).clamp(1, TILE_TOKENS);
    let items = n.div_ceil(tile) * nkv;
    // Each token split as it would be alone (the module doc says why).
    let splits = if tile == 1 && n <= SPLIT_TOKENS { n_splits(nkv, nth, 1) } else { 1 };
    let tasks = items * splits;
    let stride = thread_floats(c);
    let part_w = group * (hdv + 2);
    let (rows_tmp, parts) = tmp.split_at_mut(nth * stride);
    debug_assert!(splits == 1 || tasks * part_w <= parts.len());
    let (tmp_p, out_p, part_p) =
        (SendPtr(rows_tmp.as_mut_ptr()), SendPtr(out.as_mut_ptr()), SendPtr(parts.as_mut_ptr()));
    let job = Job { c, kv, il, lw: kv.layer_window(il), batch, b0, q, group };
    pool.run(|ith, nth_run| {
        let (tmp_p, out_p, part_p) = (&tmp_p, &out_p, &part_p);
        // SAFETY: `rows_tmp` holds `nth` rows of `stride` floats; row `ith` is used only by
        // thread `ith` (the pool runs at most `nth` threads).
        assert!(ith < nth && nth_run <= nth);
        let scratch = unsafe { std::slice::from_raw_parts_mut(tmp_p.0.add(ith * stride), stride) };
        let mut task = ith;
        while task < tasks {
            let (item, split) = (task / splits, task % splits);
            let (chunk, kvh) = (item / nkv, item % nkv);
            let (t0, t1) = (chunk * tile, (chunk * tile + tile).min(n));
            // Runs of consecutive tokens of one sequence share key blocks.
            let mut a = t0;
            while a < t1 {
                let seq = batch.seq[b0 + a];
                let mut e = a + 1;
                while e < t1 && batch.seq[b0 + e] == seq {
                    e += 1;
                }
                let rows = job.run(kvh, a..e, (split, splits), scratch);
                if splits == 1 {
                    for tt in a..e {
                        // SAFETY: token `tt`, KV head `kvh` owns out[tt × out_w + kvh × group ×
                        // hdv ..][..group × hdv]: disjoint across items, each item is run by
                        // exactly one task, and `out` stays borrowed until `run` returns.
                        let o = unsafe {
                            std::slice::from_raw_parts_mut(
                                out_p.0.add(tt * out_w + kvh * group * hdv),
                                group * hdv,
                            )
                        };
                        rows.finish(tt - a, o, kv.rot_v());
                    }
                } else {
                    // SAFETY: task `task` owns partial slot `task` (`tasks × part_w` floats fit,
                    // see `split_floats`), written by this task alone.
                    let p = unsafe {
                        std::slice::from_raw_parts_mut(part_p.0.add(task * part_w), part_w)
                    };
                    rows.save(p);
                }
                a = e;
            }
            task += nth_run;
        }
    });
    if splits > 1 {
        for item in 0..items {
            let (t, kvh) = (item / nkv, item % nkv);
            let o = &mut out[t * out_w + kvh * group * hdv..][..group * hdv];
            merge(&parts[item * splits * part_w..(item + 1) * splits * part_w], hdv, o, kv.rot_v());
        }
    }
}

struct Job<'a> {
    c: &'a ModelConfig,
    kv: &'a KvCache,
    il: usize,
    lw: LayerWindow,
    batch: &'a Batch,
    b0: usize,
    q: &'a [f32],
    group: usize,
}

/// Which positions of a block a query row sees.
#[derive(Clone, Copy, PartialEq)]
enum Cover {
    None,
    All,
    Some,
}

/// The keys one query at `pos` sees: `[0, sink_end) ∪ [lo, pos]`.
#[derive(Clone, Copy)]
struct Span {
    sink_end: usize,
    lo: usize,
    pos: usize,
}

impl Span {
    fn new(lw: &LayerWindow, pos: usize) -> Span {
        let (sinks, recent) = lw.ranges(pos);
        Span { sink_end: sinks.end, lo: *recent.start(), pos }
    }

    #[inline]
    fn sees(&self, p: usize) -> bool {
        p < self.sink_end || (self.lo <= p && p <= self.pos)
    }

    /// How much of block `b` this query sees.
    fn cover(&self, b: usize) -> Cover {
        let (s, e) = (b * B, b * B + B - 1);
        if e < self.sink_end || (s >= self.lo && e <= self.pos) {
            Cover::All
        } else if s >= self.sink_end && (e < self.lo || s > self.pos) {
            Cover::None
        } else {
            Cover::Some
        }
    }
}

/// One thread's scratch, carved up.
struct Rows<'s> {
    ktile: &'s mut [f32],
    vtile: &'s mut [f32],
    chan: &'s mut [f32],
    /// [rows][32]
    s: &'s mut [f32],
    m: &'s mut [f32],
    l: &'s mut [f32],
    /// [rows][hdv]
    o: &'s mut [f32],
    group: usize,
    hdv: usize,
}

impl<'s> Rows<'s> {
    fn new(c: &ModelConfig, scratch: &'s mut [f32], n_rows: usize) -> Rows<'s> {
        let (hd, hdv) = (c.head_dim, c.head_dim_v);
        let (ktile, r) = scratch.split_at_mut(B * hd);
        let (vtile, r) = r.split_at_mut(B * hdv);
        let (chan, r) = r.split_at_mut(2 * hd);
        let (s, r) = r.split_at_mut(n_rows * B);
        let (m, r) = r.split_at_mut(n_rows);
        let (l, r) = r.split_at_mut(n_rows);
        let o = &mut r[..n_rows * hdv];
        m.fill(f32::NEG_INFINITY);
        l.fill(0.0);
        o.fill(0.0);
        Rows { ktile, vtile, chan, s, m, l, o, group: c.n_head / c.n_head_kv, hdv }
    }

    /// Token `tt`'s rows, normalised, into `out` (`[group][hdv]`), rotated back in blocks of
    /// `rot_v` when values are stored rotated.
    fn finish(&self, tt: usize, out: &mut [f32], rot_v: Option<usize>) {
        let hdv = self.hdv;
        for g in 0..self.group {
            let r = tt * self.group + g;
            let inv = if self.l[r] > 0.0 { 1.0 / self.l[r] } else { 0.0 };
            let dst = &mut out[g * hdv..(g + 1) * hdv];
            for (d, &v) in dst.iter_mut().zip(&self.o[r * hdv..(r + 1) * hdv]) {
                *d = v * inv;
            }
            if let Some(block) = rot_v {
                crate::kv::rotate::rotate(dst, block);
            }
        }
    }

    /// The first token's rows as a split-K partial: `[group][m, l, o]`.
    fn save(&self, dst: &mut [f32]) {
        let hdv = self.hdv;
        for (g, p) in dst.chunks_exact_mut(hdv + 2).enumerate().take(self.group) {
            p[0] = self.m[g];
            p[1] = self.l[g];
            p[2..].copy_from_slice(&self.o[g * hdv..(g + 1) * hdv]);
        }
    }
}

/// Merges `[splits][group][m, l, o]` partials of one item into `out` (`[group][hdv]`).
fn merge(parts: &[f32], hdv: usize, out: &mut [f32], rot_v: Option<usize>) {
    let w = hdv + 2;
    let group = out.len() / hdv;
    let splits = parts.len() / (group * w);
    for g in 0..group {
        let part = |k: usize| &parts[(k * group + g) * w..(k * group + g + 1) * w];
        let m = (0..splits).map(|k| part(k)[0]).fold(f32::NEG_INFINITY, f32::max);
        let dst = &mut out[g * hdv..(g + 1) * hdv];
        dst.fill(0.0);
        if m == f32::NEG_INFINITY {
            continue;
        }
        let l: f32 = (0..splits).map(|k| part(k)[1] * (part(k)[0] - m).exp()).sum();
        for k in 0..splits {
            let p = part(k);
            if p[0] == f32::NEG_INFINITY {
                continue;
            }
            let a = (p[0] - m).exp() / l;
            for (d, &v) in dst.iter_mut().zip(&p[2..]) {
                *d = a.mul_add(v, *d);
            }
        }
        if let Some(block) = rot_v {
            crate::kv::rotate::rotate(dst, block);
        }
    }
}

impl Job<'_> {
    /// Online softmax of the rows of batch tokens `toks` (one sequence) against KV head `kvh`,
    /// over split `k` of `n_split` of the blocks they see. Leaves `m`, `l`, `o` in the result.
    fn run<'s>(
        &self,
        kvh: usize,
        toks: std::ops::Range<usize>,
        (k, n_split): (usize, usize),
        scratch: &'s mut [f32],
    ) -> Rows<'s> {
        let c = self.c;
        let (hd, hdv, group) = (c.head_dim, c.head_dim_v, self.group);
        let nt = toks.len();
        let rows = Rows::new(c, scratch, nt * group);
        let Some(view) = self.kv.layer(self.batch.seq[self.b0 + toks.start], self.il) else {
            return rows;
        };
        let mut spans = [Span { sink_end: 0, lo: 0, pos: 0 }; TILE_TOKENS];
        for (sp, t) in spans.iter_mut().zip(toks.clone()) {
            *sp = Span::new(&self.lw, self.batch.pos[self.b0 + t]);
        }
        let spans = &spans[..nt];
        // Blocks any row sees: [0, a_end) (sinks) and [b_start, b_end) (recent).
        let a_end = spans.iter().map(|s| s.sink_end.div_ceil(B)).max().unwrap_or(0);
        let b_end = spans.iter().map(|s| s.pos / B + 1).max().unwrap_or(0);
        let b_start = spans.iter().map(|s| s.lo / B).min().unwrap_or(0).max(a_end).min(b_end);
        let n_live = a_end + (b_end - b_start);
        let kern = kernels();
        let softcap = crate::ops::softcap_kernel();
        let q_w = c.q_dim();
        for idx in k * n_live / n_split..(k + 1) * n_live / n_split {
            let b = if idx < a_end { idx } else { b_start + idx - a_end };
            let mut covers = [Cover::None; TILE_TOKENS];
            for (cv, sp) in covers.iter_mut().zip(spans) {
                *cv = sp.cover(b);
            }
            if covers[..nt].iter().all(|&cv| cv == Cover::None) {
                continue;
            }
            if !view.key_tile(kvh, b, rows.ktile, rows.chan)
                || !view.value_tile(kvh, b, rows.vtile, hdv)
            {
                continue;
            }
            for (tt, t) in toks.clone().enumerate() {
                if covers[tt] == Cover::None {
                    continue;
                }
                for g in 0..group {
                    let r = tt * group + g;
                    let qr = &self.q[t * q_w + (kvh * group + g) * hd..][..hd];
                    let s: &mut [f32; B] =
                        (&mut rows.s[r * B..(r + 1) * B]).try_into().expect("32 scores");
                    let mut mx = (kern.scores)(qr, rows.ktile, c.attn_scale, s);
                    if c.attn_softcap.is_some() || covers[tt] == Cover::Some {
                        if let Some(cap) = c.attn_softcap {
                            softcap(s, cap);
                        }
                        mx = f32::NEG_INFINITY;
                        for (j, sc) in s.iter_mut().enumerate() {
                            if covers[tt] == Cover::Some && !spans[tt].sees(b * B + j) {
                                *sc = f32::NEG_INFINITY;
                            }
                            mx = mx.max(*sc);
                        }
                    }
                    if mx == f32::NEG_INFINITY {
                        continue;
                    }
                    let m_new = rows.m[r].max(mx);
                    let alpha = if rows.m[r] == f32::NEG_INFINITY {
                        0.0
                    } else {
                        (rows.m[r] - m_new).exp()
                    };
                    let sum = (kern.exp_sum)(s, m_new);
                    rows.l[r] = rows.l[r] * alpha + sum;
                    rows.m[r] = m_new;
                    (kern.pv)(&mut rows.o[r * hdv..(r + 1) * hdv], alpha, s, rows.vtile);
                }
            }
        }
        rows
    }
}

/// `base` cut to one layer of `n_head` query heads over `n_head_kv` KV heads of `hd` channels
/// (scale 1/√hd), with its own `window` and score `softcap`: for tests and benchmarks.
pub fn one_layer_config(
    base: &ModelConfig,
    n_head: usize,
    n_head_kv: usize,
    hd: usize,
    window: Option<usize>,
    softcap: Option<f32>,
) -> ModelConfig {
    let mut c = base.clone();
    c.n_layer = 1;
    c.n_head = n_head;
    c.n_head_kv = n_head_kv;
    c.head_dim = hd;
    c.head_dim_v = hd;
    c.attn_scale = 1.0 / (hd as f32).sqrt();
    c.attn_softcap = softcap;
    c.layers = vec![crate::config::LayerAttn {
        window,
        rope_base: 10000.0,
        rope_freq_scale: 1.0,
        rope: true,
    }];
    c
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::kv::KvType;
    use crate::params::ContextParams;
    use crate::test_util::rng;
    use crate::Model;

    /// A one-layer config of `n_head`/`n_head_kv` heads of `hd`, with the layer's own window.
    fn config(
        n_head: usize,
        n_head_kv: usize,
        hd: usize,
        window: Option<usize>,
        softcap: Option<f32>,
    ) -> ModelConfig {
        let p = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../testdata/refdata/tiny/tiny-qwen2.gguf");
        let m = Arc::new(Model::load(&p).expect("tiny model"));
        one_layer_config(&m.config, n_head, n_head_kv, hd, window, softcap)
    }

    /// Reference: every visible held key scored in f64, softmax, values (rotated back).
    fn naive(c: &ModelConfig, kv: &KvCache, seq: usize, pos: usize, q: &[f32]) -> Vec<f32> {
        let (hd, group) = (c.head_dim, c.n_head / c.n_head_kv);
        let mut out = vec![0.0f32; c.n_head * hd];
        let Some(view) = kv.layer(seq, 0) else { return out };
        let (sinks, recent) = kv.layer_window(0).ranges(pos);
        for h in 0..c.n_head {
            let kvh = h / group;
            let qh = &q[h * hd..(h + 1) * hd];
            let mut sc = Vec::new();
            for p in sinks.clone().chain(recent.clone()) {
                let Some(k) = view.key(p, kvh) else { continue };
                let mut s = qh.iter().zip(&k).map(|(a, b)| *a as f64 * *b as f64).sum::<f64>()
                    * c.attn_scale as f64;
                if let Some(cap) = c.attn_softcap {
                    s = cap as f64 * (s / cap as f64).tanh();
                }
                sc.push((p, s));
            }
            if sc.is_empty() {
                continue;
            }
            let m = sc.iter().map(|x| x.1).fold(f64::NEG_INFINITY, f64::max);
            let l: f64 = sc.iter().map(|x| (x.1 - m).exp()).sum();
            let mut o = vec![0.0f64; hd];
            let mut v = vec![0.0f32; hd];
            for &(p, s) in &sc {
                crate::kv::kernels().dequant(kv.v_type, view.value(p, kvh).unwrap(), &mut v);
                let w = (s - m).exp() / l;
                o.iter_mut().zip(&v).for_each(|(a, b)| *a += w * *b as f64);
            }
            let dst = &mut out[h * hd..(h + 1) * hd];
            dst.iter_mut().zip(&o).for_each(|(d, s)| *d = *s as f32);
            if let Some(block) = kv.rot_v() {
                crate::kv::rotate::rotate(dst, block);
            }
        }
        out
    }

    struct Case {
        n_head: usize,
        n_head_kv: usize,
        hd: usize,
        /// Layer's own window; user window + sinks.
        window: Option<usize>,
        user: Option<(usize, usize)>,
        softcap: Option<f32>,
        /// Positions written to sequences 0 and 1.
        lens: [usize; 2],
        /// Batch: (seq, pos) queries.
        queries: Vec<(usize, usize)>,
        /// Free blocks a query at this position no longer sees (sequence 0).
        evict_at: Option<usize>,
    }

    fn check(case: &Case, threads: &[usize]) {
        let c = config(case.n_head, case.n_head_kv, case.hd, case.window, case.softcap);
        let n_ctx = 1024;
        for (kt, vt) in [
            (KvType::F16, KvType::F16),
            (KvType::Q8, KvType::Q8),
            (KvType::Q4, KvType::Q4),
            (KvType::Q8, KvType::F16),
        ] {
            let params = ContextParams {
                n_ctx,
                n_ubatch: 64,
                n_seq_max: 2,
                kv_k: kt,
                kv_v: vt,
                kv_window: case.user.map(|u| u.0),
                kv_sinks: case.user.map_or(0, |u| u.1),
                ..ContextParams::default()
            };
            let mut kv = KvCache::new(&c, &params);
            let mut r = rng(case.hd as u64 * 31 + case.lens[0] as u64);
            let kvd = c.kv_dim();
            for (seq, &len) in case.lens.iter().enumerate() {
                for p in 0..len {
                    let k: Vec<f32> =
                        (0..kvd).map(|i| r() * 2.0 + if i % 16 == 3 { 6.0 } else { 0.0 }).collect();
                    let v: Vec<f32> = (0..kvd).map(|_| r()).collect();
                    kv.write(seq, 0, p, &k, &v).unwrap();
                }
            }
            if let Some(p) = case.evict_at {
                kv.evict(0, 0, p);
            }
            let mut batch = Batch::default();
            for &(seq, pos) in &case.queries {
                batch.push(0, pos, seq, false);
            }
            let n = batch.len();
            let q: Vec<f32> = (0..n * c.q_dim()).map(|_| r() * 3.0).collect();
            let want: Vec<f32> = (0..n)
                .flat_map(|t| {
                    naive(
                        &c,
                        &kv,
                        batch.seq[t],
                        batch.pos[t],
                        &q[t * c.q_dim()..(t + 1) * c.q_dim()],
                    )
                })
                .collect();
            for &nth in threads {
                let pool = ThreadPool::new(nth);
                let mut tmp = vec![0.0; scratch_floats(&c, nth)];
                let mut out = vec![f32::NAN; n * c.q_dim()];
                attention(&pool, &c, &kv, 0, &batch, 0, n, &q, &mut out, &mut tmp);
                for (i, (a, b)) in out.iter().zip(&want).enumerate() {
                    assert!(
                        (a - b).abs() < 2e-5,
                        "{kt}/{vt} threads {nth}: out[{i}] {a} vs {b} (token {})",
                        i / c.q_dim()
                    );
                }
                // A small batch gives each token exactly what it gets alone.
                if n <= SPLIT_TOKENS && n < 16 * nth {
                    for t in 0..n {
                        let mut one = Batch::default();
                        one.push(0, batch.pos[t], batch.seq[t], false);
                        let w = c.q_dim();
                        let mut alone = vec![f32::NAN; w];
                        let qt = &q[t * w..(t + 1) * w];
                        attention(&pool, &c, &kv, 0, &one, 0, 1, qt, &mut alone, &mut tmp);
                        let got = &out[t * w..(t + 1) * w];
                        assert!(
                            got.iter().zip(&alone).all(|(a, b)| a.to_bits() == b.to_bits()),
                            "{kt}/{vt} threads {nth}: token {t} differs from its lone decode"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn decode_matches_a_naive_softmax_for_every_precision_and_split() {
        // One token, one or two KV heads: split-K over 1..3 threads; odd key counts.
        for (lens, nkv) in [([1, 0], 1), ([33, 0], 1), ([100, 0], 2), ([517, 7], 1), ([300, 40], 2)]
        {
            let case = Case {
                n_head: 6,
                n_head_kv: nkv,
                hd: 64,
                window: None,
                user: None,
                softcap: None,
                lens,
                queries: vec![(0, lens[0] - 1)],
                evict_at: None,
            };
            check(&case, &[1, 2, 3]);
        }
    }

    #[test]
    fn a_verification_batch_gives_each_token_its_lone_decode() {
        // A decode token and its drafts (consecutive positions of one sequence) beside another
        // sequence's decode token; one KV head splits at 2 and 3 threads, two at 3.
        for nkv in [1, 2] {
            let mut queries: Vec<(usize, usize)> = (90..100).map(|p| (0, p)).collect();
            queries.push((1, 39));
            let case = Case {
                n_head: 6,
                n_head_kv: nkv,
                hd: 64,
                window: None,
                user: None,
                softcap: None,
                lens: [100, 40],
                queries,
                evict_at: None,
            };
            check(&case, &[1, 2, 3]);
        }
    }

    #[test]
    fn prefill_tiles_match_a_naive_softmax_with_mixed_sequences() {
        // 40 tokens of sequence 0 then 9 of sequence 1, causal inside the batch; head sizes that
        // are not multiples of 8 take the generic kernels.
        for hd in [64, 20, 128] {
            let mut queries: Vec<(usize, usize)> = (60..100).map(|p| (0, p)).collect();
            queries.extend((0..9).map(|p| (1, p)));
            let case = Case {
                n_head: 4,
                n_head_kv: 2,
                hd,
                window: None,
                user: None,
                softcap: Some(50.0),
                lens: [100, 9],
                queries,
                evict_at: None,
            };
            check(&case, &[1, 2]);
        }
    }

    #[test]
    fn windows_with_sinks_and_freed_blocks_match_a_naive_softmax() {
        // Gemma3-style own window (no sinks), decode and a prefill tile.
        let mut queries: Vec<(usize, usize)> = (240..280).map(|p| (0, p)).collect();
        queries.push((1, 49));
        let case = Case {
            n_head: 4,
            n_head_kv: 1,
            hd: 64,
            window: Some(70),
            user: None,
            softcap: None,
            lens: [280, 50],
            queries,
            evict_at: None,
        };
        check(&case, &[1, 2]);
        // User window + sinks, with the blocks behind the window freed.
        for (win, sinks) in [(100, 4), (64, 40), (45, 33)] {
            let case = Case {
                n_head: 4,
                n_head_kv: 2,
                hd: 32,
                window: None,
                user: Some((win, sinks)),
                softcap: None,
                lens: [400, 0],
                queries: vec![(0, 399)],
                evict_at: Some(398),
            };
            check(&case, &[1, 2, 3]);
            let case =
                Case { queries: (380..400).map(|p| (0, p)).collect(), evict_at: None, ..case };
            check(&case, &[2]);
        }
    }

    #[test]
    fn a_sequence_with_nothing_cached_attends_to_zeros() {
        let case = Case {
            n_head: 2,
            n_head_kv: 1,
            hd: 16,
            window: None,
            user: None,
            softcap: None,
            lens: [5, 0],
            queries: vec![(1, 0), (0, 4)],
            evict_at: None,
        };
        check(&case, &[1, 2]);
    }

    #[test]
    fn split_counts_balance_threads_and_stay_within_the_partial_buffer() {
        assert_eq!(n_splits(2, 2, 1), 1);
        assert_eq!(n_splits(1, 2, 1), 2);
        assert_eq!(n_splits(3, 2, 1), 2);
        assert_eq!(n_splits(1, 1, 1), 1);
        assert_eq!(n_splits(1, 2, 4), 1);
        for nth in 1..=16 {
            for items in 1..=4 * nth {
                let s = n_splits(items, nth, 1);
                assert!(
                    s >= 1 && (s == 1 || items * s <= SPLIT_TASKS_PER_THREAD * nth),
                    "items {items} threads {nth}: {s}"
                );
            }
        }
        // A full split batch fits the partials: SPLIT_TOKENS tokens × n_head_kv items × splits.
        for nkv in 1..=8 {
            let c = config(nkv * 4, nkv, 64, None, None);
            for nth in 1..=16 {
                let s = n_splits(nkv, nth, 1);
                let part_w = 4 * (64 + 2);
                assert!(s == 1 || SPLIT_TOKENS * nkv * s * part_w <= split_floats(&c, nth));
            }
        }
    }
}
