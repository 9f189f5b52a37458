//! 512-bit K-quant kernels (Q4_K, Q5_K, Q6_K) and IQ4_XS against Q8_K, generic over `C`
//! activation rows like the AVX2 ones (the module doc in `mod.rs` says the design). Every
//! kernel here has the contract of the AVX2 kernels plus AVX-512 F/BW/VL/VNNI.

// Index loops over the C activation rows read more plainly than zipped iterators here.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;
use std::mem::MaybeUninit;

use super::super::avx2::{
    f16_at, f16_end_at, f16x2_at, k4_scales_mins, load, prefetch_block, shuffle_mem, K4_MINS16,
};
use crate::blocks::IQ4_NL_VALUES;

/// 64-byte-aligned constant vector (loaded with one aligned load, often folded into its use).
#[repr(C, align(64))]
struct Z([u8; 64]);

#[inline(always)]
unsafe fn zload(z: &Z) -> __m512i {
    _mm512_load_si512(z.0.as_ptr().cast())
}

#[inline(always)]
unsafe fn load512(p: *const u8) -> __m512i {
    _mm512_loadu_si512(p.cast())
}

/// The 32 bytes at `p` in both 256-bit halves of a zmm.
#[inline(always)]
unsafe fn bcast256(p: *const u8) -> __m512i {
    _mm512_broadcast_i64x4(load(p))
}

/// i16 lane `i` as an index vector (`vpermw` control).
const fn idx_i16(table: [u8; 32]) -> Z {
    let mut z = [0u8; 64];
    let mut i = 0;
    while i < 32 {
        z[2 * i] = table[i];
        i += 1;
    }
    Z(z)
}

/// `[a; 16]` then `[b; 16]`.
const fn halves(a: u8, b: u8) -> [u8; 32] {
    let mut t = [a; 32];
    let mut i = 16;
    while i < 32 {
        t[i] = b;
        i += 1;
    }
    t
}

/// A weight format with a 512-bit kernel: its 256-value block size in bytes and the work of one
/// block for `C` activation rows (Q8_K blocks at `y0 + c·xs`), added into lane `c` of `acc`.
pub(crate) trait Block512 {
    const BYTES: usize;
    /// # Safety
    /// AVX-512 F/BW/VL/VNNI; `b` is one block of this format, `y0 + c·xs` one Q8_K block for
    /// every `c < C`, and `C <= 8`.
    unsafe fn block<const C: usize>(b: *const u8, y0: *const u8, xs: usize, acc: &mut __m256);
}

/// The dot of one weight row of `n` values of `K` with `C` Q8_K activation rows at a stride of
/// `xs` bytes: every kernel of this file is this loop around its `block`. Lane `c` of the f32
/// accumulator is token `c`, which takes one exact integer sum per block (the vector's lanes
/// folded together) and the block's float step (`k4_step`, `d_step`), block after block, as
/// the panels do (`panel.rs`): the same bits.
#[inline(always)]
pub(crate) unsafe fn dot<K: Block512, const C: usize>(
    n: usize,
    w: &[u8],
    x: &[u8],
    xs: usize,
) -> [f32; C] {
    const { assert!(C <= 8) };
    let mut acc = _mm256_setzero_ps();
    let blocks = w.chunks_exact(K::BYTES).zip(x.chunks_exact(292));
    for (b, y0) in blocks.take(n / 256) {
        prefetch_block::<C>(b.as_ptr(), K::BYTES);
        K::block::<C>(b.as_ptr(), y0.as_ptr(), xs, &mut acc);
    }
    let mut lanes = [0f32; 8];
    _mm256_storeu_ps(lanes.as_mut_ptr(), acc);
    std::array::from_fn(|c| lanes[c])
}

// --- Decode: 8 rows at once -------------------------------------------------------------------

/// Most blocks a row may have for [`dot_x1`]'s 8-row path. Its stash (36 bytes a block and row,
/// 4.5 KiB at this length) shares L1 with the activation row and the weights streaming in; at
/// 35 blocks the stash and the activations crowd the stream out of L1, and the path read about
/// 8% slower than `dot::<K, 1>` (BENCHMARKS.md). Longer rows take `dot::<K, 1>`.
const X1_MAX_BLOCKS: usize = 16;

/// Decode's row loop for Q4_K/Q5_K: every weight row of `w` (rows of `w_row` bytes, `n` values)
/// against one Q8_K activation row, row `r` into `out[r]`.
///
/// The rows are read in order, one stream as in `dot::<K, 1>`, but each block stops at its
/// integer sums ([`k4_partial`]), stashed with its scale dword. After 8 rows the stash is
/// reduced block by block for the 8 at once ([`k4_finish8`]): one tree of horizontal adds,
/// one conversion of the scales and one float step for 8 rows, where `dot::<K, 1>` pays a tree,
/// the conversions and a step per row and block. The float steps run in block order from 0 as
/// in `dot::<K, 1>`, so every row gets its bits. Rows left over, and rows of more than
/// [`X1_MAX_BLOCKS`] blocks, take `dot::<K, 1>`.
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI; `w.len()` is a multiple of `w_row`, each row `n / 256` blocks of `K`;
/// `x` one Q8_K row of `n` values; `out` valid for a write per row.
#[inline(always)]
pub(crate) unsafe fn dot_x1<K: K4Z + Block512>(
    n: usize,
    w: &[u8],
    w_row: usize,
    x: &[u8],
    out: *mut f32,
) {
    let (nb, rows) = (n / 256, w.len() / w_row);
    let mut r = 0;
    if nb <= X1_MAX_BLOCKS {
        // Uninitialised: block i of the 8 rows is written below before it is read.
        let mut part = [const { MaybeUninit::<[__m256i; 8]>::uninit() }; X1_MAX_BLOCKS];
        let mut scales = [const { MaybeUninit::<[u32; 8]>::uninit() }; X1_MAX_BLOCKS];
        while r + 8 <= rows {
            for k in 0..8 {
                let wr = w.as_ptr().add((r + k) * w_row);
                for (i, y) in x.chunks_exact(292).take(nb).enumerate() {
                    let b = wr.add(i * K::BYTES);
                    prefetch_block::<1>(b, K::BYTES);
                    (*part[i].as_mut_ptr())[k] = k4_partial::<K>(b, y.as_ptr());
                    (*scales[i].as_mut_ptr())[k] = b.cast::<u32>().read_unaligned();
                }
            }
            let mut acc = _mm256_setzero_ps();
            for (i, y) in x.chunks_exact(292).take(nb).enumerate() {
                let sc = _mm256_loadu_si256(scales[i].as_ptr().cast());
                k4_finish8(part[i].assume_init_ref(), sc, y.as_ptr(), &mut acc);
            }
            _mm256_storeu_ps(out.add(r), acc);
            r += 8;
        }
    }
    for (k, wr) in w[r * w_row..].chunks_exact(w_row).enumerate() {
        *out.add(r + k) = dot::<K, 1>(n, wr, x, 0)[0];
    }
}

// --- Per-block reductions and float steps -------------------------------------------------------

/// The 16 i32 lanes of `z` summed in pairs into 8 (exact: the block sums fit an i32).
#[inline(always)]
unsafe fn fold512(z: __m512i) -> __m256i {
    _mm256_add_epi32(_mm512_castsi512_si256(z), _mm512_extracti64x4_epi64::<1>(z))
}

/// Lanes 0..4 of the result: lanes 0..4 of `v` plus lanes 4..8; the rest zero.
#[inline(always)]
unsafe fn fold256(v: __m256i) -> __m256i {
    _mm256_zextsi128_si256(_mm_add_epi32(
        _mm256_castsi256_si128(v),
        _mm256_extracti128_si256::<1>(v),
    ))
}

/// Lane `c < N` of the result is the sum of the eight lanes of `v[c]` (N = 1, 2, 4 or 8); a
/// transposing tree of `vphaddd`, about three instructions per vector.
#[inline(always)]
unsafe fn hsum_lanes<const N: usize>(v: &[__m256i; N]) -> __m256i {
    match N {
        1 => {
            let x = _mm256_hadd_epi32(v[0], v[0]);
            fold256(_mm256_hadd_epi32(x, x))
        }
        2 => {
            let x = _mm256_hadd_epi32(v[0], v[1 % N]);
            fold256(_mm256_hadd_epi32(x, x))
        }
        4 => fold256(_mm256_hadd_epi32(
            _mm256_hadd_epi32(v[0], v[1 % N]),
            _mm256_hadd_epi32(v[2 % N], v[3 % N]),
        )),
        _ => {
            // Halves: lanes 0..4 hold tokens 0..4 (resp. 4..8) over lanes 0..4 of each vector,
            // lanes 4..8 the same over lanes 4..8.
            let q0 = _mm256_hadd_epi32(
                _mm256_hadd_epi32(v[0], v[1 % N]),
                _mm256_hadd_epi32(v[2 % N], v[3 % N]),
            );
            let q1 = _mm256_hadd_epi32(
                _mm256_hadd_epi32(v[4 % N], v[5 % N]),
                _mm256_hadd_epi32(v[6 % N], v[7 % N]),
            );
            _mm256_add_epi32(
                _mm256_permute2x128_si256::<0x20>(q0, q1),
                _mm256_permute2x128_si256::<0x31>(q0, q1),
            )
        }
    }
}

/// The block sums `S` (lanes of `s[c]`) and `M` (lanes of `m[c]`) of `C` tokens as floats,
/// lane `c` token `c`. One tree for both when C <= 2 (decode).
#[inline(always)]
unsafe fn hsum_pairs<const C: usize>(s: &[__m256i; C], m: &[__m256i; C]) -> (__m256, __m256) {
    match C {
        1 => {
            let x = _mm256_hadd_epi32(s[0], m[0]);
            // [S, M, S, M]
            let f = _mm256_cvtepi32_ps(fold256(_mm256_hadd_epi32(x, x)));
            (f, _mm256_movehdup_ps(f))
        }
        2 => {
            let x = _mm256_hadd_epi32(
                _mm256_hadd_epi32(s[0], s[1 % C]),
                _mm256_hadd_epi32(m[0], m[1 % C]),
            );
            // [S0, S1, M0, M1]
            let f = _mm256_cvtepi32_ps(fold256(x));
            (
                f,
                _mm256_castps128_ps256(_mm_movehl_ps(
                    _mm256_castps256_ps128(f),
                    _mm256_castps256_ps128(f),
                )),
            )
        }
        _ => (_mm256_cvtepi32_ps(hsum_lanes(s)), _mm256_cvtepi32_ps(hsum_lanes(m))),
    }
}

/// The f32 at `p`.
#[inline(always)]
unsafe fn f32_at(p: *const u8) -> f32 {
    p.cast::<f32>().read_unaligned()
}

/// Each token's Q8_K scale: lane `c` = the f32 at `y0 + c·xs`; lanes from `C` on are zero (or,
/// for 8, gathered).
#[inline(always)]
unsafe fn yd_lanes<const C: usize>(y0: *const u8, xs: usize) -> __m256 {
    let y = |c: usize| y0.wrapping_add(c * xs);
    match C {
        1 => _mm256_zextps128_ps256(_mm_set_ss(f32_at(y0))),
        2 => _mm256_zextps128_ps256(_mm_setr_ps(f32_at(y0), f32_at(y(1)), 0.0, 0.0)),
        4 => _mm256_zextps128_ps256(_mm_setr_ps(
            f32_at(y0),
            f32_at(y(1)),
            f32_at(y(2)),
            f32_at(y(3)),
        )),
        _ => {
            let idx = _mm256_mullo_epi32(
                _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                _mm256_set1_epi32(xs as i32),
            );
            _mm256_i32gather_ps::<1>(y0.cast(), idx)
        }
    }
}

/// The float step of a Q4_K/Q5_K block, here and in the panels: `acc += yd · (d·S − dmin·M)`
/// as `t = dmin·M; v = fmsub(d, S, t); acc = fma(yd, v, acc)`.
#[inline(always)]
unsafe fn k4_step(acc: &mut __m256, s: __m256, m: __m256, d: __m256, dmin: __m256, yd: __m256) {
    let t = _mm256_mul_ps(dmin, m);
    let v = _mm256_fmsub_ps(d, s, t);
    *acc = _mm256_fmadd_ps(yd, v, *acc);
}

/// The float step of a Q6_K/IQ4_XS block (offset folded into `S`), here and in the panels:
/// `v = d·S; acc = fma(yd, v, acc)`.
#[inline(always)]
unsafe fn d_step(acc: &mut __m256, s: __m256i, d: f32, yd: __m256) {
    let v = _mm256_mul_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(s));
    *acc = _mm256_fmadd_ps(yd, v, *acc);
}

// --- Q4_K / Q5_K --------------------------------------------------------------------------------

/// A Q4_K or Q5_K block read 64 values at a time.
pub(crate) trait K4Z {
    /// Most values whose `u·q8` sum fits an i16 (the panels weigh such sums by `vpdpwssd`).
    const SUB: usize;
    /// Values 64j..64j+64 of the block at `b` as unsigned bytes.
    unsafe fn quad(b: *const u8, j: usize) -> __m512i;
}

pub(crate) struct Q4KZ;
pub(crate) struct Q5KZ;

/// The 32 nibble bytes at `p`: low nibbles in bytes 0..32, high nibbles in bytes 32..64.
#[inline(always)]
unsafe fn nibbles_64(p: *const u8) -> __m512i {
    let q = _mm512_srlv_epi64(bcast256(p), _mm512_setr_epi64(0, 0, 0, 0, 4, 4, 4, 4));
    _mm512_and_si512(q, _mm512_set1_epi8(0xF))
}

impl K4Z for Q4KZ {
    const SUB: usize = 16;
    #[inline(always)]
    unsafe fn quad(b: *const u8, j: usize) -> __m512i {
        nibbles_64(b.add(16 + 32 * j))
    }
}

/// Q5_K: bit 2j of qh[l] is bit 4 of value 64j + l, bit 2j + 1 that of value 64j + 32 + l.
static Q5K_BITS: [Z; 4] = {
    let mut t = [const { Z([0; 64]) }; 4];
    let mut j = 0;
    while j < 4 {
        let mut p = 0;
        while p < 64 {
            t[j].0[p] = 1 << (2 * j + p / 32);
            p += 1;
        }
        j += 1;
    }
    t
};

impl K4Z for Q5KZ {
    const SUB: usize = 8;
    #[inline(always)]
    unsafe fn quad(b: *const u8, j: usize) -> __m512i {
        let q = nibbles_64(b.add(48 + 32 * j));
        let hi = _mm512_test_epi8_mask(bcast256(b.add(16)), zload(&Q5K_BITS[j]));
        _mm512_mask_add_epi8(q, hi, q, _mm512_set1_epi8(16))
    }
}

/// `K4_PAIR[p]`: the i16 scales for the `vpackssdw` of quads 2p and 2p + 1's `vpdpbusd` sums:
/// i16 lane k of 128-bit lane L holds values 64(2p + k/4) + 16L.. (4 per i32 sum), whose scale
/// is 2(2p + k/4) + L/2 (`vpermw` indices into the scales as i16).
static K4_PAIR: [Z; 2] = [pair_idx(0, 2, 2), pair_idx(4, 2, 2)];

/// A `vpermw` control for the i16 lanes after `vpackssdw`: i16 lane k of 128-bit lane L takes
/// scale `base + step·(k/4) + L/per_l` (k/4 picks the packed source, L its 16 values).
const fn pair_idx(base: usize, step: usize, per_l: usize) -> Z {
    let mut t = [0u8; 32];
    let mut i = 0;
    while i < 32 {
        let (l, k) = (i / 8, i % 8);
        t[i] = (base + step * (k / 4) + l / per_l) as u8;
        i += 1;
    }
    idx_i16(t)
}

/// For each activation row c: `sumi[c] += scales · (u0·y | u1·y')` over the 128 activation
/// bytes at `y0 + c·xs + off`: one `vpdpbusd` per 64 values (u8 · i8 in sums of 4, which fit
/// an i16: |4·63·127| < 2^15), both packed to i16 and scaled by one `vpdpwssd`. Six of the
/// eight ops run on port 0 where `vpmaddubsw` + `vpdpwssd` per 64 values would take eight.
#[inline(always)]
unsafe fn dpbusd_pair_rows<const C: usize>(
    sumi: &mut [__m512i; C],
    (u0, u1): (__m512i, __m512i),
    scale16: __m512i,
    y0: *const u8,
    xs: usize,
    off: usize,
) {
    for c in 0..C {
        let y = y0.add(c * xs + off);
        let d0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u0, load512(y));
        let d1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u1, load512(y.add(64)));
        sumi[c] = _mm512_dpwssd_epi32(sumi[c], _mm512_packs_epi32(d0, d1), scale16);
    }
}

/// Q4_K/Q5_K against Q8_K: `d·S − dmin·M` with `S = Σ scale·u·q8` (scales splatted per 32
/// values) and `M = Σ min·bsum` against the Q8_K block sums, both exact i32. Per token, the
/// two i32 vectors whose lanes add up to `S` and `M`.
#[inline(always)]
unsafe fn k4_sums<W: K4Z, const C: usize>(
    b: *const u8,
    y0: *const u8,
    xs: usize,
) -> ([__m256i; C], [__m256i; C]) {
    let sm = k4_scales_mins(b.add(4));
    let sc16 = _mm512_castsi256_si512(_mm256_cvtepu8_epi16(_mm256_castsi256_si128(sm)));
    let mut sumi = [_mm512_setzero_si512(); C];
    for p in 0..2 {
        let u = (W::quad(b, 2 * p), W::quad(b, 2 * p + 1));
        let scale = _mm512_permutexvar_epi16(zload(&K4_PAIR[p]), sc16);
        dpbusd_pair_rows(&mut sumi, u, scale, y0, xs, 4 + 128 * p);
    }
    // Min term Σ_k bsums[k] · min[k/2] (8 lanes of i32).
    let mins16 = shuffle_mem(sm, &K4_MINS16);
    let (mut s, mut m) = ([_mm256_setzero_si256(); C], [_mm256_setzero_si256(); C]);
    for c in 0..C {
        s[c] = fold512(sumi[c]);
        m[c] = _mm256_madd_epi16(mins16, load(y0.add(c * xs + 260)));
    }
    (s, m)
}

#[inline(always)]
unsafe fn k4_block<W: K4Z, const C: usize>(
    b: *const u8,
    y0: *const u8,
    xs: usize,
    acc: &mut __m256,
) {
    let (d, dmin) = f16x2_at(b);
    let (s, m) = k4_sums::<W, C>(b, y0, xs);
    let (s, m) = hsum_pairs(&s, &m);
    k4_step(acc, s, m, _mm256_set1_ps(d), _mm256_set1_ps(dmin), yd_lanes::<C>(y0, xs));
}

/// Rows a..a+4 from `hadd(p[a], p[a+1])` and `hadd(p[a+2], p[a+3])`, whose 128-bit halves hold
/// `[S_a, M_a, S_a+1, M_a+1]` parts: the halves added, `[S_a, M_a, .., S_a+3, M_a+3]`.
#[inline(always)]
unsafe fn pair_quad(x: __m256i, y: __m256i) -> __m256i {
    _mm256_add_epi32(
        _mm256_permute2x128_si256::<0x20>(x, y),
        _mm256_permute2x128_si256::<0x31>(x, y),
    )
}

/// The part of `k4_block::<W, 1>` that depends on the row alone, for [`dot_x1`]: the block's
/// two i32 vectors against the token at `y` as one, `[S, S, M, M | S, S, M, M]` in parts.
#[inline(always)]
unsafe fn k4_partial<W: K4Z>(b: *const u8, y: *const u8) -> __m256i {
    let ([s], [m]) = k4_sums::<W, 1>(b, y, 0);
    _mm256_hadd_epi32(s, m)
}

/// The rest of `k4_block::<W, 1>` for 8 rows, for [`dot_x1`]: row `r`'s [`k4_partial`] in
/// `p[r]` and the first dword of its block (`d`, `dmin`) in lane `r` of `scales`, stepped into
/// lane `r` of `acc` with `k4_block`'s float step, so lane `r` gets the bits `k4_block::<W, 1>`
/// gives row `r`.
#[inline(always)]
unsafe fn k4_finish8(p: &[__m256i; 8], scales: __m256i, y: *const u8, acc: &mut __m256) {
    // [S0, M0, S1, M1, S2, M2, S3, M3] and the same for rows 4..8.
    let z0 = pair_quad(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
    let z1 = pair_quad(_mm256_hadd_epi32(p[4], p[5]), _mm256_hadd_epi32(p[6], p[7]));
    let s = _mm256_permutex2var_epi32(z0, _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14), z1);
    let m = _mm256_permutex2var_epi32(z0, _mm256_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15), z1);
    // Each dword is the block's d (low f16) and dmin (high f16).
    let d = _mm256_cvtph_ps(_mm256_cvtepi32_epi16(scales));
    let dmin = _mm256_cvtph_ps(_mm256_cvtepi32_epi16(_mm256_srli_epi32::<16>(scales)));
    let (s, m) = (_mm256_cvtepi32_ps(s), _mm256_cvtepi32_ps(m));
    k4_step(acc, s, m, d, dmin, _mm256_set1_ps(f32_at(y)));
}

impl Block512 for Q4KZ {
    const BYTES: usize = 144;
    #[inline(always)]
    unsafe fn block<const C: usize>(b: *const u8, y0: *const u8, xs: usize, acc: &mut __m256) {
        k4_block::<Self, C>(b, y0, xs, acc)
    }
}

impl Block512 for Q5KZ {
    const BYTES: usize = 176;
    #[inline(always)]
    unsafe fn block<const C: usize>(b: *const u8, y0: *const u8, xs: usize, acc: &mut __m256) {
        k4_block::<Self, C>(b, y0, xs, acc)
    }
}

// --- Q6_K ---------------------------------------------------------------------------------------

/// `Q6K_PAIR[h]`: the i16 scales for the `vpackssdw` of chunks (h, 0) and (h, 1): i16 lane k of
/// 128-bit lane L holds values 128h + 64(k/4) + 16L.., scale 8h + 4(k/4) + L.
static Q6K_PAIR: [Z; 2] = [pair_idx(0, 4, 1), pair_idx(8, 4, 1)];

/// Q6_K against Q8_K. Values 128h + 64m + l: low 4 bits from the nibble m of ql[64h + l], bits
/// 4..5 from crumb 2m + l/32 of qh[128 + 32h + l % 32]; stored q = u − 32, folded in as
/// −32·scale per Q8_K block sum.
pub(crate) struct Q6KZ;

/// Values 128h..128h + 64 and 128h + 64..128h + 128 of the Q6_K block at `b`, unsigned (the
/// stored value plus 32).
#[inline(always)]
pub(crate) unsafe fn q6k_quads(b: *const u8, h: usize) -> (__m512i, __m512i) {
    let (m4, m30) = (_mm512_set1_epi8(0xF), _mm512_set1_epi8(0x30));
    let ql = load512(b.add(64 * h));
    let qh = bcast256(b.add(128 + 32 * h));
    // Crumb 2m (low half) / 2m + 1 (high half) to bits 4..5; a 64-bit shift moves each byte's
    // own bits there, the mask drops the rest. (lo & 0xF) | (hi & 0x30): the OR and the second
    // AND in one ternary op.
    let hi0 = _mm512_sllv_epi64(qh, _mm512_setr_epi64(4, 4, 4, 4, 2, 2, 2, 2));
    let hi1 = _mm512_srlv_epi64(qh, _mm512_setr_epi64(0, 0, 0, 0, 2, 2, 2, 2));
    let u0 = _mm512_ternarylogic_epi32::<0xF8>(_mm512_and_si512(ql, m4), hi0, m30);
    let lo1 = _mm512_and_si512(_mm512_srli_epi16::<4>(ql), m4);
    (u0, _mm512_ternarylogic_epi32::<0xF8>(lo1, hi1, m30))
}

impl Block512 for Q6KZ {
    const BYTES: usize = 210;
    #[inline(always)]
    unsafe fn block<const C: usize>(b: *const u8, y0: *const u8, xs: usize, acc: &mut __m256) {
        let d = f16_end_at(b.add(208));
        let sc = _mm256_cvtepi8_epi16(_mm_loadu_si128(b.add(192).cast()));
        let scz = _mm512_castsi256_si512(sc);
        // −32·scale per Q8_K block sum: |32·128·2032·2| < 2^31.
        let bias = _mm512_zextsi256_si512(_mm256_sub_epi16(
            _mm256_setzero_si256(),
            _mm256_slli_epi16::<5>(sc),
        ));
        let mut sumi = [_mm512_setzero_si512(); C];
        for c in 0..C {
            let bs = _mm512_zextsi256_si512(load(y0.add(c * xs + 260)));
            sumi[c] = _mm512_dpwssd_epi32(sumi[c], bias, bs);
        }
        for h in 0..2 {
            let scale = _mm512_permutexvar_epi16(zload(&Q6K_PAIR[h]), scz);
            dpbusd_pair_rows(&mut sumi, q6k_quads(b, h), scale, y0, xs, 4 + 128 * h);
        }
        let mut s8 = [_mm256_setzero_si256(); C];
        for c in 0..C {
            s8[c] = fold512(sumi[c]);
        }
        let s = hsum_lanes(&s8);
        d_step(acc, s, d, yd_lanes::<C>(y0, xs));
    }
}

// --- IQ4_XS -------------------------------------------------------------------------------------

/// `IQ4_SCALE[p]`: scale 2p into i16 lanes 0..16, 2p + 1 into lanes 16..32.
static IQ4_SCALE: [Z; 4] =
    [idx_i16(halves(0, 1)), idx_i16(halves(2, 3)), idx_i16(halves(4, 5)), idx_i16(halves(6, 7))];

/// The 8 IQ4_XS scales (6 bits, minus 32) of the block at `b` as i16 lanes 0..8.
#[inline(always)]
unsafe fn iq4_xs_scales(b: *const u8) -> __m128i {
    // Low 4 bits: nibble ib % 2 of scales_l[ib / 2]; high 2 bits: crumb ib of scales_h.
    let sl = _mm_set1_epi32(b.add(4).cast::<i32>().read_unaligned());
    let z = 0x80u8 as i8;
    let sl = _mm_shuffle_epi8(sl, _mm_setr_epi8(0, z, 0, z, 1, z, 1, z, 2, z, 2, z, 3, z, 3, z));
    let lo = _mm_and_si128(
        _mm_srlv_epi16(sl, _mm_setr_epi16(0, 4, 0, 4, 0, 4, 0, 4)),
        _mm_set1_epi16(0xF),
    );
    let sh = _mm_set1_epi16(b.add(2).cast::<i16>().read_unaligned());
    let hi = _mm_and_si128(
        _mm_srlv_epi16(sh, _mm_setr_epi16(0, 2, 4, 6, 8, 10, 12, 14)),
        _mm_set1_epi16(3),
    );
    let hi = _mm_slli_epi16::<4>(hi);
    _mm_sub_epi16(_mm_or_si128(lo, hi), _mm_set1_epi16(32))
}

/// IQ4_XS against Q8_K. Values 32ib + l: codebook entry of nibble l / 16 of qs[16ib + l % 16];
/// a zmm takes groups 2p and 2p + 1. The codebook is signed, so each token's activations take
/// the weights' signs (masked negate) against the weights' magnitudes.
pub(crate) struct Iq4XsZ;

/// The IQ4 codebook in each 128-bit lane (the `lut` of [`iq4_xs_quad`]).
#[inline(always)]
pub(crate) unsafe fn iq4_lut() -> __m512i {
    _mm512_broadcast_i32x4(_mm_loadu_si128(IQ4_NL_VALUES.as_ptr().cast()))
}

/// Values 64p..64p + 64 of the IQ4_XS block at `b` as signed codebook entries.
#[inline(always)]
pub(crate) unsafe fn iq4_xs_quad(b: *const u8, p: usize, lut: __m512i) -> __m512i {
    // 128-bit lanes: qs 32p.. low, same high, qs 32p + 16.. low, same high.
    let q = {
        let t = bcast256(b.add(8 + 32 * p));
        _mm512_shuffle_i64x2::<0b0101_0000>(t, t)
    };
    let q = _mm512_srlv_epi64(q, _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4));
    _mm512_shuffle_epi8(lut, _mm512_and_si512(q, _mm512_set1_epi8(0xF)))
}

impl Block512 for Iq4XsZ {
    const BYTES: usize = 136;
    #[inline(always)]
    unsafe fn block<const C: usize>(b: *const u8, y0: *const u8, xs: usize, acc: &mut __m256) {
        let lut = iq4_lut();
        let d = f16_at(b);
        let sc = _mm512_castsi128_si512(iq4_xs_scales(b));
        let mut sumi = [_mm512_setzero_si512(); C];
        for p in 0..4 {
            let q = iq4_xs_quad(b, p, lut);
            let (neg, mag) = (_mm512_movepi8_mask(q), _mm512_abs_epi8(q));
            let scale = _mm512_permutexvar_epi16(zload(&IQ4_SCALE[p]), sc);
            for c in 0..C {
                let y = load512(y0.add(c * xs + 4 + 64 * p));
                let y = _mm512_mask_sub_epi8(y, neg, _mm512_setzero_si512(), y);
                let pr = _mm512_maddubs_epi16(mag, y);
                sumi[c] = _mm512_dpwssd_epi32(sumi[c], pr, scale);
            }
        }
        let mut s8 = [_mm256_setzero_si256(); C];
        for c in 0..C {
            s8[c] = fold512(sumi[c]);
        }
        let s = hsum_lanes(&s8);
        d_step(acc, s, d, yd_lanes::<C>(y0, xs));
    }
}
