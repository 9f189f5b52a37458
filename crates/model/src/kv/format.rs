//! KV formats (f16, q8, q4) and the attention kernels that read them.
//!
//! Values, and f16 keys, are stored per token: one row is one token's heads for one layer,
//! `[n_head_kv][groups of 32 values]`, each head quantized on its own (a partial last group is
//! zero-padded). q8 group: f16 scale + 32 × i8 (34 bytes); q4 group: f16 scale + 16 bytes of
//! nibbles (18 bytes; value i in the low nibble of byte i, value i + 16 in the high one, as
//! ggml's Q4_0). A rotated value group's q4 scale is searched ([`q4_scale`]): ggml's (largest
//! magnitude to -8) or a least-squares refit of it, whichever codes the group with less error;
//! decoding is Q4_0's either way.
//!
//! Quantized keys are stored per channel instead (KIVI): a block of [`KEY_BLOCK_TOKENS`] tokens
//! of one head is `[d] f16 scales, [d] f16 mins, [32 tokens][codes]`, each channel with its own
//! scale and zero point over the 32 tokens (codes: `d` bytes for q8, `d/2` nibble bytes for q4),
//! so Qwen's large, steady outlier channels do not crush every other channel of the token (they
//! do with per-token q4 keys; BENCHMARKS.md has the perplexities). A block can only be encoded
//! once its 32 tokens are known; the cache keeps the block being filled in f16 meanwhile.
//! Kernels are compiled twice (generic, and AVX2 + FMA + F16C) and [`kernels`] picks the set of
//! the process's one kernel path ([`quant::kernels::isa`]); the generic set is the reference
//! the tests compare against.

use half::f16;
use half::slice::HalfFloatSliceExt;

use crate::params::KvType;

/// The version of the encoders: what a block's bytes are for given f32 input. Part of the disk
/// tier's key (`KvCache::attach_disk`), so blocks another encoder wrote are not read back as
/// this one's. 2: rotated q4 values' scales are searched ([`q4_scale`]).
pub const ENCODING: u32 = 2;

/// Values per quantization group.
pub const QK: usize = 32;
/// Bytes of one q8 group: f16 scale + 32 × i8.
pub const Q8_GROUP_BYTES: usize = 2 + QK;
/// Bytes of one q4 group: f16 scale + 32 nibbles.
pub const Q4_GROUP_BYTES: usize = 2 + QK / 2;
const _: () = assert!(Q8_GROUP_BYTES == 34 && Q4_GROUP_BYTES == 18);
/// Tokens per per-channel key block (the cache's block size).
pub const KEY_BLOCK_TOKENS: usize = 32;

/// Bytes of one token's codes in a per-channel key block of `d` channels: q8, one byte per
/// channel; q4, `ceil(d/2)` bytes (channel i in the low nibble of byte i, channel i + ceil(d/2)
/// in the high one); f16 keys are not stored per channel (2 bytes per channel, unused).
fn key_codes_bytes(ty: KvType, d: usize) -> usize {
    match ty {
        KvType::F16 => 2 * d,
        KvType::Q8 => d,
        KvType::Q4 => d.div_ceil(2),
    }
}

/// Bytes of one head (`d` channels) of one per-channel key block of `ty`: `d` f16 scales, `d`
/// f16 mins, then 32 rows of codes; rounded up to a multiple of 32 so a token's share is whole.
pub fn key_block_bytes(ty: KvType, d: usize) -> usize {
    (4 * d + KEY_BLOCK_TOKENS * key_codes_bytes(ty, d)).next_multiple_of(KEY_BLOCK_TOKENS)
}

/// The sizes of each precision's layout (the enum itself is [`crate::params::KvType`]).
impl KvType {
    /// Bytes one token's value head of `n` values takes, block scales included.
    pub fn v_head_bytes(self, n: usize) -> usize {
        match self {
            KvType::F16 => 2 * n,
            KvType::Q8 => n.div_ceil(QK) * Q8_GROUP_BYTES,
            KvType::Q4 => n.div_ceil(QK) * Q4_GROUP_BYTES,
        }
    }

    /// Bytes one token's key head of `d` channels takes: as a value head for f16; quantized
    /// keys share their per-channel scales and mins with the 32 tokens of a block.
    pub fn k_head_bytes(self, d: usize) -> usize {
        match self {
            KvType::F16 => self.v_head_bytes(d),
            KvType::Q8 | KvType::Q4 => key_block_bytes(self, d) / KEY_BLOCK_TOKENS,
        }
    }

    /// Keys are stored per channel in blocks of 32 tokens (q8, q4), not token by token (f16).
    pub fn k_per_channel(self) -> bool {
        self.is_quantized()
    }
}

/// Encodes one token's head (`x.len()` values) into `dst` (`ty.v_head_bytes(x.len())` bytes).
/// `fit`: q4 groups take the searched scale ([`q4_scale`]) instead of ggml's. For rotated
/// values, whose groups the rotation makes near-Gaussian; an unrotated group's largest value
/// is often an outlier that carries the signal, and ggml's scale keeps it exact (BENCHMARKS.md:
/// the search measured worse unrotated on gemma3-270m).
pub fn encode_head(ty: KvType, x: &[f32], dst: &mut [u8], fit: bool) {
    debug_assert_eq!(dst.len(), ty.v_head_bytes(x.len()));
    match ty {
        KvType::F16 => {
            for (d, &v) in dst.chunks_exact_mut(2).zip(x) {
                d.copy_from_slice(&f16::from_f32(v).to_le_bytes());
            }
        }
        KvType::Q8 => {
            for (g, d) in x.chunks(QK).zip(dst.chunks_exact_mut(Q8_GROUP_BYTES)) {
                let amax = g.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                let scale = amax / 127.0;
                let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
                d[..2].copy_from_slice(&f16::from_f32(scale).to_le_bytes());
                d[2..].fill(0);
                for (q, &v) in d[2..].iter_mut().zip(g) {
                    *q = ((v * inv).round() as i8) as u8;
                }
            }
        }
        KvType::Q4 => {
            for (g, d) in x.chunks(QK).zip(dst.chunks_exact_mut(Q4_GROUP_BYTES)) {
                // ggml's Q4_0 unless fitted: the value of largest magnitude maps to -8 exactly.
                let scale = if fit { q4_scale(g) } else { signed_max(g) / -8.0 };
                let inv = if scale != 0.0 { 1.0 / scale } else { 0.0 };
                d[..2].copy_from_slice(&f16::from_f32(scale).to_le_bytes());
                let nib = |i: usize| -> u8 { g.get(i).map_or(8, |&v| q4_code(v, inv) as u8) };
                for i in 0..QK / 2 {
                    d[2 + i] = nib(i) | (nib(i + QK / 2) << 4);
                }
            }
        }
    }
}

/// Candidate scales [`q4_scale`] tries besides ggml's: the largest magnitude mapped to
/// `-(8 + 0.1·i)` for `i` in `-SCALE_STEPS..=SCALE_STEPS`, each refitted by least squares.
const SCALE_STEPS: i32 = 10;

/// The q4 code (0..=15, zero at 8) of `v` under `inv` = 1 / scale, as ggml's Q4_0 rounds.
#[inline]
fn q4_code(v: f32, inv: f32) -> i32 {
    ((v * inv + 8.5) as i32).clamp(0, 15)
}

/// Squared error of the group `g` coded as q4 with `scale` (already an f16 value).
fn q4_error(g: &[f32], scale: f32) -> f32 {
    let inv = if scale != 0.0 { 1.0 / scale } else { 0.0 };
    g.iter().map(|&v| (v - scale * (q4_code(v, inv) - 8) as f32).powi(2)).sum()
}

/// The value of largest magnitude in `g` (0 for none).
fn signed_max(g: &[f32]) -> f32 {
    g.iter().copied().fold(0.0f32, |m, v| if v.abs() > m.abs() { v } else { m })
}

/// The scale of one q4 group: ggml's Q4_0 maps the value of largest magnitude to -8 exactly,
/// which spends the whole range on that one value; here that scale is the first candidate, and
/// each of `2 × SCALE_STEPS + 1` others (the extreme mapped to -7..-9, codes refitted by least
/// squares, after ggml's `make_qx_quants`) replaces it when its squared error, f16 rounding
/// included, is smaller. So a group is never coded worse than Q4_0 would; the cost is ~22
/// passes over 32 values at encode time, nothing when decoding.
pub fn q4_scale(g: &[f32]) -> f32 {
    let m = signed_max(g);
    let f16r = |s: f32| f16::from_f32(s).to_f32();
    let mut best = f16r(m / -8.0);
    if m == 0.0 {
        return best;
    }
    let mut best_err = q4_error(g, best);
    for i in -SCALE_STEPS..=SCALE_STEPS {
        let iscale = -(8.0 + 0.1 * i as f32) / m;
        let (mut sxl, mut sll) = (0.0f32, 0.0f32);
        for &v in g {
            let l = (v * iscale).round().clamp(-8.0, 7.0);
            sxl += v * l;
            sll += l * l;
        }
        if sll > 0.0 {
            let s = f16r(sxl / sll);
            let e = q4_error(g, s);
            if e < best_err {
                (best, best_err) = (s, e);
            }
        }
    }
    best
}

/// Encodes one head of a per-channel key block of `ty` (q8 or q4): channel `c` of token `j` is
/// `rows[j * stride + c]` (`j < 32`, `c < d`); `dst` is `key_block_bytes(ty, d)` bytes. Each
/// channel maps its minimum to code 0 and its maximum to the top code (scale and min rounded to
/// f16 first, so decoding inverts exactly what was encoded).
pub fn encode_key_block(ty: KvType, rows: &[f16], stride: usize, d: usize, dst: &mut [u8]) {
    debug_assert!(ty.k_per_channel());
    debug_assert_eq!(dst.len(), key_block_bytes(ty, d));
    debug_assert!(rows.len() >= (KEY_BLOCK_TOKENS - 1) * stride + d);
    let (top, row_bytes) = (if ty == KvType::Q8 { 255.0 } else { 15.0 }, key_codes_bytes(ty, d));
    let (params, codes) = dst.split_at_mut(4 * d);
    codes.fill(0);
    for c in 0..d {
        let x = |j: usize| rows[j * stride + c].to_f32();
        let (lo, hi) = (0..KEY_BLOCK_TOKENS)
            .fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), j| (lo.min(x(j)), hi.max(x(j))));
        let (scale, min) = (f16::from_f32((hi - lo) / top), f16::from_f32(lo));
        params[2 * c..2 * c + 2].copy_from_slice(&scale.to_le_bytes());
        params[2 * (d + c)..2 * (d + c) + 2].copy_from_slice(&min.to_le_bytes());
        let (scale, min) = (scale.to_f32(), min.to_f32());
        let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
        // q8: byte c; q4: nibble c of the low half, or of the high half of byte c - row_bytes.
        let (byte, shift) = match ty {
            KvType::Q4 if c >= row_bytes => (c - row_bytes, 4),
            _ => (c, 0),
        };
        for j in 0..KEY_BLOCK_TOKENS {
            let q = ((x(j) - min) * inv).round().clamp(0.0, top) as u8;
            codes[j * row_bytes + byte] |= q << shift;
        }
    }
}

/// Token `slot` of one head of a per-channel key block of `ty` (`block`, `key_block_bytes(ty,
/// d)` bytes) → `row` (`d` floats). `chan`: the block's scales then mins as f32 (`2d` floats,
/// [`dequant_f16`] of its first `4d` bytes), decoded once per block.
#[inline]
pub fn key_block_row(
    k: &Kernels,
    ty: KvType,
    block: &[u8],
    d: usize,
    slot: usize,
    chan: &[f32],
    row: &mut [f32],
) {
    let n = key_codes_bytes(ty, d);
    let codes = &block[4 * d + slot * n..4 * d + (slot + 1) * n];
    let dequant = if ty == KvType::Q8 { k.dequant_key_q8 } else { k.dequant_key_q4 };
    dequant(codes, &chan[..d], &chan[d..2 * d], row);
}

/// `(codes, scales, mins, dst)`: one token's row of a per-channel key block → f32.
pub type DequantKeyRow = fn(&[u8], &[f32], &[f32], &mut [f32]);

/// The kernels attention uses, chosen once for this CPU.
pub struct Kernels {
    pub name: &'static str,
    /// One head of q8 groups → f32 (`dst.len()` values).
    pub dequant_q8: fn(&[u8], &mut [f32]),
    /// One head of q4 groups → f32.
    pub dequant_q4: fn(&[u8], &mut [f32]),
    /// One token of a per-channel q8 key block: `d` code bytes, with per-channel scales and
    /// mins (f32, `d` each) → f32 (`d` values).
    pub dequant_key_q8: DequantKeyRow,
    /// As `dequant_key_q8` for q4: `ceil(d/2)` nibble bytes.
    pub dequant_key_q4: DequantKeyRow,
    /// f16 → f32 (`dst.len()` values; `src` at least as long).
    pub f16_to_f32: fn(&[f16], &mut [f32]),
}

impl Kernels {
    /// One head of `ty` bytes → f32.
    #[inline]
    pub fn dequant(&self, ty: KvType, src: &[u8], dst: &mut [f32]) {
        match ty {
            KvType::F16 => dequant_f16(src, dst),
            KvType::Q8 => (self.dequant_q8)(src, dst),
            KvType::Q4 => (self.dequant_q4)(src, dst),
        }
    }
}

pub static GENERIC: Kernels = Kernels {
    name: "generic",
    dequant_q8: dequant_q8_generic,
    dequant_q4: dequant_q4_generic,
    dequant_key_q8: dequant_key_q8_generic,
    dequant_key_q4: dequant_key_q4_generic,
    f16_to_f32: f16_to_f32_generic,
};

/// The kernel set of the kernel path this process runs ([`quant::kernels::isa`], which honours
/// `SNUG_KERNELS`): AVX2 for the AVX2 family, the generic one otherwise.
pub fn kernels() -> &'static Kernels {
    quant::by_isa!(&avx2::KERNELS, &GENERIC)
}

/// f16 values (2-byte aligned little-endian bytes, at least `dst.len()` values) → f32.
pub fn dequant_f16(src: &[u8], dst: &mut [f32]) {
    let n = dst.len();
    assert!(
        src.len() >= 2 * n && (src.as_ptr() as usize).is_multiple_of(2),
        "f16 KV row misaligned or short"
    );
    // SAFETY: `src` holds at least `n` f16 values (checked above) at a 2-byte aligned address;
    // every bit pattern is a valid f16.
    let h = unsafe { std::slice::from_raw_parts(src.as_ptr() as *const f16, n) };
    (kernels().f16_to_f32)(h, dst);
}

#[inline(always)]
fn dequant_q8_impl(src: &[u8], dst: &mut [f32]) {
    for (out, b) in dst.chunks_mut(QK).zip(src.chunks_exact(Q8_GROUP_BYTES)) {
        let d = f16::from_le_bytes([b[0], b[1]]).to_f32();
        let qs: &[u8; QK] = b[2..].try_into().expect("q8 group is 34 bytes");
        if out.len() == QK {
            for i in 0..QK {
                out[i] = d * (qs[i] as i8) as f32;
            }
        } else {
            for (o, &q) in out.iter_mut().zip(qs) {
                *o = d * (q as i8) as f32;
            }
        }
    }
}

#[inline(always)]
fn dequant_q4_impl(src: &[u8], dst: &mut [f32]) {
    for (out, b) in dst.chunks_mut(QK).zip(src.chunks_exact(Q4_GROUP_BYTES)) {
        let d = f16::from_le_bytes([b[0], b[1]]).to_f32();
        let qs: &[u8; QK / 2] = b[2..].try_into().expect("q4 group is 18 bytes");
        if out.len() == QK {
            for i in 0..QK / 2 {
                out[i] = d * ((qs[i] & 15) as i32 - 8) as f32;
                out[i + QK / 2] = d * ((qs[i] >> 4) as i32 - 8) as f32;
            }
        } else {
            for (i, o) in out.iter_mut().enumerate() {
                let q = if i < QK / 2 { qs[i] & 15 } else { qs[i - QK / 2] >> 4 };
                *o = d * (q as i32 - 8) as f32;
            }
        }
    }
}

#[inline(always)]
fn dequant_key_q8_impl(codes: &[u8], scale: &[f32], min: &[f32], dst: &mut [f32]) {
    let d = dst.len();
    let (codes, scale, min) = (&codes[..d], &scale[..d], &min[..d]);
    for i in 0..d {
        dst[i] = scale[i].mul_add(codes[i] as f32, min[i]);
    }
}

#[inline(always)]
fn dequant_key_q4_impl(nibbles: &[u8], scale: &[f32], min: &[f32], dst: &mut [f32]) {
    let d = dst.len();
    let half = d.div_ceil(2);
    let (lo, hi) = dst.split_at_mut(half);
    let (s_lo, s_hi) = scale[..d].split_at(half);
    let (m_lo, m_hi) = min[..d].split_at(half);
    let nibbles = &nibbles[..half];
    for i in 0..half {
        lo[i] = s_lo[i].mul_add((nibbles[i] & 15) as f32, m_lo[i]);
    }
    for i in 0..hi.len() {
        hi[i] = s_hi[i].mul_add((nibbles[i] >> 4) as f32, m_hi[i]);
    }
}

fn f16_to_f32_generic(src: &[f16], dst: &mut [f32]) {
    let n = dst.len();
    src[..n].convert_to_f32_slice(dst);
}
fn dequant_q8_generic(src: &[u8], dst: &mut [f32]) {
    dequant_q8_impl(src, dst)
}
fn dequant_q4_generic(src: &[u8], dst: &mut [f32]) {
    dequant_q4_impl(src, dst)
}
fn dequant_key_q8_generic(codes: &[u8], scale: &[f32], min: &[f32], dst: &mut [f32]) {
    dequant_key_q8_impl(codes, scale, min, dst)
}
fn dequant_key_q4_generic(nibbles: &[u8], scale: &[f32], min: &[f32], dst: &mut [f32]) {
    dequant_key_q4_impl(nibbles, scale, min, dst)
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    //! The generic kernels recompiled with AVX2 + FMA + F16C enabled (LLVM vectorises them 8 wide).
    //!
    //! # Safety
    //! Every `unsafe fn` here has one contract: the CPU has AVX2, FMA and F16C. Slices are
    //! indexed with bounds checks (the bodies are the generic ones), except in `f16_to_f32_tf`,
    //! which asserts `src` is at least as long as `dst` before reading through raw pointers.
    use super::*;

    pub static KERNELS: Kernels = Kernels {
        name: "avx2",
        dequant_q8,
        dequant_q4,
        dequant_key_q8,
        dequant_key_q4,
        f16_to_f32,
    };

    /// 8 values per F16C conversion, inline (the `half` crate converts 8 per call).
    ///
    /// # Safety
    /// Module contract (`src.len() >= dst.len()` is asserted).
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn f16_to_f32_tf(src: &[f16], dst: &mut [f32]) {
        use std::arch::x86_64::*;
        let n = dst.len();
        assert!(src.len() >= n);
        let mut i = 0;
        while i + 8 <= n {
            // SAFETY: values i..i+8 are inside `src` and `dst` (n ≤ both lengths).
            let h = _mm_loadu_si128(src.as_ptr().add(i) as *const __m128i);
            _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
            i += 8;
        }
        for j in i..n {
            dst[j] = src[j].to_f32();
        }
    }
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dequant_q8_tf(src: &[u8], dst: &mut [f32]) {
        dequant_q8_impl(src, dst)
    }
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dequant_q4_tf(src: &[u8], dst: &mut [f32]) {
        dequant_q4_impl(src, dst)
    }
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dequant_key_q8_tf(codes: &[u8], scale: &[f32], min: &[f32], dst: &mut [f32]) {
        dequant_key_q8_impl(codes, scale, min, dst)
    }
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dequant_key_q4_tf(nibbles: &[u8], scale: &[f32], min: &[f32], dst: &mut [f32]) {
        dequant_key_q4_impl(nibbles, scale, min, dst)
    }

    // SAFETY (all five): `KERNELS` is only handed out by `kernels()` when
    // `quant::kernels::isa()` chose an AVX2-family path, which it does only after
    // `is_x86_feature_detected!` confirmed AVX2, FMA and F16C on this CPU.
    fn dequant_q8(src: &[u8], dst: &mut [f32]) {
        unsafe { dequant_q8_tf(src, dst) }
    }
    fn dequant_q4(src: &[u8], dst: &mut [f32]) {
        unsafe { dequant_q4_tf(src, dst) }
    }
    fn dequant_key_q8(codes: &[u8], scale: &[f32], min: &[f32], dst: &mut [f32]) {
        unsafe { dequant_key_q8_tf(codes, scale, min, dst) }
    }
    fn dequant_key_q4(nibbles: &[u8], scale: &[f32], min: &[f32], dst: &mut [f32]) {
        unsafe { dequant_key_q4_tf(nibbles, scale, min, dst) }
    }
    fn f16_to_f32(src: &[f16], dst: &mut [f32]) {
        unsafe { f16_to_f32_tf(src, dst) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::{require_simd, rng};

    fn roundtrip(ty: KvType, x: &[f32]) -> Vec<f32> {
        let mut bytes = vec![0u8; ty.v_head_bytes(x.len()) + 2];
        let off = (bytes.as_ptr() as usize) % 2; // keep f16 rows 2-byte aligned
        let b = &mut bytes[off..off + ty.v_head_bytes(x.len())];
        encode_head(ty, x, b, false);
        let mut out = vec![0.0; x.len()];
        GENERIC.dequant(ty, b, &mut out);
        out
    }

    fn nmse(a: &[f32], b: &[f32]) -> f64 {
        let e: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
        let s: f64 = a.iter().map(|x| (*x as f64).powi(2)).sum();
        e / s.max(1e-30)
    }

    #[test]
    fn each_precision_round_trips_within_its_error_budget_over_odd_lengths() {
        let mut r = rng(7);
        for n in [1, 7, 31, 32, 33, 64, 100, 128, 256] {
            let x: Vec<f32> = (0..n).map(|_| r() * 3.0).collect();
            for (ty, budget) in [(KvType::F16, 1e-6), (KvType::Q8, 1e-4), (KvType::Q4, 2e-2)] {
                let e = nmse(&x, &roundtrip(ty, &x));
                assert!(e < budget, "{ty} n={n}: nmse {e} > {budget}");
            }
        }
    }

    #[test]
    fn searched_q4_scales_never_code_a_group_worse_than_ggmls_and_mostly_better() {
        let mut r = rng(5);
        let (mut ours, mut ggml) = (0.0f64, 0.0f64);
        for trial in 0..400 {
            // Gaussian-like groups, some with one outlier, some partial.
            let n = if trial % 7 == 0 { 13 } else { QK };
            let mut g: Vec<f32> = (0..n).map(|_| r() + r() + r()).collect();
            if trial % 3 == 0 {
                g[trial % n] *= 8.0;
            }
            let plain = q4_error(&g, f16::from_f32(signed_max(&g) / -8.0).to_f32());
            let searched = q4_error(&g, q4_scale(&g));
            assert!(searched <= plain, "trial {trial}: {searched} > {plain}");
            // What the encoder stores decodes to the searched error.
            let mut b = vec![0u8; KvType::Q4.v_head_bytes(n)];
            encode_head(KvType::Q4, &g, &mut b, true);
            let mut out = vec![0.0; n];
            GENERIC.dequant(KvType::Q4, &b, &mut out);
            let e: f32 = g.iter().zip(&out).map(|(a, b)| (a - b).powi(2)).sum();
            assert!((e - searched).abs() <= 1e-4 * searched.max(1e-3), "trial {trial}");
            if trial % 3 != 0 {
                (ours, ggml) = (ours + searched as f64, ggml + plain as f64);
            }
        }
        // On the near-Gaussian groups (what rotated values look like) the error drops by more
        // than a tenth.
        assert!(ours < 0.9 * ggml, "searched {ours} vs ggml's {ggml}");
        assert_eq!(q4_scale(&[0.0; QK]), 0.0);
    }

    #[test]
    fn simd_kernels_match_the_generic_ones_over_odd_lengths() {
        let k = kernels();
        require_simd();
        let mut r = rng(11);
        for n in [1, 5, 16, 17, 31, 32, 33, 63, 64, 65, 128, 200, 256] {
            let a: Vec<f32> = (0..n).map(|_| r()).collect();
            for ty in [KvType::Q8, KvType::Q4] {
                let mut bytes = vec![0u8; ty.v_head_bytes(n)];
                encode_head(ty, &a, &mut bytes, n % 2 == 0);
                let (mut o0, mut o1) = (vec![0.0; n], vec![0.0; n]);
                GENERIC.dequant(ty, &bytes, &mut o0);
                k.dequant(ty, &bytes, &mut o1);
                assert_eq!(o0, o1, "{ty} n={n}");
            }
            let h: Vec<f16> = a.iter().map(|&v| f16::from_f32(v * 100.0)).collect();
            let (mut o0, mut o1) = (vec![0.0; n], vec![0.0; n]);
            f16_to_f32_generic(&h, &mut o0);
            (k.f16_to_f32)(&h, &mut o1);
            assert_eq!(o0, o1, "f16 n={n}");
            let (scale, min): (Vec<f32>, Vec<f32>) = (0..n).map(|_| (r().abs(), r())).unzip();
            let codes: Vec<u8> = (0..n).map(|i| (i * 37 % 256) as u8).collect();
            for (name, generic, simd) in [
                ("q8", GENERIC.dequant_key_q8, k.dequant_key_q8),
                ("q4", GENERIC.dequant_key_q4, k.dequant_key_q4),
            ] {
                let (mut o0, mut o1) = (vec![0.0; n], vec![0.0; n]);
                generic(&codes, &scale, &min, &mut o0);
                simd(&codes, &scale, &min, &mut o1);
                assert_eq!(o0, o1, "{name} key row n={n}");
            }
        }
    }

    /// Keys shaped like Qwen's: a few channels with a large, steady offset over the block.
    fn outlier_keys(d: usize, seed: u64) -> Vec<f16> {
        let mut r = rng(seed);
        (0..KEY_BLOCK_TOKENS * d)
            .map(|i| {
                let c = i % d;
                let v = r() + if c % 16 == 3 { 60.0 + 5.0 * r() } else { 0.0 };
                f16::from_f32(v)
            })
            .collect()
    }

    /// Encodes `x` (`[32][d]`) as one head of a per-channel key block of `ty` and decodes
    /// every token back.
    fn key_block_roundtrip(ty: KvType, x: &[f16], d: usize) -> Vec<f32> {
        let mut block = vec![0u8; key_block_bytes(ty, d)];
        encode_key_block(ty, x, d, d, &mut block);
        let mut chan = vec![0.0; 2 * d];
        dequant_f16(&block[..4 * d], &mut chan);
        let mut out = vec![0.0; KEY_BLOCK_TOKENS * d];
        for (slot, row) in out.chunks_mut(d).enumerate() {
            key_block_row(&GENERIC, ty, &block, d, slot, &chan, row);
        }
        out
    }

    #[test]
    fn per_channel_keys_keep_small_channels_next_to_outliers() {
        for (ty, top) in [(KvType::Q8, 255.0), (KvType::Q4, 15.0)] {
            for d in [1, 7, 32, 33, 64, 128, 256] {
                let x = outlier_keys(d, d as u64);
                let got = key_block_roundtrip(ty, &x, d);
                let want: Vec<f32> = x.iter().map(|v| v.to_f32()).collect();
                // Error per channel: at most half a step of that channel's own range (+ the f16
                // rounding of its min, up to 65 × 2^-11).
                for c in 0..d {
                    let col =
                        |v: &[f32]| (0..KEY_BLOCK_TOKENS).map(|j| v[j * d + c]).collect::<Vec<_>>();
                    let (w, g) = (col(&want), col(&got));
                    let range = w.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v))
                        - w.iter().fold(f32::INFINITY, |m, &v| m.min(v));
                    let err = w.iter().zip(&g).fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
                    assert!(
                        err <= range / (2.0 * top) * 1.01 + 0.035,
                        "{ty} d={d} channel {c}: error {err}, range {range}"
                    );
                }
                // Per-token quantization of the same keys loses the small channels under the
                // outliers.
                if d >= 32 {
                    let small = |v: &[f32]| -> Vec<f32> {
                        v.iter()
                            .enumerate()
                            .filter(|(i, _)| i % d % 16 != 3)
                            .map(|(_, &v)| v)
                            .collect()
                    };
                    let per_token: Vec<f32> =
                        want.chunks(d).flat_map(|t| roundtrip(ty, t)).collect();
                    let (e_chan, e_tok) = (
                        nmse(&small(&want), &small(&got)),
                        nmse(&small(&want), &small(&per_token)),
                    );
                    assert!(
                        e_chan < 0.02 && e_tok > 10.0 * e_chan,
                        "{ty} d={d}: per-channel {e_chan}, per-token {e_tok}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_constant_channel_decodes_exactly_to_its_f16_value() {
        let d = 64;
        let x: Vec<f16> =
            (0..KEY_BLOCK_TOKENS * d).map(|i| f16::from_f32((i % d) as f32 * 0.25 - 3.0)).collect();
        for ty in [KvType::Q8, KvType::Q4] {
            let got = key_block_roundtrip(ty, &x, d);
            assert!(x.iter().zip(&got).all(|(a, b)| a.to_f32() == *b), "{ty}");
        }
    }

    #[test]
    fn precision_names_parse_and_unknown_ones_are_a_clear_error() {
        for ty in KvType::ALL {
            assert_eq!(ty.name().parse::<KvType>().unwrap(), ty);
        }
        let e = "q5".parse::<KvType>().unwrap_err().to_string();
        assert!(e.contains("q5") && e.contains("f16, q8 and q4"), "{e}");
    }

    #[test]
    fn block_scale_overhead_is_34_and_18_bytes_per_32_values() {
        assert_eq!(KvType::Q8.v_head_bytes(128), 128 * 34 / 32);
        assert_eq!(KvType::Q4.v_head_bytes(128), 128 * 18 / 32);
        assert_eq!(KvType::F16.v_head_bytes(128), 256);
        assert_eq!(KvType::F16.k_head_bytes(128), 256);
    }

    #[test]
    fn per_channel_keys_cost_36_and_20_bytes_per_32_values() {
        // Per head per block: 32 tokens of codes (d bytes for q8, d/2 for q4) + d f16 scales +
        // d f16 mins.
        for d in [64, 128, 256] {
            assert_eq!(key_block_bytes(KvType::Q8, d), 32 * d + 4 * d);
            assert_eq!(key_block_bytes(KvType::Q4, d), 16 * d + 4 * d);
            assert_eq!(KvType::Q8.k_head_bytes(d), d / 32 * 36);
            assert_eq!(KvType::Q4.k_head_bytes(d), d / 32 * 20);
        }
        // Odd sizes round up to whole bytes per token.
        assert_eq!(key_block_bytes(KvType::Q4, 7), 32 * 4 + 28 + 4);
        assert_eq!(KvType::Q4.k_head_bytes(7), 5);
        assert_eq!(KvType::Q8.k_head_bytes(7), 8);
    }
}
