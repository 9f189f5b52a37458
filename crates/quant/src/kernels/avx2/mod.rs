//! x86-64 AVX2 (+FMA, F16C) kernels: activation quantizers and the dot product of every weight
//! type, each written once generic over `C` activation rows (C = 1 for decode, C = TILE for the
//! prefill tile) so one unpack of a weight block serves C tokens. Integer products use
//! `vpmaddubsw` (u8 × i8 → i16 pairs) then `vpmaddwd` into i32, as ggml's AVX2 path does.
//! This file: helpers, quantizers, float and legacy formats, the kernel tables; K-quants live in
//! `kquants.rs`. Cost: ~110 instructions per Q4_K block (256 values, 144 B) for one activation row, ~45 more
//! per extra row of the tile; the AVX-512 path compiles these same bodies with more registers.

//! # Safety
//! Every `unsafe fn` here has one contract: the CPU has AVX2, FMA and F16C (plus whatever the
//! calling wrapper's feature string adds); `n` is a whole number of weight and activation
//! blocks; `w` holds a full weight row of `n` values; `x` holds `C` full activation rows at a
//! stride of `xs` bytes (quantizers: `dst` holds the quantized row). The dispatcher in
//! `kernels/mod.rs` checks all of this before the first call.

// Index loops over the C activation rows read more plainly than zipped iterators here.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

mod kquants;

pub(super) use kquants::*;

use super::{DotKernels, Partner, QuantizeFn};
use crate::blocks::IQ4_NL_VALUES;
use crate::GgmlType;

// --- small helpers ------------------------------------------------------------------------------

/// The four f16 at `p..p + 8` as f32 lanes. Inline asm on purpose: converting one f16 through
/// intrinsics compiles to a 16-bit `vpinsrw` into lane 0 that merges into whatever register LLVM
/// picks (often the loop's accumulator), chaining every block to the previous one;
/// `vcvtph2ps` from memory writes a fresh register.
///
/// # Safety
/// 8 bytes at `p` are readable and the CPU has F16C.
#[inline(always)]
pub(super) unsafe fn f16x4_at(p: *const u8) -> __m128 {
    let v: __m128;
    // SAFETY: forwarded contract; the instruction only reads those 8 bytes.
    unsafe {
        std::arch::asm!(
            "vcvtph2ps {v}, qword ptr [{p}]",
            p = in(reg) p,
            v = out(xmm_reg) v,
            options(pure, readonly, nostack, preserves_flags)
        );
    }
    v
}

/// The two f16 at `p` and `p + 2` (8 readable bytes at `p`) as f32.
#[inline(always)]
pub(super) unsafe fn f16x2_at(p: *const u8) -> (f32, f32) {
    let v = f16x4_at(p);
    (_mm_cvtss_f32(v), _mm_cvtss_f32(_mm_movehdup_ps(v)))
}

/// The f16 at `p` (8 readable bytes at `p`) as f32.
#[inline(always)]
pub(super) unsafe fn f16_at(p: *const u8) -> f32 {
    _mm_cvtss_f32(f16x4_at(p))
}

/// The f16 that ends a block at `p + 2` (8 readable bytes end there) as f32.
#[inline(always)]
pub(super) unsafe fn f16_end_at(p: *const u8) -> f32 {
    let v = f16x4_at(p.sub(6));
    _mm_cvtss_f32(_mm_permute_ps::<0b11>(v))
}

#[inline(always)]
pub(super) unsafe fn load(p: *const u8) -> __m256i {
    _mm256_loadu_si256(p.cast())
}

#[inline(always)]
unsafe fn hsum_ps(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
}

#[inline(always)]
unsafe fn hsum_epi32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32::<0b01>(s)))
}

#[inline(always)]
unsafe fn hmax_ps(v: __m256) -> f32 {
    let s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)))
}

/// Horizontal sum of each accumulator plus `extra`.
#[inline(always)]
unsafe fn hsum_all<const C: usize>(acc: &[__m256; C], extra: [f32; C]) -> [f32; C] {
    let mut out = extra;
    for (o, a) in out.iter_mut().zip(acc) {
        *o += hsum_ps(*a);
    }
    out
}

/// How far ahead of the weight block being multiplied a one-row (decode) kernel asks for weight
/// bytes. Decode streams each weight once, and the hardware prefetcher alone keeps too few cache
/// lines in flight for a core to reach its share of the memory bandwidth. The hints are spread
/// over the blocks (one per cache line of each block) rather than issued a row at a time before
/// the row's dot product: a 15 KB row (the 7B's `ffn_down`) issued 240 hints in one burst, the
/// core stalled on them with the miss buffers full, and memory then idled while the row computed.
pub(crate) const PREFETCH_AHEAD: usize = 4096;

/// Hint the cache lines that hold bytes `p + PREFETCH_AHEAD ..` `+ bytes` (a block that far
/// ahead) into L1, in the decode kernels of up to 4 activation rows (`C <= 4`: batched decode
/// streams the weights from DRAM too, and at 2–4 rows still faster than the hardware prefetcher
/// alone keeps up with); the prefill tile works on rows already in L2.
/// One hint per 64 bytes covers every line: a line a block's hints miss, the next block's first
/// hint takes.
#[inline(always)]
pub(super) unsafe fn prefetch_block<const C: usize>(p: *const u8, bytes: usize) {
    if C <= 4 {
        let mut o = 0;
        while o < bytes {
            // Wrapping: the address may lie past the row (or the mapping); a prefetch never faults.
            _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH_AHEAD + o).cast());
            o += 64;
        }
    }
}

/// 16 nibbles at `p` → 32 bytes: low nibbles in bytes 0..16, high nibbles in bytes 16..32.
#[inline(always)]
unsafe fn nibbles_32(p: *const u8) -> __m256i {
    // Broadcast load (no vector op) and one per-half shift, not shift + `vinserti128`.
    let t = _mm256_broadcastsi128_si256(_mm_loadu_si128(p.cast()));
    let b = _mm256_srlv_epi32(t, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4));
    _mm256_and_si256(b, _mm256_set1_epi8(0xF))
}

/// The u32 at `p` → 32 bytes: byte j is byte j/8 of it (the byte that holds bit j).
#[inline(always)]
unsafe fn spread_bits_32(p: *const u8) -> __m256i {
    let x = p.cast::<u32>().read_unaligned() as i32;
    let shuf = _mm256_set_epi64x(
        0x0303030303030303,
        0x0202020202020202,
        0x0101010101010101,
        0x0000000000000000,
    );
    _mm256_shuffle_epi8(_mm256_set1_epi32(x), shuf)
}

/// The 32 bits of the u32 at `p` → 32 bytes, 0xFF where the bit is set.
#[inline(always)]
unsafe fn bits_32(p: *const u8) -> __m256i {
    let bytes = _mm256_or_si256(spread_bits_32(p), _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
    _mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1))
}

/// The 32 bits of the u32 at `p` → 32 bytes, 0xFF where the bit is clear (byte j tests bit
/// j against a one-bit mask: one op fewer than [`bits_32`] and its complement).
#[inline(always)]
unsafe fn clear_bits_32(p: *const u8) -> __m256i {
    let bit = _mm256_and_si256(spread_bits_32(p), _mm256_set1_epi64x(0x8040201008040201u64 as i64));
    _mm256_cmpeq_epi8(bit, _mm256_setzero_si256())
}

/// `acc` + Σ of each 4 adjacent u8 × i8 products (one `vpdpbusd` with VNNI, else
/// `vpmaddubsw` + `vpmaddwd` + add; identical results as long as no i16 pair saturates, which
/// the value ranges used here guarantee: |u| ≤ 128, |i| ≤ 127).
#[inline(always)]
unsafe fn dpbusd<const VNNI: bool>(acc: __m256i, u: __m256i, i: __m256i) -> __m256i {
    if VNNI {
        _mm256_dpbusd_epi32(acc, u, i)
    } else {
        let p = _mm256_madd_epi16(_mm256_maddubs_epi16(u, i), _mm256_set1_epi16(1));
        _mm256_add_epi32(acc, p)
    }
}

/// Signed i8 × signed i8 pairwise into 16 × i16 (|a·b| pairs ≤ 2·127·128 fit).
#[inline(always)]
unsafe fn mul_i8_i16(w: __m256i, x: __m256i) -> __m256i {
    _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w))
}

// --- activation quantizers ----------------------------------------------------------------------

/// Quantize 32 floats at `x` with multiplier `id`; returns the i8s in order plus their 4 i32
/// partial vectors' sum (for Q8_1's s and Q8_K's bsums the caller re-derives what it needs).
#[inline(always)]
unsafe fn quant32(x: *const f32, id: f32) -> (__m256i, [__m256i; 4]) {
    let m = _mm256_set1_ps(id);
    let mut v = [_mm256_setzero_si256(); 4];
    for (k, v) in v.iter_mut().enumerate() {
        let f = _mm256_mul_ps(_mm256_loadu_ps(x.add(8 * k)), m);
        *v = _mm256_cvtps_epi32(
            _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(f),
        );
    }
    let a = _mm256_packs_epi32(v[0], v[1]);
    let b = _mm256_packs_epi32(v[2], v[3]);
    let p = _mm256_packs_epi16(a, b);
    let p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    (p, v)
}

#[inline(always)]
unsafe fn amax_n(x: *const f32, n: usize) -> f32 {
    let sign = _mm256_set1_ps(-0.0);
    let mut m = _mm256_setzero_ps();
    for k in (0..n).step_by(8) {
        m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x.add(k))));
    }
    hmax_ps(m)
}

#[inline(always)]
pub(super) unsafe fn quantize_q8_0(x: &[f32], dst: &mut [u8]) {
    debug_assert!(dst.len() >= x.len() / 32 * 34);
    for i in 0..x.len() / 32 {
        let (xp, yp) = (x.as_ptr().add(32 * i), dst.as_mut_ptr().add(34 * i));
        let a = amax_n(xp, 32);
        let id = if a != 0.0 { 127.0 / a } else { 0.0 };
        let (q, _) = quant32(xp, id);
        yp.cast::<u16>().write_unaligned(half::f16::from_f32(a / 127.0).to_bits());
        _mm256_storeu_si256(yp.add(2).cast(), q);
    }
}

#[inline(always)]
pub(super) unsafe fn quantize_q8_1(x: &[f32], dst: &mut [u8]) {
    debug_assert!(dst.len() >= x.len() / 32 * 36);
    for i in 0..x.len() / 32 {
        let (xp, yp) = (x.as_ptr().add(32 * i), dst.as_mut_ptr().add(36 * i));
        let a = amax_n(xp, 32);
        let d = a / 127.0;
        let id = if a != 0.0 { 127.0 / a } else { 0.0 };
        let (q, v) = quant32(xp, id);
        let sum = hsum_epi32(_mm256_add_epi32(
            _mm256_add_epi32(v[0], v[1]),
            _mm256_add_epi32(v[2], v[3]),
        ));
        yp.cast::<u16>().write_unaligned(half::f16::from_f32(d).to_bits());
        yp.add(2).cast::<u16>().write_unaligned(half::f16::from_f32(d * sum as f32).to_bits());
        _mm256_storeu_si256(yp.add(4).cast(), q);
    }
}

#[inline(always)]
pub(super) unsafe fn quantize_q8_k(x: &[f32], dst: &mut [u8]) {
    debug_assert!(dst.len() >= x.len() / 256 * 292);
    for i in 0..x.len() / 256 {
        let (xp, yp) = (x.as_ptr().add(256 * i), dst.as_mut_ptr().add(292 * i));
        let a = amax_n(xp, 256);
        let id = if a != 0.0 { 127.0 / a } else { 0.0 };
        yp.cast::<f32>().write_unaligned(a / 127.0);
        for j in 0..8 {
            let (q, v) = quant32(xp.add(32 * j), id);
            _mm256_storeu_si256(yp.add(4 + 32 * j).cast(), q);
            let s0 = hsum_epi32(_mm256_add_epi32(v[0], v[1]));
            let s1 = hsum_epi32(_mm256_add_epi32(v[2], v[3]));
            let bs = yp.add(260 + 4 * j).cast::<i16>();
            bs.write_unaligned(s0 as i16);
            bs.add(1).write_unaligned(s1 as i16);
        }
    }
}

/// Build the quantizer table entry for `vdt` with the kernels compiled for `$feat`.
macro_rules! simd_quantizer {
    ($feat:literal, $p:expr) => {{
        use $crate::kernels::avx2::{quantize_q8_0, quantize_q8_1, quantize_q8_k};
        use $crate::kernels::Partner;
        #[target_feature(enable = $feat)]
        unsafe fn q8_0(x: &[f32], dst: &mut [u8]) {
            // SAFETY: forwarded QuantizeFn contract; the features are checked by the dispatcher.
            unsafe { quantize_q8_0(x, dst) }
        }
        #[target_feature(enable = $feat)]
        unsafe fn q8_1(x: &[f32], dst: &mut [u8]) {
            // SAFETY: as above.
            unsafe { quantize_q8_1(x, dst) }
        }
        #[target_feature(enable = $feat)]
        unsafe fn q8_k(x: &[f32], dst: &mut [u8]) {
            // SAFETY: as above.
            unsafe { quantize_q8_k(x, dst) }
        }
        let f: $crate::kernels::QuantizeFn = match $p {
            Partner::Q8_0 => q8_0,
            Partner::Q8_1 => q8_1,
            Partner::Q8K => q8_k,
        };
        f
    }};
}
pub(super) use simd_quantizer;

pub(crate) fn quantizer(p: Partner) -> QuantizeFn {
    simd_quantizer!("avx2,fma,f16c", p)
}

// --- float weights · f32 activations ------------------------------------------------------------

/// A float weight format: how to widen 8 weights to f32 and read one.
pub(super) trait FloatW {
    const BYTES: usize;
    unsafe fn load8(p: *const u8) -> __m256;
    fn one(b: &[u8]) -> f32;
}

pub(super) struct F32W;
pub(super) struct F16W;
pub(super) struct Bf16W;

impl FloatW for F32W {
    const BYTES: usize = 4;
    #[inline(always)]
    unsafe fn load8(p: *const u8) -> __m256 {
        _mm256_loadu_ps(p.cast())
    }
    fn one(b: &[u8]) -> f32 {
        f32::from_le_bytes([b[0], b[1], b[2], b[3]])
    }
}

impl FloatW for F16W {
    const BYTES: usize = 2;
    #[inline(always)]
    unsafe fn load8(p: *const u8) -> __m256 {
        _mm256_cvtph_ps(_mm_loadu_si128(p.cast()))
    }
    fn one(b: &[u8]) -> f32 {
        half::f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32()
    }
}

impl FloatW for Bf16W {
    const BYTES: usize = 2;
    #[inline(always)]
    unsafe fn load8(p: *const u8) -> __m256 {
        let w = _mm256_cvtepu16_epi32(_mm_loadu_si128(p.cast()));
        _mm256_castsi256_ps(_mm256_slli_epi32::<16>(w))
    }
    fn one(b: &[u8]) -> f32 {
        half::bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32()
    }
}

#[inline(always)]
pub(super) unsafe fn dot_float<W: FloatW, const C: usize>(
    n: usize,
    w: &[u8],
    x: &[u8],
    xs: usize,
) -> [f32; C] {
    let (wp, xp) = (w.as_ptr(), x.as_ptr());
    // One row: 4 independent chains hide the FMA latency; a tile has C chains already.
    let step = if C == 1 { 32 } else { 8 };
    let mut acc = [[_mm256_setzero_ps(); 4]; C];
    let mut k = 0;
    while k + step <= n {
        prefetch_block::<C>(wp.add(k * W::BYTES), step * W::BYTES);
        for u in 0..step / 8 {
            let wv = W::load8(wp.add((k + 8 * u) * W::BYTES));
            for c in 0..C {
                let xv = _mm256_loadu_ps(xp.add(c * xs).cast::<f32>().add(k + 8 * u));
                acc[c][u] = _mm256_fmadd_ps(wv, xv, acc[c][u]);
            }
        }
        k += step;
    }
    let mut out = [0f32; C];
    for (c, (o, a)) in out.iter_mut().zip(&acc).enumerate() {
        *o = hsum_ps(_mm256_add_ps(_mm256_add_ps(a[0], a[1]), _mm256_add_ps(a[2], a[3])));
        for j in k..n {
            let xv = xp.add(c * xs + 4 * j).cast::<f32>().read_unaligned();
            *o += W::one(&w[j * W::BYTES..]) * xv;
        }
    }
    out
}

// --- legacy 32-value formats --------------------------------------------------------------------

/// A legacy weight block against Q8_0: its scale and its 32 values as signed bytes.
pub(super) trait LegacySigned {
    const BYTES: usize;
    unsafe fn decode(b: *const u8) -> (f32, __m256i);
}

pub(super) struct Q4_0W;
pub(super) struct Q5_0W;
pub(super) struct Q8_0W;
pub(super) struct Iq4NlW;

impl LegacySigned for Q4_0W {
    const BYTES: usize = 18;
    #[inline(always)]
    unsafe fn decode(b: *const u8) -> (f32, __m256i) {
        (f16_at(b), _mm256_sub_epi8(nibbles_32(b.add(2)), _mm256_set1_epi8(8)))
    }
}

impl LegacySigned for Q5_0W {
    const BYTES: usize = 22;
    #[inline(always)]
    unsafe fn decode(b: *const u8) -> (f32, __m256i) {
        // Bit clear → value - 16: OR 0xF0 into the nibble gives the two's-complement byte.
        let hi = _mm256_and_si256(clear_bits_32(b.add(2)), _mm256_set1_epi8(0xF0u8 as i8));
        (f16_at(b), _mm256_or_si256(nibbles_32(b.add(6)), hi))
    }
}

impl LegacySigned for Q8_0W {
    const BYTES: usize = 34;
    #[inline(always)]
    unsafe fn decode(b: *const u8) -> (f32, __m256i) {
        (f16_at(b), load(b.add(2)))
    }
}

impl LegacySigned for Iq4NlW {
    const BYTES: usize = 18;
    #[inline(always)]
    unsafe fn decode(b: *const u8) -> (f32, __m256i) {
        let lut = _mm_loadu_si128(IQ4_NL_VALUES.as_ptr().cast());
        let lut = _mm256_set_m128i(lut, lut);
        (f16_at(b), _mm256_shuffle_epi8(lut, nibbles_32(b.add(2))))
    }
}

#[inline(always)]
pub(super) unsafe fn dot_legacy<W: LegacySigned, const C: usize, const VNNI: bool>(
    n: usize,
    w: &[u8],
    x: &[u8],
    xs: usize,
) -> [f32; C] {
    let (wp, xp) = (w.as_ptr(), x.as_ptr());
    let mut acc = [_mm256_setzero_ps(); C];
    for i in 0..n / 32 {
        prefetch_block::<C>(wp.add(i * W::BYTES), W::BYTES);
        let (dw, qw) = W::decode(wp.add(i * W::BYTES));
        let aw = _mm256_sign_epi8(qw, qw);
        for c in 0..C {
            let yb = xp.add(c * xs + 34 * i);
            let qx = _mm256_sign_epi8(load(yb.add(2)), qw);
            let p = dpbusd::<VNNI>(_mm256_setzero_si256(), aw, qx);
            let d = _mm256_set1_ps(dw * f16_at(yb));
            acc[c] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc[c]);
        }
    }
    hsum_all(&acc, [0.0; C])
}

/// A legacy weight block with a min, against Q8_1: scale, min and unsigned values.
pub(super) trait LegacyUnsigned {
    const BYTES: usize;
    unsafe fn decode(b: *const u8) -> (f32, f32, __m256i);
}

pub(super) struct Q4_1W;
pub(super) struct Q5_1W;

impl LegacyUnsigned for Q4_1W {
    const BYTES: usize = 20;
    #[inline(always)]
    unsafe fn decode(b: *const u8) -> (f32, f32, __m256i) {
        let (d, m) = f16x2_at(b);
        (d, m, nibbles_32(b.add(4)))
    }
}

impl LegacyUnsigned for Q5_1W {
    const BYTES: usize = 24;
    #[inline(always)]
    unsafe fn decode(b: *const u8) -> (f32, f32, __m256i) {
        let hi = _mm256_and_si256(bits_32(b.add(4)), _mm256_set1_epi8(0x10));
        let (d, m) = f16x2_at(b);
        (d, m, _mm256_or_si256(nibbles_32(b.add(8)), hi))
    }
}

#[inline(always)]
pub(super) unsafe fn dot_legacy_min<W: LegacyUnsigned, const C: usize, const VNNI: bool>(
    n: usize,
    w: &[u8],
    x: &[u8],
    xs: usize,
) -> [f32; C] {
    let (wp, xp) = (w.as_ptr(), x.as_ptr());
    let mut acc = [_mm256_setzero_ps(); C];
    let mut mins = [0f32; C];
    for i in 0..n / 32 {
        prefetch_block::<C>(wp.add(i * W::BYTES), W::BYTES);
        let (dw, mw, qw) = W::decode(wp.add(i * W::BYTES));
        for c in 0..C {
            let yb = xp.add(c * xs + 36 * i);
            let p = dpbusd::<VNNI>(_mm256_setzero_si256(), qw, load(yb.add(4)));
            let (yd, ys) = f16x2_at(yb);
            acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(dw * yd), _mm256_cvtepi32_ps(p), acc[c]);
            mins[c] += mw * ys;
        }
    }
    hsum_all(&acc, mins)
}

/// Build a [`DotKernels`] from a kernel generic over the number of activation rows, compiled
/// for the target features `$feat` (the kernel bodies are `#[inline(always)]`, so the intrinsics
/// they call are compiled with the wrapper's features).
macro_rules! simd_kernels {
    ($feat:literal, $f:ident $(:: < $($g:ty),* >)? $(, $vnni:literal)?) => {
        $crate::kernels::kernels_from_row!(#[target_feature(enable = $feat)] |n, wr, x, stride| -> [f32; N] {
            // SAFETY: the kernel's contract is DotRowsFn's for one row (ISA checked by the
            // dispatcher).
            unsafe { $f::<$($($g,)*)? N $(, $vnni)?>(n, wr, x, stride) }
        })
    };
}
pub(super) use simd_kernels;

/// The kernel table for one feature set: `$vnni` says whether `vpdpbusd` may be used.
macro_rules! simd_table {
    ($feat:literal, $vnni:literal, $ty:expr) => {{
        use $crate::kernels::avx2::*;
        use GgmlType::*;
        let k: Option<DotKernels> = match $ty {
            F32 => Some(simd_kernels!($feat, dot_float::<F32W>)),
            F16 => Some(simd_kernels!($feat, dot_float::<F16W>)),
            BF16 => Some(simd_kernels!($feat, dot_float::<Bf16W>)),
            Q4_0 => Some(simd_kernels!($feat, dot_legacy::<Q4_0W>, $vnni)),
            Q5_0 => Some(simd_kernels!($feat, dot_legacy::<Q5_0W>, $vnni)),
            Q8_0 => Some(simd_kernels!($feat, dot_legacy::<Q8_0W>, $vnni)),
            IQ4NL => Some(simd_kernels!($feat, dot_legacy::<Iq4NlW>, $vnni)),
            Q4_1 => Some(simd_kernels!($feat, dot_legacy_min::<Q4_1W>, $vnni)),
            Q5_1 => Some(simd_kernels!($feat, dot_legacy_min::<Q5_1W>, $vnni)),
            Q2K => Some(simd_kernels!($feat, dot_k16::<Q2KW>)),
            Q3K => Some(simd_kernels!($feat, dot_k16::<Q3KW>)),
            Q4K => Some(simd_kernels!($feat, dot_k4::<Q4KW>)),
            Q5K => Some(simd_kernels!($feat, dot_k4::<Q5KW>)),
            Q6K => Some(simd_kernels!($feat, dot_k16::<Q6KW>)),
            IQ4XS => Some(simd_kernels!($feat, dot_iq4_xs)),
            Q8_1 | Q8K | $crate::kernels::no_kernel_types!() => None,
        };
        k
    }};
}
pub(super) use simd_table;

pub(crate) fn dot_kernels(ty: GgmlType) -> Option<DotKernels> {
    simd_table!("avx2,fma,f16c", false, ty)
}
