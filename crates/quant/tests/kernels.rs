//! Every SIMD kernel against its scalar twin (random and edge-case blocks, odd lengths, every
//! token count through two tiles), every path's matmul against plain f32 math on dequantized
//! weights, and typed errors on bad shapes. Its own harness (`harness = false`, `common::gated`):
//! on a CPU without a SIMD path the tests that compare one with the scalar path are listed as
//! "not run" by name (`SNUG_REQUIRE_SIMD=1` makes that a failure).

use quant::kernels::{
    matmul_panels_with, matmul_with, quantize_activation_with, vec_dot_rows_with, vec_dot_type,
    vec_dot_with, Isa, KernelError, MatRef, TILE,
};
use quant::threads::ThreadPool;
use quant::{dequantize_row, GgmlType};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

mod common;
use common::*;

const TYPES: [GgmlType; 15] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q2K,
    GgmlType::Q3K,
    GgmlType::Q4K,
    GgmlType::Q5K,
    GgmlType::Q6K,
    GgmlType::IQ4NL,
    GgmlType::IQ4XS,
];

/// Activation row in the partner format of `ty`, made by the scalar quantizer.
fn act_row(ty: GgmlType, x: &[f32]) -> Vec<u8> {
    let vdt = vec_dot_type(ty);
    if vdt == GgmlType::F32 {
        return x.iter().flat_map(|v| v.to_le_bytes()).collect();
    }
    let mut q = vec![0u8; vdt.row_bytes(x.len()).unwrap()];
    quantize_activation_with(Isa::Scalar, vdt, x, &mut q).unwrap();
    q
}

/// The SIMD paths this CPU has (what the second group of tests compares with the scalar one).
fn simd_paths() -> Vec<Isa> {
    Isa::all_available().into_iter().filter(|i| *i != Isa::Scalar).collect()
}

fn close(a: f32, b: f32, scale: f32, tol: f32) -> bool {
    (a - b).abs() <= tol * scale.max(1e-3)
}

fn every_simd_dot_matches_its_scalar_twin_on_odd_lengths() {
    let mut rng = StdRng::seed_from_u64(1);
    for isa in simd_paths() {
        for ty in TYPES {
            let block = ty.block_size().max(vec_dot_type(ty).block_size());
            for blocks in [1usize, 3, 7] {
                let n = if block == 1 { blocks * 16 + 5 } else { blocks * block };
                for _ in 0..4 {
                    let w = random_row(&mut rng, ty, n);
                    let x = random_f32(&mut rng, n);
                    let xq = act_row(ty, &x);
                    let want = vec_dot_with(Isa::Scalar, ty, n, &w, &xq).unwrap();
                    let got = vec_dot_with(isa, ty, n, &w, &xq).unwrap();
                    // Integer sums are exact; only the f32 accumulation order differs.
                    let scale = magnitude(ty, n, &w, &x);
                    assert!(
                        close(got, want, scale, 1e-5),
                        "{isa} {ty} n={n}: {got} vs scalar {want}"
                    );
                }
            }
        }
    }
}

/// Σ|w_k x_k| from the dequantized row: the scale rounding errors are relative to.
fn magnitude(ty: GgmlType, n: usize, w: &[u8], x: &[f32]) -> f32 {
    let mut wf = vec![0f32; n];
    dequantize_row(ty, w, &mut wf).unwrap();
    wf.iter().zip(x).map(|(a, b)| (a * b).abs()).sum()
}

fn every_multi_row_kernel_matches_single_row_dots() {
    let mut rng = StdRng::seed_from_u64(2);
    for isa in Isa::all_available() {
        for ty in TYPES {
            let block = ty.block_size().max(vec_dot_type(ty).block_size()).max(16);
            let n = 3 * block + if ty.block_size() == 1 { 3 } else { 0 };
            let w = random_row(&mut rng, ty, n);
            // One row is `vec_dot_with` itself (checked against the scalar path elsewhere).
            for rows in [2, 4, TILE] {
                let xs: Vec<Vec<u8>> =
                    (0..rows).map(|_| act_row(ty, &random_f32(&mut rng, n))).collect();
                let mut got = vec![0f32; rows];
                vec_dot_rows_with(isa, ty, n, &w, &xs.concat(), &mut got).unwrap();
                for (c, x) in xs.iter().enumerate() {
                    let one = vec_dot_with(isa, ty, n, &w, x).unwrap();
                    // Float kernels sum in a different order per row count.
                    let xf: Vec<f32> = if vec_dot_type(ty) == GgmlType::F32 {
                        x.chunks_exact(4)
                            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
                            .collect()
                    } else {
                        vec![1.0; n]
                    };
                    let scale = magnitude(ty, n, &w, &xf);
                    assert!(
                        close(got[c], one, scale, 1e-5),
                        "{isa} {ty} {rows} rows, row {c}: {} vs {one}",
                        got[c]
                    );
                }
            }
        }
    }
}

fn simd_activation_quantizers_are_bit_identical_to_scalar() {
    let mut rng = StdRng::seed_from_u64(3);
    for isa in simd_paths() {
        for vdt in [GgmlType::Q8_0, GgmlType::Q8_1, GgmlType::Q8K] {
            for blocks in [1usize, 2, 5] {
                let n = blocks * vdt.block_size();
                let mut x = random_f32(&mut rng, n);
                x[..vdt.block_size()].iter_mut().for_each(|v| *v = 0.0); // an all-zero block
                let bytes = vdt.row_bytes(n).unwrap();
                let (mut a, mut b) = (vec![0u8; bytes], vec![0u8; bytes]);
                quantize_activation_with(Isa::Scalar, vdt, &x, &mut a).unwrap();
                quantize_activation_with(isa, vdt, &x, &mut b).unwrap();
                assert_eq!(a, b, "{isa} {vdt} n={n}");
            }
        }
    }
}

/// Relative L2 error of each path's matmul against f32 math on the dequantized weights: the
/// budget covers the once-quantized activations (8-bit: ~0.5% per value, averaging out).
fn budget(ty: GgmlType) -> f32 {
    match vec_dot_type(ty) {
        GgmlType::F32 => 1e-5,
        _ => 1.5e-2,
    }
}

fn reference(ty: GgmlType, w: &[u8], rows: usize, cols: usize, x: &[f32], m: usize) -> Vec<f32> {
    let mut wf = vec![0f32; rows * cols];
    dequantize_row(ty, w, &mut wf).unwrap();
    let mut y = vec![0f32; m * rows];
    for t in 0..m {
        for r in 0..rows {
            y[t * rows + r] = (0..cols)
                .map(|k| wf[r * cols + k] as f64 * x[t * cols + k] as f64)
                .sum::<f64>() as f32;
        }
    }
    y
}

fn rel_err(got: &[f32], want: &[f32]) -> f32 {
    let num: f64 = got.iter().zip(want).map(|(a, b)| ((a - b) as f64).powi(2)).sum();
    let den: f64 = want.iter().map(|b| (*b as f64).powi(2)).sum();
    (num / den.max(1e-30)).sqrt() as f32
}

fn matmul_on_every_path_matches_f32_math_on_dequantized_weights() {
    let mut rng = StdRng::seed_from_u64(4);
    let pools = [ThreadPool::new(1), ThreadPool::new(2), ThreadPool::new(3)];
    let mut scratch = Vec::new();
    for isa in Isa::all_available() {
        for ty in TYPES {
            let cols = 2 * ty.block_size().max(vec_dot_type(ty).block_size()).max(32);
            for (i, (rows, m)) in
                [(37usize, 1usize), (19, 3), (8, 4), (21, 7), (13, 33)].into_iter().enumerate()
            {
                let w = random_row(&mut rng, ty, rows * cols);
                let x = random_f32(&mut rng, m * cols);
                let want = reference(ty, &w, rows, cols, &x, m);
                let mut y = vec![f32::NAN; m * rows];
                let mat = MatRef { ty, data: &w, rows, cols };
                matmul_with(isa, &pools[i % 3], mat, &x, m, &mut y, &mut scratch).unwrap();
                let e = rel_err(&y, &want);
                assert!(e < budget(ty), "{isa} {ty} rows={rows} m={m}: rel err {e}");
            }
        }
    }
}

fn matmul_paths_agree_with_each_other_on_real_layer_widths() {
    let mut rng = StdRng::seed_from_u64(5);
    let pool = ThreadPool::new(2);
    let mut scratch = Vec::new();
    for ty in [GgmlType::Q4K, GgmlType::Q6K, GgmlType::Q5_0, GgmlType::Q8_0, GgmlType::F16] {
        let (rows, cols, m) = (67, 1536, 9);
        let w = random_row(&mut rng, ty, rows * cols);
        let x = random_f32(&mut rng, m * cols);
        let mat = MatRef { ty, data: &w, rows, cols };
        let mut want = vec![0f32; m * rows];
        matmul_with(Isa::Scalar, &pool, mat, &x, m, &mut want, &mut scratch).unwrap();
        for isa in simd_paths() {
            let mut y = vec![0f32; m * rows];
            matmul_with(isa, &pool, mat, &x, m, &mut y, &mut scratch).unwrap();
            assert!(rel_err(&y, &want) < 1e-5, "{isa} {ty}");
        }
    }
}

fn bad_shapes_are_typed_errors_not_panics() {
    let pool = ThreadPool::new(2);
    let mut scratch = Vec::new();
    let w = vec![0u8; 144 * 4];
    let x = vec![0f32; 512];
    let mut y = vec![0f32; 2];
    let ok = MatRef { ty: GgmlType::Q4K, data: &w, rows: 2, cols: 512 };
    assert!(matches!(quant::kernels::matmul(&pool, ok, &x, 1, &mut y, &mut scratch), Ok(())));
    let short = MatRef { data: &w[..100], ..ok };
    assert!(matches!(
        quant::kernels::matmul(&pool, short, &x, 1, &mut y, &mut scratch),
        Err(KernelError::Len { .. })
    ));
    assert!(matches!(
        quant::kernels::matmul(&pool, ok, &x[..300], 1, &mut y, &mut scratch),
        Err(KernelError::Len { .. })
    ));
    assert!(matches!(
        quant::kernels::matmul(&pool, ok, &x, 1, &mut y[..1], &mut scratch),
        Err(KernelError::Len { .. })
    ));
    let partial = MatRef { ty: GgmlType::Q4K, data: &w, rows: 1, cols: 100 };
    assert!(matches!(
        quant::kernels::matmul(&pool, partial, &x[..100], 1, &mut y[..1], &mut scratch),
        Err(KernelError::PartialBlock { .. })
    ));
    let iq2 = MatRef { ty: GgmlType::IQ2XXS, data: &w, rows: 1, cols: 256 };
    assert!(matches!(
        quant::kernels::matmul(&pool, iq2, &x[..256], 1, &mut y[..1], &mut scratch),
        Err(KernelError::Unsupported(GgmlType::IQ2XXS))
    ));
    assert!(matches!(
        vec_dot_with(Isa::Scalar, GgmlType::Q8_0, 32, &w[..33], &w[..34]),
        Err(KernelError::Len { .. })
    ));
}

fn unavailable_paths_are_refused() {
    for isa in Isa::ALL {
        let r = vec_dot_with(isa, GgmlType::F32, 1, &[0; 4], &[0; 4]);
        assert_eq!(r.is_ok(), isa.available(), "{isa}");
    }
    assert!(quant::kernels::isa().available());
}

fn matmul_multi_equals_one_matmul_per_matrix() {
    let mut rng = StdRng::seed_from_u64(6);
    let pool = ThreadPool::new(2);
    let mut scratch = Vec::new();
    let cols = 512;
    let specs = [(GgmlType::Q4K, 40usize), (GgmlType::Q6K, 9), (GgmlType::Q4K, 17)];
    let ws: Vec<Vec<u8>> =
        specs.iter().map(|&(ty, rows)| random_row(&mut rng, ty, rows * cols)).collect();
    let mats: Vec<MatRef> =
        specs.iter().zip(&ws).map(|(&(ty, rows), data)| MatRef { ty, data, rows, cols }).collect();
    for isa in Isa::all_available() {
        for m in [1usize, 3, 8, 19] {
            let x = random_f32(&mut rng, m * cols);
            let mut outs: Vec<Vec<f32>> =
                specs.iter().map(|&(_, rows)| vec![0f32; m * rows]).collect();
            let mut ys: Vec<&mut [f32]> = outs.iter_mut().map(|v| v.as_mut_slice()).collect();
            quant::kernels::matmul_multi_with(isa, &pool, &mats, &x, m, &mut ys, &mut scratch)
                .unwrap();
            for (mat, got) in mats.iter().zip(&outs) {
                let mut want = vec![0f32; m * mat.rows];
                matmul_with(isa, &pool, *mat, &x, m, &mut want, &mut scratch).unwrap();
                assert_eq!(got, &want, "{isa} {} m={m}", mat.ty);
            }
        }
    }
}

fn matmul_multi_refuses_mixed_activation_formats_and_widths() {
    let pool = ThreadPool::new(2);
    let mut scratch = Vec::new();
    let (a, b) = (vec![0u8; 144 * 2], vec![0u8; 34 * 16]);
    let q4k = MatRef { ty: GgmlType::Q4K, data: &a, rows: 1, cols: 512 };
    let q8 = MatRef { ty: GgmlType::Q8_0, data: &b, rows: 1, cols: 512 };
    let x = vec![0f32; 512];
    let (mut y0, mut y1) = (vec![0f32; 1], vec![0f32; 1]);
    let r = quant::kernels::matmul_multi(
        &pool,
        &[q4k, q8],
        &x,
        1,
        &mut [&mut y0, &mut y1],
        &mut scratch,
    );
    assert!(matches!(r, Err(KernelError::Mixed { .. })), "{r:?}");
    let narrow = MatRef { ty: GgmlType::Q4K, data: &a[..144], rows: 1, cols: 256 };
    let r = quant::kernels::matmul_multi(
        &pool,
        &[q4k, narrow],
        &x,
        1,
        &mut [&mut y0, &mut y1],
        &mut scratch,
    );
    assert!(matches!(r, Err(KernelError::Len { .. })), "{r:?}");
    let r = quant::kernels::matmul_multi(&pool, &[], &x, 1, &mut [], &mut scratch);
    assert!(matches!(r, Err(KernelError::Len { .. })), "{r:?}");
}

// --- edge cases: every SIMD path's 1-, 2-, 4- and TILE-row kernels against the scalar twin on
// blocks with every quant byte at 0x00, 0xFF, 0x80, 0x7F and alternating patterns (all-min and
// all-max quants, the most negative Q6_K scales), zero, subnormal and largest-finite f16 scales,
// and activations that quantize to ±127, 0 or one outlier; then matmul over every token count up
// to two tiles and a bit, so each tile/tail split runs.

/// The quantized types: the ones with 512-bit kernels first.
const QUANTIZED: [GgmlType; 12] = [
    GgmlType::Q4K,
    GgmlType::Q5K,
    GgmlType::Q6K,
    GgmlType::IQ4XS,
    GgmlType::Q8_0,
    GgmlType::Q5_0,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_1,
    GgmlType::Q2K,
    GgmlType::Q3K,
    GgmlType::IQ4NL,
];

fn every_simd_row_kernel_matches_scalar_on_edge_case_blocks() {
    let mut rng = StdRng::seed_from_u64(30);
    let mut checked = 0usize;
    for isa in simd_paths() {
        for ty in QUANTIZED {
            let per = ty.block_size().max(vec_dot_type(ty).block_size());
            for (fi, fill) in FILLS.into_iter().enumerate() {
                for blocks in [1usize, 2, 5] {
                    let n = blocks * per;
                    let w = edge_row(&mut rng, ty, n / ty.block_size(), fill, fi + blocks);
                    let acts = edge_acts(&mut rng, n);
                    let xq: Vec<Vec<u8>> = acts.iter().map(|x| act_row(ty, x)).collect();
                    let want: Vec<f32> = xq
                        .iter()
                        .map(|x| vec_dot_with(Isa::Scalar, ty, n, &w, x).unwrap())
                        .collect();
                    let tol: Vec<f32> =
                        acts.iter().map(|x| 1e-5 * magnitude(ty, n, &w, x).max(1e-3)).collect();
                    for rows in [1, 2, 4, TILE] {
                        for first in (0..acts.len()).step_by(rows.min(acts.len())) {
                            let idx: Vec<usize> =
                                (0..rows).map(|c| (first + c) % acts.len()).collect();
                            let x: Vec<u8> = idx.iter().flat_map(|&k| xq[k].clone()).collect();
                            let mut got = vec![f32::NAN; rows];
                            vec_dot_rows_with(isa, ty, n, &w, &x, &mut got).unwrap();
                            for (c, &k) in idx.iter().enumerate() {
                                assert!(
                                    (got[c] - want[k]).abs() <= tol[k],
                                    "{isa} {ty} fill {fill:?} n={n} {rows} rows, act {k}: {} vs \
                                     scalar {}",
                                    got[c],
                                    want[k]
                                );
                                checked += 1;
                            }
                        }
                    }
                }
            }
        }
    }
    // On a machine with a SIMD path, the loops above ran; with none there is nothing to compare.
    assert!(checked > 10_000, "only {checked} dots compared");
}

fn matmul_matches_scalar_for_every_token_count_through_two_tiles() {
    let mut rng = StdRng::seed_from_u64(31);
    let pool = ThreadPool::new(2);
    let mut scratch = Vec::new();
    for ty in QUANTIZED {
        let (rows, cols) = (19, 2 * 256);
        let w: Vec<u8> = {
            let mut v: Vec<u8> =
                (0..ty.row_bytes(rows * cols).unwrap()).map(|_| rng.gen()).collect();
            for block in v.chunks_exact_mut(ty.type_size()) {
                for &off in f16_fields(ty) {
                    let d = half::f16::from_f32(rng.gen_range(-0.05f32..0.05));
                    block[off..off + 2].copy_from_slice(&d.to_le_bytes());
                }
            }
            v
        };
        let mat = MatRef { ty, data: &w, rows, cols };
        let w_row = ty.row_bytes(cols).unwrap();
        for m in 1..=2 * TILE + 3 {
            let x: Vec<f32> = (0..m * cols).map(|_| rng.gen_range(-2f32..2.0)).collect();
            let mut want = vec![0f32; m * rows];
            matmul_with(Isa::Scalar, &pool, mat, &x, m, &mut want, &mut scratch).unwrap();
            for isa in simd_paths() {
                let mut y = vec![f32::NAN; m * rows];
                matmul_with(isa, &pool, mat, &x, m, &mut y, &mut scratch).unwrap();
                for (k, (a, b)) in y.iter().zip(&want).enumerate() {
                    let (t, r) = (k / rows, k % rows);
                    let wr = &w[r * w_row..(r + 1) * w_row];
                    let tol =
                        1e-5 * magnitude(ty, cols, wr, &x[t * cols..(t + 1) * cols]).max(1e-3);
                    assert!((a - b).abs() <= tol, "{isa} {ty} m={m} token {t} row {r}: {a} vs {b}");
                }
            }
        }
    }
}

/// Prefill batches (at least 32 tokens) with panels on take the panel kernels where the path has them: every
/// type, with whole panels of 16 rows and a tail of rows that takes the row kernels, on blocks
/// with edge-case values and scales and on edge-case activations, against the scalar path.
fn prefill_batches_match_scalar_on_edge_case_blocks() {
    let mut rng = StdRng::seed_from_u64(32);
    let pool = ThreadPool::new(2);
    let mut scratch = Vec::new();
    let mut checked = 0usize;
    for ty in QUANTIZED {
        for (cols, rows, m) in [(256usize, 16usize, 32usize), (512, 35, 41), (1536, 48, 64)] {
            let blocks = cols / ty.block_size();
            let w: Vec<u8> = (0..rows)
                .flat_map(|r| edge_row(&mut rng, ty, blocks, FILLS[r % FILLS.len()], r))
                .collect();
            let acts = edge_acts(&mut rng, cols);
            let x: Vec<f32> =
                (0..m).flat_map(|t| acts[(t * 5 + t / 8) % acts.len()].clone()).collect();
            let mat = MatRef { ty, data: &w, rows, cols };
            let mut want = vec![0f32; m * rows];
            matmul_with(Isa::Scalar, &pool, mat, &x, m, &mut want, &mut scratch).unwrap();
            let w_row = ty.row_bytes(cols).unwrap();
            for isa in simd_paths() {
                let mut y = vec![f32::NAN; m * rows];
                matmul_panels_with(isa, &pool, mat, &x, m, &mut y, &mut scratch).unwrap();
                for (k, (a, b)) in y.iter().zip(&want).enumerate() {
                    let (t, r) = (k / rows, k % rows);
                    let wr = &w[r * w_row..(r + 1) * w_row];
                    let tol =
                        1e-5 * magnitude(ty, cols, wr, &x[t * cols..(t + 1) * cols]).max(1e-3);
                    assert!(
                        (a - b).abs() <= tol || (a.is_nan() && b.is_nan()),
                        "{isa} {ty} cols={cols} m={m} token {t} row {r}: {a} vs scalar {b}"
                    );
                    checked += 1;
                }
            }
        }
    }
    assert!(checked > 100_000, "only {checked} outputs compared");
}

/// Decode (one token) gives every row the bits that the same token gets as the first of a batch
/// of two: on AVX-512 the Q4_K/Q5_K decode kernel finishes 8 rows' blocks at once for rows of up
/// to 16 blocks and runs the one-row kernel past that, so row lengths on both sides of the
/// switch, row counts with a tail of fewer than 8, and edge-case blocks (zero and maximal
/// scales, extreme quants) are checked.
fn decode_is_bit_identical_to_the_first_token_of_a_batch() {
    let mut rng = StdRng::seed_from_u64(34);
    let pool = ThreadPool::new(2);
    let mut scratch = Vec::new();
    let mut checked = 0usize;
    for isa in simd_paths() {
        for ty in [GgmlType::Q4K, GgmlType::Q5K, GgmlType::Q6K, GgmlType::IQ4XS] {
            for (cols, rows) in [(256usize, 8usize), (2048, 61), (4096, 19), (4352, 17)] {
                let w = edge_and_random_rows(&mut rng, ty, cols, rows, 1);
                let mat = MatRef { ty, data: &w, rows, cols };
                for act in edge_acts(&mut rng, cols) {
                    let mut one = vec![f32::NAN; rows];
                    matmul_with(isa, &pool, mat, &act, 1, &mut one, &mut scratch).unwrap();
                    let two: Vec<f32> =
                        act.iter().chain(&random_f32(&mut rng, cols)).copied().collect();
                    let mut batch = vec![f32::NAN; 2 * rows];
                    matmul_with(isa, &pool, mat, &two, 2, &mut batch, &mut scratch).unwrap();
                    for (r, (a, b)) in one.iter().zip(&batch[..rows]).enumerate() {
                        assert!(
                            same_bits(*a, *b),
                            "{isa} {ty} cols={cols} rows={rows} row {r}: decode {a:e} vs batch {b:e}"
                        );
                        checked += 1;
                    }
                }
            }
        }
    }
    assert!(checked > 1_000, "only {checked} outputs compared");
}

/// Tests of every path, the scalar one included: they run on any CPU.
const TESTS: [(&str, fn()); 6] = [
    (
        "every_multi_row_kernel_matches_single_row_dots",
        every_multi_row_kernel_matches_single_row_dots,
    ),
    (
        "matmul_on_every_path_matches_f32_math_on_dequantized_weights",
        matmul_on_every_path_matches_f32_math_on_dequantized_weights,
    ),
    ("bad_shapes_are_typed_errors_not_panics", bad_shapes_are_typed_errors_not_panics),
    ("unavailable_paths_are_refused", unavailable_paths_are_refused),
    ("matmul_multi_equals_one_matmul_per_matrix", matmul_multi_equals_one_matmul_per_matrix),
    (
        "matmul_multi_refuses_mixed_activation_formats_and_widths",
        matmul_multi_refuses_mixed_activation_formats_and_widths,
    ),
];

/// Tests that hold a SIMD path against the scalar one: on a CPU with none they are listed as
/// not run.
const SIMD_TESTS: [(&str, fn()); 7] = [
    (
        "every_simd_dot_matches_its_scalar_twin_on_odd_lengths",
        every_simd_dot_matches_its_scalar_twin_on_odd_lengths,
    ),
    (
        "simd_activation_quantizers_are_bit_identical_to_scalar",
        simd_activation_quantizers_are_bit_identical_to_scalar,
    ),
    (
        "matmul_paths_agree_with_each_other_on_real_layer_widths",
        matmul_paths_agree_with_each_other_on_real_layer_widths,
    ),
    (
        "every_simd_row_kernel_matches_scalar_on_edge_case_blocks",
        every_simd_row_kernel_matches_scalar_on_edge_case_blocks,
    ),
    (
        "matmul_matches_scalar_for_every_token_count_through_two_tiles",
        matmul_matches_scalar_for_every_token_count_through_two_tiles,
    ),
    (
        "prefill_batches_match_scalar_on_edge_case_blocks",
        prefill_batches_match_scalar_on_edge_case_blocks,
    ),
    (
        "decode_is_bit_identical_to_the_first_token_of_a_batch",
        decode_is_bit_identical_to_the_first_token_of_a_batch,
    ),
];

fn main() {
    gated::run_groups(&[
        (&gated::Need::ALWAYS, &TESTS),
        (
            &gated::Need {
                have: !simd_paths().is_empty(),
                why: "this CPU has no SIMD kernel path (AVX2, AVX-512 or NEON)",
                require_var: "SNUG_REQUIRE_SIMD",
                lacking: "no SIMD",
            },
            &SIMD_TESTS,
        ),
    ]);
}
