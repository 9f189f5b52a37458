//! The scale searches behind ggml's reference quantizers (`make_qkx2_quants`, `make_qx_quants`,
//! `make_q3_quants`, the IQ4 codebook lookup), ported operation for operation so snug's blocks are
//! byte-identical to llama.cpp's. Cost: O(n · trials) per sub-block, no allocation.

use crate::blocks::IQ4_NL_VALUES;

/// ggml's `nearest_int`: round half to even via the 1.5·2^23 trick (exact for |f| < 2^22;
/// out-of-range or NaN input gives a meaningless but harmless integer, never a panic).
#[inline]
pub(super) fn nearest_int(f: f32) -> i32 {
    let v = f + 12_582_912.0;
    (v.to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

/// The value of largest magnitude (first one on ties), as ggml's `amax`/`max` loops find it.
#[inline]
pub(super) fn signed_absmax(x: &[f32]) -> f32 {
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    max
}

/// Smallest sub-block maximum treated as non-zero (ggml's `GROUP_MAX_EPS`).
pub(super) const GROUP_MAX_EPS: f32 = 1e-15;

/// ggml's `make_qkx2_quants`: fit `x ≈ scale * l + min` (min ≤ 0, l in 0..=nmax) minimising the
/// weighted error, trying `nstep + 1` scales around `nmax / (max - min)`.
#[derive(Clone, Copy)]
pub(super) struct QkxSearch {
    pub nmax: u8,
    pub rmin: f32,
    pub rdelta: f32,
    pub nstep: u8,
    /// Absolute instead of squared error.
    pub use_mad: bool,
}

impl QkxSearch {
    /// Writes the levels to `l` and returns (scale, -min).
    pub fn run(&self, x: &[f32], w: &[f32], l: &mut [u8]) -> (f32, f32) {
        let nmax = f32::from(self.nmax);
        let (mut min, mut max) = (x[0], x[0]);
        let mut sum_w = w[0];
        let mut sum_x = sum_w * x[0];
        for i in 1..x.len() {
            if x[i] < min {
                min = x[i];
            }
            if x[i] > max {
                max = x[i];
            }
            sum_w += w[i];
            sum_x += w[i] * x[i];
        }
        if min > 0.0 {
            min = 0.0;
        }
        if max == min {
            l.fill(0);
            return (0.0, -min);
        }
        let err = |d: f32| if self.use_mad { d.abs() } else { d * d };
        // `min` moves as better fits are found, and later trials start from it (as in ggml).
        let level = |iscale: f32, min: f32, v: f32| {
            nearest_int(iscale * (v - min)).clamp(0, i32::from(self.nmax)) as u8
        };
        let iscale = nmax / (max - min);
        let mut scale = 1.0 / iscale;
        let mut best_error = 0f32;
        for i in 0..x.len() {
            l[i] = level(iscale, min, x[i]);
            best_error += w[i] * err(scale * f32::from(l[i]) + min - x[i]);
        }
        let mut laux = [0u8; 32];
        let laux = &mut laux[..x.len()];
        for is in 0..=self.nstep {
            let iscale = (self.rmin + self.rdelta * f32::from(is) + nmax) / (max - min);
            let (mut sum_l, mut sum_l2, mut sum_xl) = (0f32, 0f32, 0f32);
            for i in 0..x.len() {
                laux[i] = level(iscale, min, x[i]);
                let li = f32::from(laux[i]);
                sum_l += w[i] * li;
                sum_l2 += w[i] * li * li;
                sum_xl += w[i] * li * x[i];
            }
            let det = sum_w * sum_l2 - sum_l * sum_l;
            if det > 0.0 {
                let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
                let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
                if this_min > 0.0 {
                    this_min = 0.0;
                    this_scale = sum_xl / sum_l2;
                }
                let mut cur_error = 0f32;
                for i in 0..x.len() {
                    cur_error += w[i] * err(this_scale * f32::from(laux[i]) + this_min - x[i]);
                }
                if cur_error < best_error {
                    l.copy_from_slice(laux);
                    best_error = cur_error;
                    scale = this_scale;
                    min = this_min;
                }
            }
        }
        (scale, -min)
    }
}

/// ggml's `make_qx_quants` with `rmse_type = 1` and no importance weights (weight x²): symmetric
/// levels `l + nmax` in 0..2·nmax, trying 19 scales around `-nmax / max`. Returns the scale.
pub(super) fn make_qx_quants(x: &[f32], nmax: i32, l: &mut [u8]) -> f32 {
    let max = signed_absmax(x);
    if max.abs() < GROUP_MAX_EPS {
        l.fill(0);
        return 0.0;
    }
    let level = |iscale: f32, v: f32| nearest_int(iscale * v).clamp(-nmax, nmax - 1);
    let sums = |iscale: f32| {
        x.iter().fold((0f32, 0f32), |(slx, sl2), &v| {
            let (li, w) = (level(iscale, v) as f32, v * v);
            (slx + w * v * li, sl2 + w * li * li)
        })
    };
    let mut iscale = -(nmax as f32) / max;
    let (sumlx, suml2) = sums(iscale);
    let mut best_iscale = iscale;
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in -9i32..=9 {
        if is == 0 {
            continue;
        }
        iscale = -(nmax as f32 + 0.1 * is as f32) / max;
        let (sumlx, suml2) = sums(iscale);
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            best_iscale = iscale;
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    for (q, &v) in l.iter_mut().zip(x) {
        *q = (level(best_iscale, v) + nmax) as u8;
    }
    scale
}

/// ggml's `make_q3_quants` with `do_rmse`: levels in -nmax..nmax (returned as `l + nmax`) fit by
/// x²-weighted least squares, then up to 5 rounds of per-value coordinate descent.
pub(super) fn make_q3_quants(x: &[f32], l: &mut [u8]) -> f32 {
    const NMAX: i32 = 4;
    let max = signed_absmax(x);
    if max.abs() < GROUP_MAX_EPS {
        l.fill(0);
        return 0.0;
    }
    let iscale = -(NMAX as f32) / max;
    let mut li = [0i32; 16];
    let (mut sumlx, mut suml2) = (0f32, 0f32);
    for i in 0..x.len() {
        li[i] = nearest_int(iscale * x[i]).clamp(-NMAX, NMAX - 1);
        let w = x[i] * x[i];
        sumlx += w * x[i] * li[i] as f32;
        suml2 += w * li[i] as f32 * li[i] as f32;
    }
    for _ in 0..5 {
        let mut n_changed = 0;
        for i in 0..x.len() {
            let w = x[i] * x[i];
            let mut slx = sumlx - w * x[i] * li[i] as f32;
            if slx > 0.0 {
                let mut sl2 = suml2 - w * li[i] as f32 * li[i] as f32;
                let new_l = nearest_int(x[i] * sl2 / slx).clamp(-NMAX, NMAX - 1);
                if new_l != li[i] {
                    slx += w * x[i] * new_l as f32;
                    sl2 += w * new_l as f32 * new_l as f32;
                    if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                        (li[i], sumlx, suml2) = (new_l, slx, sl2);
                        n_changed += 1;
                    }
                }
            }
        }
        if n_changed == 0 {
            break;
        }
    }
    for (q, &v) in l.iter_mut().zip(&li) {
        *q = (v + NMAX) as u8;
    }
    if suml2 > 0.0 {
        sumlx / suml2
    } else {
        0.0
    }
}

/// Index of the codebook value nearest `x` in the sorted `IQ4_NL_VALUES` (ggml's
/// `best_index_int8`: binary search, ties to the upper neighbour).
pub(super) fn best_index_iq4(x: f32) -> u8 {
    let v = |i: usize| f32::from(IQ4_NL_VALUES[i]);
    if x <= v(0) {
        return 0;
    }
    if x >= v(15) {
        return 15;
    }
    let (mut ml, mut mu) = (0, 15);
    while mu - ml > 1 {
        let mav = (ml + mu) / 2;
        if x < v(mav) {
            mu = mav;
        } else {
            ml = mav;
        }
    }
    if x - v(mu - 1) < v(mu) - x {
        (mu - 1) as u8
    } else {
        mu as u8
    }
}
