//! x86-64 AVX-512 path: the AVX2 kernel sources compiled again with AVX-512 F/BW/VL + VNNI
//! enabled, so LLVM has 32 vector registers (no accumulator spills in the 8-token tile) and the
//! legacy formats' u8·i8 sums use one `vpdpbusd` instead of `vpmaddubsw`+`vpmaddwd`+add.
//! Same source, same integer results as the AVX2 path; chosen only on CPUs that report all of
//! these features. Not yet a 512-bit-wide kernel set.

use super::avx2::{simd_kernels, simd_quantizer, simd_table};
use super::{DotKernels, Partner, QuantizeFn};
use crate::GgmlType;

pub(crate) fn dot_kernels(ty: GgmlType) -> Option<DotKernels> {
    simd_table!("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni", true, ty)
}

pub(crate) fn quantizer(p: Partner) -> QuantizeFn {
    simd_quantizer!("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni", p)
}
