//! The AMX tile panels (`Isa::Amx`) against the row kernels, bit for bit. Its own harness
//! (`harness = false`): a test needs AMX int8 tiles that the kernel lets this process use, and
//! where they are missing it is listed as "not run", by name, and counted apart from the passed
//! ones (`SNUG_REQUIRE_AMX=1` makes that a failure instead, for a machine known to have them);
//! the harness is `common::gated`.

use quant::kernels::Isa;
use quant::GgmlType;

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
/// panels): edge-case and random blocks and activations, and every token count (whole tiles of
/// 16 and the tail on the VNNI panel, in every mix).
fn tiles_are_bit_identical_to_row_kernels() {
    let counts: Vec<usize> = token_counts().collect();
    let checked = panels_against_row_kernels(Isa::Amx, &TYPES, &counts, 51);
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
