//! Scalar reference quantize: f32 row → GGUF blocks, following ggml's `quantize_row_*_ref`
//! (no importance matrix) step for step, so files snug writes quantize like llama-quantize's
//! defaults. Cost: Q4_0..Q8_1 and Q8_K one pass per block; K-quants search ~20 trial scales per
//! sub-block, run across sub-blocks at once; IQ4_NL/IQ4_XS are bound by codebook lookups
//! (throughputs in BENCHMARKS.md).

// Index loops mirror ggml's C so the two can be read side by side.
#![allow(clippy::needless_range_loop)]

use bytemuck::Zeroable;
use half::{bf16, f16};

use crate::blocks::{with_block, *};
use crate::{GgmlType, QuantError};

mod search;

use search::{
    best_index_iq4, iq4_sub_scales, make_q3_quants, make_qx_quants, nearest_int, signed_absmax,
    QkxSearch, GROUP_MAX_EPS,
};

/// Quantize one row: `src` holds the row's f32 values; `dst` receives them as type `ty`, blocks
/// back to back (`ty.row_bytes(src.len())` bytes, checked).
///
/// Errors if `src.len()` is not a whole number of blocks, if `dst` is not exactly one row long,
/// or if snug has no quantizer for `ty` ([`QuantError::CannotQuantize`]; see [`can_quantize`]).
pub fn quantize_row(ty: GgmlType, src: &[f32], dst: &mut [u8]) -> Result<(), QuantError> {
    use GgmlType::*;
    if !can_quantize(ty) {
        return Err(QuantError::CannotQuantize(ty));
    }
    QuantError::check_row(ty, src.len(), dst.len())?;
    match ty {
        F32 => {
            for (b, x) in dst.chunks_exact_mut(4).zip(src) {
                b.copy_from_slice(&x.to_le_bytes());
            }
        }
        F16 => {
            for (b, x) in dst.chunks_exact_mut(2).zip(src) {
                b.copy_from_slice(&f16::from_f32(*x).to_le_bytes());
            }
        }
        BF16 => {
            for (b, x) in dst.chunks_exact_mut(2).zip(src) {
                b.copy_from_slice(&f32_to_bf16(*x).to_le_bytes());
            }
        }
        _ => with_block!(ty, blocks(src, dst), return Err(QuantError::CannotQuantize(ty))),
    }
    Ok(())
}

/// Whether [`quantize_row`] handles `ty`: every format snug reads it can also write.
pub const fn can_quantize(ty: GgmlType) -> bool {
    crate::can_dequantize(ty)
}

/// A block that can be built from `Self::VALUES` floats.
pub trait Quantize: Block {
    /// Quantize `x` (`x.len() == Self::VALUES`) into one block.
    fn quantize(x: &[f32]) -> Self;
}

/// Quantize whole blocks; lengths were checked by the caller.
fn blocks<B: Quantize>(src: &[f32], dst: &mut [u8]) {
    for (x, out) in src.chunks_exact(B::VALUES).zip(dst.chunks_exact_mut(B::BYTES)) {
        out.copy_from_slice(bytemuck::bytes_of(&B::quantize(x)));
    }
}

/// ggml's f32 → bf16: round to nearest even, NaN kept NaN (quiet bit forced).
fn f32_to_bf16(x: f32) -> bf16 {
    let u = x.to_bits();
    if u & 0x7fff_ffff > 0x7f80_0000 {
        return bf16::from_bits(((u >> 16) | 64) as u16);
    }
    bf16::from_bits(((u as u64 + (0x7fff + ((u >> 16) & 1)) as u64) >> 16) as u16)
}

/// `d != 0 ? 1/d : 0`.
#[inline]
fn inverse(d: f32) -> f32 {
    if d != 0.0 {
        1.0 / d
    } else {
        0.0
    }
}

/// (min, max) with ggml's initial values (FLT_MAX, -FLT_MAX).
#[inline]
fn min_max(x: &[f32]) -> (f32, f32) {
    let (mut min, mut max) = (f32::MAX, -f32::MAX);
    for &v in x {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    (min, max)
}

/// Pack 32 small values (< 16) as Q4_0 orders them: byte j = value j | value j + 16 << 4.
#[inline]
fn pack_nibbles(l: impl Fn(usize) -> u8) -> [u8; 16] {
    std::array::from_fn(|j| (l(j) & 0xF) | ((l(j + 16) & 0xF) << 4))
}

/// Bit 4 of each of 32 values, as the little-endian u32 `qh` of Q5_0/Q5_1.
#[inline]
fn pack_fifth_bits(l: impl Fn(usize) -> u8) -> [u8; 4] {
    let qh = (0..32).fold(0u32, |qh, j| qh | (u32::from((l(j) >> 4) & 1) << j));
    qh.to_le_bytes()
}

impl Quantize for BlockQ4_0 {
    fn quantize(x: &[f32]) -> Self {
        let d = signed_absmax(x) / -8.0;
        let id = inverse(d);
        let l = |j: usize| ((x[j] * id + 8.5) as i8).clamp(0, 15) as u8;
        BlockQ4_0 { d: f16::from_f32(d), qs: pack_nibbles(l) }
    }
}

impl Quantize for BlockQ4_1 {
    fn quantize(x: &[f32]) -> Self {
        let (min, max) = min_max(x);
        let d = (max - min) / 15.0;
        let id = inverse(d);
        let l = |j: usize| (((x[j] - min) * id + 0.5) as i8).clamp(0, 15) as u8;
        BlockQ4_1 { d: f16::from_f32(d), m: f16::from_f32(min), qs: pack_nibbles(l) }
    }
}

impl Quantize for BlockQ5_0 {
    fn quantize(x: &[f32]) -> Self {
        let d = signed_absmax(x) / -16.0;
        let id = inverse(d);
        let l = |j: usize| ((x[j] * id + 16.5) as i8).clamp(0, 31) as u8;
        BlockQ5_0 { d: f16::from_f32(d), qh: pack_fifth_bits(l), qs: pack_nibbles(l) }
    }
}

impl Quantize for BlockQ5_1 {
    fn quantize(x: &[f32]) -> Self {
        let (min, max) = min_max(x);
        let d = (max - min) / 31.0;
        let id = inverse(d);
        let l = |j: usize| (((x[j] - min) * id + 0.5) as u8).min(31);
        BlockQ5_1 {
            d: f16::from_f32(d),
            m: f16::from_f32(min),
            qh: pack_fifth_bits(l),
            qs: pack_nibbles(l),
        }
    }
}

/// Q8_0/Q8_1 core: `d = amax / 127`, `q = round(x / d)` (half away from zero, as `roundf`).
#[inline]
fn q8_symmetric(x: &[f32]) -> (f32, [i8; QK]) {
    let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
    let d = amax / 127.0;
    let id = inverse(d);
    (d, std::array::from_fn(|j| (x[j] * id).round() as i8))
}

impl Quantize for BlockQ8_0 {
    fn quantize(x: &[f32]) -> Self {
        let (d, qs) = q8_symmetric(x);
        BlockQ8_0 { d: f16::from_f32(d), qs }
    }
}

impl Quantize for BlockQ8_1 {
    fn quantize(x: &[f32]) -> Self {
        let (d, qs) = q8_symmetric(x);
        let sum: i32 = qs.iter().map(|&q| i32::from(q)).sum();
        BlockQ8_1 { d: f16::from_f32(d), s: f16::from_f32(sum as f32 * d), qs }
    }
}

impl Quantize for BlockQ8K {
    fn quantize(x: &[f32]) -> Self {
        let max = signed_absmax(x);
        if max == 0.0 {
            return BlockQ8K::zeroed();
        }
        let iscale = -127.0 / max;
        let qs: [i8; QK_K] = std::array::from_fn(|j| nearest_int(iscale * x[j]).min(127) as i8);
        let bsums =
            std::array::from_fn(|i| qs[16 * i..16 * i + 16].iter().map(|&q| i16::from(q)).sum());
        BlockQ8K { d: 1.0 / iscale, qs, bsums }
    }
}

/// Pack 256 2-bit values as Q2_K/Q3_K do: byte 32h + l (h = 128-value half) holds values
/// 128h + l + 32k at bit shift 2k, k = 0..4.
fn pack_2bit(l: &[u8; QK_K]) -> [u8; QK_K / 4] {
    std::array::from_fn(|i| {
        let (h, l0) = (i / 32, i % 32);
        (0..4).fold(0u8, |b, k| b | ((l[128 * h + l0 + 32 * k] & 3) << (2 * k)))
    })
}

impl Quantize for BlockQ2K {
    fn quantize(x: &[f32]) -> Self {
        let mut l = [0u8; QK_K];
        let weights: [f32; QK_K] = std::array::from_fn(|i| x[i].abs());
        let fit = QkxSearch { nmax: 3, rmin: -0.5, rdelta: 0.1, nstep: 15, use_mad: true };
        let (scales, mins) = fit.run::<16, 16>(x, &weights, &mut l);
        let max_scale = scales.iter().fold(0f32, |m, &s| if s > m { s } else { m });
        let max_min = mins.iter().fold(0f32, |m, &s| if s > m { s } else { m });
        let mut b = BlockQ2K::zeroed();
        if max_scale > 0.0 {
            let iscale = 15.0 / max_scale;
            for j in 0..16 {
                b.scales[j] = nearest_int(iscale * scales[j]) as u8;
            }
            b.d = f16::from_f32(max_scale / 15.0);
        }
        if max_min > 0.0 {
            let iscale = 15.0 / max_min;
            for j in 0..16 {
                b.scales[j] |= (nearest_int(iscale * mins[j]) as u8) << 4;
            }
            b.dmin = f16::from_f32(max_min / 15.0);
        }
        for j in 0..16 {
            let d = b.d.to_f32() * f32::from(b.scales[j] & 0xF);
            if d == 0.0 {
                continue;
            }
            let dm = b.dmin.to_f32() * f32::from(b.scales[j] >> 4);
            for i in 16 * j..16 * j + 16 {
                l[i] = nearest_int((x[i] + dm) / d).clamp(0, 3) as u8;
            }
        }
        b.qs = pack_2bit(&l);
        b
    }
}

impl Quantize for BlockQ3K {
    fn quantize(x: &[f32]) -> Self {
        let mut l = [0u8; QK_K];
        let mut scales = [0f32; 16];
        let (mut amax, mut max_scale) = (0f32, 0f32);
        for j in 0..16 {
            scales[j] = make_q3_quants(&x[16 * j..16 * j + 16], &mut l[16 * j..16 * j + 16]);
            if scales[j].abs() > amax {
                (amax, max_scale) = (scales[j].abs(), scales[j]);
            }
        }
        let mut b = BlockQ3K::zeroed();
        if max_scale != 0.0 {
            let iscale = -32.0 / max_scale;
            for j in 0..16 {
                // ggml stores nearest_int into an int8_t before clamping.
                let ls = ((nearest_int(iscale * scales[j]) as i8).clamp(-32, 31) + 32) as u8;
                if j < 8 {
                    b.scales[j] = ls & 0xF;
                } else {
                    b.scales[j - 8] |= (ls & 0xF) << 4;
                }
                b.scales[8 + j % 4] |= (ls >> 4) << (2 * (j / 4));
            }
            b.d = f16::from_f32(1.0 / iscale);
        }
        let sc = scales_q3k(&b.scales);
        for j in 0..16 {
            let d = b.d.to_f32() * f32::from(sc[j]);
            if d == 0.0 {
                continue;
            }
            for i in 16 * j..16 * j + 16 {
                l[i] = (nearest_int(x[i] / d).clamp(-4, 3) + 4) as u8;
            }
        }
        // High bit of value v goes to bit v / 32 of hmask[v % 32].
        for (v, q) in l.iter_mut().enumerate() {
            if *q > 3 {
                b.hmask[v % 32] |= 1 << (v / 32);
                *q -= 4;
            }
        }
        b.qs = pack_2bit(&l);
        b
    }
}

/// Pack 8 6-bit (scale, min) pairs into Q4_K/Q5_K's 12 bytes (inverse of [`scale_min_k4`]).
fn pack_scale_min_k4(ls: &[u8; 8], lm: &[u8; 8]) -> [u8; K_SCALE_SIZE] {
    let mut q = [0u8; K_SCALE_SIZE];
    for j in 0..8 {
        if j < 4 {
            q[j] = ls[j];
            q[j + 4] = lm[j];
        } else {
            q[j + 4] = (ls[j] & 0xF) | ((lm[j] & 0xF) << 4);
            q[j - 4] |= (ls[j] >> 4) << 6;
            q[j] |= (lm[j] >> 4) << 6;
        }
    }
    q
}

/// Shared Q4_K/Q5_K quantizer: per 32-value sub-block fit (scale, min) with values 0..=nmax,
/// quantize the 8 scales and 8 mins to 6 bits against f16 super-scales, then requantize the
/// values against the rounded scales. Returns (d, dmin, packed scales, 256 levels).
fn k4_quantize(x: &[f32], fit: QkxSearch) -> (f16, f16, [u8; K_SCALE_SIZE], [u8; QK_K]) {
    let mut l = [0u8; QK_K];
    let mut weights = [0f32; QK_K];
    for (xs, w) in x.chunks_exact(32).zip(weights.chunks_exact_mut(32)) {
        let av_x = (xs.iter().fold(0f32, |s, v| s + v * v) / 32.0).sqrt();
        for (w, v) in w.iter_mut().zip(xs) {
            *w = av_x + v.abs();
        }
    }
    let (scales, mins) = fit.run::<8, 32>(x, &weights, &mut l);
    let max_scale = scales.iter().fold(0f32, |m, &s| if s > m { s } else { m });
    let max_min = mins.iter().fold(0f32, |m, &s| if s > m { s } else { m });
    let inv_scale = if max_scale > 0.0 { 63.0 / max_scale } else { 0.0 };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let ls: [u8; 8] = std::array::from_fn(|j| (nearest_int(inv_scale * scales[j]) as u8).min(63));
    let lm: [u8; 8] = std::array::from_fn(|j| (nearest_int(inv_min * mins[j]) as u8).min(63));
    let packed = pack_scale_min_k4(&ls, &lm);
    let (d, dmin) = (f16::from_f32(max_scale / 63.0), f16::from_f32(max_min / 63.0));
    for j in 0..8 {
        let (sc, m) = scale_min_k4(j, &packed);
        let dj = d.to_f32() * f32::from(sc);
        if dj == 0.0 {
            continue;
        }
        let dm = dmin.to_f32() * f32::from(m);
        for i in 32 * j..32 * j + 32 {
            l[i] = nearest_int((x[i] + dm) / dj).clamp(0, i32::from(fit.nmax)) as u8;
        }
    }
    (d, dmin, packed, l)
}

impl Quantize for BlockQ4K {
    fn quantize(x: &[f32]) -> Self {
        let fit = QkxSearch { nmax: 15, rmin: -1.0, rdelta: 0.1, nstep: 20, use_mad: false };
        let (d, dmin, scales, l) = k4_quantize(x, fit);
        // Chunk c of 64 values → qs[32c..32c+32]: first 32 in low nibbles, next 32 in high.
        let qs = std::array::from_fn(|i| {
            let (c, j) = (i / 32, i % 32);
            l[64 * c + j] | (l[64 * c + j + 32] << 4)
        });
        BlockQ4K { d, dmin, scales, qs }
    }
}

impl Quantize for BlockQ5K {
    fn quantize(x: &[f32]) -> Self {
        let fit = QkxSearch { nmax: 31, rmin: -0.5, rdelta: 0.1, nstep: 15, use_mad: false };
        let (d, dmin, scales, l) = k4_quantize(x, fit);
        // As Q4_K for the low nibbles; bit 4 of value v → bit v / 32 of qh[v % 32].
        let qs = std::array::from_fn(|i| {
            let (c, j) = (i / 32, i % 32);
            (l[64 * c + j] & 0xF) | ((l[64 * c + j + 32] & 0xF) << 4)
        });
        let qh =
            std::array::from_fn(|j| (0..8).fold(0u8, |h, k| h | (((l[32 * k + j] >> 4) & 1) << k)));
        BlockQ5K { d, dmin, scales, qh, qs }
    }
}

impl Quantize for BlockQ6K {
    fn quantize(x: &[f32]) -> Self {
        let mut l = [0u8; QK_K];
        let scales = make_qx_quants::<16, 16>(x, 32, &mut l);
        let (mut max_abs, mut max_scale) = (0f32, 0f32);
        for &s in &scales {
            if s.abs() > max_abs {
                (max_abs, max_scale) = (s.abs(), s);
            }
        }
        if max_abs < GROUP_MAX_EPS {
            return BlockQ6K::zeroed();
        }
        let iscale = -128.0 / max_scale;
        let mut b = BlockQ6K::zeroed();
        b.d = f16::from_f32(1.0 / iscale);
        for j in 0..16 {
            b.scales[j] = nearest_int(iscale * scales[j]).min(127) as i8;
        }
        for j in 0..16 {
            let d = b.d.to_f32() * f32::from(b.scales[j]);
            if d == 0.0 {
                continue;
            }
            for i in 16 * j..16 * j + 16 {
                l[i] = (nearest_int(x[i] / d).clamp(-32, 31) + 32) as u8;
            }
        }
        // Half h (128 values): value 128h + 32k + j has its low nibble in
        // ql[64h + j + 32 * (k % 2)] (k < 2: low nibble, else high) and top 2 bits in
        // qh[32h + j] at shift 2k.
        for h in 0..2 {
            for j in 0..32 {
                let v = |k: usize| l[128 * h + 32 * k + j];
                b.ql[64 * h + j] = (v(0) & 0xF) | ((v(2) & 0xF) << 4);
                b.ql[64 * h + j + 32] = (v(1) & 0xF) | ((v(3) & 0xF) << 4);
                b.qh[32 * h + j] = (0..4).fold(0u8, |q, k| q | ((v(k) >> 4) << (2 * k)));
            }
        }
        b
    }
}

/// ggml's `quantize_row_iq4_nl_impl` without importance weights (weight x²) and with
/// `ntry = 7` (what `quantize_iq4_nl`/`quantize_iq4_xs`, hence llama-quantize, use): per
/// 32-value sub-block, search 15 scales for the best codebook fit. With 8 sub-blocks (IQ4_XS) the
/// sub-block scales become 6-bit multiples of `d = -max_scale / 32` and the values are re-fit to
/// them. Returns (d, 6-bit scale + 32 per sub-block, packed nibbles as Q4_0 orders them).
fn iq4_quantize<const L: usize, const N: usize, const Q: usize>(
    x: &[f32],
) -> (f16, [u8; 8], [u8; Q]) {
    let nsub = L;
    let mut l = [0u8; N];
    let scales = iq4_sub_scales::<L>(x);
    let (mut amax_scale, mut max_scale) = (0f32, 0f32);
    for &d in &scales {
        if d.abs() > amax_scale {
            (amax_scale, max_scale) = (d.abs(), d);
        }
    }
    let mut ls = [0u8; 8];
    let dh;
    if nsub > 1 {
        let d = -max_scale / 32.0;
        dh = f16::from_f32(d);
        let id = inverse(d);
        for ib in 0..nsub {
            let s = nearest_int(id * scales[ib]).clamp(-32, 31);
            let idl = inverse(d * s as f32);
            for j in 32 * ib..32 * ib + 32 {
                l[j] = best_index_iq4(idl * x[j]);
            }
            ls[ib] = (s + 32) as u8;
        }
    } else {
        dh = f16::from_f32(scales[0]);
        let id = inverse(scales[0]);
        for j in 0..N {
            l[j] = best_index_iq4(id * x[j]);
        }
    }
    let qs = std::array::from_fn(|i| {
        let (b, j) = (i / 16, i % 16);
        l[32 * b + j] | (l[32 * b + 16 + j] << 4)
    });
    (dh, ls, qs)
}

impl Quantize for BlockIQ4NL {
    fn quantize(x: &[f32]) -> Self {
        let (d, _, qs) = iq4_quantize::<1, QK, { QK / 2 }>(x);
        BlockIQ4NL { d, qs }
    }
}

impl Quantize for BlockIQ4XS {
    fn quantize(x: &[f32]) -> Self {
        let (d, ls, qs) = iq4_quantize::<8, QK_K, { QK_K / 2 }>(x);
        let scales_l = std::array::from_fn(|i| (ls[2 * i] & 0xF) | ((ls[2 * i + 1] & 0xF) << 4));
        let scales_h = (0..8).fold(0u16, |h, ib| h | (u16::from(ls[ib] >> 4) << (2 * ib)));
        BlockIQ4XS { d, scales_h, scales_l, qs }
    }
}
