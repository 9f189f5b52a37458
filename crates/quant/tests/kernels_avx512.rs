//! The AVX-512 VNNI prefill panels against the row kernels, bit for bit. Its own harness
//! (`harness = false`, `common::gated`): where the CPU lacks AVX-512 VNNI the test is listed as
//! "not run", by name, and counted apart from the passed ones (`SNUG_REQUIRE_AVX512=1` makes
//! that a failure instead, for a machine known to have it).

use quant::kernels::{matmul_panels_with, matmul_with, Isa, MatRef};
use quant::threads::ThreadPool;
use quant::GgmlType;
use rand::rngs::StdRng;
use rand::SeedableRng;

mod common;
use common::*;

/// The formats with prefill panels (AVX-512 VNNI).
const PANEL_TYPES: [GgmlType; 4] = [GgmlType::Q4K, GgmlType::Q5K, GgmlType::Q6K, GgmlType::IQ4XS];

/// On AVX-512 the panels and the row kernels give every (row, token) the same f32 bits, so the
/// kernel a token meets is a speed choice only: edge-case blocks (every fill pattern, so zero and
/// maximal scales and mins, extreme quants; f16 scales from zero and subnormal to ±65504) and
/// random ones, odd row counts (a tail of rows that stays on the row kernels), edge-case and
/// random activations, and every token count 1..=40 (the row kernels' 1/2/4/8-token groups and
/// the panels' 8/4/2/1-token steps in every mix).
fn panels_are_bit_identical_to_row_kernels() {
    let mut rng = StdRng::seed_from_u64(33);
    let pool = ThreadPool::new(2);
    let mut scratch = Vec::new();
    let mut checked = 0usize;
    for ty in PANEL_TYPES {
        for (cols, rows) in [(256usize, 16usize), (512, 35), (1536, 33)] {
            let w = edge_and_random_rows(&mut rng, ty, cols, rows, 2);
            let acts = edge_acts(&mut rng, cols);
            let mat = MatRef { ty, data: &w, rows, cols };
            for m in 1..=40 {
                let x: Vec<f32> = (0..m)
                    .flat_map(|t| match (t + m) % (acts.len() + 1) {
                        a if a < acts.len() => acts[a].clone(),
                        _ => random_f32(&mut rng, cols),
                    })
                    .collect();
                let mut want = vec![f32::NAN; m * rows];
                matmul_with(Isa::Avx512, &pool, mat, &x, m, &mut want, &mut scratch).unwrap();
                let mut got = vec![f32::NAN; m * rows];
                matmul_panels_with(Isa::Avx512, &pool, mat, &x, m, &mut got, &mut scratch).unwrap();
                for (k, (a, b)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        same_bits(*a, *b),
                        "{ty} cols={cols} rows={rows} m={m} token {} row {}: panel {a:e} ({:#x}) \
                         vs row kernel {b:e} ({:#x})",
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
    assert!(checked > 100_000, "only {checked} outputs compared");
}

const TESTS: [(&str, fn()); 1] =
    [("panels_are_bit_identical_to_row_kernels", panels_are_bit_identical_to_row_kernels)];

fn main() {
    gated::run(
        gated::Need {
            have: Isa::Avx512.available(),
            why: "this CPU has no AVX-512 (F, BW, VL and VNNI)",
            require_var: "SNUG_REQUIRE_AVX512",
            lacking: "no AVX-512",
        },
        &TESTS,
    );
}
