//! Vector math shared by this crate's SIMD kernels: `exp` eight lanes at a time, used by the
//! attention tiles' softmax and by SwiGLU's `silu`. A Cephes-style polynomial (about 2 ulp, a
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
