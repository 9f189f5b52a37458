//! The matmul the forward pass calls: `y = W · x` for `m` activation rows, over one weight matrix
//! or several that share the activation row (q/k/v, gate/up). Activations are quantized once into
//! caller-owned scratch; rows are cut into chunks that the pool's threads claim from one atomic
//! counter (a late or descheduled thread just claims fewer). Decode chunks are wide (one pass over
//! the weights, ~8 chunks per thread); prefill chunks are 16 rows, each swept over all tokens in
//! tiles of [`TILE`], so the chunk's weights stay in L1/L2 while activations stream from L2.

use std::sync::atomic::{AtomicUsize, Ordering};

use super::{
    act_row_bytes, check_isa, check_len, dot_kernels, f32_bytes, isa, quantizer, row_bytes,
    vec_dot_type, DotKernels, DotRowsFn, Isa, KernelError, MatRef, TILE,
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

/// One matrix of a multi-matmul, validated, with its share of the chunk numbering.
#[derive(Clone, Copy)]
struct Part<'a> {
    k: DotKernels,
    data: &'a [u8],
    rows: usize,
    w_row: usize,
    out: SharedMut<f32>,
    chunk_rows: usize,
    /// Global index of this part's first chunk.
    chunk0: usize,
}

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
    let nth = pool.n_threads();

    let mut parts: [Option<Part>; MAX_MULTI] = [None; MAX_MULTI];
    let mut n_chunks = 0;
    for (i, (w, y)) in ws.iter().zip(ys.iter_mut()).enumerate() {
        let MatRef {
            ty,
            data,
            rows,
            cols: c,
        } = *w;
        if vec_dot_type(ty) != vdt {
            return Err(KernelError::Mixed { first, other: ty });
        }
        check_len("cols of every matrix", cols, c)?;
        let k = dot_kernels(isa, ty).ok_or(KernelError::Unsupported(ty))?;
        let w_row = row_bytes(ty, cols)?;
        check_len(
            "weight data (bytes)",
            rows.saturating_mul(w_row),
            data.len(),
        )?;
        check_len("y", m.saturating_mul(rows), y.len())?;
        let chunk_rows = if m < TILE {
            (rows / (nth * 8)).clamp(8, 256)
        } else {
            16
        };
        let out = SharedMut(y.as_mut_ptr());
        parts[i] = Some(Part {
            k,
            data,
            rows,
            w_row,
            out,
            chunk_rows,
            chunk0: n_chunks,
        });
        n_chunks += rows.div_ceil(chunk_rows);
    }
    if m == 0 || n_chunks == 0 {
        return Ok(());
    }
    let acts = quantize_acts(isa, pool, x, m, cols, x_row, vdt, scratch);

    let next = AtomicUsize::new(0);
    let work = |_ith: usize, _nth: usize| loop {
        let chunk = next.fetch_add(1, Ordering::Relaxed);
        if chunk >= n_chunks {
            break;
        }
        let Some(p) = parts.iter().flatten().rev().find(|p| p.chunk0 <= chunk) else {
            break;
        };
        let r0 = (chunk - p.chunk0) * p.chunk_rows;
        run_chunk(p, r0, (r0 + p.chunk_rows).min(p.rows), acts, x_row, m, cols);
    };
    if n_chunks == 1 || nth == 1 {
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

/// Rows `r0..r1` of part `p` against all `m` activation rows: [`TILE`] tokens at a time, then
/// the rest in groups of 4, 2 and 1, so each weight row is read once per group.
fn run_chunk(p: &Part, r0: usize, r1: usize, acts: &[u8], x_row: usize, m: usize, cols: usize) {
    let mut t = 0;
    while t < m {
        t += match m - t {
            left if left >= TILE => sweep(p, p.k.tile, r0, r1, acts, x_row, t, cols),
            left if left >= 4 => sweep(p, p.k.x4, r0, r1, acts, x_row, t, cols),
            left if left >= 2 => sweep(p, p.k.x2, r0, r1, acts, x_row, t, cols),
            _ => {
                let xt = &acts[t * x_row..(t + 1) * x_row];
                for r in r0..r1 {
                    let wr = &p.data[r * p.w_row..(r + 1) * p.w_row];
                    prefetch_bytes(p.data, r * p.w_row + PREFETCH_AHEAD, p.w_row);
                    // SAFETY: ISA checked by matmul; full rows.
                    let v = unsafe { (p.k.dot)(cols, wr, xt) };
                    // SAFETY: rows r0..r1 of this part belong to this chunk alone; t < m.
                    unsafe { *p.out.0.add(t * p.rows + r) = v };
                }
                1
            }
        };
    }
}

/// Rows `r0..r1` of part `p` · activation rows `t..t + N` through `f`; returns `N`.
#[allow(clippy::too_many_arguments)]
#[inline]
fn sweep<const N: usize>(
    p: &Part,
    f: DotRowsFn<N>,
    r0: usize,
    r1: usize,
    acts: &[u8],
    x_row: usize,
    t: usize,
    cols: usize,
) -> usize {
    let xt = &acts[t * x_row..(t + N) * x_row];
    for r in r0..r1 {
        let wr = &p.data[r * p.w_row..(r + 1) * p.w_row];
        // SAFETY: ISA checked by matmul; wr one full row, xt N full rows at stride x_row.
        let v = unsafe { f(cols, wr, xt, x_row) };
        for (c, v) in v.into_iter().enumerate() {
            // SAFETY: rows r0..r1 of this part belong to this chunk alone; (t+c) < m, r < rows.
            unsafe { *p.out.0.add((t + c) * p.rows + r) = v };
        }
    }
    N
}

/// How far ahead of the row being multiplied decode asks for weight bytes. One token's decode
/// streams each weight once, and the hardware prefetcher alone keeps too few cache lines in
/// flight for a core to reach its share of the memory bandwidth: hinting the next 4 KiB of the
/// chunk measured +3% to +15% decode tok/s on the 0.5B/1.5B models (2 threads, A/B runs);
/// 2 KiB and 8 KiB measured the same as 4 KiB.
const PREFETCH_AHEAD: usize = 4096;

/// Hint the cache lines of `data[start..start + len]` (clipped to `data`) into L1; a no-op off
/// x86_64 (aarch64 cores prefetch streams well on their own).
#[inline]
fn prefetch_bytes(data: &[u8], start: usize, len: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        let end = (start + len).min(data.len());
        let mut o = start;
        while o < end {
            // SAFETY: prefetch is a hint that never faults; the address is inside `data`.
            unsafe {
                std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                    data.as_ptr().add(o).cast(),
                )
            };
            o += 64;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (data, start, len);
}
