//! Scalar reference kernels: activation quantizers (Q8_0, Q8_1, Q8_K) and one `vec_dot` per
//! weight type, following ggml's `ggml_vec_dot_*_generic` integer math (weights × once-quantized
//! activations, K-quant mins via the Q8_K block sums). Plain bounds-checked Rust, no `unsafe`;
//! every SIMD kernel is tested against these. Cost: ~1 value per cycle — the fallback only.

use half::{bf16, f16};

use super::{kernels_from_row, no_kernel_types, DotKernels, Partner, QuantizeFn};
use crate::blocks::IQ4_NL_VALUES;
use crate::GgmlType;

#[inline]
pub(crate) fn f16_at(b: &[u8], off: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[off], b[off + 1]])).to_f32()
}

#[inline]
fn f32_at(b: &[u8], off: usize) -> f32 {
    f32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

#[inline]
fn i16_at(b: &[u8], off: usize) -> i32 {
    i16::from_le_bytes([b[off], b[off + 1]]) as i32
}

/// Largest |x| of a block (NaN-free inputs assumed; NaNs are ignored).
#[inline]
fn amax(x: &[f32]) -> f32 {
    x.iter().fold(0f32, |a, v| a.max(v.abs()))
}

/// Q8_0: per 32 values `d = amax/127` (f16), `q = round_half_even(x · 127/amax)`.
pub(crate) fn quantize_q8_0(x: &[f32], dst: &mut [u8]) {
    for (xb, yb) in x.chunks_exact(32).zip(dst.chunks_exact_mut(34)) {
        let a = amax(xb);
        let id = if a != 0.0 { 127.0 / a } else { 0.0 };
        yb[..2].copy_from_slice(&f16::from_f32(a / 127.0).to_bits().to_le_bytes());
        for (q, v) in yb[2..].iter_mut().zip(xb) {
            *q = (v * id).round_ties_even() as i8 as u8;
        }
    }
}

/// Q8_1: Q8_0 plus `s = d · Σq` (f16), used for the min term of Q4_1/Q5_1.
pub(crate) fn quantize_q8_1(x: &[f32], dst: &mut [u8]) {
    for (xb, yb) in x.chunks_exact(32).zip(dst.chunks_exact_mut(36)) {
        let a = amax(xb);
        let d = a / 127.0;
        let id = if a != 0.0 { 127.0 / a } else { 0.0 };
        let mut sum = 0i32;
        for (q, v) in yb[4..].iter_mut().zip(xb) {
            let qi = (v * id).round_ties_even() as i8;
            sum += qi as i32;
            *q = qi as u8;
        }
        yb[..2].copy_from_slice(&f16::from_f32(d).to_bits().to_le_bytes());
        yb[2..4].copy_from_slice(&f16::from_f32(d * sum as f32).to_bits().to_le_bytes());
    }
}

/// Q8_K: per 256 values `d = amax/127` (f32), `q = round_half_even(x · 127/amax)`, and the sum
/// of every 16 q's (`bsums`).
pub(crate) fn quantize_q8_k(x: &[f32], dst: &mut [u8]) {
    for (xb, yb) in x.chunks_exact(256).zip(dst.chunks_exact_mut(292)) {
        let a = amax(xb);
        let id = if a != 0.0 { 127.0 / a } else { 0.0 };
        yb[..4].copy_from_slice(&(a / 127.0).to_le_bytes());
        for (j, xs) in xb.chunks_exact(16).enumerate() {
            let mut sum = 0i32;
            for (l, v) in xs.iter().enumerate() {
                let q = (v * id).round_ties_even() as i8;
                sum += q as i32;
                yb[4 + 16 * j + l] = q as u8;
            }
            yb[260 + 2 * j..262 + 2 * j].copy_from_slice(&(sum as i16).to_le_bytes());
        }
    }
}

pub(crate) fn quantizer(p: Partner) -> QuantizeFn {
    match p {
        Partner::Q8_0 => quantize_q8_0,
        Partner::Q8_1 => quantize_q8_1,
        Partner::Q8K => quantize_q8_k,
    }
}

fn x_f32(x: &[u8], k: usize) -> f32 {
    f32_at(x, 4 * k)
}

pub(crate) fn dot_f32(n: usize, w: &[u8], x: &[u8]) -> f32 {
    (0..n).map(|k| f32_at(w, 4 * k) * x_f32(x, k)).sum()
}

pub(crate) fn dot_f16(n: usize, w: &[u8], x: &[u8]) -> f32 {
    (0..n).map(|k| f16_at(w, 2 * k) * x_f32(x, k)).sum()
}

pub(crate) fn dot_bf16(n: usize, w: &[u8], x: &[u8]) -> f32 {
    (0..n)
        .map(|k| {
            bf16::from_bits(u16::from_le_bytes([w[2 * k], w[2 * k + 1]])).to_f32() * x_f32(x, k)
        })
        .sum()
}

/// Σ over one 32-value legacy block of `weight(j) · q8[j]`, `q8` the Q8_0/Q8_1 values.
#[inline]
fn sum32(q8: &[u8], weight: impl Fn(usize) -> i32) -> i32 {
    (0..32).map(|j| weight(j) * q8[j] as i8 as i32).sum()
}

/// The 4-bit value j of a 16-byte nibble array (j < 16 low nibbles, j ≥ 16 high nibbles).
#[inline]
fn nib(qs: &[u8], j: usize) -> i32 {
    if j < 16 {
        (qs[j] & 0xF) as i32
    } else {
        (qs[j - 16] >> 4) as i32
    }
}

/// Bit 4 of Q5 value j (0 or 16) from the little-endian u32 `qh`.
#[inline]
fn q5_high(qh: &[u8], j: usize) -> i32 {
    (((qh[j / 8] >> (j % 8)) & 1) as i32) << 4
}

pub(crate) fn dot_q4_0(n: usize, w: &[u8], x: &[u8]) -> f32 {
    (0..n / 32)
        .map(|i| {
            let (b, y) = (&w[18 * i..18 * i + 18], &x[34 * i..34 * i + 34]);
            let s = sum32(&y[2..], |j| nib(&b[2..], j) - 8);
            s as f32 * f16_at(b, 0) * f16_at(y, 0)
        })
        .sum()
}

pub(crate) fn dot_q4_1(n: usize, w: &[u8], x: &[u8]) -> f32 {
    (0..n / 32)
        .map(|i| {
            let (b, y) = (&w[20 * i..20 * i + 20], &x[36 * i..36 * i + 36]);
            let s = sum32(&y[4..], |j| nib(&b[4..], j));
            s as f32 * f16_at(b, 0) * f16_at(y, 0) + f16_at(b, 2) * f16_at(y, 2)
        })
        .sum()
}

pub(crate) fn dot_q5_0(n: usize, w: &[u8], x: &[u8]) -> f32 {
    (0..n / 32)
        .map(|i| {
            let (b, y) = (&w[22 * i..22 * i + 22], &x[34 * i..34 * i + 34]);
            let s = sum32(&y[2..], |j| (nib(&b[6..], j) | q5_high(&b[2..6], j)) - 16);
            s as f32 * f16_at(b, 0) * f16_at(y, 0)
        })
        .sum()
}

pub(crate) fn dot_q5_1(n: usize, w: &[u8], x: &[u8]) -> f32 {
    (0..n / 32)
        .map(|i| {
            let (b, y) = (&w[24 * i..24 * i + 24], &x[36 * i..36 * i + 36]);
            let s = sum32(&y[4..], |j| nib(&b[8..], j) | q5_high(&b[4..8], j));
            s as f32 * f16_at(b, 0) * f16_at(y, 0) + f16_at(b, 2) * f16_at(y, 2)
        })
        .sum()
}

pub(crate) fn dot_q8_0(n: usize, w: &[u8], x: &[u8]) -> f32 {
    (0..n / 32)
        .map(|i| {
            let (b, y) = (&w[34 * i..34 * i + 34], &x[34 * i..34 * i + 34]);
            let s = sum32(&y[2..], |j| b[2 + j] as i8 as i32);
            s as f32 * f16_at(b, 0) * f16_at(y, 0)
        })
        .sum()
}

pub(crate) fn dot_iq4_nl(n: usize, w: &[u8], x: &[u8]) -> f32 {
    (0..n / 32)
        .map(|i| {
            let (b, y) = (&w[18 * i..18 * i + 18], &x[34 * i..34 * i + 34]);
            let s = sum32(&y[2..], |j| IQ4_NL_VALUES[nib(&b[2..], j) as usize] as i32);
            s as f32 * f16_at(b, 0) * f16_at(y, 0)
        })
        .sum()
}

/// Q8_K block `i` of `x`: (d, qs, bsums reader).
#[inline]
fn q8k(x: &[u8], i: usize) -> (f32, &[u8], &[u8]) {
    let y = &x[292 * i..292 * i + 292];
    (f32_at(y, 0), &y[4..260], &y[260..292])
}

/// The 8 six-bit scales and 8 mins of a Q4_K/Q5_K block (ggml's `get_scale_min_k4`).
#[inline]
pub(crate) fn scales_mins_k4(s: &[u8]) -> ([u8; 8], [u8; 8]) {
    let mut sc = [0u8; 8];
    let mut mn = [0u8; 8];
    for j in 0..8 {
        if j < 4 {
            sc[j] = s[j] & 63;
            mn[j] = s[j + 4] & 63;
        } else {
            sc[j] = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
            mn[j] = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
        }
    }
    (sc, mn)
}

/// Σ_j bsums[j] · mins[j/2]: the min term of Q4_K/Q5_K against a Q8_K block.
#[inline]
fn min_term(bsums: &[u8], mins: &[u8; 8]) -> i32 {
    (0..16).map(|j| i16_at(bsums, 2 * j) * mins[j / 2] as i32).sum()
}

pub(crate) fn dot_q4_k(n: usize, w: &[u8], x: &[u8]) -> f32 {
    (0..n / 256)
        .map(|i| {
            let b = &w[144 * i..144 * i + 144];
            let (yd, q8, bsums) = q8k(x, i);
            let (sc, mn) = scales_mins_k4(&b[4..16]);
            let qs = &b[16..];
            let mut sumi = 0i32;
            for j in 0..4 {
                let (mut lo, mut hi) = (0i32, 0i32);
                for l in 0..32 {
                    lo += (qs[32 * j + l] & 0xF) as i32 * q8[64 * j + l] as i8 as i32;
                    hi += (qs[32 * j + l] >> 4) as i32 * q8[64 * j + 32 + l] as i8 as i32;
                }
                sumi += lo * sc[2 * j] as i32 + hi * sc[2 * j + 1] as i32;
            }
            yd * (f16_at(b, 0) * sumi as f32 - f16_at(b, 2) * min_term(bsums, &mn) as f32)
        })
        .sum()
}

pub(crate) fn dot_q5_k(n: usize, w: &[u8], x: &[u8]) -> f32 {
    (0..n / 256)
        .map(|i| {
            let b = &w[176 * i..176 * i + 176];
            let (yd, q8, bsums) = q8k(x, i);
            let (sc, mn) = scales_mins_k4(&b[4..16]);
            let (qh, qs) = (&b[16..48], &b[48..]);
            let mut sumi = 0i32;
            for j in 0..4 {
                let (mut lo, mut hi) = (0i32, 0i32);
                for l in 0..32 {
                    let h_lo = ((qh[l] >> (2 * j)) & 1) as i32 * 16;
                    let h_hi = ((qh[l] >> (2 * j + 1)) & 1) as i32 * 16;
                    lo += ((qs[32 * j + l] & 0xF) as i32 + h_lo) * q8[64 * j + l] as i8 as i32;
                    hi += ((qs[32 * j + l] >> 4) as i32 + h_hi) * q8[64 * j + 32 + l] as i8 as i32;
                }
                sumi += lo * sc[2 * j] as i32 + hi * sc[2 * j + 1] as i32;
            }
            yd * (f16_at(b, 0) * sumi as f32 - f16_at(b, 2) * min_term(bsums, &mn) as f32)
        })
        .sum()
}

pub(crate) fn dot_q6_k(n: usize, w: &[u8], x: &[u8]) -> f32 {
    (0..n / 256)
        .map(|i| {
            let b = &w[210 * i..210 * i + 210];
            let (yd, q8, _) = q8k(x, i);
            let mut sumi = 0i32;
            for h in 0..2 {
                let (ql, qh) = (&b[64 * h..], &b[128 + 32 * h..]);
                let sc = &b[192 + 8 * h..];
                let q8 = &q8[128 * h..];
                for l in 0..32 {
                    let is = l / 16;
                    let v = [
                        ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i32 - 32,
                        ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32,
                        ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32,
                        ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32,
                    ];
                    for (k, v) in v.into_iter().enumerate() {
                        sumi += sc[is + 2 * k] as i8 as i32 * v * q8[l + 32 * k] as i8 as i32;
                    }
                }
            }
            yd * f16_at(b, 208) * sumi as f32
        })
        .sum()
}

/// The 16 signed scales of a Q3_K block (6-bit, stored biased by 32).
#[inline]
pub(crate) fn scales_q3_k(s: &[u8]) -> [i32; 16] {
    std::array::from_fn(|j| {
        let low = if j < 8 { s[j] & 0xF } else { s[j - 8] >> 4 };
        let high = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
        (low | (high << 4)) as i32 - 32
    })
}

pub(crate) fn dot_q3_k(n: usize, w: &[u8], x: &[u8]) -> f32 {
    (0..n / 256)
        .map(|i| {
            let b = &w[110 * i..110 * i + 110];
            let (yd, q8, _) = q8k(x, i);
            let (hm, qs) = (&b[..32], &b[32..96]);
            let sc = scales_q3_k(&b[96..108]);
            let mut sumi = 0i32;
            // Value v: 128-chunk h = v/128, shift pair s = (v%128)/32, l = v%32.
            for v in 0..256 {
                let (h, s, l) = (v / 128, (v % 128) / 32, v % 32);
                let low = ((qs[32 * h + l] >> (2 * s)) & 3) as i32;
                let high_set = hm[l] & (1 << (4 * h + s)) != 0;
                let q = low - if high_set { 0 } else { 4 };
                sumi += sc[v / 16] * q * q8[v] as i8 as i32;
            }
            yd * f16_at(b, 108) * sumi as f32
        })
        .sum()
}

pub(crate) fn dot_q2_k(n: usize, w: &[u8], x: &[u8]) -> f32 {
    (0..n / 256)
        .map(|i| {
            let b = &w[84 * i..84 * i + 84];
            let (yd, q8, bsums) = q8k(x, i);
            let (sc, qs) = (&b[..16], &b[16..80]);
            let summs: i32 = (0..16).map(|j| i16_at(bsums, 2 * j) * (sc[j] >> 4) as i32).sum();
            let mut sumi = 0i32;
            for v in 0..256 {
                let (h, s, l) = (v / 128, (v % 128) / 32, v % 32);
                let q = ((qs[32 * h + l] >> (2 * s)) & 3) as i32;
                sumi += (sc[v / 16] & 0xF) as i32 * q * q8[v] as i8 as i32;
            }
            yd * (f16_at(b, 80) * sumi as f32 - f16_at(b, 82) * summs as f32)
        })
        .sum()
}

/// The 6-bit scale of 32-value sub-block `ib` of an IQ4_XS block, minus its bias of 32.
#[inline]
pub(crate) fn scale_iq4_xs(b: &[u8], ib: usize) -> i32 {
    let sh = u16::from_le_bytes([b[2], b[3]]);
    let low = (b[4 + ib / 2] >> (4 * (ib % 2))) & 0xF;
    let high = ((sh >> (2 * ib)) & 3) as u8;
    (low | (high << 4)) as i32 - 32
}

pub(crate) fn dot_iq4_xs(n: usize, w: &[u8], x: &[u8]) -> f32 {
    (0..n / 256)
        .map(|i| {
            let b = &w[136 * i..136 * i + 136];
            let (yd, q8, _) = q8k(x, i);
            let sumi: i32 = (0..8)
                .map(|ib| {
                    let s = sum32(&q8[32 * ib..], |j| {
                        IQ4_NL_VALUES[nib(&b[8 + 16 * ib..], j) as usize] as i32
                    });
                    s * scale_iq4_xs(b, ib)
                })
                .sum();
            yd * f16_at(b, 0) * sumi as f32
        })
        .sum()
}

/// Wrap a scalar `dot` into a [`DotKernels`] (the multi-row kernels call it once per row).
macro_rules! scalar_kernels {
    ($dot:ident) => {
        kernels_from_row!(|n, wr, x, stride| -> [f32; N] {
            std::array::from_fn(|c| $dot(n, wr, &x[c * stride..]))
        })
    };
}

pub(crate) fn dot_kernels(ty: GgmlType) -> Option<DotKernels> {
    use GgmlType::*;
    Some(match ty {
        F32 => scalar_kernels!(dot_f32),
        F16 => scalar_kernels!(dot_f16),
        BF16 => scalar_kernels!(dot_bf16),
        Q4_0 => scalar_kernels!(dot_q4_0),
        Q4_1 => scalar_kernels!(dot_q4_1),
        Q5_0 => scalar_kernels!(dot_q5_0),
        Q5_1 => scalar_kernels!(dot_q5_1),
        Q8_0 => scalar_kernels!(dot_q8_0),
        IQ4NL => scalar_kernels!(dot_iq4_nl),
        Q2K => scalar_kernels!(dot_q2_k),
        Q3K => scalar_kernels!(dot_q3_k),
        Q4K => scalar_kernels!(dot_q4_k),
        Q5K => scalar_kernels!(dot_q5_k),
        Q6K => scalar_kernels!(dot_q6_k),
        IQ4XS => scalar_kernels!(dot_iq4_xs),
        Q8_1 | Q8K | no_kernel_types!() => return None,
    })
}
