//! The LoRA delta of a batch, Punica's BGMV (batched gather matrix-vector) on the CPU: after a
//! matrix group's base matmul has run once for the whole batch, each token gathers the adapters
//! of its own sequence and adds `s · B·(A·x)` to its outputs — `r` dot products of length `n_in`
//! (`x·Aᵀ`), then `r` axpys of length `n_out` (`·Bᵀ`, `B` stored transposed so both read rows).
//! A token's result depends only on its own row and adapters, so a sequence gets the same bits
//! alone or in any batch, and a token whose sequence has no adapter costs one empty-set check.
//!
//! Cost per token and adapted matrix: `r·(n_in + n_out)` multiply-adds over `4·r·(n_in + n_out)`
//! bytes of f32 weights (a rank-16 adapter on a 896×896 matrix: 29 K FMAs, 115 KB, against the
//! base matrix's 803 K). Tokens are split across the pool's threads; the kernels are AVX2 + FMA
//! with a scalar twin, chosen from [`quant::kernels::isa`] like the rest of the forward pass.

use quant::threads::ThreadPool;

use super::{AdapterSet, LoraMat};
use crate::kv::SeqId;
use crate::par::SendPtr;

/// Rank rows computed per pass: `x·Aᵀ` for this many rows is kept on the stack, then added
/// through `Bᵀ` (the delta is linear, so passes add up to the whole).
const CHUNK: usize = 64;

/// One set of kernels; [`kernels`] picks the one this process runs.
pub struct LoraKernels {
    pub name: &'static str,
    /// `Σ a[i]·b[i]` over equal-length slices.
    pub dot: fn(&[f32], &[f32]) -> f32,
    /// `y[i] += s·x[i]` over equal-length slices.
    pub axpy: fn(&mut [f32], f32, &[f32]),
}

pub static GENERIC: LoraKernels =
    LoraKernels { name: "generic", dot: dot_generic, axpy: axpy_generic };

/// The kernels of the path this process runs ([`quant::kernels::isa`], which honours
/// `SNUG_KERNELS`): AVX2 for the AVX2 family, the generic ones otherwise.
pub fn kernels() -> &'static LoraKernels {
    quant::by_isa!(&avx2::KERNELS, &GENERIC)
}

fn dot_generic(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).fold(0.0f32, |s, (x, y)| x.mul_add(*y, s))
}

fn axpy_generic(y: &mut [f32], s: f32, x: &[f32]) {
    y.iter_mut().zip(x).for_each(|(y, x)| *y = s.mul_add(*x, *y));
}

/// Adds the delta of every token's adapters for layer `il`'s matrix group `g` (inputs `x`,
/// `[m][n_in]`; outputs `ys`, each `[m][width_k]`). `sets` is indexed by sequence id and `seqs`
/// gives each token's sequence; sequences past `sets` have no adapters.
pub(crate) fn apply(
    pool: &ThreadPool,
    sets: &[AdapterSet],
    seqs: &[SeqId],
    il: usize,
    g: usize,
    x: &[f32],
    ys: &mut [&mut [f32]],
) {
    let m = seqs.len();
    if m == 0 || !seqs.iter().any(|&s| sets.get(s).is_some_and(|a| !a.is_empty())) {
        return;
    }
    let n_in = x.len() / m;
    let mut outs: [(SendPtr, usize); 3] =
        std::array::from_fn(|_| (SendPtr(std::ptr::null_mut()), 0));
    for (o, y) in outs.iter_mut().zip(ys.iter_mut()) {
        *o = (SendPtr(y.as_mut_ptr()), y.len() / m);
    }
    let outs = &outs[..ys.len().min(3)];
    let k = kernels();
    let token = |t: usize| {
        let Some(set) = sets.get(seqs[t]) else { return };
        let xt = &x[t * n_in..(t + 1) * n_in];
        for (lora, scale) in set {
            for mat in lora.layer(il).iter().filter(|l| l.group == g) {
                // SAFETY: token `t` is handled by exactly one call of `token` (the split
                // below), and row `t` of each output is written only here, so no two threads
                // touch the same row; each row lies inside its slice (`width · m = len`).
                let rows = outs[mat.first..mat.first + mat.count]
                    .iter()
                    .map(|(p, w)| unsafe { std::slice::from_raw_parts_mut(p.0.add(t * w), *w) });
                add_delta(k, mat, scale * mat.ab_scale, xt, rows);
            }
        }
    };
    let nth = pool.n_threads();
    if m == 1 || nth == 1 {
        (0..m).for_each(token);
    } else {
        pool.run(|ith, nth| (ith * m / nth..(ith + 1) * m / nth).for_each(token));
    }
}

/// `y += s · B·(A·x)` for one token, `y` being the matrix's output split over its group's
/// outputs (in order, each as wide as its slice).
fn add_delta<'y>(
    k: &LoraKernels,
    mat: &LoraMat,
    s: f32,
    x: &[f32],
    ys: impl Iterator<Item = &'y mut [f32]> + Clone,
) {
    let mut t = [0.0f32; CHUNK];
    let mut j0 = 0;
    while j0 < mat.rank {
        let j1 = (j0 + CHUNK).min(mat.rank);
        for (j, tj) in (j0..j1).zip(t.iter_mut()) {
            *tj = s * (k.dot)(&mat.a[j * mat.n_in..(j + 1) * mat.n_in], x);
        }
        let mut off = 0;
        for y in ys.clone() {
            let w = y.len();
            for (j, &tj) in (j0..j1).zip(t.iter()) {
                let b = &mat.bt[j * mat.n_out + off..j * mat.n_out + off + w];
                (k.axpy)(y, tj, b);
            }
            off += w;
        }
        j0 = j1;
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    //! AVX2 + FMA twins of the generic kernels: four 8-lane accumulators for the dot product,
    //! eight lanes per FMA for axpy; tails of fewer than 8 values in scalar code.
    //!
    //! # Safety
    //! The `unsafe fn`s need AVX2 and FMA; [`KERNELS`] is handed out by [`super::kernels`] only
    //! when `quant::kernels::isa()` chose an AVX2-family path, which it does after
    //! `is_x86_feature_detected!` confirmed AVX2, FMA and F16C.
    use std::arch::x86_64::*;

    use super::LoraKernels;

    pub static KERNELS: LoraKernels = LoraKernels { name: "avx2", dot, axpy };

    fn dot(a: &[f32], b: &[f32]) -> f32 {
        let n = a.len().min(b.len());
        // SAFETY: module contract; both slices hold at least `n` values.
        unsafe { dot_tf(&a[..n], &b[..n]) }
    }

    fn axpy(y: &mut [f32], s: f32, x: &[f32]) {
        let n = y.len().min(x.len());
        // SAFETY: module contract; both slices hold at least `n` values.
        unsafe { axpy_tf(&mut y[..n], s, &x[..n]) }
    }

    /// # Safety
    /// Module contract; `a` and `b` have the same length.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dot_tf(a: &[f32], b: &[f32]) -> f32 {
        let n = a.len();
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut i = 0;
        while i + 32 <= n {
            for (u, acc) in acc.iter_mut().enumerate() {
                // SAFETY: i + 8u + 8 <= i + 32 <= n.
                unsafe {
                    let o = i + 8 * u;
                    *acc = _mm256_fmadd_ps(
                        _mm256_loadu_ps(pa.add(o)),
                        _mm256_loadu_ps(pb.add(o)),
                        *acc,
                    );
                }
            }
            i += 32;
        }
        while i + 8 <= n {
            // SAFETY: i + 8 <= n.
            unsafe {
                acc[0] =
                    _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i)), _mm256_loadu_ps(pb.add(i)), acc[0]);
            }
            i += 8;
        }
        let v = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
        let h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let h = _mm_add_ps(h, _mm_movehl_ps(h, h));
        let h = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));
        let mut s = _mm_cvtss_f32(h);
        for j in i..n {
            s = a[j].mul_add(b[j], s);
        }
        s
    }

    /// # Safety
    /// Module contract; `y` and `x` have the same length.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn axpy_tf(y: &mut [f32], s: f32, x: &[f32]) {
        let n = y.len();
        let (py, px) = (y.as_mut_ptr(), x.as_ptr());
        let sv = _mm256_set1_ps(s);
        let mut i = 0;
        while i + 8 <= n {
            // SAFETY: i + 8 <= n, the length of both.
            unsafe {
                let r = _mm256_fmadd_ps(sv, _mm256_loadu_ps(px.add(i)), _mm256_loadu_ps(py.add(i)));
                _mm256_storeu_ps(py.add(i), r);
            }
            i += 8;
        }
        for j in i..n {
            y[j] = s.mul_add(x[j], y[j]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::{noise, require_simd};

    #[test]
    fn every_kernel_path_matches_the_generic_one_over_odd_lengths() {
        let k = kernels();
        require_simd();
        for n in [1, 7, 8, 9, 31, 32, 33, 95, 896, 4864 + 3] {
            let (a, b) = (noise(n, 1, 1.0), noise(n, 2, 1.0));
            let want = dot_generic(&a, &b) as f64;
            let exact: f64 = a.iter().zip(&b).map(|(x, y)| *x as f64 * *y as f64).sum();
            let got = (k.dot)(&a, &b) as f64;
            let tol = 1e-5 * (n as f64).sqrt().max(1.0);
            assert!((got - exact).abs() <= tol, "{} dot n={n}: {got} vs {exact}", k.name);
            assert!((want - exact).abs() <= tol, "generic dot n={n}: {want} vs {exact}");
            let (mut y1, mut y2) = (noise(n, 3, 1.0), noise(n, 3, 1.0));
            (k.axpy)(&mut y1, 0.37, &a);
            axpy_generic(&mut y2, 0.37, &a);
            // Both are one FMA per element: the same bits.
            assert_eq!(y1, y2, "{} axpy n={n}", k.name);
        }
    }
}
