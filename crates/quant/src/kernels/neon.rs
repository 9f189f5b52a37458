//! aarch64 NEON kernels (baseline NEON, no dotprod needed): Q8_0 and Q4_0 against Q8_0 via
//! widening `smull` + pairwise accumulate. Other types use the scalar kernels on aarch64.
//! Cost: ~4 instructions per 16 values; written for correctness first, not yet tuned.
//!
//! # Safety
//! As in `avx2/mod.rs`: whole blocks, full rows, `C` activation rows at stride `xs`.

use std::arch::aarch64::*;

use super::{kernels_from_row, no_kernel_types, DotKernels, Partner, QuantizeFn};
use crate::GgmlType;

#[inline(always)]
fn f16_at(p: &[u8], off: usize) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([p[off], p[off + 1]])).to_f32()
}

/// Σ of 16 signed byte products into 4 i32 lanes.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn dot16(a: int8x16_t, b: int8x16_t, acc: int32x4_t) -> int32x4_t {
    let lo = vmull_s8(vget_low_s8(a), vget_low_s8(b));
    let hi = vmull_s8(vget_high_s8(a), vget_high_s8(b));
    vpadalq_s16(vpadalq_s16(acc, lo), hi)
}

/// The 32 signed values of a weight block: Q8_0 as stored, Q4_0 nibbles minus 8.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn values(ty: GgmlType, b: *const u8) -> (int8x16_t, int8x16_t) {
    if ty == GgmlType::Q8_0 {
        (vld1q_s8(b.add(2).cast()), vld1q_s8(b.add(18).cast()))
    } else {
        let q = vld1q_u8(b.add(2));
        let eight = vdupq_n_s8(8);
        let lo = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(q, vdupq_n_u8(0xF))), eight);
        let hi = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8::<4>(q)), eight);
        (lo, hi)
    }
}

#[target_feature(enable = "neon")]
unsafe fn dot_q8_0_like<const C: usize>(
    ty: GgmlType,
    n: usize,
    w: &[u8],
    x: &[u8],
    xs: usize,
) -> [f32; C] {
    let bytes = ty.type_size();
    let mut acc = [0f32; C];
    for i in 0..n / 32 {
        let b = w.as_ptr().add(i * bytes);
        let (lo, hi) = values(ty, b);
        let dw = f16_at(w, i * bytes);
        for c in 0..C {
            let y = x.as_ptr().add(c * xs + 34 * i);
            let s = dot16(lo, vld1q_s8(y.add(2).cast()), vdupq_n_s32(0));
            let s = dot16(hi, vld1q_s8(y.add(18).cast()), s);
            acc[c] += dw * f16_at(x, c * xs + 34 * i) * vaddvq_s32(s) as f32;
        }
    }
    acc
}

macro_rules! neon_kernels {
    ($ty:expr) => {
        kernels_from_row!(|n, wr, x, stride| -> [f32; N] {
            // SAFETY: DotRowsFn's contract for one row; NEON is always present on aarch64.
            unsafe { dot_q8_0_like::<N>($ty, n, wr, x, stride) }
        })
    };
}

pub(crate) fn dot_kernels(ty: GgmlType) -> Option<DotKernels> {
    match ty {
        GgmlType::Q8_0 => Some(neon_kernels!(GgmlType::Q8_0)),
        GgmlType::Q4_0 => Some(neon_kernels!(GgmlType::Q4_0)),
        // Scalar until a NEON kernel is written.
        GgmlType::F32
        | GgmlType::F16
        | GgmlType::BF16
        | GgmlType::Q4_1
        | GgmlType::Q5_0
        | GgmlType::Q5_1
        | GgmlType::IQ4NL
        | GgmlType::Q2K
        | GgmlType::Q3K
        | GgmlType::Q4K
        | GgmlType::Q5K
        | GgmlType::Q6K
        | GgmlType::IQ4XS => None,
        GgmlType::Q8_1 | GgmlType::Q8K | no_kernel_types!() => None,
    }
}

pub(crate) fn quantizer(_p: Partner) -> Option<QuantizeFn> {
    None
}
