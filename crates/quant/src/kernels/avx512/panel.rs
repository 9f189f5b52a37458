//! Prefill on AVX-512 VNNI: 16 weight rows unpacked once into a panel, then every token of the
//! batch broadcast against it. Its outputs are bit-identical to the row kernels' (`kquants.rs`),
//! so which kernel a token meets is a matter of speed only.
//!
//! The row kernels unpack a weight block for each group of at most 8 tokens and spend about as
//! many instructions applying scales, packing and taking the mins as on the products themselves.
//! Here a chunk of [`PANEL_ROWS`] rows is unpacked once per matmul into unsigned bytes laid out
//! `[k / 4][row][k % 4]`, so one zmm holds four consecutive values of each of the 16 rows. A
//! token's four activation bytes at `k` are one broadcast (an embedded `{1to16}` memory operand)
//! and one `vpdpbusd` adds 64 products into the 16 rows' sums: the token's outputs end up as one
//! zmm of 16 rows, stored with one write. Eight tokens run at once (8 × 3 accumulators of the 32
//! registers), each weight zmm loaded once for the eight.
//!
//! Same bits as the row kernels: per 256-value block and (row, token) both compute the exact
//! i32 `S = Σ_groups scale · Σ u·q8` (the offset of Q6_K and IQ4_XS folded in through the Q8_K
//! block sums) and, for Q4_K/Q5_K, `M = Σ min · bsum`; integer sums do not depend on their order.
//! Then one float step per block, in block order, from 0: Q4_K/Q5_K
//! `acc = fma(yd, fmsub(d, S, dmin·M), acc)`, Q6_K/IQ4_XS `acc = fma(yd, d·S, acc)` (`k4_step`,
//! `d_step` in `kquants.rs`). The row kernels fold their i32 vector into `S` each block (a
//! `vphaddd` tree across the tokens, ~3 instructions per token); here one lane is one row and
//! the group sums are weighed by their integer scales: a `vpdpwssd` by `(scale, 0)` per sum of 16
//! (Q4_K) or 8 (Q5_K) values, whose magnitude fits an i16, or a `vpmulld` per group (Q6_K's 16
//! values, IQ4_XS's 32, whose sums do not). Ranges: `|S| < 2^28` and `|M| < 2^22` for every
//! format, with `|q8| <= 128`.
//!
//! Cost per 256-value block and token: 64 `vpdpbusd`; 16 `vpdpwssd` (Q4_K), 32 (Q5_K), or 16
//! (IQ4_XS: 8 groups) or 32 (Q6_K: 16 groups) `vpmulld` µops and 8 or 16 adds; 8 `vpdpwssd` for
//! the min or offset term against the Q8_K block sums; 2 `cvt` and 2 or 3 float ops. That is
//! close to one instruction per 64 products, against ~2.5 in the row kernels; next to the old
//! float-per-group panel (one `cvt` and one FMA per group), Q4_K costs the same, Q5_K, Q6_K
//! and IQ4_XS a few per cent more.
//!
//! Panel block (one per 256 columns), [`BLOCK_BYTES`]: the 64 value zmm; one i32 zmm per scale
//! group holding each row's scale; 8 zmm of i16 pairs per row that weigh the 16 block sums
//! (Q4_K/Q5_K: the mins; Q6_K: −32·scale, its offset; IQ4_XS: −128·scale, the offset that made
//! its signed codebook unsigned); one f32 zmm of `d` and one of `dmin` per row.
//!
//! The unpack, paid once per chunk and matmul: each row's block is decoded to bytes in place
//! (the row kernels' quads), then the 16 rows' bytes are transposed in registers, 64 shuffles
//! per 16 × 64 values; the scale fields of the 16 rows are gathered as dwords (one row per
//! lane) and decoded for all 16 at once. It costs about what running 4–6 tokens does (a gather
//! per output zmm and scalar scale decoding cost twice that), so
//! [`PANEL_MIN_TOKENS`](super::super::PANEL_MIN_TOKENS) keeps only smaller batches on the row
//! kernels.
//!
//! # Safety
//! Every function here needs AVX-512 F/BW/VL/VNNI; the callers check the ISA.

// Index loops over the token rows read more plainly than zipped iterators here.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use super::kquants::{iq4_lut, iq4_xs_quad, q6k_quads, Block512, Iq4XsZ, K4Z, Q4KZ, Q5KZ, Q6KZ};
use crate::kernels::{PanelKernels, PANEL_ROWS};
use crate::GgmlType;

// One panel row per i32 lane of a zmm.
const _: () = assert!(PANEL_ROWS == 16);

/// Offsets inside a panel block.
pub(super) const VALUES: usize = 0;
pub(super) const SCALES: usize = 64 * 64;
pub(super) const PAIRS: usize = SCALES + 16 * 64;
pub(super) const D: usize = PAIRS + 8 * 64;
pub(super) const DMIN: usize = D + 64;

/// Bytes of one panel block (16 rows × 256 values and their scales).
pub(crate) const BLOCK_BYTES: usize = DMIN + 64;

/// Tokens run together by the microkernel.
const NT: usize = 8;

/// A weight format the panel takes (its block size is [`Block512::BYTES`]): its scale groups,
/// how their integer sums are weighed, and how one block of one row unpacks.
pub(crate) trait PanelFormat: Block512 {
    /// Values per scale (16 or 32).
    const GROUP: usize;
    /// Values per `vpdpwssd`-weighed sum, whose magnitude fits an i16 (`SUB < GROUP`), or
    /// `GROUP`: the group's i32 sum is weighed with `vpmulld`.
    const SUB: usize;
    /// Whether the block sums' term has its own factor (`dmin`: Q4_K/Q5_K's mins) or is an
    /// offset folded into `S` (Q6_K, IQ4_XS).
    const MIN: bool;
    /// The block's 256 values as unsigned bytes, in order, at `out`.
    ///
    /// # Safety
    /// AVX-512 F/BW/VL/VNNI; `b` is one block, `out` 256 writable bytes.
    unsafe fn values(b: *const u8, out: *mut u8);
    /// The scale fields of one block in each of the 16 rows, one row per i32 lane, written into
    /// the panel block at `pb`: the integer scale per group ([`SCALES`], `256 / GROUP` zmm), the
    /// i16 pair weighing block sums `2p` and `2p + 1` ([`PAIRS`], 8 zmm), `d` ([`D`]) and `dmin`
    /// ([`DMIN`], 0 without a min term). Row `r`'s block is at `b + idx[r]`.
    ///
    /// # Safety
    /// AVX-512 F/BW/VL/VNNI; each `b + idx[r]` is one whole block; `pb` one panel block.
    unsafe fn scales16(b: *const u8, idx: __m512i, pb: *mut u8);
}

/// The dword at `b + off + idx[r]` in lane `r`.
#[inline(always)]
unsafe fn gather(b: *const u8, off: usize, idx: __m512i) -> __m512i {
    _mm512_i32gather_epi32::<1>(idx, b.add(off).cast())
}

/// The f16 in the low half of each i32 lane, as f32 (exact).
#[inline(always)]
unsafe fn f16_lanes(v: __m512i) -> __m512 {
    _mm512_cvtph_ps(_mm512_cvtepi32_epi16(v))
}

/// Byte `k` of each i32 lane, zero-extended.
#[inline(always)]
unsafe fn byte(v: __m512i, k: usize) -> __m512i {
    _mm512_and_si512(_mm512_srlv_epi32(v, _mm512_set1_epi32(8 * k as i32)), _mm512_set1_epi32(0xFF))
}

/// The i16 pair (low half of `lo`, low half of `hi`) in each i32 lane: what weighs two block
/// sums.
#[inline(always)]
unsafe fn i16_pair(lo: __m512i, hi: __m512i) -> __m512i {
    _mm512_or_si512(_mm512_and_si512(lo, _mm512_set1_epi32(0xFFFF)), _mm512_slli_epi32::<16>(hi))
}

#[inline(always)]
unsafe fn store(pb: *mut u8, off: usize, v: __m512i) {
    _mm512_storeu_si512(pb.add(off).cast(), v);
}

/// Q4_K and Q5_K: the four 64-value quads of a [`K4Z`] block; scales by [`k4_scales`]. A
/// 16-value Q4_K sum is at most 16·15·128 = 30,720 and an 8-value Q5_K sum 8·31·128 = 31,744
/// in magnitude: both fit an i16.
impl<W: K4Z + Block512> PanelFormat for W {
    const GROUP: usize = 32;
    const SUB: usize = W::SUB;
    const MIN: bool = true;
    #[inline(always)]
    unsafe fn values(b: *const u8, out: *mut u8) {
        for j in 0..4 {
            _mm512_storeu_si512(out.add(64 * j).cast(), W::quad(b, j));
        }
    }
    #[inline(always)]
    unsafe fn scales16(b: *const u8, idx: __m512i, pb: *mut u8) {
        k4_scales16(b, idx, pb)
    }
}

/// Q4_K/Q5_K: `d` and `dmin` (two f16 at 0), and the 6-bit scale and min per 32 values packed
/// in the 12 bytes at 4 (ggml's `get_scale_min_k4`): for j < 4 the low 6 bits of bytes j and
/// j + 4, for j >= 4 a nibble of byte j + 4 with the top two bits of bytes j − 4 and j. The min
/// weighs both block sums of its 32 values.
#[inline(always)]
unsafe fn k4_scales16(b: *const u8, idx: __m512i, pb: *mut u8) {
    let dd = gather(b, 0, idx);
    _mm512_storeu_ps(pb.add(D).cast(), f16_lanes(dd));
    _mm512_storeu_ps(pb.add(DMIN).cast(), f16_lanes(_mm512_srli_epi32::<16>(dd)));
    let q = [gather(b, 4, idx), gather(b, 8, idx), gather(b, 12, idx)];
    let (m63, m15) = (_mm512_set1_epi32(63), _mm512_set1_epi32(15));
    let top2 = |v: __m512i| _mm512_slli_epi32::<4>(_mm512_srli_epi32::<6>(v));
    for j in 0..8 {
        let (sc, mn) = if j < 4 {
            (_mm512_and_si512(byte(q[0], j), m63), _mm512_and_si512(byte(q[1], j), m63))
        } else {
            let c = byte(q[2], j - 4);
            (
                _mm512_or_si512(_mm512_and_si512(c, m15), top2(byte(q[0], j - 4))),
                _mm512_or_si512(_mm512_srli_epi32::<4>(c), top2(byte(q[1], j - 4))),
            )
        };
        store(pb, SCALES + 64 * j, sc);
        store(pb, PAIRS + 64 * j, i16_pair(mn, mn));
    }
}

/// Q6_K: unsigned values (stored + 32), the signed scale per 16, the offset −32 · scale per
/// block sum folded into `S`.
impl PanelFormat for Q6KZ {
    const GROUP: usize = 16;
    const SUB: usize = 16;
    const MIN: bool = false;
    #[inline(always)]
    unsafe fn values(b: *const u8, out: *mut u8) {
        for h in 0..2 {
            let (u0, u1) = q6k_quads(b, h);
            _mm512_storeu_si512(out.add(128 * h).cast(), u0);
            _mm512_storeu_si512(out.add(128 * h + 64).cast(), u1);
        }
    }
    /// `d` at 208 (read as the high half of the dword at 206, inside the 210-byte block), the
    /// signed scale per 16 values at 192, the offset −32 · scale per block sum folded into `S`.
    #[inline(always)]
    unsafe fn scales16(b: *const u8, idx: __m512i, pb: *mut u8) {
        _mm512_storeu_ps(pb.add(D).cast(), f16_lanes(_mm512_srli_epi32::<16>(gather(b, 206, idx))));
        _mm512_storeu_ps(pb.add(DMIN).cast(), _mm512_setzero_ps());
        let s =
            [gather(b, 192, idx), gather(b, 196, idx), gather(b, 200, idx), gather(b, 204, idx)];
        let sc: [__m512i; 16] = std::array::from_fn(|g| {
            let up = _mm512_sllv_epi32(s[g / 4], _mm512_set1_epi32(24 - 8 * (g % 4) as i32));
            _mm512_srai_epi32::<24>(up)
        });
        let off = |v: __m512i| _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32::<5>(v));
        for g in 0..16 {
            store(pb, SCALES + 64 * g, sc[g]);
        }
        for p in 0..8 {
            store(pb, PAIRS + 64 * p, i16_pair(off(sc[2 * p]), off(sc[2 * p + 1])));
        }
    }
}

/// IQ4_XS: codebook entries + 128 (unsigned), the signed scale per 32, the offset −128 · scale
/// folded into `S`.
impl PanelFormat for Iq4XsZ {
    const GROUP: usize = 32;
    const SUB: usize = 32;
    const MIN: bool = false;
    #[inline(always)]
    unsafe fn values(b: *const u8, out: *mut u8) {
        let (lut, bias) = (iq4_lut(), _mm512_set1_epi8(-128));
        for p in 0..4 {
            let q = _mm512_xor_si512(iq4_xs_quad(b, p, lut), bias);
            _mm512_storeu_si512(out.add(64 * p).cast(), q);
        }
    }
    /// `d` (f16 at 0) and the high scale bits (u16 at 2) in one dword, the low nibbles at 4:
    /// scale `ib` is `(low nibble ib | high crumb ib << 4) − 32`, its offset −128 · scale.
    #[inline(always)]
    unsafe fn scales16(b: *const u8, idx: __m512i, pb: *mut u8) {
        let h = gather(b, 0, idx);
        _mm512_storeu_ps(pb.add(D).cast(), f16_lanes(h));
        _mm512_storeu_ps(pb.add(DMIN).cast(), _mm512_setzero_ps());
        let l = gather(b, 4, idx);
        let field = |v: __m512i, shift: usize, mask: i32| {
            _mm512_and_si512(
                _mm512_srlv_epi32(v, _mm512_set1_epi32(shift as i32)),
                _mm512_set1_epi32(mask),
            )
        };
        for ib in 0..8 {
            let ls = _mm512_or_si512(
                field(l, 4 * ib, 0xF),
                _mm512_slli_epi32::<4>(field(h, 16 + 2 * ib, 3)),
            );
            let sc = _mm512_sub_epi32(ls, _mm512_set1_epi32(32));
            let off = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32::<7>(sc));
            store(pb, SCALES + 64 * ib, sc);
            store(pb, PAIRS + 64 * ib, i16_pair(off, off));
        }
    }
}

/// Bytes of the panel for rows of `cols` values.
fn panel_bytes(cols: usize) -> usize {
    cols / 256 * BLOCK_BYTES
}

/// Unpacks [`PANEL_ROWS`] weight rows (`w`, rows of `w_row` bytes, `cols` values) into `panel`
/// ([`panel_bytes`] long).
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI; `w` holds 16 full rows; `cols` is a multiple of 256.
#[inline(always)]
pub(crate) unsafe fn unpack<F: PanelFormat>(cols: usize, w: &[u8], w_row: usize, panel: &mut [u8]) {
    #[repr(C, align(64))]
    struct Rows([[u8; 256]; PANEL_ROWS]);
    let mut rows = Rows([[0; 256]; PANEL_ROWS]);
    let idx = _mm512_mullo_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
        _mm512_set1_epi32(w_row as i32),
    );
    let (nb, bytes) = (cols / 256, <F as Block512>::BYTES);
    for (i, pb) in panel.chunks_exact_mut(BLOCK_BYTES).take(nb).enumerate() {
        // The chunk is read a column of blocks at a time, 16 rows apart, which the hardware
        // prefetcher does not follow, and in decode it comes from DRAM: hints for the column two
        // on (near the end, the next 16 rows' first columns, which this or another thread
        // unpacks next). One hint per 64 bytes; a line a block's hints miss, the block after it
        // in the row takes.
        let (rows_on, col) = if i + 2 < nb { (0, i + 2) } else { (PANEL_ROWS, i + 2 - nb) };
        for r in 0..PANEL_ROWS {
            let p = w.as_ptr().wrapping_add((rows_on + r) * w_row + col * bytes);
            for o in (0..bytes).step_by(64) {
                // Wrapping: past the last chunk the address may lie outside the matrix (or the
                // mapping); a prefetch never faults.
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(o).cast());
            }
        }
        let b0 = w.as_ptr().add(i * bytes);
        for (r, row) in rows.0.iter_mut().enumerate() {
            F::values(b0.add(r * w_row), row.as_mut_ptr());
        }
        let dst = pb.as_mut_ptr();
        // Dwords 16j..16j + 16 of the 16 rows, transposed: zmm 16j + k holds dword 16j + k (values
        // 4(16j + k)..) of each row.
        for j in 0..4 {
            let v: [__m512i; 16] =
                std::array::from_fn(|r| _mm512_load_si512(rows.0[r].as_ptr().add(64 * j).cast()));
            for (k, col) in transpose16(v).into_iter().enumerate() {
                store(dst, VALUES + 64 * (16 * j + k), col);
            }
        }
        F::scales16(b0, idx, dst);
    }
}

/// `o[k]` lane `r` = i32 lane `k` of `v[r]`: a 16 × 16 dword transpose in 64 shuffles (pairs of
/// rows interleaved by dword, then by qword, within 128-bit lanes; then the lanes gathered).
#[inline(always)]
unsafe fn transpose16(v: [__m512i; 16]) -> [__m512i; 16] {
    let z = _mm512_setzero_si512();
    // Per 128-bit lane: t[2i] = a0 b0 a1 b1, t[2i + 1] = a2 b2 a3 b3 (a, b rows 2i, 2i + 1).
    let mut t = [z; 16];
    for i in 0..8 {
        t[2 * i] = _mm512_unpacklo_epi32(v[2 * i], v[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(v[2 * i], v[2 * i + 1]);
    }
    // u[4g + k], 128-bit lane L: dword 4L + k of rows 4g..4g + 4.
    let mut u = [z; 16];
    for g in 0..4 {
        let (t0, t1, t2, t3) = (t[4 * g], t[4 * g + 1], t[4 * g + 2], t[4 * g + 3]);
        u[4 * g] = _mm512_unpacklo_epi64(t0, t2);
        u[4 * g + 1] = _mm512_unpackhi_epi64(t0, t2);
        u[4 * g + 2] = _mm512_unpacklo_epi64(t1, t3);
        u[4 * g + 3] = _mm512_unpackhi_epi64(t1, t3);
    }
    // o[4L + k]: lane L of u[k], u[4 + k], u[8 + k], u[12 + k].
    let mut o = [z; 16];
    for k in 0..4 {
        let (u0, u1, u2, u3) = (u[k], u[4 + k], u[8 + k], u[12 + k]);
        let (x01, y01) =
            (_mm512_shuffle_i32x4::<0x44>(u0, u1), _mm512_shuffle_i32x4::<0x44>(u2, u3));
        let (x23, y23) =
            (_mm512_shuffle_i32x4::<0xEE>(u0, u1), _mm512_shuffle_i32x4::<0xEE>(u2, u3));
        o[k] = _mm512_shuffle_i32x4::<0x88>(x01, y01);
        o[4 + k] = _mm512_shuffle_i32x4::<0xDD>(x01, y01);
        o[8 + k] = _mm512_shuffle_i32x4::<0x88>(x23, y23);
        o[12 + k] = _mm512_shuffle_i32x4::<0xDD>(x23, y23);
    }
    o
}

/// `out[t * out_stride + r] = Σ_k panel[r, k] · x_t[k]` for the 16 rows of `panel` and the `m`
/// Q8_K activation rows of `x` (stride `x_row`).
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI; `panel` was unpacked for `cols` columns; `x` holds `m` rows of
/// `cols` Q8_K values at `x_row` bytes; `out` is valid for 16 writes at each `t * out_stride`.
#[inline(always)]
pub(crate) unsafe fn run<F: PanelFormat>(
    cols: usize,
    panel: &[u8],
    x: &[u8],
    x_row: usize,
    m: usize,
    out: *mut f32,
    out_stride: usize,
) {
    let mut t = 0;
    while t < m {
        t += match m - t {
            left if left >= NT => tokens::<F, NT>(cols, panel, x, x_row, t, out, out_stride),
            left if left >= 4 => tokens::<F, 4>(cols, panel, x, x_row, t, out, out_stride),
            left if left >= 2 => tokens::<F, 2>(cols, panel, x, x_row, t, out, out_stride),
            _ => tokens::<F, 1>(cols, panel, x, x_row, t, out, out_stride),
        };
    }
}

/// Tokens `t0..t0 + C` of [`run`]; returns `C`.
#[inline(always)]
unsafe fn tokens<F: PanelFormat, const C: usize>(
    cols: usize,
    panel: &[u8],
    x: &[u8],
    x_row: usize,
    t0: usize,
    out: *mut f32,
    out_stride: usize,
) -> usize {
    let mut acc = [_mm512_setzero_ps(); C];
    let xp = x.as_ptr().add(t0 * x_row);
    for i in 0..cols / 256 {
        let pb = panel.as_ptr().add(i * BLOCK_BYTES);
        block::<F, C>(pb, xp.add(i * 292), x_row, &mut acc);
    }
    for c in 0..C {
        _mm512_storeu_ps(out.add((t0 + c) * out_stride), acc[c]);
    }
    C
}

/// The four bytes at `p` in every i32 lane (folded into its use as a `{1to16}` operand).
#[inline(always)]
unsafe fn bcast(p: *const u8) -> __m512i {
    _mm512_set1_epi32(p.cast::<i32>().read_unaligned())
}

/// One panel block against the Q8_K blocks at `y0 + c · xs` (c < C), added into `acc`: per
/// token the exact i32 `S` (and `M`), then the block's float step of the row kernels
/// (`kquants.rs`: `k4_step`, `d_step`) with one row per lane.
#[inline(always)]
unsafe fn block<F: PanelFormat, const C: usize>(
    pb: *const u8,
    y0: *const u8,
    xs: usize,
    acc: &mut [__m512; C],
) {
    let mut s = [_mm512_setzero_si512(); C];
    for g in 0..256 / F::GROUP {
        let sc = _mm512_loadu_si512(pb.add(SCALES + 64 * g).cast());
        for h in 0..F::GROUP / F::SUB {
            let mut raw = [_mm512_setzero_si512(); C];
            for j in 0..F::SUB / 4 {
                let kg = (g * F::GROUP + h * F::SUB) / 4 + j;
                let w = _mm512_loadu_si512(pb.add(VALUES + 64 * kg).cast());
                for c in 0..C {
                    raw[c] = _mm512_dpbusd_epi32(raw[c], w, bcast(y0.add(c * xs + 4 + 4 * kg)));
                }
            }
            for c in 0..C {
                s[c] = if F::SUB < F::GROUP {
                    // |raw| < 2^15 and 0 <= scale < 2^15: the high i16 halves add 0.
                    _mm512_dpwssd_epi32(s[c], raw[c], sc)
                } else {
                    _mm512_add_epi32(s[c], _mm512_mullo_epi32(raw[c], sc))
                };
            }
        }
    }
    // The min or offset term: Σ_p pair_p · (bsum 2p, bsum 2p + 1).
    let mut m = if F::MIN { [_mm512_setzero_si512(); C] } else { s };
    for p in 0..8 {
        let pair = _mm512_loadu_si512(pb.add(PAIRS + 64 * p).cast());
        for c in 0..C {
            m[c] = _mm512_dpwssd_epi32(m[c], pair, bcast(y0.add(c * xs + 260 + 4 * p)));
        }
    }
    let d = _mm512_loadu_ps(pb.add(D).cast());
    let dmin = _mm512_loadu_ps(pb.add(DMIN).cast());
    for c in 0..C {
        let yd = _mm512_set1_ps(y0.add(c * xs).cast::<f32>().read_unaligned());
        let v = if F::MIN {
            let t = _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(m[c]));
            _mm512_fmsub_ps(d, _mm512_cvtepi32_ps(s[c]), t)
        } else {
            _mm512_mul_ps(d, _mm512_cvtepi32_ps(m[c]))
        };
        acc[c] = _mm512_fmadd_ps(yd, v, acc[c]);
    }
}

/// The panel kernels of `ty`, if it has them.
pub(crate) fn panel_kernels(ty: GgmlType) -> Option<PanelKernels> {
    match ty {
        GgmlType::Q4K => panel_table!(Q4KZ, panel_bytes),
        GgmlType::Q5K => panel_table!(Q5KZ, panel_bytes),
        GgmlType::Q6K => panel_table!(Q6KZ, panel_bytes),
        GgmlType::IQ4XS => panel_table!(Iq4XsZ, panel_bytes),
        _ => None,
    }
}
