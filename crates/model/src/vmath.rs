//! Vector math shared by this crate's SIMD kernels: `exp` eight lanes at a time, used by the
//! attention tiles' softmax and by SwiGLU's `silu`, and `tanh` built on it for soft-capping. A Cephes-style polynomial (about 2 ulp, a
//! dozen vector instructions per 8 values) instead of one libm call per value; the scalar
//! kernels beside each caller use `f32::exp` and are what the tests compare against.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// `exp(x)` to about 2 ulp (Cephes' expf polynomial; its last coefficient, 0.50000001, is 0.5
/// in f32); below −87.3 (and −∞) it is 0.
///
/// # Safety
/// The CPU has AVX2 and FMA. Callers are `#[target_feature(enable = "avx2,fma,f16c")]` kernels
/// handed out only when [`quant::kernels::isa`] chose a path of the AVX2 family.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) unsafe fn exp8(x: __m256) -> __m256 {
    let lo = _mm256_set1_ps(-87.336_55);
    let under = _mm256_cmp_ps::<_CMP_LT_OQ>(x, lo);
    let xc = _mm256_min_ps(_mm256_max_ps(x, lo), _mm256_set1_ps(88.0));
    let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(
        xc,
        _mm256_set1_ps(std::f32::consts::LOG2_E),
    ));
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693_359_4), xc);
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.121_944_4e-4), r);
    let mut p = _mm256_set1_ps(1.987_569_1e-4);
    for c in [1.398_199_9e-3, 8.333_452e-3, 4.166_579_6e-2, 1.666_666_5e-1, 0.5] {
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
    }
    let y = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0)));
    let pow2n = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(
        _mm256_cvtps_epi32(n),
        _mm256_set1_epi32(127),
    )));
    _mm256_andnot_ps(under, _mm256_mul_ps(y, pow2n))
}

/// `tanh(x)` to within about 3 ulp relative at every magnitude: an odd Taylor polynomial
/// below 0.25 (where `1 − 2/(e^2x + 1)` would cancel), that formula on [`exp8`] above, and
/// ±1 from 9 on (tanh(9) rounds to 1 in f32). NaN stays NaN.
///
/// # Safety
/// As [`exp8`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) unsafe fn tanh8(x: __m256) -> __m256 {
    let sign = _mm256_set1_ps(-0.0);
    let a = _mm256_andnot_ps(sign, x);
    // Small: x + x³(−1/3 + x²(2/15 + x²(−17/315 + x²·62/2835))); the next term is 2e-9 of
    // the value at 0.25.
    let x2 = _mm256_mul_ps(x, x);
    let mut p = _mm256_set1_ps(62.0 / 2835.0);
    for c in [-17.0 / 315.0, 2.0 / 15.0, -1.0 / 3.0] {
        p = _mm256_fmadd_ps(p, x2, _mm256_set1_ps(c));
    }
    let small = _mm256_fmadd_ps(_mm256_mul_ps(p, x2), x, x);
    // Large: 1 − 2/(e^{2|x|} + 1), with the sign put back.
    let one = _mm256_set1_ps(1.0);
    let e = exp8(_mm256_min_ps(_mm256_add_ps(a, a), _mm256_set1_ps(18.0)));
    let t = _mm256_sub_ps(one, _mm256_div_ps(_mm256_set1_ps(2.0), _mm256_add_ps(e, one)));
    let large = _mm256_or_ps(t, _mm256_and_ps(sign, x));
    let y = _mm256_blendv_ps(large, small, _mm256_cmp_ps::<_CMP_LT_OQ>(a, _mm256_set1_ps(0.25)));
    _mm256_blendv_ps(y, x, _mm256_cmp_ps::<_CMP_UNORD_Q>(x, x))
}
