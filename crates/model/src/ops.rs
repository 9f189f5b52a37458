//! Elementwise and per-row operations of the forward pass (norms, RoPE, activations). All are
//! O(n) per token and run on the calling thread; the matmuls and attention are what is parallel.

use half::f16;

use crate::arch::{Activation, RopeStyle};

/// `x = x / sqrt(mean(x²) + eps) * w`, in place.
pub fn rms_norm(x: &mut [f32], w: &[f32], eps: f32) {
    let ss: f32 = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    let scale = 1.0 / (ss + eps).sqrt();
    for (v, &g) in x.iter_mut().zip(w) {
        *v = *v * scale * g;
    }
}

/// `out = rms_norm(x) * w` without touching x.
pub fn rms_norm_into(out: &mut [f32], x: &[f32], w: &[f32], eps: f32) {
    out.copy_from_slice(x);
    rms_norm(out, w, eps);
}

/// `x = softmax(x)` in place (max subtracted first; sums in f32 like ggml's `soft_max`).
pub fn softmax(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0f32;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    x.iter_mut().for_each(|v| *v /= sum);
}

/// Per-position rotation table for one head: `cos`/`sin` of each rotated pair.
pub struct RopeTable {
    /// [n_rot / 2]
    pub cos: Vec<f32>,
    pub sin: Vec<f32>,
    /// Multiplier on every cos and sin (ggml's `attn_factor`; 1 but for LongRoPE models).
    pub mscale: f32,
}

impl RopeTable {
    pub fn new(n_rot: usize, mscale: f32) -> RopeTable {
        RopeTable { cos: vec![0.0; n_rot / 2], sin: vec![0.0; n_rot / 2], mscale }
    }

    /// Fills the table for position `pos`. Angles follow ggml's rope cache exactly:
    /// theta starts at `pos` and is multiplied by `base^(-2/n_rot)` once per pair (f32), then
    /// divided by the per-pair frequency factor and scaled by `freq_scale`.
    pub fn fill(&mut self, pos: usize, base: f32, freq_scale: f32, freq_factors: Option<&[f32]>) {
        let n_rot = self.cos.len() * 2;
        let theta_scale = base.powf(-2.0 / n_rot as f32);
        let mut theta = pos as f32;
        for i in 0..self.cos.len() {
            let ff = freq_factors.map_or(1.0, |f| f[i]);
            let t = freq_scale * (theta / ff);
            self.cos[i] = t.cos() * self.mscale;
            self.sin[i] = t.sin() * self.mscale;
            theta *= theta_scale;
        }
    }

    /// Rotates the first `n_rot` dimensions of one head in place.
    pub fn apply(&self, head: &mut [f32], style: RopeStyle) {
        let half = self.cos.len();
        match style {
            RopeStyle::Norm => {
                for i in 0..half {
                    let (x0, x1) = (head[2 * i], head[2 * i + 1]);
                    head[2 * i] = x0 * self.cos[i] - x1 * self.sin[i];
                    head[2 * i + 1] = x0 * self.sin[i] + x1 * self.cos[i];
                }
            }
            RopeStyle::Neox => {
                for i in 0..half {
                    let (x0, x1) = (head[i], head[i + half]);
                    head[i] = x0 * self.cos[i] - x1 * self.sin[i];
                    head[i + half] = x0 * self.sin[i] + x1 * self.cos[i];
                }
            }
        }
    }
}

/// `gate = act(gate) * up`, in place in `gate`.
pub fn glu(gate: &mut [f32], up: &[f32], act: Activation) {
    match act {
        Activation::Silu => (silu_kernel())(gate, up),
        Activation::GeluTanh => (gelu_kernel())(gate, up),
    }
}

/// `gate = gelu(gate) * up` one value at a time, through the same table as the SIMD version.
pub fn gelu_mul_generic(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = gelu_like_ggml(*g) * u;
    }
}

/// The `gelu_mul` of the kernel path this process runs. Like SwiGLU it runs on one thread
/// between two matmuls; a libm `tanh` per value cost Gemma's prompt processing about a quarter
/// of its time on two threads, a table lookup costs a gather.
pub fn gelu_kernel() -> fn(&mut [f32], &[f32]) {
    quant::by_isa!(avx2::gelu_mul, gelu_mul_generic)
}

/// `gelu_tanh` of every f16 input rounded to f16, indexed by the input's bits: ggml keeps the
/// same table (in f16; these are its values widened), 256 KiB built once per process.
fn gelu_table() -> &'static [f32; 1 << 16] {
    static TABLE: std::sync::OnceLock<Box<[f32; 1 << 16]>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        let mut t = Box::new([0.0f32; 1 << 16]);
        for (bits, v) in t.iter_mut().enumerate() {
            let x = f16::from_bits(bits as u16).to_f32();
            *v = f16::from_f32(gelu_tanh(x)).to_f32();
        }
        t
    })
}

/// `gate = silu(gate) * up`, the reference the SIMD version is tested against.
pub fn silu_mul_generic(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + (-*g).exp()) * u;
    }
}

/// The `silu_mul` of the kernel path this process runs ([`quant::kernels::isa`], which honours
/// `SNUG_KERNELS`). SwiGLU runs on one thread between two matmuls over `n_ff` values a token,
/// so a libm `exp` per value is worth replacing with the vector one.
pub fn silu_kernel() -> fn(&mut [f32], &[f32]) {
    quant::by_isa!(avx2::silu_mul, silu_mul_generic)
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use crate::vmath::{exp8, tanh8};

    /// `gate = silu(gate) * up` eight at a time with the polynomial `exp` (about 2 ulp).
    pub fn silu_mul(gate: &mut [f32], up: &[f32]) {
        let n = gate.len().min(up.len());
        // SAFETY: `silu_kernel` hands this out only when `quant::kernels::isa()` chose an
        // AVX2-family path, which it does only after AVX2, FMA and F16C were detected.
        unsafe { silu_mul_tf(&mut gate[..n], &up[..n]) }
    }

    /// # Safety
    /// The CPU has AVX2, FMA and F16C; `gate` and `up` have the same length.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn silu_mul_tf(gate: &mut [f32], up: &[f32]) {
        let n8 = gate.len() / 8 * 8;
        let one = _mm256_set1_ps(1.0);
        for i in (0..n8).step_by(8) {
            // SAFETY: i + 8 <= n8 <= both lengths.
            unsafe {
                let g = _mm256_loadu_ps(gate.as_ptr().add(i));
                let e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), g));
                let s = _mm256_div_ps(g, _mm256_add_ps(one, e));
                _mm256_storeu_ps(
                    gate.as_mut_ptr().add(i),
                    _mm256_mul_ps(s, _mm256_loadu_ps(up.as_ptr().add(i))),
                );
            }
        }
        super::silu_mul_generic(&mut gate[n8..], &up[n8..]);
    }

    /// `x = cap * tanh(x / cap)` eight at a time with the vector `tanh`.
    pub fn softcap(x: &mut [f32], cap: f32) {
        // SAFETY: as in `silu_mul`.
        unsafe { softcap_tf(x, cap) }
    }

    /// # Safety
    /// The CPU has AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn softcap_tf(x: &mut [f32], cap: f32) {
        let n8 = x.len() / 8 * 8;
        let c = _mm256_set1_ps(cap);
        for i in (0..n8).step_by(8) {
            // SAFETY: i + 8 <= n8 <= x.len().
            unsafe {
                let v = _mm256_div_ps(_mm256_loadu_ps(x.as_ptr().add(i)), c);
                _mm256_storeu_ps(x.as_mut_ptr().add(i), _mm256_mul_ps(c, tanh8(v)));
            }
        }
        super::softcap_generic(&mut x[n8..], cap);
    }

    /// `gate = gelu(gate) * up` eight at a time: round to f16, gather from the table, and keep
    /// ggml's ends (0 at or below −10, x at or above 10).
    pub fn gelu_mul(gate: &mut [f32], up: &[f32]) {
        let n = gate.len().min(up.len());
        let table = super::gelu_table();
        // SAFETY: as in `silu_mul`; the table has an entry for every 16-bit index.
        unsafe { gelu_mul_tf(&mut gate[..n], &up[..n], table) }
    }

    /// # Safety
    /// The CPU has AVX2, FMA and F16C; `gate` and `up` have the same length.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn gelu_mul_tf(gate: &mut [f32], up: &[f32], table: &[f32; 1 << 16]) {
        let n8 = gate.len() / 8 * 8;
        let lo = _mm256_set1_ps(-10.0);
        let hi = _mm256_set1_ps(10.0);
        for i in (0..n8).step_by(8) {
            // SAFETY: i + 8 <= n8 <= both lengths; every gathered index is a u16, inside the
            // table.
            unsafe {
                let x = _mm256_loadu_ps(gate.as_ptr().add(i));
                let h = _mm256_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT }>(x);
                let idx = _mm256_cvtepu16_epi32(h);
                let t = _mm256_i32gather_ps::<4>(table.as_ptr(), idx);
                let y = _mm256_blendv_ps(t, x, _mm256_cmp_ps::<_CMP_GE_OQ>(x, hi));
                let y = _mm256_andnot_ps(_mm256_cmp_ps::<_CMP_LE_OQ>(x, lo), y);
                _mm256_storeu_ps(
                    gate.as_mut_ptr().add(i),
                    _mm256_mul_ps(y, _mm256_loadu_ps(up.as_ptr().add(i))),
                );
            }
        }
        super::gelu_mul_generic(&mut gate[n8..], &up[n8..]);
    }
}

/// GELU (tanh approximation) as ggml's CPU backend computes it: outside ±10 it is 0 or x;
/// inside, the input is rounded to f16 and the result is read from a table of f16 values,
/// [`gelu_table`], as here.
#[inline]
pub fn gelu_like_ggml(x: f32) -> f32 {
    if x <= -10.0 {
        0.0
    } else if x >= 10.0 {
        x
    } else {
        gelu_table()[f16::from_f32(x).to_bits() as usize]
    }
}

#[inline]
pub fn gelu_tanh(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (1.0 + 0.044715 * x * x)).tanh())
}

/// `cap * tanh(x / cap)` on every element, with libm's `tanh`: the reference the SIMD version
/// is tested against.
pub fn softcap_generic(x: &mut [f32], cap: f32) {
    for v in x {
        *v = cap * (*v / cap).tanh();
    }
}

/// The soft-cap of the kernel path this process runs. Gemma 2 caps every attention score and
/// every logit (a 256,000-entry vocabulary), a libm `tanh` each: at a 3,500-token context that
/// was about 6% of the 9B shape's decode.
pub fn softcap_kernel() -> fn(&mut [f32], f32) {
    quant::by_isa!(avx2::softcap, softcap_generic)
}

/// `cap * tanh(x / cap)` on every element, by [`softcap_kernel`].
pub fn softcap(x: &mut [f32], cap: f32) {
    (softcap_kernel())(x, cap)
}

/// The logistic function `1 / (1 + e^-x)`: a sigmoid router's gates, a shared expert's weight.
#[inline]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

pub fn add_assign(x: &mut [f32], y: &[f32]) {
    for (a, &b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    // Eight independent partial sums let the compiler vectorise without reassociation.
    let mut acc = [0.0f32; 8];
    let chunks = a.len() / 8;
    for c in 0..chunks {
        for j in 0..8 {
            acc[j] += a[c * 8 + j] * b[c * 8 + j];
        }
    }
    let mut s: f32 = acc.iter().sum();
    for i in chunks * 8..a.len() {
        s += a[i] * b[i];
    }
    s
}

/// `y += a * x`
#[inline]
pub fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
    for (d, &s) in y.iter_mut().zip(x) {
        *d += a * s;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rms_norm_of_constant_row_is_the_weight() {
        let mut x = vec![3.0; 8];
        let w: Vec<f32> = (0..8).map(|i| i as f32).collect();
        rms_norm(&mut x, &w, 0.0);
        for (a, b) in x.iter().zip(&w) {
            assert!((a - b).abs() < 1e-6);
        }
    }

    #[test]
    fn rope_at_position_zero_is_identity_and_preserves_norm_elsewhere() {
        let mut t = RopeTable::new(8, 1.0);
        let orig: Vec<f32> = (0..8).map(|i| i as f32 - 3.5).collect();
        for style in [RopeStyle::Norm, RopeStyle::Neox] {
            t.fill(0, 10000.0, 1.0, None);
            let mut h = orig.clone();
            t.apply(&mut h, style);
            assert_eq!(h, orig);
            t.fill(17, 10000.0, 1.0, None);
            t.apply(&mut h, style);
            let n0: f32 = orig.iter().map(|v| v * v).sum();
            let n1: f32 = h.iter().map(|v| v * v).sum();
            assert!((n0 - n1).abs() < 1e-3);
            assert_ne!(h, orig);
        }
    }

    #[test]
    fn simd_silu_matches_the_generic_one_on_odd_lengths() {
        crate::test_util::require_simd();
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut rnd = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
        };
        for n in [1, 7, 8, 9, 33, 4864, 4867] {
            // Gates over ±40 cover both saturated ends; a few far beyond exp's range.
            let mut g: Vec<f32> = (0..n).map(|_| 40.0 * rnd()).collect();
            if n > 8 {
                g[3] = -200.0;
                g[5] = 200.0;
            }
            let u: Vec<f32> = (0..n).map(|_| rnd()).collect();
            let (mut a, mut b) = (g.clone(), g.clone());
            silu_mul_generic(&mut a, &u);
            (silu_kernel())(&mut b, &u);
            for i in 0..n {
                let tol = 8.0 * f32::EPSILON * a[i].abs() + 1e-30;
                assert!(
                    (a[i] - b[i]).abs() <= tol,
                    "n {n} i {i}: gate {} up {}: {} vs {}",
                    g[i],
                    u[i],
                    a[i],
                    b[i]
                );
            }
        }
    }

    #[test]
    fn gelu_table_kernels_equal_ggml_gelu_bit_for_bit() {
        // Every f16 value, the points either side of ±10 and of each f16 rounding boundary,
        // the infinities and NaN.
        let mut g: Vec<f32> = (0..=u16::MAX).map(|b| f16::from_bits(b).to_f32()).collect();
        g.extend([-10.0, 10.0, -10.000_001, 9.999_999, 1e30, -1e30, f32::INFINITY]);
        g.extend([f32::NEG_INFINITY, f32::NAN, 0.333_333_34, -2.718_281_7, 65_520.0]);
        let u: Vec<f32> = (0..g.len()).map(|i| 1.0 + (i % 7) as f32 * 0.25).collect();
        // ggml's definition written out: ends at ±10, both sides rounded through f16 inside.
        let ggml = |x: f32| {
            if x <= -10.0 {
                0.0
            } else if x >= 10.0 {
                x
            } else {
                f16::from_f32(gelu_tanh(f16::from_f32(x).to_f32())).to_f32()
            }
        };
        let want: Vec<f32> = g.iter().zip(&u).map(|(&x, &u)| ggml(x) * u).collect();
        for f in [gelu_mul_generic as fn(&mut [f32], &[f32]), gelu_kernel()] {
            let mut got = g.clone();
            f(&mut got, &u);
            for i in 0..g.len() {
                assert!(
                    got[i].to_bits() == want[i].to_bits() || (got[i].is_nan() && want[i].is_nan()),
                    "x {}: {} vs {}",
                    g[i],
                    got[i],
                    want[i]
                );
            }
        }
    }

    #[test]
    fn simd_softcap_is_within_4_ulp_of_libm() {
        crate::test_util::require_simd();
        // Every magnitude from 1e-6 to 40 caps (both saturated), both signs, zeros and NaN.
        let cap = 30.0f32;
        let mut x: Vec<f32> = (0..20_000)
            .map(|i| {
                let m = 1e-6f32 * (40.0 * cap / 1e-6f32).powf(i as f32 / 20_000.0);
                if i % 2 == 0 {
                    m
                } else {
                    -m
                }
            })
            .collect();
        x.extend([0.0, -0.0, 7.5, -7.5, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 1e30]);
        let (mut a, mut b) = (x.clone(), x.clone());
        softcap_generic(&mut a, cap);
        (softcap_kernel())(&mut b, cap);
        for i in 0..x.len() {
            if a[i].is_nan() {
                assert!(b[i].is_nan(), "x {}: {}", x[i], b[i]);
                continue;
            }
            let tol = 4.0 * f32::EPSILON * a[i].abs();
            assert!((a[i] - b[i]).abs() <= tol, "x {}: {} vs {}", x[i], a[i], b[i]);
        }
    }

    #[test]
    fn gelu_matches_known_values() {
        assert!((gelu_tanh(1.0) - 0.841_192).abs() < 1e-5);
        assert_eq!(gelu_like_ggml(-11.0), 0.0);
        assert_eq!(gelu_like_ggml(12.0), 12.0);
    }
}
