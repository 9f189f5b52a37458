//! The AMX tile panels (`Isa::Amx`) against the row kernels, bit for bit. Its own harness
//! (`harness = false`): a test needs AMX int8 tiles that the kernel lets this process use, and
//! where they are missing it is listed as "not run", by name, and counted apart from the passed
//! ones (`SNUG_REQUIRE_AMX=1` makes that a failure instead, for a machine known to have them);
//! the harness is `common::gated`.

use quant::kernels::{matmul_panels_with, matmul_with, Isa, MatRef};
use quant::threads::ThreadPool;
use quant::GgmlType;
use rand::rngs::StdRng;
use rand::SeedableRng;

mod common;
use common::*;

/// The formats with tile panels, and formats that fall back to the VNNI panels or the row
/// kernels on the AMX path.
const TYPES: [GgmlType; 6] =
    [GgmlType::Q4K, GgmlType::Q6K, GgmlType::Q5K, GgmlType::IQ4XS, GgmlType::Q8_0, GgmlType::Q5_0];

/// Token counts: every count through two tiles of 16 and a tail, then larger batches.
fn token_counts() -> impl Iterator<Item = usize> {
    (1..=40).chain([47, 48, 64, 100])
}

/// Every (row, token) of a tile panel has the row kernels' f32 bits (`Isa::Avx512` without
/// panels), for edge-case blocks (every fill pattern: zero and maximal scales and mins, extreme
/// quants; f16 scales from zero and subnormal to ±65504) and random ones, row counts with a tail
/// that stays on the row kernels, edge-case and random activations, and every token count
/// (whole tiles of 16 and the tail on the VNNI panel, in every mix).
fn tiles_are_bit_identical_to_row_kernels() {
    let mut rng = StdRng::seed_from_u64(51);
    let pool = ThreadPool::new(2);
    let mut scratch = Vec::new();
    let mut checked = 0usize;
    for ty in TYPES {
        for (cols, rows) in [(256usize, 16usize), (512, 35), (1536, 33)] {
            let w = edge_and_random_rows(&mut rng, ty, cols, rows, 2);
            let acts = edge_acts(&mut rng, cols);
            let mat = MatRef { ty, data: &w, rows, cols };
            for m in token_counts() {
                let x: Vec<f32> = (0..m)
                    .flat_map(|t| match (t + m) % (acts.len() + 1) {
                        a if a < acts.len() => acts[a].clone(),
                        _ => random_f32(&mut rng, cols),
                    })
                    .collect();
                let mut want = vec![f32::NAN; m * rows];
                matmul_with(Isa::Avx512, &pool, mat, &x, m, &mut want, &mut scratch).unwrap();
                let mut got = vec![f32::NAN; m * rows];
                matmul_panels_with(Isa::Amx, &pool, mat, &x, m, &mut got, &mut scratch).unwrap();
                for (k, (a, b)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        same_bits(*a, *b),
                        "{ty} cols={cols} rows={rows} m={m} token {} row {}: tiles {a:e} ({:#x}) \
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
    assert!(checked > 200_000, "only {checked} outputs compared");
}

/// Without `SNUG_KERNELS`, a CPU whose tiles this process may use runs the AMX path.
fn amx_is_the_best_path_where_usable() {
    assert_eq!(Isa::best(), Isa::Amx);
}

const TESTS: [(&str, fn()); 2] = [
    ("tiles_are_bit_identical_to_row_kernels", tiles_are_bit_identical_to_row_kernels),
    ("amx_is_the_best_path_where_usable", amx_is_the_best_path_where_usable),
];

fn main() {
    gated::run(
        gated::Need {
            have: Isa::Amx.available(),
            why: "this CPU has no AMX int8 tiles, or the kernel refused them to this process",
            require_var: "SNUG_REQUIRE_AMX",
            lacking: "no AMX",
        },
        &TESTS,
    );
}
