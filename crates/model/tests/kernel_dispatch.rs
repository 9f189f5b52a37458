//! One kernel path per process: `quant::kernels::isa()` is chosen once (CPU features, or
//! `SNUG_KERNELS`) and every SIMD table follows it — quant's matmul kernels, attention's tile
//! kernels, the KV format kernels and SwiGLU. The override is read once per process, so the
//! forced case runs in a child process of this test binary with the variable set.

use std::process::Command;

use quant::kernels::{isa, Isa};

/// Set in the child process, which checks the forced path instead of spawning.
const CHILD: &str = "SNUG_TEST_DISPATCH_CHILD";

/// Which path each model table runs: the tile kernels, the KV kernels and SwiGLU (true: AVX2).
fn model_tables() -> [bool; 3] {
    let silu_simd = model::ops::silu_kernel() as usize
        != model::ops::silu_mul_generic as fn(&mut [f32], &[f32]) as usize;
    [
        model::attention::tiles::kernels().name == "avx2",
        model::kv::kernels().name == "avx2",
        silu_simd,
    ]
}

#[test]
fn every_table_follows_the_one_kernel_path() {
    let want = isa().avx2_family();
    assert_eq!(model_tables(), [want; 3], "kernel path {}", isa());
}

#[test]
fn snug_kernels_scalar_reaches_every_table() {
    let name = "snug_kernels_scalar_reaches_every_table";
    if std::env::var_os(CHILD).is_some() {
        assert_eq!(isa(), Isa::Scalar);
        assert_eq!(model_tables(), [false; 3]);
        return;
    }
    let out = Command::new(std::env::current_exe().expect("test binary"))
        .args(["--exact", name, "--test-threads=1"])
        .env(CHILD, "1")
        .env("SNUG_KERNELS", "scalar")
        .output()
        .expect("run the test binary again");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "child with SNUG_KERNELS=scalar failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `SNUG_KERNELS=avx512` keeps the AVX-512 VNNI path on a CPU with AMX tiles (the tiles are off,
/// for comparison); on a CPU without AVX-512 the best path it has runs instead, never AMX.
#[test]
fn snug_kernels_avx512_turns_the_tiles_off() {
    let name = "snug_kernels_avx512_turns_the_tiles_off";
    if std::env::var_os(CHILD).is_some() {
        let want = if Isa::Avx512.available() { Isa::Avx512 } else { Isa::best() };
        assert_eq!(isa(), want);
        assert_ne!(isa(), Isa::Amx);
        assert_eq!(model_tables(), [isa().avx2_family(); 3]);
        return;
    }
    let out = Command::new(std::env::current_exe().expect("test binary"))
        .args(["--exact", name, "--test-threads=1"])
        .env(CHILD, "1")
        .env("SNUG_KERNELS", "avx512")
        .output()
        .expect("run the test binary again");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "child with SNUG_KERNELS=avx512 failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
