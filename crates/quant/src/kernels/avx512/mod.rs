//! x86-64 AVX-512 path (F/BW/VL + VNNI): 512-bit kernels for the K-quants that make up the
//! Q4_K_M mix (Q4_K, Q6_K, Q5_K) and IQ4_XS (`kquants.rs`), and for every other type the AVX2
//! kernel sources compiled again with these features (32 vector registers, and one `vpdpbusd`
//! for the legacy formats' u8·i8 sums).
//!
//! Design of the 512-bit kernels: one zmm holds 64 consecutive values of a weight block, which
//! are also 64 consecutive bytes of the Q8_K activation block, so an activation row is read with
//! one full-width load per 64 values and no shuffles. For the K-quants a token costs one
//! `vpdpbusd` per 64 values (u8 weights × i8 activations, in i32 sums of 4 that fit an i16), and
//! per 128 values one `vpackssdw` and one `vpdpwssd` that multiplies by the per-16 or per-32
//! scales and adds into the i32 accumulator: four ops per 128 values, three of them on port 0,
//! where the AVX2 path takes about fourteen 256-bit ones. Unpacking the weights and splatting their
//! scales is done once per block for all `C` tokens. Offsets (Q6_K's −32) fold into the same
//! integer sum through the Q8_K block sums (one more `vpdpwssd`); Q4_K/Q5_K's float mins are one
//! 256-bit `vpmaddwd` a token. IQ4_XS (a signed codebook) negates each token's activations where
//! the weight is negative and uses `vpmaddubsw` + `vpdpwssd` per 64 values. With 32 registers an
//! 8-token tile keeps its 8 integer accumulators in registers. Each block's i32 vector is folded
//! into one exact integer per token (a `vphaddd` tree across the tokens, ~3 instructions per
//! token and block) and the block's float step runs with one token per lane: the same integers
//! and the same float steps, in the same order, as the prefill panels (`panel.rs`), so both give
//! the same bits. Against the scalar twins only the f32 accumulation order differs. Decode of
//! Q4_K/Q5_K (one token) stops each block at its integer sums and finishes 8 rows' blocks at
//! once (`kquants::dot_x1`): the tree, the scale conversions and the float step that a lone
//! token pays per row and block are a third of its instructions; same integers, same steps.
//!
//! # Safety
//! Same contract as the AVX2 kernels (see `avx2/mod.rs`), with AVX-512 F/BW/VL/VNNI on top.

use super::avx2::{simd_kernels, simd_quantizer, simd_table};
use super::{DotKernels, Partner, QuantizeFn};
use crate::GgmlType;

/// The [`PanelKernels`](super::PanelKernels) of format `$f`: `unpack::<$f>` and `run::<$f>`
/// (functions of the module that expands it) behind this path's target features, and `$bytes`.
macro_rules! panel_table {
    ($f:ty, $bytes:expr) => {{
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
        unsafe fn unpack_f(cols: usize, w: &[u8], w_row: usize, panel: &mut [u8]) {
            // SAFETY: forwarded contract of PanelKernels::unpack.
            unsafe { unpack::<$f>(cols, w, w_row, panel) }
        }
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
        unsafe fn run_f(
            cols: usize,
            panel: &[u8],
            x: &[u8],
            x_row: usize,
            m: usize,
            out: *mut f32,
            out_stride: usize,
        ) {
            // SAFETY: forwarded contract of PanelKernels::run (a tile panel is handed out only
            // where tiles::usable() holds).
            unsafe { run::<$f>(cols, panel, x, x_row, m, out, out_stride) }
        }
        Some(PanelKernels { unpack: unpack_f, run: run_f, bytes: $bytes })
    }};
}

mod kquants;
mod panel;
mod tile_panel;
mod tiles;

pub(crate) use panel::panel_kernels;
pub(crate) use tile_panel::panel_kernels as tile_panel_kernels;
pub(crate) use tiles::usable as tiles_usable;

/// The kernel table of Q4_K or Q5_K: `dot::<K, N>` for 2, 4 and 8 tokens, and decode (one
/// token) 8 weight rows at a time (`kquants::dot_x1`).
macro_rules! rows8_kernels {
    ($k:ty) => {{
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
        unsafe fn x1(
            n: usize,
            w: &[u8],
            w_row: usize,
            x: &[u8],
            _stride: usize,
            out: *mut f32,
            _out_stride: usize,
        ) {
            // SAFETY: DotRowsFn's contract for one activation row is dot_x1's.
            unsafe { kquants::dot_x1::<$k>(n, w, w_row, x, out) }
        }
        Some(DotKernels {
            x1,
            ..simd_kernels!("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni", dot::<$k>)
        })
    }};
}

pub(crate) fn dot_kernels(ty: GgmlType) -> Option<DotKernels> {
    use kquants::*;
    match ty {
        GgmlType::Q4K => rows8_kernels!(Q4KZ),
        GgmlType::Q5K => rows8_kernels!(Q5KZ),
        GgmlType::Q6K => {
            Some(simd_kernels!("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni", dot::<Q6KZ>))
        }
        GgmlType::IQ4XS => {
            Some(simd_kernels!("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni", dot::<Iq4XsZ>))
        }
        _ => simd_table!("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni", true, ty),
    }
}

pub(crate) fn quantizer(p: Partner) -> QuantizeFn {
    simd_quantizer!("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni", p)
}
