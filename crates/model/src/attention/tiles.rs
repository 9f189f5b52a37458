//! Attention's tile kernels: per 32-key block, the scores of one query row (`q·k_j`, scaled),
//! `exp` of the scores less the running max, and the weighted values added into the output row.
//! [`attention`](super::attention) calls them once per query row and block; everything else
//! it does (masks, soft-capping, the online-softmax bookkeeping) is shared by every path.
//!
//! Two sets: generic Rust (the reference, and what runs on head sizes that are not a multiple
//! of 8) and AVX2 + FMA, chosen by [`kernels`] from the process's one kernel path
//! ([`quant::kernels::isa`]). Cost per block and row: `32·d` multiply-adds for the scores and
//! as many for the values, the same count on both paths; AVX2 does 8 per instruction.

use crate::kv::BLOCK_TOKENS as B;

/// One set of tile kernels (generic or AVX2); [`kernels`] picks the one this process runs.
pub struct TileKernels {
    pub name: &'static str,
    /// `s[j] = scale × q·k_j` for the 32 keys of `k` (`[32][q.len()]`); returns `max s`.
    pub scores: fn(&[f32], &[f32], f32, &mut [f32; B]) -> f32,
    /// `s[j] = exp(s[j] − m)`; returns `Σ s[j]`.
    pub exp_sum: fn(&mut [f32; B], f32) -> f32,
    /// `o = alpha·o + Σ_j p[j]·v_j` (`v`: `[32][o.len()]`).
    pub pv: fn(&mut [f32], f32, &[f32; B], &[f32]),
}

pub static GENERIC: TileKernels = TileKernels {
    name: "generic",
    scores: scores_generic,
    exp_sum: exp_sum_generic,
    pv: pv_generic,
};

/// The tile kernels of the kernel path this process runs ([`quant::kernels::isa`], which
/// honours `SNUG_KERNELS`): AVX2 for the AVX2 family, the generic ones otherwise.
pub fn kernels() -> &'static TileKernels {
    quant::by_isa!(&avx2::KERNELS, &GENERIC)
}

fn scores_generic(q: &[f32], k: &[f32], scale: f32, s: &mut [f32; B]) -> f32 {
    let d = q.len();
    let mut mx = f32::NEG_INFINITY;
    for (j, sc) in s.iter_mut().enumerate() {
        let kj = &k[j * d..(j + 1) * d];
        *sc = q.iter().zip(kj).fold(0.0f32, |a, (x, y)| x.mul_add(*y, a)) * scale;
        mx = mx.max(*sc);
    }
    mx
}

fn exp_sum_generic(s: &mut [f32; B], m: f32) -> f32 {
    let mut sum = 0.0;
    for v in s.iter_mut() {
        *v = (*v - m).exp();
        sum += *v;
    }
    sum
}

fn pv_generic(o: &mut [f32], alpha: f32, p: &[f32; B], v: &[f32]) {
    let d = o.len();
    o.iter_mut().for_each(|x| *x *= alpha);
    for (j, &pj) in p.iter().enumerate() {
        for (x, &vv) in o.iter_mut().zip(&v[j * d..(j + 1) * d]) {
            *x = pj.mul_add(vv, *x);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    //! AVX2 + FMA tile kernels: 8 keys' dot products at once with one horizontal reduction,
    //! a polynomial `exp`, and output rows held in registers across a block's 32 values.
    //!
    //! # Safety
    //! Every `unsafe fn` here has one contract: the CPU has AVX2, FMA and F16C, and the slices
    //! hold what the matching [`TileKernels`] field documents (`k` and `v`: 32 rows of the
    //! head size). The safe wrappers in [`KERNELS`] rely on [`super::kernels`] handing the table
    //! out only on such a CPU; the bounds are asserted where a kernel reads through raw pointers.
    use std::arch::x86_64::*;

    use super::{TileKernels, B};
    use crate::vmath::exp8;

    pub static KERNELS: TileKernels = TileKernels { name: "avx2", scores, exp_sum, pv };

    // SAFETY (the three wrappers): `KERNELS` is only handed out by `kernels()` when
    // `quant::kernels::isa()` chose an AVX2-family path, which it does only after
    // `is_x86_feature_detected!` confirmed AVX2, FMA and F16C on this CPU.
    fn scores(q: &[f32], k: &[f32], scale: f32, s: &mut [f32; B]) -> f32 {
        if !q.len().is_multiple_of(8) {
            return super::scores_generic(q, k, scale, s);
        }
        unsafe { scores_tf(q, k, scale, s) }
    }
    fn exp_sum(s: &mut [f32; B], m: f32) -> f32 {
        unsafe { exp_sum_tf(s, m) }
    }
    fn pv(o: &mut [f32], alpha: f32, p: &[f32; B], v: &[f32]) {
        unsafe { pv_tf(o, alpha, p, v) }
    }

    /// The 8 lanes of `a[i]` summed, as lane i of the result.
    ///
    /// # Safety
    /// The CPU has AVX2 (module contract).
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn hsum8x8(a: [__m256; 8]) -> __m256 {
        let t0 = _mm256_hadd_ps(a[0], a[1]);
        let t1 = _mm256_hadd_ps(a[2], a[3]);
        let t2 = _mm256_hadd_ps(a[4], a[5]);
        let t3 = _mm256_hadd_ps(a[6], a[7]);
        let u0 = _mm256_hadd_ps(t0, t1);
        let u1 = _mm256_hadd_ps(t2, t3);
        _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31))
    }

    /// The 8 lanes of `v` reduced by max (`MAX`) or by sum.
    ///
    /// # Safety
    /// The CPU has AVX2 (module contract).
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn reduce<const MAX: bool>(v: __m256) -> f32 {
        let op = |a, b| if MAX { _mm_max_ps(a, b) } else { _mm_add_ps(a, b) };
        let m = op(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let m = op(m, _mm_movehl_ps(m, m));
        let m = op(m, _mm_shuffle_ps(m, m, 1));
        _mm_cvtss_f32(m)
    }

    /// [`TileKernels::scores`] for a head size that is a multiple of 8 (asserted).
    ///
    /// # Safety
    /// Module contract; `k` holds 32 keys of `q.len()` channels (asserted).
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn scores_tf(q: &[f32], k: &[f32], scale: f32, s: &mut [f32; B]) -> f32 {
        let d = q.len();
        assert!(d.is_multiple_of(8) && k.len() >= B * d);
        let (qp, kp) = (q.as_ptr(), k.as_ptr());
        let sc = _mm256_set1_ps(scale);
        let mut mx = _mm256_set1_ps(f32::NEG_INFINITY);
        for o in 0..B / 8 {
            // SAFETY: keys 8o..8o+8 are inside `k` ([32][d], asserted), channels c..c+8 < d.
            let kb = kp.add(o * 8 * d);
            let mut a = [_mm256_setzero_ps(); 8];
            let mut c = 0;
            while c < d {
                let qv = _mm256_loadu_ps(qp.add(c));
                for (j, acc) in a.iter_mut().enumerate() {
                    *acc = _mm256_fmadd_ps(qv, _mm256_loadu_ps(kb.add(j * d + c)), *acc);
                }
                c += 8;
            }
            let r = _mm256_mul_ps(hsum8x8(a), sc);
            _mm256_storeu_ps(s.as_mut_ptr().add(o * 8), r);
            mx = _mm256_max_ps(mx, r);
        }
        reduce::<true>(mx)
    }

    /// [`TileKernels::exp_sum`].
    ///
    /// # Safety
    /// Module contract (the 32 scores are a fixed-size array).
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn exp_sum_tf(s: &mut [f32; B], m: f32) -> f32 {
        let mv = _mm256_set1_ps(m);
        let mut sum = _mm256_setzero_ps();
        for o in 0..B / 8 {
            // SAFETY: lanes 8o..8o+8 of the 32 scores.
            let p = s.as_mut_ptr().add(o * 8);
            let e = exp8(_mm256_sub_ps(_mm256_loadu_ps(p), mv));
            _mm256_storeu_ps(p, e);
            sum = _mm256_add_ps(sum, e);
        }
        reduce::<false>(sum)
    }

    /// Columns `[0, 8N)` of `o` (at `o`, row stride of `v`: `d`).
    ///
    /// # Safety
    /// Module contract; `o..o + 8N` is writable and each of the 32 rows `v + j·d` has `8N`
    /// readable floats.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn pv_cols<const N: usize>(
        o: *mut f32,
        alpha: __m256,
        p: &[f32; B],
        v: *const f32,
        d: usize,
    ) {
        let mut acc = [_mm256_setzero_ps(); N];
        for (i, a) in acc.iter_mut().enumerate() {
            *a = _mm256_mul_ps(_mm256_loadu_ps(o.add(8 * i)), alpha);
        }
        for (j, &pj) in p.iter().enumerate() {
            let (pj, vj) = (_mm256_set1_ps(pj), v.add(j * d));
            for (i, a) in acc.iter_mut().enumerate() {
                *a = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vj.add(8 * i)), *a);
            }
        }
        for (i, a) in acc.iter().enumerate() {
            _mm256_storeu_ps(o.add(8 * i), *a);
        }
    }

    /// [`TileKernels::pv`].
    ///
    /// # Safety
    /// Module contract; `v` holds 32 rows of `o.len()` values (asserted).
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn pv_tf(o: &mut [f32], alpha: f32, p: &[f32; B], v: &[f32]) {
        let d = o.len();
        assert!(v.len() >= B * d);
        let (op, vp, a) = (o.as_mut_ptr(), v.as_ptr(), _mm256_set1_ps(alpha));
        let mut c = 0;
        // SAFETY: every call covers columns c..c+8N ≤ d of `o` and of each of the 32 rows of `v`.
        while c + 64 <= d {
            pv_cols::<8>(op.add(c), a, p, vp.add(c), d);
            c += 64;
        }
        while c + 32 <= d {
            pv_cols::<4>(op.add(c), a, p, vp.add(c), d);
            c += 32;
        }
        while c + 8 <= d {
            pv_cols::<1>(op.add(c), a, p, vp.add(c), d);
            c += 8;
        }
        for cc in c..d {
            let mut x = o[cc] * alpha;
            for (j, &pj) in p.iter().enumerate() {
                x = pj.mul_add(v[j * d + cc], x);
            }
            o[cc] = x;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::{require_simd, rng};

    #[test]
    fn simd_tile_kernels_match_the_generic_ones() {
        let k = kernels();
        require_simd();
        let mut r = rng(5);
        for d in [4, 8, 20, 64, 72, 128, 256] {
            let q: Vec<f32> = (0..d).map(|_| r()).collect();
            let keys: Vec<f32> = (0..B * d).map(|_| r()).collect();
            let (mut s0, mut s1) = ([0.0; B], [0.0; B]);
            let (m0, m1) =
                (scores_generic(&q, &keys, 0.125, &mut s0), (k.scores)(&q, &keys, 0.125, &mut s1));
            assert!((m0 - m1).abs() < 1e-5, "d={d}");
            assert!(s0.iter().zip(&s1).all(|(a, b)| (a - b).abs() < 1e-5), "d={d}");
            let (mut o0, mut o1): (Vec<f32>, Vec<f32>) =
                (0..d).map(|_| r()).map(|v| (v, v)).unzip();
            let p: [f32; B] = std::array::from_fn(|_| r().abs());
            pv_generic(&mut o0, 0.75, &p, &keys);
            (k.pv)(&mut o1, 0.75, &p, &keys);
            assert!(o0.iter().zip(&o1).all(|(a, b)| (a - b).abs() < 1e-5), "d={d}");
        }
    }

    #[test]
    fn vector_exp_is_within_a_few_ulp_and_zero_far_below() {
        let k = kernels();
        let mut worst = 0.0f64;
        for i in 0..=20_000 {
            let base = -90.0 + 90.0 * i as f32 / 20_000.0;
            let mut s: [f32; B] = std::array::from_fn(|j| base - j as f32 * 1e-3);
            let s_in = s;
            let sum = (k.exp_sum)(&mut s, 0.0);
            let mut want_sum = 0.0f64;
            for (x, e) in s_in.iter().zip(&s) {
                let want = (*x as f64).exp();
                want_sum += want;
                if *x < -87.34 {
                    assert!(*e == 0.0 || (*e as f64 - want).abs() < 1e-37, "exp({x}) = {e}");
                } else if *x > -87.0 {
                    worst = worst.max(((*e as f64 - want) / want).abs());
                }
            }
            if base > -80.0 {
                assert!(((sum as f64) - want_sum).abs() <= 1e-6 * want_sum, "sum at {base}");
            }
        }
        assert!(worst < 1e-6, "worst relative error {worst}");
        let mut s = [f32::NEG_INFINITY; B];
        assert_eq!((k.exp_sum)(&mut s, 1.5), 0.0);
        assert!(s.iter().all(|&v| v == 0.0));
    }
}
