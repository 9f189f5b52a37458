//! The AVX-512 VNNI prefill panels against the row kernels, bit for bit. Its own harness
//! (`harness = false`, `common::gated`): where the CPU lacks AVX-512 VNNI the test is listed as
//! "not run", by name, and counted apart from the passed ones (`SNUG_REQUIRE_AVX512=1` makes
//! that a failure instead, for a machine known to have it).

use quant::kernels::Isa;
use quant::GgmlType;

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
    let counts: Vec<usize> = (1..=40).collect();
    let checked = panels_against_row_kernels(Isa::Avx512, &PANEL_TYPES, &counts, 33);
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
