//! Tensor data: the bytes each tensor gets. Matrices tile blocks drawn from a pool of rows
//! quantized once per (type, row length, standard deviation), or (`exact`) quantize every row;
//! 1-D tensors are f32 values.

use gguf::GgmlType;
use quant::QuantError;

use super::rng::{mix, Rng};
use super::{Kind, PlannedTensor, Shape, SynthError, SynthOptions};

/// Quantized pools of random rows, one per (type, row length, standard deviation).
#[derive(Default)]
pub(super) struct Pools(Vec<((GgmlType, usize, u32), Vec<u8>)>);

impl Pools {
    pub(super) fn get(
        &mut self,
        t: &PlannedTensor,
        opts: &SynthOptions,
        row_bytes: usize,
    ) -> Result<&[u8], SynthError> {
        let std = opts.std_of(t);
        let key = (t.ggml_type, t.dims[0] as usize, std.to_bits());
        if let Some(i) = self.0.iter().position(|(k, _)| *k == key) {
            return Ok(&self.0[i].1);
        }
        let n = opts.pool_rows.max(1);
        let mut pool = vec![0u8; n * row_bytes];
        let spec = PlannedTensor { dims: vec![key.1 as u64, n as u64], ..t.clone() };
        let seed = mix(opts.seed ^ 0x9e37_79b9_7f4a_7c15, (key.0.id() as u64) << 32 | key.1 as u64);
        quantize_all(&spec, &mut pool, row_bytes, seed, std, opts.threads)?;
        self.0.push((key, pool));
        Ok(self.0.last().map(|(_, p)| p.as_slice()).unwrap_or_default())
    }
}

/// Fills `buf` block by block (`block_bytes`, a whole number of them per row) with blocks of
/// `pool`, each chosen by a seeded hash of its index, so that rows share no pattern: a matrix
/// tiled from whole pool rows would have the pool's rank, and every matrix of one type and width
/// the same rows.
pub(super) fn tile(buf: &mut [u8], block_bytes: usize, pool: &[u8], seed: u64, threads: usize) {
    if block_bytes == 0 {
        return;
    }
    let n_pool = (pool.len() / block_bytes) as u64;
    let per = buf.len().div_ceil(threads.max(1) * block_bytes).max(1) * block_bytes;
    std::thread::scope(|s| {
        for (c, chunk) in buf.chunks_mut(per).enumerate() {
            s.spawn(move || {
                let first = c * per / block_bytes;
                for (r, dst) in chunk.chunks_exact_mut(block_bytes).enumerate() {
                    let k = (mix(seed, (first + r) as u64) % n_pool) as usize;
                    dst.copy_from_slice(&pool[k * block_bytes..(k + 1) * block_bytes]);
                }
            });
        }
    });
}

/// Generates (N(0, `std`)) and quantizes every row of `t` into `buf`; row `r`'s values depend only on
/// `(seed, r)`, so the result does not depend on the thread count.
pub(super) fn quantize_all(
    t: &PlannedTensor,
    buf: &mut [u8],
    row_bytes: usize,
    seed: u64,
    std: f32,
    threads: usize,
) -> Result<(), SynthError> {
    let cols = t.dims[0] as usize;
    if row_bytes == 0 {
        return Ok(());
    }
    let per = buf.len().div_ceil(threads.max(1) * row_bytes).max(1) * row_bytes;
    let results: Vec<Result<(), QuantError>> = std::thread::scope(|s| {
        let handles: Vec<_> = buf
            .chunks_mut(per)
            .enumerate()
            .map(|(c, chunk)| {
                s.spawn(move || {
                    let first = c * per / row_bytes;
                    let mut row = vec![0f32; cols];
                    for (r, dst) in chunk.chunks_exact_mut(row_bytes).enumerate() {
                        let mut rng = Rng::new(mix(seed, (first + r) as u64));
                        rng.fill_normal(&mut row, 0.0, std);
                        quant::quantize_row(t.ggml_type, &row, dst)?;
                    }
                    Ok(())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or(Err(QuantError::CannotQuantize(t.ggml_type))))
            .collect()
    });
    results
        .into_iter()
        .collect::<Result<(), _>>()
        .map_err(|e| SynthError::Quant { tensor: t.name.clone(), source: e })
}

/// Values of a 1-D f32 tensor.
pub(super) fn one_d_values(kind: Kind, n: usize, seed: u64, shape: &Shape) -> Vec<f32> {
    let mut v = vec![0f32; n];
    let mut rng = Rng::new(seed);
    match kind {
        Kind::Norm => rng.fill_normal(&mut v, 1.0, 0.02),
        Kind::RopeFreqs => v = llama3_rope_factors(shape, n),
        // Shaped like Phi's: short ≈ 1, long rising from 1 to ~40 across the frequencies.
        Kind::RopeFactorsShort => v = (0..n).map(|i| 1.0 + 0.05 * i as f32 / n as f32).collect(),
        Kind::RopeFactorsLong => v = (0..n).map(|i| 40f32.powf(i as f32 / n as f32)).collect(),
        _ => rng.fill_normal(&mut v, 0.0, 0.02),
    }
    v
}

/// llama.cpp converter's `rope_freqs` for Llama 3.1 (`generate_extra_tensors` in
/// convert_hf_to_gguf.py): per frequency, 1 (high), `factor` (low) or a smooth blend.
fn llama3_rope_factors(shape: &Shape, n: usize) -> Vec<f32> {
    let Some((factor, low, high, old_ctx)) = shape.llama3_rope else {
        return vec![1.0; n];
    };
    let base = shape.rope_freq_base as f64;
    let dim = shape.head_dim() as f64;
    let (low_wavelen, high_wavelen) = (old_ctx as f64 / low as f64, old_ctx as f64 / high as f64);
    (0..n)
        .map(|i| {
            let freq = 1.0 / base.powf(2.0 * i as f64 / dim);
            let wavelen = 2.0 * std::f64::consts::PI / freq;
            if wavelen < high_wavelen {
                1.0
            } else if wavelen > low_wavelen {
                factor
            } else {
                let smooth = (old_ctx as f64 / wavelen - low as f64) / (high as f64 - low as f64);
                (1.0 / ((1.0 - smooth) / factor as f64 + smooth)) as f32
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synth::shape;

    #[test]
    fn llama3_rope_factors_match_the_converter() {
        let f = llama3_rope_factors(shape("llama-3.1-8b").unwrap(), 64);
        assert_eq!(f[0], 1.0);
        assert_eq!(f[63], 8.0);
        assert!(f.iter().all(|x| (1.0..=8.0).contains(x)));
        assert!(f.windows(2).all(|w| w[0] <= w[1]));
    }
}
