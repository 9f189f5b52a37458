//! Seeds and random numbers: a fixed, documented generator, so a seed means the same weights in
//! every snug version.

use rand_xoshiro::rand_core::{RngCore, SeedableRng};
use rand_xoshiro::Xoshiro256StarStar;

/// splitmix64 of `a` combined with `b`: independent seeds per tensor and row.
pub(super) fn mix(a: u64, b: u64) -> u64 {
    let mut z = a ^ b.wrapping_mul(0x9e37_79b9_7f4a_7c15).wrapping_add(0x632b_e59b_d9b4_e019);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Seeded normals: xoshiro256** (a fixed, documented algorithm, so a seed means the same weights
/// in every snug version) with Box–Muller.
pub(super) struct Rng(Xoshiro256StarStar);

impl Rng {
    pub(super) fn new(seed: u64) -> Rng {
        Rng(Xoshiro256StarStar::seed_from_u64(seed))
    }

    /// Uniform in (0, 1].
    fn unit(&mut self) -> f64 {
        ((self.0.next_u64() >> 11) + 1) as f64 / (1u64 << 53) as f64
    }

    pub(super) fn fill_normal(&mut self, out: &mut [f32], mean: f32, std: f32) {
        for pair in out.chunks_mut(2) {
            let (u1, u2) = (self.unit(), self.unit());
            let r = (-2.0 * u1.ln()).sqrt();
            let th = 2.0 * std::f64::consts::PI * u2;
            pair[0] = mean + std * (r * th.cos()) as f32;
            if let Some(x) = pair.get_mut(1) {
                *x = mean + std * (r * th.sin()) as f32;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normals_have_the_asked_mean_and_spread() {
        let mut v = vec![0f32; 100_001];
        Rng::new(7).fill_normal(&mut v, 0.0, 0.02);
        let mean = v.iter().map(|&x| x as f64).sum::<f64>() / v.len() as f64;
        let var = v.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / v.len() as f64;
        assert!(mean.abs() < 1e-3 && (var.sqrt() - 0.02).abs() < 5e-4, "{mean} {var}");
    }
}
