//! The matmul the forward pass calls: `y = W · x` for `m` activation rows, over one weight matrix
//! or several that share the activation row (q/k/v, gate/up). Activations are quantized once into
//! caller-owned scratch; rows are cut into chunks that the pool's threads claim from one atomic
//! cursor (a late or descheduled thread just claims fewer). Decode claims are guided: each takes
//! 1/(2·threads) of the weight bytes still unclaimed (at most half a matrix), so the first claims
//! are long runs of one matrix and the last ones small enough that both threads finish
//! together; prefill chunks are 16 rows, each swept over all tokens in tiles of [`TILE`], so the
//! chunk's weights stay in L1/L2 while activations stream from L2.
//!
//! Prefill panels ([`matmul_multi_panels`]): the caller names the token rows that may run on
//! them (the forward pass: the whole micro-batch), and each 16-row chunk is unpacked once and run
//! against every run of at least [`panel_min_tokens`] rows, the other rows going through the row
//! kernels. On AVX-512 the panels give every (row, token) the row kernels' exact bits
//! (`avx512/panel.rs`), so a token's result does not depend on its kernel, its batch or its
//! chunk: the panels are on by default (`SNUG_PANELS=0` turns them off, `SNUG_KERNELS=avx2`
//! leaves the AVX-512 path). On the AMX path the Q4_K and Q6_K panels run on tiles
//! (`avx512/tile_panel.rs`), with the same bits. Their cost is the unpack, once per 16 rows
//! and call, which smaller batches do not earn back ([`PANEL_MIN_TOKENS`]).

use std::cell::RefCell;
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

use super::{
    act_row_bytes, check_isa, check_len, dot_kernels, f32_bytes, isa, panel_kernels, quantizer,
    row_bytes, vec_dot_type, DotKernels, DotRowsFn, Isa, KernelError, MatRef, PanelKernels,
    PANEL_MIN_TOKENS, PANEL_ROWS, TILE,
};
use crate::threads::ThreadPool;

/// Most matrices one [`matmul_multi`] call takes.
pub const MAX_MULTI: usize = 4;

/// `y[t*rows + r] = Σ_k W[r,k] · x[t*cols + k]` for `t in 0..m`, on this process's kernel path.
/// `x` is `[m][cols]` f32, `y` is `[m][rows]` f32; both must be exactly that long. Activations are
/// quantized once into `scratch` (grown only when too small) and rows are split across `pool`.
pub fn matmul(
    pool: &ThreadPool,
    w: MatRef,
    x: &[f32],
    m: usize,
    y: &mut [f32],
    scratch: &mut Vec<u8>,
) -> Result<(), KernelError> {
    matmul_with(isa(), pool, w, x, m, y, scratch)
}

/// [`matmul`] on an explicit kernel path (for tests and benchmarks).
pub fn matmul_with(
    isa: Isa,
    pool: &ThreadPool,
    w: MatRef,
    x: &[f32],
    m: usize,
    y: &mut [f32],
    scratch: &mut Vec<u8>,
) -> Result<(), KernelError> {
    matmul_multi_with(isa, pool, &[w], x, m, &mut [y], scratch)
}

/// [`matmul`] for up to [`MAX_MULTI`] matrices applied to the same `x` (e.g. q/k/v or gate/up):
/// `ys[i] = ws[i] · x`. All matrices need the same `cols` and the same activation format
/// ([`vec_dot_type`]; Q4_K and Q6_K mix fine). One quantization of `x`, one hand-off to the pool.
pub fn matmul_multi(
    pool: &ThreadPool,
    ws: &[MatRef],
    x: &[f32],
    m: usize,
    ys: &mut [&mut [f32]],
    scratch: &mut Vec<u8>,
) -> Result<(), KernelError> {
    matmul_multi_with(isa(), pool, ws, x, m, ys, scratch)
}

/// A pointer the worker threads share; each writes only the part it claimed.
#[derive(Clone, Copy)]
struct SharedMut<T>(*mut T);
// SAFETY: used only to hand disjoint parts of one buffer to the pool's threads (see each use).
unsafe impl<T> Sync for SharedMut<T> {}
// SAFETY: as above.
unsafe impl<T> Send for SharedMut<T> {}

/// One matrix of a multi-matmul, validated, with its place in the job's row numbering.
#[derive(Clone, Copy)]
struct Part<'a> {
    k: DotKernels,
    /// Set when a run of panel rows is long enough and the path has panels for this type.
    panel: Option<PanelKernels>,
    data: &'a [u8],
    rows: usize,
    w_row: usize,
    out: SharedMut<f32>,
    /// Most and fewest rows one claim takes (equal for prefill).
    chunk_rows: usize,
    min_rows: usize,
    /// Index of this part's first row among all the job's rows, and weight bytes before it.
    row0: usize,
    byte0: usize,
}

/// Decode claims shrink toward the end of a job, but never below this many weight bytes: each
/// claim restarts the kernels' prefetch stream (4 KiB ahead) and costs an atomic round trip.
/// (Claims of at most 256 rows, ~8 a thread, decoded 4–11% slower on Zen 4 than long guided
/// ones: BENCHMARKS.md.)
const MIN_CLAIM_BYTES: usize = 32 << 10;

/// [`matmul_multi`] on an explicit kernel path.
pub fn matmul_multi_with(
    isa: Isa,
    pool: &ThreadPool,
    ws: &[MatRef],
    x: &[f32],
    m: usize,
    ys: &mut [&mut [f32]],
    scratch: &mut Vec<u8>,
) -> Result<(), KernelError> {
    matmul_multi_on(isa, pool, ws, x, m, ys, scratch, &[], usize::MAX)
}

/// [`matmul_multi`] where the activation rows in `panels` (sorted, disjoint, inside `0..m`) may
/// run on the prefill panels, if the path has them for the weight type, the run is at least
/// [`panel_min_tokens`] rows and the panels are on ([`panels_enabled`]). The panels give the
/// row kernels' bits, so this is [`matmul_multi`] made faster, with the same results.
#[allow(clippy::too_many_arguments)]
pub fn matmul_multi_panels(
    pool: &ThreadPool,
    ws: &[MatRef],
    x: &[f32],
    m: usize,
    ys: &mut [&mut [f32]],
    scratch: &mut Vec<u8>,
    panels: &[Range<usize>],
) -> Result<(), KernelError> {
    let panels = if panels_enabled() { panels } else { &[] };
    matmul_multi_on(isa(), pool, ws, x, m, ys, scratch, panels, panel_min_tokens())
}

/// [`matmul_with`] with every activation row on the prefill panels where the path has them,
/// whatever `SNUG_PANELS` says and however small `m` is (tests and benchmarks).
pub fn matmul_panels_with(
    isa: Isa,
    pool: &ThreadPool,
    w: MatRef,
    x: &[f32],
    m: usize,
    y: &mut [f32],
    scratch: &mut Vec<u8>,
) -> Result<(), KernelError> {
    let all = 0..m;
    matmul_multi_on(isa, pool, &[w], x, m, &mut [y], scratch, std::slice::from_ref(&all), 1)
}

/// Whether [`matmul_multi_panels`] takes the prefill panels: yes unless `SNUG_PANELS=0` (they
/// change the speed only, never a bit of the results).
pub fn panels_enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("SNUG_PANELS").map_or(true, |v| v.trim() != "0"))
}

/// Fewest tokens in a run for [`matmul_multi_panels`] to take the panels: [`PANEL_MIN_TOKENS`],
/// or `SNUG_PANEL_MIN_TOKENS` (for measuring where the panels start to pay on a machine).
pub fn panel_min_tokens() -> usize {
    static MIN: OnceLock<usize> = OnceLock::new();
    *MIN.get_or_init(|| {
        std::env::var("SNUG_PANEL_MIN_TOKENS")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(PANEL_MIN_TOKENS)
            .max(1)
    })
}

/// Whether [`matmul_multi_panels`] runs matrices of type `ty` on the prefill panels on this
/// process's path.
pub fn has_panels(ty: crate::GgmlType) -> bool {
    panels_enabled() && panel_kernels(isa(), ty).is_some()
}

#[allow(clippy::too_many_arguments)]
fn matmul_multi_on(
    isa: Isa,
    pool: &ThreadPool,
    ws: &[MatRef],
    x: &[f32],
    m: usize,
    ys: &mut [&mut [f32]],
    scratch: &mut Vec<u8>,
    panels: &[Range<usize>],
    min_tokens: usize,
) -> Result<(), KernelError> {
    check_isa(isa)?;
    if ws.is_empty() || ws.len() > MAX_MULTI {
        return Err(KernelError::Len {
            what: "matrices (1 to MAX_MULTI)",
            expected: MAX_MULTI,
            got: ws.len(),
        });
    }
    check_len("ys (one output per matrix)", ws.len(), ys.len())?;
    let (cols, first) = (ws[0].cols, ws[0].ty);
    let vdt = vec_dot_type(first);
    let x_row = act_row_bytes(vdt, cols)?;
    check_len("x", m.saturating_mul(cols), x.len())?;
    let mut end = 0;
    for r in panels {
        if r.start < end || r.end < r.start || r.end > m {
            return Err(KernelError::Len {
                what: "panel rows (sorted, disjoint, inside the batch)",
                expected: m,
                got: r.end,
            });
        }
        end = r.end;
    }
    let panels_pay = panels.iter().any(|r| r.len() >= min_tokens.max(1));
    let nth = pool.n_threads();

    let mut parts: [Option<Part>; MAX_MULTI] = [None; MAX_MULTI];
    let (mut n_rows, mut n_bytes) = (0, 0);
    for (i, (w, y)) in ws.iter().zip(ys.iter_mut()).enumerate() {
        let MatRef { ty, data, rows, cols: c } = *w;
        if vec_dot_type(ty) != vdt {
            return Err(KernelError::Mixed { first, other: ty });
        }
        check_len("cols of every matrix", cols, c)?;
        let k = dot_kernels(isa, ty).ok_or(KernelError::Unsupported(ty))?;
        let w_row = row_bytes(ty, cols)?;
        check_len("weight data (bytes)", rows.saturating_mul(w_row), data.len())?;
        check_len("y", m.saturating_mul(rows), y.len())?;
        let panel = if panels_pay { panel_kernels(isa, ty) } else { None };
        let (chunk_rows, min_rows) = if m < TILE && panel.is_none() {
            let most = (rows / nth).max(8);
            (most, MIN_CLAIM_BYTES.div_ceil(w_row).min(most))
        } else {
            (PANEL_ROWS, PANEL_ROWS)
        };
        let out = SharedMut(y.as_mut_ptr());
        parts[i] = Some(Part {
            k,
            panel,
            data,
            rows,
            w_row,
            out,
            chunk_rows,
            min_rows,
            row0: n_rows,
            byte0: n_bytes,
        });
        n_rows += rows;
        n_bytes += rows * w_row;
    }
    if m == 0 || n_rows == 0 {
        return Ok(());
    }
    let acts = quantize_acts(isa, pool, x, m, cols, x_row, vdt, scratch);

    // Threads claim rows from one cursor over all parts' rows. A claim takes `chunk_rows`, or
    // near the end of the job 1/(2·nth) of the weight bytes still unclaimed (at least
    // `min_rows`), so the threads finish within a small claim of each other.
    let cursor = AtomicUsize::new(0);
    let work = |_ith: usize, nth: usize| {
        let mut cur = cursor.load(Ordering::Relaxed);
        while cur < n_rows {
            let Some(p) = parts.iter().flatten().rev().find(|p| p.row0 <= cur) else {
                break;
            };
            let r0 = cur - p.row0;
            let left = n_bytes - (p.byte0 + r0 * p.w_row);
            let take =
                (left / (2 * nth) / p.w_row).clamp(p.min_rows, p.chunk_rows).min(p.rows - r0);
            match cursor.compare_exchange_weak(
                cur,
                cur + take,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    run_chunk(p, r0, r0 + take, acts, x_row, m, cols, panels, min_tokens);
                    cur = cursor.load(Ordering::Relaxed);
                }
                Err(now) => cur = now,
            }
        }
    };
    if n_rows <= parts[0].map_or(0, |p| p.chunk_rows) || nth == 1 {
        work(0, 1);
    } else {
        pool.run(work);
    }
    Ok(())
}

/// `x` in the activation format `vdt` (borrowed as-is for f32), quantized into `scratch`, by
/// all threads when there is enough of it.
#[allow(clippy::too_many_arguments)]
fn quantize_acts<'a>(
    isa: Isa,
    pool: &ThreadPool,
    x: &'a [f32],
    m: usize,
    cols: usize,
    x_row: usize,
    vdt: crate::GgmlType,
    scratch: &'a mut Vec<u8>,
) -> &'a [u8] {
    let Some(q) = quantizer(isa, vdt) else {
        return f32_bytes(x);
    };
    let need = m * x_row;
    if scratch.len() < need {
        scratch.resize(need, 0);
    }
    let dst = &mut scratch[..need];
    let nth = pool.n_threads();
    if m < 2 * nth || cols * m < 1 << 15 {
        for (xr, dr) in x.chunks_exact(cols).zip(dst.chunks_exact_mut(x_row)) {
            // SAFETY: ISA checked by the caller; xr is `cols` values (whole blocks), dr one row.
            unsafe { q(xr, dr) };
        }
    } else {
        let base = SharedMut(dst.as_mut_ptr());
        pool.run(|ith, nth| {
            // Capture the whole wrapper (a closure would otherwise capture the bare pointer).
            #[allow(clippy::redundant_locals)]
            let base = base;
            for t in (ith..m).step_by(nth) {
                // SAFETY: thread `ith` writes only rows t ≡ ith (mod nth) of `dst`, which
                // outlives the run; rows are disjoint and in bounds (t < m).
                let dr = unsafe { std::slice::from_raw_parts_mut(base.0.add(t * x_row), x_row) };
                // SAFETY: as above; ISA checked, whole blocks.
                unsafe { q(&x[t * cols..(t + 1) * cols], dr) };
            }
        });
    }
    &scratch[..need]
}

/// Rows `r0..r1` of part `p` against all `m` activation rows: where the part has panel kernels
/// and the chunk is a whole panel, its rows are unpacked once and run against each run of
/// `panels` of at least [`PANEL_MIN_TOKENS`] rows; every other activation row goes through the
/// row kernels ([`rows`]).
#[allow(clippy::too_many_arguments)]
fn run_chunk(
    p: &Part,
    r0: usize,
    r1: usize,
    acts: &[u8],
    x_row: usize,
    m: usize,
    cols: usize,
    panels: &[Range<usize>],
    min_tokens: usize,
) {
    let Some(pk) = p.panel.filter(|_| r1 - r0 == PANEL_ROWS) else {
        rows(p, r0, r1, acts, x_row, 0..m, cols);
        return;
    };
    let w = &p.data[r0 * p.w_row..r1 * p.w_row];
    with_panel((pk.bytes)(cols), |panel| {
        // SAFETY: ISA checked by matmul (the part has panel kernels only on their path); `w` is
        // PANEL_ROWS whole rows of `cols` values (whole 256-value blocks, checked by row_bytes)
        // and `panel` is the size the kernels asked for.
        unsafe { (pk.unpack)(cols, w, p.w_row, panel) };
        let mut t = 0;
        for r in panels.iter().filter(|r| !r.is_empty() && r.len() >= min_tokens) {
            rows(p, r0, r1, acts, x_row, t..r.start, cols);
            // SAFETY: as above; `acts` holds rows r.start..r.end (r.end <= m, checked by
            // matmul) at `x_row`, and outputs t * rows + r0.. (16 of them) for those rows lie in
            // this chunk's part of y.
            unsafe {
                let x = &acts[r.start * x_row..r.end * x_row];
                let out = p.out.0.add(r.start * p.rows + r0);
                (pk.run)(cols, panel, x, x_row, r.len(), out, p.rows);
            }
            t = r.end;
        }
        rows(p, r0, r1, acts, x_row, t..m, cols);
    });
}

/// Rows `r0..r1` of part `p` against activation rows `ts` on the row kernels: [`TILE`] tokens
/// at a time, then the rest in groups of 4, 2 and 1, so each weight row is read once per group.
/// Each output is the same whichever group computes it.
fn rows(p: &Part, r0: usize, r1: usize, acts: &[u8], x_row: usize, ts: Range<usize>, cols: usize) {
    let mut t = ts.start;
    while t < ts.end {
        t += match ts.end - t {
            left if left >= TILE => sweep(p, p.k.tile, TILE, r0, r1, acts, x_row, t, cols),
            left if left >= 4 => sweep(p, p.k.x4, 4, r0, r1, acts, x_row, t, cols),
            left if left >= 2 => sweep(p, p.k.x2, 2, r0, r1, acts, x_row, t, cols),
            _ => sweep(p, p.k.x1, 1, r0, r1, acts, x_row, t, cols),
        };
    }
}

thread_local! {
    /// Each thread's panel buffer, grown to the largest panel it has held (a few hundred KiB).
    static PANEL: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// `f` on this thread's panel buffer, `bytes` long and 64-byte aligned.
fn with_panel(bytes: usize, f: impl FnOnce(&mut [u8])) {
    PANEL.with(|b| {
        let mut b = b.borrow_mut();
        if b.len() < bytes + 64 {
            b.resize(bytes + 64, 0);
        }
        let skew = b.as_ptr().align_offset(64);
        f(&mut b[skew..skew + bytes]);
    });
}

/// Rows `r0..r1` of part `p` · activation rows `t..t + n` through `f` (a kernel for `n` rows);
/// returns `n`.
#[allow(clippy::too_many_arguments)]
#[inline]
fn sweep(
    p: &Part,
    f: DotRowsFn,
    n: usize,
    r0: usize,
    r1: usize,
    acts: &[u8],
    x_row: usize,
    t: usize,
    cols: usize,
) -> usize {
    let xt = &acts[t * x_row..(t + n) * x_row];
    let w = &p.data[r0 * p.w_row..r1 * p.w_row];
    // SAFETY: ISA checked by matmul; w whole rows, xt n full rows at stride x_row; the outputs
    // (t + c) * rows + r for c < n, r0 <= r < r1 belong to this chunk alone and lie inside y
    // ((t + c) < m, r < rows).
    unsafe { f(cols, w, p.w_row, xt, x_row, p.out.0.add(t * p.rows + r0), p.rows) };
    n
}
