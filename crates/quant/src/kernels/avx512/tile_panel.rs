//! Prefill on Intel AMX tiles for Q4_K and Q6_K: the AVX-512 panel (`panel.rs`) with its
//! products moved to `tdpbssd`, 16 tokens × 16 weight rows × 64 values an instruction. Its
//! outputs are bit-identical to the row kernels' and the VNNI panels', so a token's result does
//! not depend on which of them it meets.
//!
//! Same integers: the panel and the row kernels compute, per 256-value block and (row, token),
//! the exact i32 `S = Σ_groups scale · Σ q·q8` and for Q4_K `M = Σ min · bsum`, then one float
//! step per block in block order. A tile product sums 64 values with one weight per value, so
//! the per-group scale goes into the weights: each value is multiplied by a *digit* of its
//! group's scale, small enough that the product stays an i8, and the block's sums by digit are
//! recombined exactly in i32:
//! - Q4_K (q 0..15, scale 0..63): digits `scale & 7` and `scale >> 3` (products ≤ 105), so
//!   `S = C0 + 8·C1`; the mins (0..63) are a third "weight" of their own, `M = C2`.
//! - Q6_K (stored q − 32 in −32..31, signed scale −128..127): balanced base-7 digits in −3..3
//!   (|products| ≤ 96), `S = C0 + 7·C1 + 49·C2`; the offset −32 is in the values, where the
//!   panel folds it in through the block sums: the same integer.
//!
//! Then the block's float step of `panel.rs` for each token, one row per lane: Q4_K
//! `acc = fma(yd, fmsub(d, S, dmin·M), acc)`, Q6_K `acc = fma(yd, d·S, acc)`.
//!
//! Layout: the VNNI panel of the rows first (`panel.rs`: its scales, `d` and `dmin`; a batch's
//! tail of fewer than [`TILE_MIN_TOKENS`] tokens runs on it, a longer one on tiles of its
//! height), then per 256-value block three digit
//! weights of four 1 KiB tiles, `[k / 4][row][k % 4]` (the VNNI panel's value layout, which is
//! what `tdpbssd` takes as its second source). The activations are the Q8_K rows themselves:
//! one tile load with the row stride takes 64 values of 16 tokens.
//!
//! Cost per block and 16 tokens: 12 `tdpbssd` (16 × 16 × 64 products each), 24 tile loads and
//! 3 tile stores, then per token 3 loads, 2–5 integer ops and the float step, where the VNNI
//! panel issues ~90 vector instructions per token. The unpack adds to the VNNI panel's 3 × 64
//! digit multiplications (5 ops each) per block (BENCHMARKS.md: where it pays).
//!
//! # Safety
//! Every function here needs AVX-512 F/BW/VL/VNNI, and AMX tiles granted to the process
//! ([`tiles::usable`]); the callers check both.

// Index loops over the token rows read more plainly than zipped iterators here.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use super::kquants::{Q4KZ, Q6KZ};
use super::panel::{self, PanelFormat, BLOCK_BYTES, D, DMIN, PAIRS, SCALES, VALUES};
use super::tiles;
use crate::kernels::{PanelKernels, PANEL_ROWS};
use crate::GgmlType;

// One weight row per i32 lane of a tile row (and of a zmm).
const _: () = assert!(PANEL_ROWS == 16);

/// Tokens per tile (its rows).
const TT: usize = 16;
/// Digit weights per block, and their bytes (four 1 KiB tiles each).
const DIGITS: usize = 3;
const DIGIT_BYTES: usize = 4096;

/// A format the tiles take: how a VNNI panel block becomes its digit weights, and how a token's
/// three digit sums finish the block.
trait TileFormat: PanelFormat {
    /// The three digit weights of the VNNI panel block `pb`, into `out` (12 KiB).
    ///
    /// # Safety
    /// AVX-512 F/BW/VL/VNNI; `pb` one unpacked panel block, `out` writable for 12 KiB.
    unsafe fn digits(pb: *const u8, out: *mut u8);
    /// One token's block, from its digit sums (one row per lane): `acc` after the float step.
    ///
    /// # Safety
    /// AVX-512 F/BW/VL/VNNI.
    unsafe fn finish(c: [__m512i; DIGITS], pb: *const u8, yd: __m512, acc: __m512) -> __m512;
}

/// `v` (bytes) times the small signed integer in each i32 lane of `dig`, bytewise modulo 256:
/// the exact product wherever it fits an i8. Only the low byte of a 16-bit product depends on
/// the low bytes of its factors, so two `vpmullw` give all 64.
#[inline(always)]
unsafe fn mul_bytes(v: __m512i, dig: __m512i) -> __m512i {
    let d16 = _mm512_or_si512(
        _mm512_and_si512(dig, _mm512_set1_epi32(0xFFFF)),
        _mm512_slli_epi32::<16>(dig),
    );
    let even = _mm512_and_si512(
        _mm512_mullo_epi16(_mm512_and_si512(v, _mm512_set1_epi16(0xFF)), d16),
        _mm512_set1_epi16(0xFF),
    );
    let odd = _mm512_mullo_epi16(_mm512_and_si512(v, _mm512_set1_epi16(0xFF00u16 as i16)), d16);
    _mm512_or_si512(even, odd)
}

/// Digit weight `p`'s tile row for value zmm `kg` (values 4kg..4kg + 4 of the 16 rows).
#[inline(always)]
unsafe fn digit_at(out: *mut u8, p: usize, kg: usize) -> *mut __m512i {
    out.add(DIGIT_BYTES * p + 64 * kg).cast()
}

#[inline(always)]
unsafe fn lanes(pb: *const u8, off: usize) -> __m512i {
    _mm512_loadu_si512(pb.add(off).cast())
}

impl TileFormat for Q4KZ {
    #[inline(always)]
    unsafe fn digits(pb: *const u8, out: *mut u8) {
        for g in 0..8 {
            let sc = lanes(pb, SCALES + 64 * g);
            let (lo, hi) = (_mm512_and_si512(sc, _mm512_set1_epi32(7)), _mm512_srli_epi32::<3>(sc));
            // The pair's low i16 is the group's min (0..63): one byte, in all four of a lane.
            let mn = _mm512_and_si512(lanes(pb, PAIRS + 64 * g), _mm512_set1_epi32(0xFF));
            let mn = _mm512_mullo_epi32(mn, _mm512_set1_epi32(0x0101_0101));
            for kg in 8 * g..8 * g + 8 {
                let v = lanes(pb, VALUES + 64 * kg);
                _mm512_storeu_si512(digit_at(out, 0, kg), mul_bytes(v, lo));
                _mm512_storeu_si512(digit_at(out, 1, kg), mul_bytes(v, hi));
                _mm512_storeu_si512(digit_at(out, 2, kg), mn);
            }
        }
    }
    #[inline(always)]
    unsafe fn finish(c: [__m512i; DIGITS], pb: *const u8, yd: __m512, acc: __m512) -> __m512 {
        let s = _mm512_add_epi32(c[0], _mm512_slli_epi32::<3>(c[1]));
        let d = _mm512_loadu_ps(pb.add(D).cast());
        let dmin = _mm512_loadu_ps(pb.add(DMIN).cast());
        let t = _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(c[2]));
        _mm512_fmadd_ps(yd, _mm512_fmsub_ps(d, _mm512_cvtepi32_ps(s), t), acc)
    }
}

/// Balanced base-7 digits of a Q6_K scale (−128..127): `s = d0 + 7·d1 + 49·d2`, each in −3..3.
fn base7(s: i32) -> [i32; 3] {
    // 171 = 3·(1 + 7 + 49): shifts every digit to 0..6 and `s` to 43..298 (< 7³).
    let t = s + 171;
    [t % 7 - 3, t / 7 % 7 - 3, t / 49 - 3]
}

impl TileFormat for Q6KZ {
    #[inline(always)]
    unsafe fn digits(pb: *const u8, out: *mut u8) {
        for g in 0..16 {
            let mut sc = [0i32; 16];
            _mm512_storeu_si512(sc.as_mut_ptr().cast(), lanes(pb, SCALES + 64 * g));
            let mut dig = [[0i32; 16]; DIGITS];
            for (r, &s) in sc.iter().enumerate() {
                for (p, d) in base7(s).into_iter().enumerate() {
                    dig[p][r] = d;
                }
            }
            let dig = dig.map(|d| _mm512_loadu_si512(d.as_ptr().cast()));
            for kg in 4 * g..4 * g + 4 {
                // The panel keeps q + 32 (unsigned); the tiles take q itself.
                let v = _mm512_sub_epi8(lanes(pb, VALUES + 64 * kg), _mm512_set1_epi8(32));
                for p in 0..DIGITS {
                    _mm512_storeu_si512(digit_at(out, p, kg), mul_bytes(v, dig[p]));
                }
            }
        }
    }
    #[inline(always)]
    unsafe fn finish(c: [__m512i; DIGITS], pb: *const u8, yd: __m512, acc: __m512) -> __m512 {
        let times7 = |v: __m512i| _mm512_sub_epi32(_mm512_slli_epi32::<3>(v), v);
        let s = _mm512_add_epi32(c[0], times7(_mm512_add_epi32(c[1], times7(c[2]))));
        let d = _mm512_loadu_ps(pb.add(D).cast());
        _mm512_fmadd_ps(yd, _mm512_mul_ps(d, _mm512_cvtepi32_ps(s)), acc)
    }
}

/// Bytes of the tile panel for rows of `cols` values: the VNNI panel, then the digit weights.
fn tile_panel_bytes(cols: usize) -> usize {
    cols / 256 * (BLOCK_BYTES + DIGITS * DIGIT_BYTES)
}

/// Unpacks 16 weight rows into the VNNI panel and the digit weights.
///
/// # Safety
/// As [`panel::unpack`], for a `panel` of [`tile_panel_bytes`].
#[inline(always)]
unsafe fn unpack<F: TileFormat>(cols: usize, w: &[u8], w_row: usize, panel: &mut [u8]) {
    let nb = cols / 256;
    let (vnni, digits) = panel.split_at_mut(nb * BLOCK_BYTES);
    panel::unpack::<F>(cols, w, w_row, vnni);
    for i in 0..nb {
        F::digits(
            vnni.as_ptr().add(i * BLOCK_BYTES),
            digits.as_mut_ptr().add(i * DIGITS * DIGIT_BYTES),
        );
    }
}

/// Fewest tokens a tile runs: a smaller tail of a batch runs on the VNNI panel.
const TILE_MIN_TOKENS: usize = 4;

/// `out[t * out_stride + r]` for the 16 rows of the panel and the `m` Q8_K rows of `x`: tiles of
/// 16 tokens, then a tile of the tail's height, or the VNNI panel for a tail of fewer than
/// [`TILE_MIN_TOKENS`].
///
/// # Safety
/// As [`panel::run`], for a panel [`unpack`] filled, with AMX usable in this process.
#[inline(always)]
unsafe fn run<F: TileFormat>(
    cols: usize,
    panel: &[u8],
    x: &[u8],
    x_row: usize,
    m: usize,
    out: *mut f32,
    out_stride: usize,
) {
    let nb = cols / 256;
    let (vnni, digits) = panel.split_at(nb * BLOCK_BYTES);
    let full = m / TT * TT;
    let on_tiles = if m - full >= TILE_MIN_TOKENS { m } else { full };
    // A tile of tokens at a time, against every block: its activations are read once, in row
    // order (blocks first ran against every tile of tokens, their digit weights held in L1:
    // slower, as the activations then stream from L3 once per block). The running sums wait
    // in `out`, 16 lines that stay in L1 (a token's float steps keep their block order).
    for t0 in (0..on_tiles).step_by(TT) {
        let n = (on_tiles - t0).min(TT);
        if t0 == 0 || n < TT {
            tiles::configure(n);
        }
        let (xp, o) = (x.as_ptr().add(t0 * x_row), out.add(t0 * out_stride));
        for i in 0..nb {
            block::<F>(i, vnni, digits, xp, x_row, n, o, out_stride);
        }
    }
    if on_tiles > 0 {
        tiles::release();
    }
    if on_tiles < m {
        let x = &x[on_tiles * x_row..];
        let out = out.add(on_tiles * out_stride);
        panel::run::<F>(cols, vnni, x, x_row, m - on_tiles, out, out_stride);
    }
}

/// Block `i` of the panel against `n <= 16` tokens from `xp` (the configured tile height): each
/// token's running sum in `out` (from 0 at block 0) after the block's float step.
///
/// # Safety
/// As [`run`], with the tiles configured for `n` tokens and `out` holding the sums of blocks
/// `0..i`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn block<F: TileFormat>(
    i: usize,
    vnni: &[u8],
    digits: &[u8],
    xp: *const u8,
    x_row: usize,
    n: usize,
    out: *mut f32,
    out_stride: usize,
) {
    #[repr(C, align(64))]
    struct Sums([[[i32; 16]; TT]; DIGITS]);
    let mut c = std::mem::MaybeUninit::<Sums>::uninit();
    let y0 = xp.add(i * 292);
    let w = digits.as_ptr().add(i * DIGITS * DIGIT_BYTES);
    tiles::dot3(y0.add(4), x_row, w, c.as_mut_ptr().cast());
    // SAFETY: dot3 wrote the sums of every configured token (rows 0..n of each digit).
    let c = c.as_ptr().cast::<[[i32; 16]; TT]>();
    let pb = vnni.as_ptr().add(i * BLOCK_BYTES);
    for t in 0..n {
        let sums = std::array::from_fn(|p| _mm512_load_si512((*c.add(p))[t].as_ptr().cast()));
        let yd = _mm512_set1_ps(y0.add(t * x_row).cast::<f32>().read_unaligned());
        let o = out.add(t * out_stride);
        let acc = if i == 0 { _mm512_setzero_ps() } else { _mm512_loadu_ps(o) };
        _mm512_storeu_ps(o, F::finish(sums, pb, yd, acc));
    }
}

/// The tile panel kernels of `ty`, if it has them.
pub(crate) fn panel_kernels(ty: GgmlType) -> Option<PanelKernels> {
    match ty {
        GgmlType::Q4K => panel_table!(Q4KZ, tile_panel_bytes),
        GgmlType::Q6K => panel_table!(Q6KZ, tile_panel_bytes),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::base7;

    #[test]
    fn base7_digits_cover_every_q6k_scale() {
        for s in -128..=127 {
            let d = base7(s);
            assert!(d.iter().all(|d| (-3..=3).contains(d)), "{s}: {d:?}");
            assert_eq!(d[0] + 7 * d[1] + 49 * d[2], s);
        }
    }
}
