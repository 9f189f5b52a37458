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
    /// Fit `L` sub-blocks of `N` values at once (sub-block k is `x[N*k..][..N]`, weights `w`
    /// alike); writes the levels to `l` (same layout) and returns per sub-block (scale, -min).
    ///
    /// The sub-blocks are independent, so each lane runs ggml's exact sequence of float
    /// operations (bit-identical results) while the compiler vectorizes across lanes: the
    /// serial sums that bound the one-at-a-time search run L wide.
    pub fn run<const L: usize, const N: usize>(
        &self,
        x: &[f32],
        w: &[f32],
        l: &mut [u8],
    ) -> ([f32; L], [f32; L]) {
        // Transposed copies: xt[i][k] is value i of sub-block k.
        let xt: [[f32; L]; N] = std::array::from_fn(|i| std::array::from_fn(|k| x[N * k + i]));
        let wt: [[f32; L]; N] = std::array::from_fn(|i| std::array::from_fn(|k| w[N * k + i]));
        let nmax = f32::from(self.nmax);
        let (mut min, mut max, mut sum_w) = (xt[0], xt[0], wt[0]);
        let mut sum_x: [f32; L] = std::array::from_fn(|k| sum_w[k] * xt[0][k]);
        for i in 1..N {
            for k in 0..L {
                let (v, wi) = (xt[i][k], wt[i][k]);
                min[k] = if v < min[k] { v } else { min[k] };
                max[k] = if v > max[k] { v } else { max[k] };
                sum_w[k] += wi;
                sum_x[k] += wi * v;
            }
        }
        for m in &mut min {
            if *m > 0.0 {
                *m = 0.0;
            }
        }
        // A constant sub-block (max == min once min is clamped to ≤ 0) gets levels 0, scale 0;
        // its lane still computes (on infinities) but never accepts a fit.
        let flat: [bool; L] = std::array::from_fn(|k| max[k] == min[k]);
        let err = |d: f32| if self.use_mad { d.abs() } else { d * d };
        let level = |iscale: f32, min: f32, v: f32| {
            nearest_int(iscale * (v - min)).clamp(0, i32::from(self.nmax)) as f32
        };
        // The levels of the best fit so far are those of (iscale, min) at the time it was
        // found; `min` itself then moves to the fit's min, and later trials start from it.
        let mut best_iscale: [f32; L] = std::array::from_fn(|k| nmax / (max[k] - min[k]));
        let mut best_level_min = min;
        let mut scale: [f32; L] = std::array::from_fn(|k| 1.0 / best_iscale[k]);
        let mut best_error = [0f32; L];
        for i in 0..N {
            for k in 0..L {
                let li = level(best_iscale[k], min[k], xt[i][k]);
                best_error[k] += wt[i][k] * err(scale[k] * li + min[k] - xt[i][k]);
            }
        }
        let mut laux = [[0f32; L]; N];
        for is in 0..=self.nstep {
            let step = self.rmin + self.rdelta * f32::from(is) + nmax;
            let iscale: [f32; L] = std::array::from_fn(|k| step / (max[k] - min[k]));
            let (mut sum_l, mut sum_l2, mut sum_xl) = ([0f32; L], [0f32; L], [0f32; L]);
            for i in 0..N {
                for k in 0..L {
                    let li = level(iscale[k], min[k], xt[i][k]);
                    laux[i][k] = li;
                    sum_l[k] += wt[i][k] * li;
                    sum_l2[k] += wt[i][k] * li * li;
                    sum_xl[k] += wt[i][k] * li * xt[i][k];
                }
            }
            let mut this_scale = [0f32; L];
            let mut this_min = [0f32; L];
            let mut valid = [false; L];
            for k in 0..L {
                let det = sum_w[k] * sum_l2[k] - sum_l[k] * sum_l[k];
                valid[k] = det > 0.0;
                this_scale[k] = (sum_w[k] * sum_xl[k] - sum_x[k] * sum_l[k]) / det;
                this_min[k] = (sum_l2[k] * sum_x[k] - sum_l[k] * sum_xl[k]) / det;
                if this_min[k] > 0.0 {
                    this_min[k] = 0.0;
                    this_scale[k] = sum_xl[k] / sum_l2[k];
                }
            }
            let mut cur_error = [0f32; L];
            for i in 0..N {
                for k in 0..L {
                    cur_error[k] +=
                        wt[i][k] * err(this_scale[k] * laux[i][k] + this_min[k] - xt[i][k]);
                }
            }
            for k in 0..L {
                if valid[k] && !flat[k] && cur_error[k] < best_error[k] {
                    best_iscale[k] = iscale[k];
                    best_level_min[k] = min[k];
                    best_error[k] = cur_error[k];
                    scale[k] = this_scale[k];
                    min[k] = this_min[k];
                }
            }
        }
        let mut out_scale = scale;
        for k in 0..L {
            for i in 0..N {
                l[N * k + i] = if flat[k] {
                    0
                } else {
                    level(best_iscale[k], best_level_min[k], xt[i][k]) as u8
                };
            }
            if flat[k] {
                out_scale[k] = 0.0;
            }
        }
        (out_scale, min.map(|m| -m))
    }
}

/// ggml's `make_qx_quants` with `rmse_type = 1` and no importance weights (weight x²) for `L`
/// sub-blocks of `N` values (sub-block k is `x[N*k..][..N]`): symmetric levels `l + nmax` in
/// 0..2·nmax written to `l` (same layout), trying 19 scales around `-nmax / max`. Returns the
/// scales. Lanes are sub-blocks, each running ggml's exact float sequence (see
/// [`QkxSearch::run`]).
pub(super) fn make_qx_quants<const L: usize, const N: usize>(
    x: &[f32],
    nmax: i32,
    l: &mut [u8],
) -> [f32; L] {
    let xt: [[f32; L]; N] = std::array::from_fn(|i| std::array::from_fn(|k| x[N * k + i]));
    let (mut amax, mut max) = ([0f32; L], [0f32; L]);
    for row in &xt {
        for k in 0..L {
            if amax[k] < row[k].abs() {
                (amax[k], max[k]) = (row[k].abs(), row[k]);
            }
        }
    }
    let level = |iscale: f32, v: f32| nearest_int(iscale * v).clamp(-nmax, nmax - 1) as f32;
    let sums = |iscale: &[f32; L]| {
        let (mut slx, mut sl2) = ([0f32; L], [0f32; L]);
        for row in &xt {
            for k in 0..L {
                let (v, li) = (row[k], level(iscale[k], row[k]));
                let w = v * v;
                slx[k] += w * v * li;
                sl2[k] += w * li * li;
            }
        }
        (slx, sl2)
    };
    let mut best_iscale: [f32; L] = std::array::from_fn(|k| -(nmax as f32) / max[k]);
    let (sumlx, suml2) = sums(&best_iscale);
    let mut scale: [f32; L] =
        std::array::from_fn(|k| if suml2[k] != 0.0 { sumlx[k] / suml2[k] } else { 0.0 });
    let mut best: [f32; L] = std::array::from_fn(|k| scale[k] * sumlx[k]);
    for is in (-9i32..=9).filter(|&is| is != 0) {
        let iscale: [f32; L] = std::array::from_fn(|k| -(nmax as f32 + 0.1 * is as f32) / max[k]);
        let (sumlx, suml2) = sums(&iscale);
        for k in 0..L {
            if suml2[k] > 0.0 && sumlx[k] * sumlx[k] > best[k] * suml2[k] {
                best_iscale[k] = iscale[k];
                scale[k] = sumlx[k] / suml2[k];
                best[k] = scale[k] * sumlx[k];
            }
        }
    }
    for k in 0..L {
        let zero = amax[k] < GROUP_MAX_EPS;
        for (i, row) in xt.iter().enumerate() {
            l[N * k + i] =
                if zero { 0 } else { (level(best_iscale[k], row[k]) as i32 + nmax) as u8 };
        }
        if zero {
            scale[k] = 0.0;
        }
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

/// `IQ4_NL_VALUES` as f32.
const IQ4_F32: [f32; 16] = {
    let mut t = [0f32; 16];
    let mut i = 0;
    while i < 16 {
        t[i] = IQ4_NL_VALUES[i] as f32;
        i += 1;
    }
    t
};

/// Index of the codebook value nearest `x` in the sorted `IQ4_NL_VALUES` (ggml's
/// `best_index_int8`: binary search keeping `v[lo] <= x < v[hi]`, ties to the upper neighbour;
/// NaN walks right and gives 15).
pub(super) fn best_index_iq4(x: f32) -> u8 {
    let v = &IQ4_F32;
    if x <= v[0] {
        return 0;
    }
    if x >= v[15] {
        return 15;
    }
    let (mut ml, mut mu) = (0, 15);
    while mu - ml > 1 {
        let mav = (ml + mu) / 2;
        if x < v[mav] {
            mu = mav;
        } else {
            ml = mav;
        }
    }
    (mu - usize::from(x - v[mu - 1] < v[mu] - x)) as u8
}

/// The IQ4 sub-block scale search of ggml's `quantize_row_iq4_nl_impl` (weight x², `ntry = 7`)
/// for `L` sub-blocks of 32 values (sub-block k is `x[32*k..][..32]`): the least-squares scale
/// of the codebook fit at 16 trial inverse scales around `-127 / max`. Zero sub-blocks get 0.
/// Lanes are sub-blocks, each running ggml's exact float sequence (see [`QkxSearch::run`]).
pub(super) fn iq4_sub_scales<const L: usize>(x: &[f32]) -> [f32; L] {
    const NTRY: i32 = 7;
    let xt: [[f32; L]; 32] = std::array::from_fn(|i| std::array::from_fn(|k| x[32 * k + i]));
    let (mut amax, mut max) = ([0f32; L], [0f32; L]);
    for row in &xt {
        for k in 0..L {
            if row[k].abs() > amax[k] {
                (amax[k], max[k]) = (row[k].abs(), row[k]);
            }
        }
    }
    let fit = |id: &[f32; L]| {
        let (mut sqx, mut sq2) = ([0f32; L], [0f32; L]);
        for row in &xt {
            for k in 0..L {
                let v = row[k];
                let q = IQ4_F32[usize::from(best_index_iq4(id[k] * v))];
                let w = v * v;
                sqx[k] += w * q * v;
                sq2[k] += w * q * q;
            }
        }
        (sqx, sq2)
    };
    let values0 = f32::from(IQ4_NL_VALUES[0]);
    let (sumqx, sumq2) = fit(&std::array::from_fn(|k| 1.0 / (-max[k] / values0)));
    let mut d: [f32; L] =
        std::array::from_fn(|k| if sumq2[k] > 0.0 { sumqx[k] / sumq2[k] } else { 0.0 });
    let mut best: [f32; L] = std::array::from_fn(|k| d[k] * sumqx[k]);
    for itry in -NTRY..=NTRY {
        let id = std::array::from_fn(|k| (itry + i32::from(IQ4_NL_VALUES[0])) as f32 / max[k]);
        let (sumqx, sumq2) = fit(&id);
        for k in 0..L {
            if sumq2[k] > 0.0 && sumqx[k] * sumqx[k] > best[k] * sumq2[k] {
                d[k] = sumqx[k] / sumq2[k];
                best[k] = d[k] * sumqx[k];
            }
        }
    }
    std::array::from_fn(|k| if amax[k] < GROUP_MAX_EPS { 0.0 } else { d[k] })
}
