//! Walsh–Hadamard rotation of KV heads (after llama.cpp PR #21038 and ik_llama.cpp's `-khad`/
//! `-vhad`): before a quantized cache stores a head, the head is multiplied by the normalised
//! Hadamard matrix H (orthonormal, symmetric, its own inverse), which spreads an outlier channel
//! over every channel of its block so that one channel no longer sets the quantization scale of
//! the others.
//!
//! - **Keys:** q and k are both rotated after RoPE, so (Hq)·(Hk) = q·k and the scores need
//!   nothing else; the cache holds Hk.
//! - **Values:** the cache holds Hv; attention sums weighted Hv, so its output is H·out and one
//!   more H (H·H = I) gives the output back.
//!
//! A head of `d` channels is rotated in blocks of [`block_for`]`(d)` channels: the largest power
//! of two dividing `d` (all of a 64-, 128- or 256-channel head; 3 × 32 for 96, 5 × 16 for 80),
//! block-diagonal H. Below [`MIN_BLOCK`] channels (a head dim such as 72 = 9 × 8) nothing is
//! rotated: an 8-channel block spreads an outlier too little to pay.
//!
//! Cost: `n log2 n` adds per block and one multiply per channel, in place (no scratch); per token
//! per layer that is one rotation of q (all query heads), k and v each, plus one of the
//! attention output. [`rotate`] runs the kernel of the process's path ([`quant::kernels::isa`]):
//! AVX-512 (16 lanes) and AVX2 (8 lanes) do the butterflies inside a register with lane permutes
//! and across registers with add/sub, in the same order and roundings as the scalar twin
//! [`rotate_generic`], so all three give the same bits (the tests hold them to it).

/// Smallest rotation block (see the module doc).
pub const MIN_BLOCK: usize = 16;

/// The rotation block of a head of `d` channels: the largest power of two dividing `d`, or
/// `None` when that is below [`MIN_BLOCK`].
pub fn block_for(d: usize) -> Option<usize> {
    if d == 0 {
        return None;
    }
    let b = 1usize << d.trailing_zeros();
    (b >= MIN_BLOCK).then_some(b)
}

/// Rotates each `block`-channel piece of `x` in place by the normalised Walsh–Hadamard matrix.
/// `block` is a power of two of at least [`MIN_BLOCK`] and `x.len()` a multiple of it.
#[inline]
pub fn rotate(x: &mut [f32], block: usize) {
    assert!(
        block >= MIN_BLOCK && block.is_power_of_two() && x.len().is_multiple_of(block),
        "rotation block {block} does not fit {} values",
        x.len()
    );
    #[cfg(target_arch = "x86_64")]
    {
        use quant::kernels::{isa, Isa};
        match isa() {
            // SAFETY: the path is the AVX-512 one only on a CPU with AVX-512F (and AVX2 below
            // it only with AVX2 + FMA); the block was checked above.
            Isa::Avx512 => return unsafe { x86::rotate_avx512(x, block) },
            i if i.avx2_family() => return unsafe { x86::rotate_avx2(x, block) },
            _ => {}
        }
    }
    rotate_generic(x, block);
}

/// The scalar twin of [`rotate`] (the reference the SIMD paths are tested against).
pub fn rotate_generic(x: &mut [f32], block: usize) {
    let s = 1.0 / (block as f32).sqrt();
    for c in x.chunks_exact_mut(block) {
        let mut h = 1;
        while h < block {
            for i in (0..block).step_by(2 * h) {
                for j in i..i + h {
                    let (a, b) = (c[j], c[j + h]);
                    c[j] = a + b;
                    c[j + h] = a - b;
                }
            }
            h *= 2;
        }
        c.iter_mut().for_each(|v| *v *= s);
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    //! # Safety
    //! Each function requires the CPU features it enables, `block` a power of two of at least
    //! 16 and `x.len()` a multiple of it (checked by [`super::rotate`]); every load and store is
    //! of a whole vector inside `x`.
    use std::arch::x86_64::*;

    /// Butterflies of stride `h ≥ lanes` across vectors of `block`-channel pieces, then the
    /// scale; `L` lanes per vector, `ld`/`st`/`add`/`sub`/`mul` the vector ops.
    macro_rules! cross_stages {
        ($x:ident, $block:ident, $L:expr, $ld:ident, $st:ident, $add:ident, $sub:ident, $mul:ident, $s:ident) => {{
            let p = $x.as_mut_ptr();
            for c0 in (0..$x.len()).step_by($block) {
                let mut h = $L;
                while h < $block {
                    let last = 2 * h == $block;
                    for i in (c0..c0 + $block).step_by(2 * h) {
                        for j in (i..i + h).step_by($L) {
                            let (a, b) = ($ld(p.add(j)), $ld(p.add(j + h)));
                            let (u, v) = ($add(a, b), $sub(a, b));
                            if last {
                                $st(p.add(j), $mul(u, $s));
                                $st(p.add(j + h), $mul(v, $s));
                            } else {
                                $st(p.add(j), u);
                                $st(p.add(j + h), v);
                            }
                        }
                    }
                    h *= 2;
                }
                if $block == $L {
                    $st(p.add(c0), $mul($ld(p.add(c0)), $s));
                }
            }
        }};
    }

    /// Per 8 lanes: the stride 1, 2 and 4 butterflies as `x·sign + swapped(x)` (one rounding,
    /// as the scalar `a + b` / `a - b`), then the cross-vector strides.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn rotate_avx2(x: &mut [f32], block: usize) {
        let sg1 = _mm256_setr_ps(1., -1., 1., -1., 1., -1., 1., -1.);
        let sg2 = _mm256_setr_ps(1., 1., -1., -1., 1., 1., -1., -1.);
        let sg4 = _mm256_setr_ps(1., 1., 1., 1., -1., -1., -1., -1.);
        let p = x.as_mut_ptr();
        for i in (0..x.len()).step_by(8) {
            let mut v = _mm256_loadu_ps(p.add(i));
            v = _mm256_fmadd_ps(v, sg1, _mm256_permute_ps::<0b10_11_00_01>(v));
            v = _mm256_fmadd_ps(v, sg2, _mm256_permute_ps::<0b01_00_11_10>(v));
            v = _mm256_fmadd_ps(v, sg4, _mm256_permute2f128_ps::<1>(v, v));
            _mm256_storeu_ps(p.add(i), v);
        }
        let s = _mm256_set1_ps(1.0 / (block as f32).sqrt());
        cross_stages!(
            x,
            block,
            8,
            _mm256_loadu_ps,
            _mm256_storeu_ps,
            _mm256_add_ps,
            _mm256_sub_ps,
            _mm256_mul_ps,
            s
        );
    }

    /// As [`rotate_avx2`] over 16 lanes: strides 1 and 2 by in-lane permutes, 4 and 8 by
    /// 128-bit lane shuffles.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn rotate_avx512(x: &mut [f32], block: usize) {
        let pm = |a: [f32; 4]| {
            _mm512_setr_ps(
                a[0], a[1], a[2], a[3], a[0], a[1], a[2], a[3], a[0], a[1], a[2], a[3], a[0], a[1],
                a[2], a[3],
            )
        };
        let sg1 = pm([1., -1., 1., -1.]);
        let sg2 = pm([1., 1., -1., -1.]);
        let sg4 =
            _mm512_setr_ps(1., 1., 1., 1., -1., -1., -1., -1., 1., 1., 1., 1., -1., -1., -1., -1.);
        let sg8 =
            _mm512_setr_ps(1., 1., 1., 1., 1., 1., 1., 1., -1., -1., -1., -1., -1., -1., -1., -1.);
        let p = x.as_mut_ptr();
        for i in (0..x.len()).step_by(16) {
            let mut v = _mm512_loadu_ps(p.add(i));
            v = _mm512_fmadd_ps(v, sg1, _mm512_permute_ps::<0b10_11_00_01>(v));
            v = _mm512_fmadd_ps(v, sg2, _mm512_permute_ps::<0b01_00_11_10>(v));
            v = _mm512_fmadd_ps(v, sg4, _mm512_shuffle_f32x4::<0b10_11_00_01>(v, v));
            v = _mm512_fmadd_ps(v, sg8, _mm512_shuffle_f32x4::<0b01_00_11_10>(v, v));
            _mm512_storeu_ps(p.add(i), v);
        }
        let s = _mm512_set1_ps(1.0 / (block as f32).sqrt());
        cross_stages!(
            x,
            block,
            16,
            _mm512_loadu_ps,
            _mm512_storeu_ps,
            _mm512_add_ps,
            _mm512_sub_ps,
            _mm512_mul_ps,
            s
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::{noise, require_simd};

    #[test]
    fn blocks_are_the_largest_power_of_two_dividing_the_head() {
        assert_eq!(block_for(64), Some(64));
        assert_eq!(block_for(256), Some(256));
        assert_eq!(block_for(96), Some(32));
        assert_eq!(block_for(80), Some(16));
        assert_eq!(block_for(72), None);
        assert_eq!(block_for(0), None);
    }

    #[test]
    fn generic_is_orthonormal_its_own_inverse_and_spreads_an_outlier() {
        for block in [16, 32, 64, 128, 256] {
            let (q, k) = (noise(3 * block, 1, 2.0), noise(3 * block, 2, 2.0));
            let (mut hq, mut hk) = (q.clone(), k.clone());
            rotate_generic(&mut hq, block);
            rotate_generic(&mut hk, block);
            let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>();
            assert!((dot(&q, &k) - dot(&hq, &hk)).abs() < 1e-3, "block {block}");
            rotate_generic(&mut hq, block);
            for (a, b) in q.iter().zip(&hq) {
                assert!((a - b).abs() < 1e-5, "block {block}: {a} vs {b}");
            }
            let mut spike = vec![0.0; block];
            spike[3] = 1.0;
            rotate_generic(&mut spike, block);
            let e = 1.0 / (block as f32).sqrt();
            assert!(spike.iter().all(|v| (v.abs() - e).abs() < 1e-6), "block {block}");
        }
    }

    #[test]
    fn every_kernel_path_gives_the_scalar_bits() {
        require_simd();
        for block in [16, 32, 64, 128, 256] {
            let x = noise(4 * block, block as u64, 2.0);
            let mut want = x.clone();
            rotate_generic(&mut want, block);
            #[cfg(target_arch = "x86_64")]
            {
                if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
                    let mut got = x.clone();
                    // SAFETY: AVX2 and FMA were detected; the block fits `got`.
                    unsafe { x86::rotate_avx2(&mut got, block) };
                    assert_eq!(got, want, "avx2, block {block}");
                }
                if is_x86_feature_detected!("avx512f") {
                    let mut got = x.clone();
                    // SAFETY: AVX-512F was detected; the block fits `got`.
                    unsafe { x86::rotate_avx512(&mut got, block) };
                    assert_eq!(got, want, "avx512, block {block}");
                }
            }
            let mut got = x.clone();
            rotate(&mut got, block);
            assert_eq!(got, want, "dispatched, block {block}");
        }
    }

    #[test]
    #[should_panic(expected = "does not fit")]
    fn a_block_that_does_not_fit_is_refused() {
        rotate(&mut [0.0; 24], 16);
    }
}
