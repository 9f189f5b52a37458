//! What the crate's unit tests share: deterministic noise, and the guard of the tests that hold
//! a SIMD kernel table against its generic twin.

/// Uniform in [-1, 1), deterministic per `seed` (xorshift64).
pub(crate) fn rng(seed: u64) -> impl FnMut() -> f32 {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

/// `n` values uniform in [-scale, scale), deterministic per `seed`.
pub(crate) fn noise(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut r = rng(seed);
    (0..n).map(|_| r() * scale).collect()
}

/// Fails a SIMD-against-generic test by name where this process runs the generic kernels
/// (`quant::by_isa!` picks them): the test would compare the generic code with itself and pass
/// without checking anything, so on a CPU without a SIMD path it says it could not run.
pub(crate) fn require_simd() {
    assert!(
        quant::by_isa!(true, false),
        "NOT RUN: this CPU (or SNUG_KERNELS) gives no SIMD kernel path, so there is nothing to \
         compare with the generic kernels"
    );
}
