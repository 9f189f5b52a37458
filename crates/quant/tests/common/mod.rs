//! Weight rows and activations the kernel tests share: random blocks, edge-case blocks (fill
//! patterns, extreme f16 scales) and edge-case activations, and bit equality of results;
//! [`gated`] is the harness for tests that need a CPU feature.

// Each test file uses the helpers it needs.
#![allow(dead_code)]

pub mod gated;

use quant::kernels::{matmul_panels_with, matmul_with, Isa, MatRef};
use quant::threads::ThreadPool;
use quant::GgmlType;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Byte offsets of the f16 scale fields in one block of `ty` (random bytes there could be
/// NaN/Inf; everything else in a block is valid for any bit pattern).
pub fn f16_fields(ty: GgmlType) -> &'static [usize] {
    use GgmlType::*;
    match ty {
        Q4_0 | Q5_0 | Q8_0 | IQ4NL | IQ4XS => &[0],
        Q4_1 | Q5_1 | Q4K | Q5K => &[0, 2],
        Q2K => &[80, 82],
        Q3K => &[108],
        Q6K => &[208],
        _ => &[],
    }
}

/// A random row of `n` values of `ty`: random quant bits, small finite scales.
pub fn random_row(rng: &mut StdRng, ty: GgmlType, n: usize) -> Vec<u8> {
    let bytes = ty.row_bytes(n).unwrap();
    match ty {
        GgmlType::F32 => (0..n).flat_map(|_| rng.gen_range(-1f32..1.0).to_le_bytes()).collect(),
        GgmlType::F16 => (0..n)
            .flat_map(|_| half::f16::from_f32(rng.gen_range(-1f32..1.0)).to_le_bytes())
            .collect(),
        GgmlType::BF16 => (0..n)
            .flat_map(|_| half::bf16::from_f32(rng.gen_range(-1f32..1.0)).to_le_bytes())
            .collect(),
        _ => {
            let mut v: Vec<u8> = (0..bytes).map(|_| rng.gen()).collect();
            for block in v.chunks_exact_mut(ty.type_size()) {
                for &off in f16_fields(ty) {
                    let d = half::f16::from_f32(rng.gen_range(-0.05f32..0.05));
                    block[off..off + 2].copy_from_slice(&d.to_le_bytes());
                }
            }
            v
        }
    }
}

pub fn random_f32(rng: &mut StdRng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.gen_range(-2f32..2.0)).collect()
}

/// Fill patterns for the non-scale bytes of a block (`None`: random bytes).
pub const FILLS: [Option<[u8; 2]>; 7] = [
    Some([0x00, 0x00]),
    Some([0xFF, 0xFF]),
    Some([0x80, 0x80]),
    Some([0x7F, 0x7F]),
    Some([0x55, 0xAA]),
    Some([0x0F, 0xF0]),
    None,
];

/// f16 scales: zero, the smallest subnormal, ordinary, and the largest finite, both signs.
pub const SCALES: [f32; 6] = [0.0, 5.96e-8, 0.013, -0.7, 65504.0, -65504.0];

/// A row of `blocks` blocks of `ty`: quant bytes from `fill`, f16 fields from `scales`
/// (rotating through them per field and block).
pub fn edge_row(
    rng: &mut StdRng,
    ty: GgmlType,
    blocks: usize,
    fill: Option<[u8; 2]>,
    s0: usize,
) -> Vec<u8> {
    let mut v = vec![0u8; blocks * ty.type_size()];
    for (k, b) in v.iter_mut().enumerate() {
        *b = match fill {
            Some(f) => f[k % 2],
            None => rng.gen(),
        };
    }
    for (bi, block) in v.chunks_exact_mut(ty.type_size()).enumerate() {
        for (fi, &off) in f16_fields(ty).iter().enumerate() {
            let d = half::f16::from_f32(SCALES[(s0 + bi + 2 * fi) % SCALES.len()]);
            block[off..off + 2].copy_from_slice(&d.to_le_bytes());
        }
    }
    v
}

/// `rows` rows of `cols` values: one [`edge_row`] for each of [`FILLS`], then `random` random
/// rows, in turn.
pub fn edge_and_random_rows(
    rng: &mut StdRng,
    ty: GgmlType,
    cols: usize,
    rows: usize,
    random: usize,
) -> Vec<u8> {
    let blocks = cols / ty.block_size();
    (0..rows)
        .flat_map(|r| match r % (FILLS.len() + random) {
            f if f < FILLS.len() => edge_row(rng, ty, blocks, FILLS[f], r),
            _ => random_row(rng, ty, cols),
        })
        .collect()
}

/// Activation rows that quantize to edge values: all +127, alternating ±127, all zero, one
/// outlier among tiny values, and random.
pub fn edge_acts(rng: &mut StdRng, n: usize) -> Vec<Vec<f32>> {
    vec![
        vec![2.0; n],
        (0..n).map(|k| if k % 2 == 0 { 3.0 } else { -3.0 }).collect(),
        vec![0.0; n],
        (0..n).map(|k| if k == n / 3 { -1000.0 } else { 1e-3 * (k % 7) as f32 }).collect(),
        (0..n).map(|_| rng.gen_range(-2f32..2.0)).collect(),
        (0..n).map(|k| if k % 3 == 0 { -2.0 } else { 2.0 }).collect(),
        (0..n).map(|_| rng.gen_range(-1e3f32..1e3)).collect(),
        (0..n).map(|k| (k % 256) as f32 - 128.0).collect(),
    ]
}

/// Whether `a` and `b` are the same f32 bits (any two NaNs count as equal: which NaN operand an
/// FMA passes on depends on the register form the compiler picked).
pub fn same_bits(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

/// Runs the panels of `panel_isa` and the row kernels of `Isa::Avx512` on the same weights and
/// activations and panics at the first (row, token) whose f32 bits differ; returns how many
/// outputs were compared. Weights: edge-case blocks (every fill pattern, so zero and maximal
/// scales and mins, extreme quants; f16 scales from zero and subnormal to ±65504) and random
/// ones, in row counts with a tail that stays on the row kernels; activations: edge-case and
/// random rows, for each of the `token_counts`.
pub fn panels_against_row_kernels(
    panel_isa: Isa,
    types: &[GgmlType],
    token_counts: &[usize],
    seed: u64,
) -> usize {
    let mut rng = StdRng::seed_from_u64(seed);
    let pool = ThreadPool::new(2);
    let mut scratch = Vec::new();
    let mut checked = 0usize;
    for &ty in types {
        for (cols, rows) in [(256usize, 16usize), (512, 35), (1536, 33)] {
            let w = edge_and_random_rows(&mut rng, ty, cols, rows, 2);
            let acts = edge_acts(&mut rng, cols);
            let mat = MatRef { ty, data: &w, rows, cols };
            for &m in token_counts {
                let x: Vec<f32> = (0..m)
                    .flat_map(|t| match (t + m) % (acts.len() + 1) {
                        a if a < acts.len() => acts[a].clone(),
                        _ => random_f32(&mut rng, cols),
                    })
                    .collect();
                let mut want = vec![f32::NAN; m * rows];
                matmul_with(Isa::Avx512, &pool, mat, &x, m, &mut want, &mut scratch).unwrap();
                let mut got = vec![f32::NAN; m * rows];
                matmul_panels_with(panel_isa, &pool, mat, &x, m, &mut got, &mut scratch).unwrap();
                for (k, (a, b)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        same_bits(*a, *b),
                        "{ty} cols={cols} rows={rows} m={m} token {} row {}: {panel_isa:?} \
                         panels {a:e} ({:#x}) vs row kernel {b:e} ({:#x})",
                        k / rows,
                        k % rows,
                        a.to_bits(),
                        b.to_bits()
                    );
                    checked += 1;
                }
            }
        }
    }
    checked
}
