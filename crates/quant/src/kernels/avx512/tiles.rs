//! Intel AMX on Linux: whether this process may use the tile registers, and the few tile
//! instructions the prefill tiles (`tile_panel.rs`) run.
//!
//! A CPU with `amx_int8` and `amx_tile` in CPUID still raises SIGILL at the first tile
//! instruction until the process asks the kernel for the tile-data state component
//! (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`): the 8 KiB of tile registers then
//! join every thread's saved context. [`usable`] makes that request once per process and says
//! whether it was granted; a refusal (an older kernel, a VM that hides the state, a seccomp
//! filter) leaves the process on the AVX-512 VNNI path, which gives the same bits.
//!
//! The tile intrinsics are unstable in Rust 1.95, so the instructions are `asm!` (LLVM's
//! assembler knows the mnemonics whatever the target features). One configuration serves a run:
//! palette 1, tiles of 64-byte rows, 16 rows for weights and one per token for the rest. Each
//! run loads it (`ldtilecfg`, a few
//! dozen cycles) and ends with `tilerelease`, so a thread holds tile state only inside a run and
//! its other context switches stay as cheap as before.

use std::arch::asm;
use std::sync::OnceLock;

/// `arch_prctl` codes (Linux `asm/prctl.h`) and the tile-data state component (XSAVE bit 18).
const ARCH_REQ_XCOMP_PERM: libc::c_ulong = 0x1023;
const XFEATURE_XTILEDATA: libc::c_ulong = 18;

/// Whether this CPU has AMX int8 tiles and the kernel let this process use them (asked once).
pub(crate) fn usable() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| {
        // `is_x86_feature_detected!("amx-int8")` is unstable in Rust 1.95: CPUID leaf 7,
        // EDX bit 24 (AMX-TILE) and 25 (AMX-INT8). A kernel that does not manage the tile
        // state refuses the request below.
        let edx = std::arch::x86_64::__cpuid_count(7, 0).edx;
        edx & (3 << 24) == 3 << 24 && request_permission()
    })
}

#[cfg(target_os = "linux")]
fn request_permission() -> bool {
    // SAFETY: arch_prctl with these arguments only changes which XSAVE components the process
    // may use; it reads and writes no memory of ours.
    unsafe { libc::syscall(libc::SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 }
}

#[cfg(not(target_os = "linux"))]
fn request_permission() -> bool {
    // Other systems grant tile state their own way (or not at all); snug does not ask them.
    false
}

/// A tile configuration ([`configure`]): palette 1, eight tiles of 64 bytes a row.
#[repr(C, align(64))]
struct Config([u8; 64]);

/// Loads this thread's tile configuration: the token tiles (A: tmm0, tmm7; sums: tmm4–6) of
/// `tokens` rows, the weight tiles (tmm1–3) of 16. A product of fewer tokens costs the tile unit
/// fewer cycles, so a batch's tail of tokens runs on tiles of its own height.
///
/// # Safety
/// [`usable`] returned true in this process; `1 <= tokens <= 16`.
#[inline(always)]
pub(crate) unsafe fn configure(tokens: usize) {
    let mut c = Config([0; 64]);
    c.0[0] = 1;
    for t in 0..8 {
        c.0[16 + 2 * t] = 64;
        c.0[48 + t] = if (1..=3).contains(&t) { 16 } else { tokens as u8 };
    }
    // SAFETY: the caller checked AMX is usable; `c` is a valid palette-1 configuration (rows
    // 1..=16, 64 bytes a row, and each product's shapes agree: sums and A rows = tokens).
    unsafe { asm!("ldtilecfg [{0}]", in(reg) c.0.as_ptr(), options(nostack, readonly)) };
}

/// Returns this thread's tiles to their initial state.
///
/// # Safety
/// [`usable`] returned true in this process.
#[inline(always)]
pub(crate) unsafe fn release() {
    // SAFETY: the caller checked AMX is usable.
    unsafe { asm!("tilerelease", options(nostack, nomem)) };
}

/// Three exact int8 products of one 256-value block, for the configured number of tokens
/// ([`configure`], up to 16) and 16 weight rows: `c[p][t][r] = Σ_k a_t[k] · b_p[k][r]` (i32)
/// for `p < 3`, at `c + 1024p + 64t + 4r`, where `a_t` is 256 signed bytes at `a + t·a_stride` (four 64-byte quads at `a + 64q`) and `b_p` is four 1 KiB tiles at
/// `b + 4096p + 1024q`, each 16 rows of `[k % 64 / 4][r][k % 4]` (the VNNI layout). Tiles: A in
/// tmm0/tmm7 (alternating quads), B in tmm1–3, sums in tmm4–6.
///
/// # Safety
/// [`usable`] and [`configure`] on this thread; `a + t·a_stride` readable for 256 bytes for
/// every configured token `t`; `b` readable for 12 KiB; `c` writable for 3 KiB (64-byte alignment is not needed).
#[inline(always)]
pub(crate) unsafe fn dot3(a: *const u8, a_stride: usize, b: *const u8, c: *mut u8) {
    // SAFETY: the caller's contract: every address the loads and stores form is in bounds.
    unsafe {
        asm!(
            "tilezero tmm4",
            "tilezero tmm5",
            "tilezero tmm6",
            "tileloadd tmm0, [{a} + {s}*1]",
            "tileloadd tmm1, [{b} + {w}*1]",
            "tileloadd tmm2, [{b} + {w}*1 + 4096]",
            "tileloadd tmm3, [{b} + {w}*1 + 8192]",
            "tdpbssd tmm4, tmm0, tmm1",
            "tdpbssd tmm5, tmm0, tmm2",
            "tdpbssd tmm6, tmm0, tmm3",
            "tileloadd tmm7, [{a} + {s}*1 + 64]",
            "tileloadd tmm1, [{b} + {w}*1 + 1024]",
            "tileloadd tmm2, [{b} + {w}*1 + 5120]",
            "tileloadd tmm3, [{b} + {w}*1 + 9216]",
            "tdpbssd tmm4, tmm7, tmm1",
            "tdpbssd tmm5, tmm7, tmm2",
            "tdpbssd tmm6, tmm7, tmm3",
            "tileloadd tmm0, [{a} + {s}*1 + 128]",
            "tileloadd tmm1, [{b} + {w}*1 + 2048]",
            "tileloadd tmm2, [{b} + {w}*1 + 6144]",
            "tileloadd tmm3, [{b} + {w}*1 + 10240]",
            "tdpbssd tmm4, tmm0, tmm1",
            "tdpbssd tmm5, tmm0, tmm2",
            "tdpbssd tmm6, tmm0, tmm3",
            "tileloadd tmm7, [{a} + {s}*1 + 192]",
            "tileloadd tmm1, [{b} + {w}*1 + 3072]",
            "tileloadd tmm2, [{b} + {w}*1 + 7168]",
            "tileloadd tmm3, [{b} + {w}*1 + 11264]",
            "tdpbssd tmm4, tmm7, tmm1",
            "tdpbssd tmm5, tmm7, tmm2",
            "tdpbssd tmm6, tmm7, tmm3",
            "tilestored [{c} + {w}*1], tmm4",
            "tilestored [{c} + {w}*1 + 1024], tmm5",
            "tilestored [{c} + {w}*1 + 2048], tmm6",
            a = in(reg) a,
            s = in(reg) a_stride,
            b = in(reg) b,
            w = in(reg) 64usize,
            c = in(reg) c,
            options(nostack),
        );
    }
}
