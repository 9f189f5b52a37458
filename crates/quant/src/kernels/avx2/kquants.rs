//! AVX2 K-quant kernels against Q8_K (Q2_K..Q6_K, IQ4_XS), generic over the number of
//! activation rows like the rest of the AVX2 path. Q4_K/Q5_K share one body (8 six-bit
//! scales + mins, mins via the Q8_K block sums); Q2_K/Q3_K/Q6_K share another (16 scales, the
//! value offset or mins folded in through the block sums). Cost for one row: ~74 instructions
//! and ~21 cycles per Q4_K block (llvm-mca, znver3), bounded by the four vector pipes (shuffles
//! and shifts share two of them), so every vector op saved counts; in a tile, by the two
//! integer-multiply pipes.

//! # Safety
//! Every `unsafe fn` here has one contract: the CPU has AVX2, FMA and F16C (plus whatever the
//! calling wrapper's feature string adds); `n` is a whole number of weight and activation
//! blocks; `w` holds a full weight row of `n` values; `x` holds `C` full activation rows at a
//! stride of `xs` bytes (quantizers: `dst` holds the quantized row). The dispatcher in
//! `kernels/mod.rs` checks all of this before the first call.

// Index loops over the C activation rows read more plainly than zipped iterators here.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use super::{
    f16_at, f16_end_at, f16x2_at, f16x4_at, hsum_all, load, mul_i8_i16, nibbles_32, prefetch_block,
};
use crate::blocks::IQ4_NL_VALUES;

/// `n`, hidden from the optimizer when `C > 1` (see the use in the K-quant kernels).
#[inline(always)]
fn sub_blocks<const C: usize>(n: usize) -> usize {
    if C > 1 {
        std::hint::black_box(n)
    } else {
        n
    }
}

/// `vpshufb` of `v` by the 32-byte control `ctrl`, as exactly one instruction with the control
/// read from memory. Through the intrinsic LLVM rewrites a shuffle that splats one i16 into an
/// extract plus `vpbroadcastw`, and a shuffle of a broadcast 128-bit load into a 128-bit shuffle
/// plus `vpermq`: extra ops on the vector shuffle pipes, which bound a Q4_K block.
///
/// # Safety
/// The CPU has AVX2 (the callers' contract).
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn shuffle_mem(v: __m256i, ctrl: &Ctrl) -> __m256i {
    let r: __m256i;
    // SAFETY: AVX2 per the contract; the instruction reads only the 32 bytes of `ctrl`.
    unsafe {
        std::arch::asm!(
            "vpshufb {r}, {v}, ymmword ptr [{c}]",
            r = lateout(ymm_reg) r,
            v = in(ymm_reg) v,
            c = in(reg) ctrl.0.as_ptr(),
            options(pure, readonly, nostack, preserves_flags)
        );
    }
    r
}

/// A `vpshufb` control (both 128-bit halves shuffle the same way; 0x80 writes a zero byte).
#[repr(C, align(32))]
pub(crate) struct Ctrl([u8; 32]);

/// Both halves of a 256-bit control from one 16-byte pattern.
const fn ctrl(half: [u8; 16]) -> Ctrl {
    let mut c = [0; 32];
    let mut k = 0;
    while k < 32 {
        c[k] = half[k % 16];
        k += 1;
    }
    Ctrl(c)
}

/// `K4_SPLAT[s]`: byte `s` zero-extended into every i16 (one Q4_K/Q5_K scale per 32 values).
static K4_SPLAT: [Ctrl; 8] = {
    let z = 0x80;
    let mut t = [const { Ctrl([0; 32]) }; 8];
    let mut s = 0;
    while s < 8 {
        let b = s as u8;
        t[s] = ctrl([b, z, b, z, b, z, b, z, b, z, b, z, b, z, b, z]);
        s += 1;
    }
    t
};

/// Q4_K/Q5_K header shuffles: low bits and high bits (see [`k4_scales_mins`]), and the 8 mins
/// (bytes 8..16) zero-extended to the 16 Q8_K bsum lanes (lane l = min l/2; the high half of
/// the register takes lanes 8..16).
static K4_LO: Ctrl = ctrl([0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11]);
static K4_HI: Ctrl = {
    let z = 0x80;
    ctrl([z, z, z, z, 0, 1, 2, 3, z, z, z, z, 4, 5, 6, 7])
};
pub(crate) static K4_MINS16: Ctrl = {
    let z = 0x80;
    Ctrl([
        8, z, 8, z, 9, z, 9, z, 10, z, 10, z, 11, z, 11, z, //
        12, z, 12, z, 13, z, 13, z, 14, z, 14, z, 15, z, 15, z,
    ])
};

/// Q4_K/Q5_K scales (bytes 0..8) and mins (bytes 8..16) in both 128-bit halves, unpacked from
/// the 12 packed bytes at `s` with two byte shuffles instead of scalar bit-twiddling (the
/// header was a third of the instructions of a block). Kept as bytes: each use zero-extends
/// what it needs in the one shuffle that places it. Reads 16 bytes: the quants follow.
#[inline(always)]
pub(crate) unsafe fn k4_scales_mins(s: *const u8) -> __m256i {
    let v = _mm256_broadcastsi128_si256(_mm_loadu_si128(s.cast()));
    // Low bits: scale j<4 = s[j]&63, scale j≥4 = s[j+4]&15, min j<4 = s[j+4]&63,
    // min j≥4 = s[j+4]>>4.
    // One per-dword shift takes s[8..12] >> 4 into the fourth dword (the mask drops what
    // crosses in from the next byte).
    let a = shuffle_mem(v, &K4_LO);
    let a = _mm256_srlv_epi32(a, _mm256_setr_epi32(0, 0, 0, 4, 0, 0, 0, 4));
    let m = i64::from_le_bytes([63, 63, 63, 63, 15, 15, 15, 15]);
    let lo = _mm256_and_si256(a, _mm256_set1_epi64x(m));
    // High two bits of the j≥4 entries: bits 6..7 of s[j-4] (scales) and s[j] (mins), to 4..5.
    let b = shuffle_mem(v, &K4_HI);
    let hi = _mm256_and_si256(_mm256_srli_epi16::<2>(b), _mm256_set1_epi8(0x30));
    _mm256_or_si256(lo, hi)
}

/// End of one K-quant block for each activation row c (Q8_K block at `y0 + c·xs`):
/// `acc[c] += yd_c · (d·sumi[c] − bias_mul·Σ_k bias16[k]·bsums_c[k])`, the weight scales
/// broadcast once per block and each row's scale loaded straight into a broadcast.
#[inline(always)]
unsafe fn block_epilogue<const C: usize>(
    acc: &mut [__m256; C],
    sumi: &[__m256i; C],
    y0: *const u8,
    xs: usize,
    d: f32,
    bias_mul: f32,
    bias16: __m256i,
) {
    let (dv, bv) = (_mm256_set1_ps(d), _mm256_set1_ps(bias_mul));
    for c in 0..C {
        let y = y0.add(c * xs);
        let bias = _mm256_cvtepi32_ps(_mm256_madd_epi16(bias16, load(y.add(260))));
        let t = _mm256_fnmadd_ps(bv, bias, _mm256_mul_ps(dv, _mm256_cvtepi32_ps(sumi[c])));
        acc[c] = _mm256_fmadd_ps(_mm256_broadcast_ss(&*y.cast::<f32>()), t, acc[c]);
    }
}

/// A Q4_K or Q5_K block: the 8 unsigned 32-value groups (pairs per 64), read one 64 at a time.
pub(crate) trait K4Like {
    const BYTES: usize;
    /// Values 64j..64j+32 and 64j+32..64j+64 as unsigned bytes.
    unsafe fn pair(b: *const u8, j: usize) -> (__m256i, __m256i);
}

pub(crate) struct Q4KW;
pub(crate) struct Q5KW;

impl K4Like for Q4KW {
    const BYTES: usize = 144;
    #[inline(always)]
    unsafe fn pair(b: *const u8, j: usize) -> (__m256i, __m256i) {
        let q = load(b.add(16 + 32 * j));
        let m4 = _mm256_set1_epi8(0xF);
        (_mm256_and_si256(q, m4), _mm256_and_si256(_mm256_srli_epi16::<4>(q), m4))
    }
}

impl K4Like for Q5KW {
    const BYTES: usize = 176;
    #[inline(always)]
    unsafe fn pair(b: *const u8, j: usize) -> (__m256i, __m256i) {
        let q = load(b.add(48 + 32 * j));
        let m4 = _mm256_set1_epi8(0xF);
        let hb = load(b.add(16));
        let bit = |k: usize| {
            // Bit k of every qh byte → 16 (or 0) per byte.
            let m = _mm256_set1_epi8(1 << k);
            _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hb, m), m), _mm256_set1_epi8(16))
        };
        let lo = _mm256_or_si256(_mm256_and_si256(q, m4), bit(2 * j));
        let hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(q), m4), bit(2 * j + 1));
        (lo, hi)
    }
}

#[inline(always)]
pub(crate) unsafe fn dot_k4<W: K4Like, const C: usize>(
    n: usize,
    w: &[u8],
    x: &[u8],
    xs: usize,
) -> [f32; C] {
    let (wp, xp) = (w.as_ptr(), x.as_ptr());
    let mut acc = [_mm256_setzero_ps(); C];
    for i in 0..n / 256 {
        let b = wp.add(i * W::BYTES);
        prefetch_block::<C>(b, W::BYTES);
        let y0 = xp.add(292 * i);
        let (d, dmin) = f16x2_at(b);
        let sm = k4_scales_mins(b.add(4));
        let mut sumi = [_mm256_setzero_si256(); C];
        // An opaque trip count keeps LLVM from unrolling and interleaving the sub-blocks, which
        // needs more than 16 registers with an 8-row tile and spills (measured with llvm-mca).
        for j in 0..sub_blocks::<C>(4) {
            let (ql, qh) = W::pair(b, j);
            let sl = shuffle_mem(sm, &K4_SPLAT[(2 * j) % 8]);
            let sh = shuffle_mem(sm, &K4_SPLAT[(2 * j + 1) % 8]);
            for c in 0..C {
                let y = y0.add(c * xs + 4 + 64 * j);
                let pl = _mm256_madd_epi16(sl, _mm256_maddubs_epi16(ql, load(y)));
                let ph = _mm256_madd_epi16(sh, _mm256_maddubs_epi16(qh, load(y.add(32))));
                sumi[c] = _mm256_add_epi32(sumi[c], _mm256_add_epi32(pl, ph));
            }
        }
        // Min term Σ_k bsums[k] · min[k/2], kept in 8 lanes until the end.
        let mins16 = shuffle_mem(sm, &K4_MINS16);
        block_epilogue(&mut acc, &sumi, y0, xs, d, dmin, mins16);
    }
    hsum_all(&acc, [0.0; C])
}

/// A K-quant with one scale per 16 values laid out in two 128-value halves (Q2_K, Q3_K, Q6_K):
/// unsigned values `u`, and a per-16 bias folded in with the Q8_K block sums, so that
/// `dot = d·yd·Σ scale·u·q8 − bias_mul·yd·Σ_k bias_k·bsum_k`.
pub(crate) trait K16Like {
    const BYTES: usize;
    /// `Some(k)` when `bias_mul = 2^k · d` (a fixed value offset, not a float min): the bias
    /// term then comes off the integer sum before the one conversion.
    const BIAS_SHIFT: Option<i32> = None;
    /// (d, bias_mul, scales as 16 × i16, bias as 16 × i16) of the block at `b`.
    unsafe fn header(b: *const u8) -> (f32, f32, __m256i, __m256i);
    /// Unsigned values 128h + 32k .. +32 of the block at `b`.
    unsafe fn values(b: *const u8, h: usize, k: usize) -> __m256i;
}

pub(crate) struct Q2KW;
pub(crate) struct Q3KW;
pub(crate) struct Q6KW;

/// `(v >> 2k) & 3` per byte.
#[inline(always)]
unsafe fn crumb(v: __m256i, k: usize) -> __m256i {
    let s = match k {
        0 => v,
        1 => _mm256_srli_epi16::<2>(v),
        2 => _mm256_srli_epi16::<4>(v),
        _ => _mm256_srli_epi16::<6>(v),
    };
    _mm256_and_si256(s, _mm256_set1_epi8(3))
}

impl K16Like for Q2KW {
    const BYTES: usize = 84;
    #[inline(always)]
    unsafe fn header(b: *const u8) -> (f32, f32, __m256i, __m256i) {
        let sm = _mm256_cvtepu8_epi16(_mm_loadu_si128(b.cast()));
        let sc = _mm256_and_si256(sm, _mm256_set1_epi16(0xF));
        let v = f16x4_at(b.add(76)); // lanes 2, 3: d, dmin (the block's last 4 bytes)
        let dd = (_mm_cvtss_f32(_mm_movehl_ps(v, v)), _mm_cvtss_f32(_mm_permute_ps::<0b11>(v)));
        (dd.0, dd.1, sc, _mm256_srli_epi16::<4>(sm))
    }
    #[inline(always)]
    unsafe fn values(b: *const u8, h: usize, k: usize) -> __m256i {
        crumb(load(b.add(16 + 32 * h)), k)
    }
}

impl K16Like for Q3KW {
    const BYTES: usize = 110;
    const BIAS_SHIFT: Option<i32> = Some(2);
    #[inline(always)]
    unsafe fn header(b: *const u8) -> (f32, f32, __m256i, __m256i) {
        let s = crate::kernels::scalar::scales_q3_k(std::slice::from_raw_parts(b.add(96), 12));
        let s8: [i8; 16] = std::array::from_fn(|j| s[j] as i8);
        let sc = _mm256_cvtepi8_epi16(_mm_loadu_si128(s8.as_ptr().cast()));
        let d = f16_end_at(b.add(108));
        // Stored q = u - 4 with u = low 2 bits + 4·hmask bit.
        (d, 4.0 * d, sc, sc)
    }
    #[inline(always)]
    unsafe fn values(b: *const u8, h: usize, k: usize) -> __m256i {
        let low = crumb(load(b.add(32 + 32 * h)), k);
        let m = _mm256_set1_epi8(1 << (4 * h + k));
        let hm = _mm256_cmpeq_epi8(_mm256_and_si256(load(b), m), m);
        _mm256_or_si256(low, _mm256_and_si256(hm, _mm256_set1_epi8(4)))
    }
}

impl K16Like for Q6KW {
    const BYTES: usize = 210;
    const BIAS_SHIFT: Option<i32> = Some(5);
    #[inline(always)]
    unsafe fn header(b: *const u8) -> (f32, f32, __m256i, __m256i) {
        let sc = _mm256_cvtepi8_epi16(_mm_loadu_si128(b.add(192).cast()));
        let d = f16_end_at(b.add(208));
        // Stored q = u - 32 with u = 4 low bits + 2 high bits.
        (d, 32.0 * d, sc, sc)
    }
    #[inline(always)]
    unsafe fn values(b: *const u8, h: usize, k: usize) -> __m256i {
        let ql = load(b.add(64 * h + 32 * (k % 2)));
        let lo = if k < 2 { ql } else { _mm256_srli_epi16::<4>(ql) };
        let lo = _mm256_and_si256(lo, _mm256_set1_epi8(0xF));
        // Crumb k of qh straight to bits 4..5: one 16-bit shift (none for k = 2) and one mask
        // (the bits a shift carries across a byte boundary fall outside 0x30).
        let qh = load(b.add(128 + 32 * h));
        let hi = match k {
            0 => _mm256_slli_epi16::<4>(qh),
            1 => _mm256_slli_epi16::<2>(qh),
            2 => qh,
            _ => _mm256_srli_epi16::<2>(qh),
        };
        _mm256_or_si256(lo, _mm256_and_si256(hi, _mm256_set1_epi8(0x30)))
    }
}

#[inline(always)]
pub(crate) unsafe fn dot_k16<W: K16Like, const C: usize>(
    n: usize,
    w: &[u8],
    x: &[u8],
    xs: usize,
) -> [f32; C] {
    let (wp, xp) = (w.as_ptr(), x.as_ptr());
    let mut acc = [_mm256_setzero_ps(); C];
    for i in 0..n / 256 {
        let b = wp.add(i * W::BYTES);
        prefetch_block::<C>(b, W::BYTES);
        let y0 = xp.add(292 * i);
        let (d, bias_mul, sc16, bias16) = W::header(b);
        let mut sumi = [_mm256_setzero_si256(); C];
        // Opaque trip count: see dot_k4.
        for h in 0..sub_blocks::<C>(2) {
            for k in 0..4 {
                let q = W::values(b, h, k);
                // Values 128h + 32k + l: scale 8h + 2k for l < 16, 8h + 2k + 1 above.
                let scale = bcast_i16_pair(sc16, 8 * h + 2 * k, 8 * h + 2 * k + 1);
                for c in 0..C {
                    let y = y0.add(c * xs + 4 + 128 * h + 32 * k);
                    let p = _mm256_maddubs_epi16(q, load(y));
                    sumi[c] = _mm256_add_epi32(sumi[c], _mm256_madd_epi16(scale, p));
                }
            }
        }
        if let Some(k) = W::BIAS_SHIFT {
            // |Σ scale·u·q8| < 256·63·127·127 and the shifted bias < 2^28: no i32 overflow.
            let dv = _mm256_set1_ps(d);
            for c in 0..C {
                let y = y0.add(c * xs);
                let bias = _mm256_madd_epi16(bias16, load(y.add(260)));
                let bias = _mm256_sll_epi32(bias, _mm_cvtsi32_si128(k));
                let t = _mm256_mul_ps(dv, _mm256_cvtepi32_ps(_mm256_sub_epi32(sumi[c], bias)));
                acc[c] = _mm256_fmadd_ps(_mm256_broadcast_ss(&*y.cast::<f32>()), t, acc[c]);
            }
        } else {
            block_epilogue(&mut acc, &sumi, y0, xs, d, bias_mul, bias16);
        }
    }
    hsum_all(&acc, [0.0; C])
}

/// i16 lane `a` of `v` broadcast over the low 128 bits and lane `b` over the high 128 bits
/// (`a` and `b` in the same half of `v`).
#[inline(always)]
unsafe fn bcast_i16_pair(v: __m256i, a: usize, b: usize) -> __m256i {
    let sel = |i: usize| {
        let lo = (2 * (i % 8)) as u8;
        _mm_set1_epi16(i16::from_le_bytes([lo, lo + 1]))
    };
    let half = |i: usize| {
        if i < 8 {
            _mm256_permute2x128_si256::<0x00>(v, v)
        } else {
            _mm256_permute2x128_si256::<0x11>(v, v)
        }
    };
    debug_assert_eq!(a / 8, b / 8, "both lanes from one 128-bit half");
    _mm256_shuffle_epi8(half(a), _mm256_set_m128i(sel(b), sel(a)))
}

#[inline(always)]
pub(crate) unsafe fn dot_iq4_xs<const C: usize>(
    n: usize,
    w: &[u8],
    x: &[u8],
    xs: usize,
) -> [f32; C] {
    let (wp, xp) = (w.as_ptr(), x.as_ptr());
    let lut = _mm_loadu_si128(IQ4_NL_VALUES.as_ptr().cast());
    let lut = _mm256_set_m128i(lut, lut);
    let mut acc = [_mm256_setzero_ps(); C];
    for i in 0..n / 256 {
        let b = wp.add(i * 136);
        prefetch_block::<C>(b, 136);
        let d = f16_at(b);
        let sh = b.add(2).cast::<u16>().read_unaligned() as i32;
        let mut sumi = [_mm256_setzero_si256(); C];
        for ib in 0..8 {
            let q = _mm256_shuffle_epi8(lut, nibbles_32(b.add(8 + 16 * ib)));
            let low = (*b.add(4 + ib / 2) >> (4 * (ib % 2))) as i32 & 0xF;
            let ls = (low | (((sh >> (2 * ib)) & 3) << 4)) - 32;
            let scale = _mm256_set1_epi16(ls as i16);
            for c in 0..C {
                let y = xp.add(c * xs + 292 * i + 4 + 32 * ib);
                let p = _mm256_madd_epi16(scale, mul_i8_i16(q, load(y)));
                sumi[c] = _mm256_add_epi32(sumi[c], p);
            }
        }
        for c in 0..C {
            let yd = xp.add(c * xs + 292 * i).cast::<f32>().read_unaligned();
            acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(d * yd), _mm256_cvtepi32_ps(sumi[c]), acc[c]);
        }
    }
    hsum_all(&acc, [0.0; C])
}
