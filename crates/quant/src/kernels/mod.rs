//! Quantized dot products and the matmul the forward pass runs on.
//!
//! Weights stay in their GGUF block format; each activation row is quantized once to the
//! weight type's dot partner ([`vec_dot_type`]: Q8_K for K-quants, Q8_0/Q8_1 for the legacy
//! formats) and every weight row is dotted against it. One table of kernels per instruction set
//! ([`Isa`]) is chosen once at run time from the CPU's features; every SIMD kernel has a scalar
//! twin in `scalar.rs` that follows ggml's `*_generic` math. Decode (m = 1) streams each weight
//! byte once; batched decode and prefill run 1-row × {2, 4, [`TILE`]}-token kernels so each
//! weight block is unpacked once per group of tokens while the rows of a chunk stay in L1/L2
//! (`matmul.rs`). The matmul hands a kernel a whole chunk of weight rows (`DotRowsFn`) and the
//! loop over them runs inside the kernel's target-feature function: a call per row (register
//! saves, constants, the result returned through memory) cost about an eighth of a 1,536-value
//! Q4_K row at 4 tokens, and decode runs ~800k rows a token on a 1.5B model. Paths: scalar,
//! AVX2+FMA+F16C, AVX-512 (512-bit VNNI kernels for Q4_K, Q5_K, Q6_K and IQ4_XS; the AVX2
//! sources recompiled with AVX-512VL+VNNI for the rest), NEON (Q8_0/Q4_0 only so far; other
//! types fall back to scalar on aarch64).
//!
//! Raw block layouts the kernels read (byte offsets; f16/f32/i16 little-endian):
//! - Q4_0 (18 B / 32): d f16 @0, qs[16] @2 (value j = low nibble of qs[j], j+16 = high nibble)
//! - Q4_1 (20 B / 32): d f16 @0, m f16 @2, qs[16] @4
//! - Q5_0 (22 B / 32): d f16 @0, qh u32 @2 (bit j = bit 4 of value j), qs[16] @6
//! - Q5_1 (24 B / 32): d f16 @0, m f16 @2, qh u32 @4, qs[16] @8
//! - Q8_0 (34 B / 32): d f16 @0, qs i8[32] @2
//! - Q8_1 (36 B / 32): d f16 @0, s f16 @2 (= d · Σqs), qs i8[32] @4
//! - IQ4_NL (18 B / 32): d f16 @0, qs[16] @2 (nibbles index the IQ4 codebook)
//! - Q2_K (84 B / 256): scales[16] @0 (low nibble scale, high nibble min), qs[64] @16,
//!   d f16 @80, dmin f16 @82
//! - Q3_K (110 B / 256): hmask[32] @0, qs[64] @32, scales[12] @96 (16 × 6-bit), d f16 @108
//! - Q4_K (144 B / 256): d f16 @0, dmin f16 @2, scales[12] @4 (8 × 6-bit scale + min), qs[128] @16
//! - Q5_K (176 B / 256): d f16 @0, dmin f16 @2, scales[12] @4, qh[32] @16, qs[128] @48
//! - Q6_K (210 B / 256): ql[128] @0, qh[64] @128, scales i8[16] @192, d f16 @208
//! - IQ4_XS (136 B / 256): d f16 @0, scales_h u16 @2, scales_l[4] @4, qs[128] @8
//! - Q8_K (292 B / 256): d f32 @0, qs i8[256] @4, bsums i16[16] @260 (Σ of each 16 qs)

use std::sync::OnceLock;

use crate::GgmlType;

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod matmul;
#[cfg(target_arch = "aarch64")]
mod neon;
mod scalar;

pub use matmul::{
    has_panels, matmul, matmul_multi, matmul_multi_panels, matmul_multi_with, matmul_panels_with,
    matmul_with, panel_min_tokens, panels_enabled, MAX_MULTI,
};

/// Tokens per prefill tile: each weight block is unpacked once per `TILE` activation rows.
pub const TILE: usize = 8;

/// An instruction-set path. Each has its own kernel table; a path without its own kernel for a
/// type uses the next older one (AMX → AVX-512 → AVX2 → scalar, NEON → scalar). AMX is the
/// AVX-512 path with the prefill panels of Q4_K and Q6_K on Intel AMX tiles
/// (`avx512/tile_panel.rs`), the same bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Isa {
    Scalar,
    Avx2,
    Avx512,
    Amx,
    Neon,
}

impl Isa {
    /// Every path, oldest first.
    pub const ALL: [Isa; 5] = [Isa::Scalar, Isa::Avx2, Isa::Avx512, Isa::Amx, Isa::Neon];

    pub const fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
            Isa::Amx => "amx",
            Isa::Neon => "neon",
        }
    }

    /// Whether this CPU can run the path (AVX2 needs AVX2+FMA+F16C; AVX-512 needs F/BW/VL/VNNI
    /// on top; AMX needs AMX-TILE/INT8 on top and the kernel's leave to use the tiles, asked for
    /// once per process; NEON needs aarch64).
    pub fn available(self) -> bool {
        match self {
            Isa::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => {
                is_x86_feature_detected!("avx2")
                    && is_x86_feature_detected!("fma")
                    && is_x86_feature_detected!("f16c")
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => {
                Isa::Avx2.available()
                    && is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512vl")
                    && is_x86_feature_detected!("avx512vnni")
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Amx => Isa::Avx512.available() && avx512::tiles_usable(),
            #[cfg(target_arch = "aarch64")]
            Isa::Neon => std::arch::is_aarch64_feature_detected!("neon"),
            #[cfg(not(target_arch = "x86_64"))]
            Isa::Avx2 | Isa::Avx512 | Isa::Amx => false,
            #[cfg(not(target_arch = "aarch64"))]
            Isa::Neon => false,
        }
    }

    /// Whether the path runs AVX2 + FMA + F16C code: the AVX2 path, and AVX-512 and AMX, which
    /// extend it. The model's own SIMD kernels (attention tiles, KV formats, SwiGLU) choose by this, so
    /// [`isa`] and `SNUG_KERNELS` decide for them too.
    pub const fn avx2_family(self) -> bool {
        match self {
            Isa::Avx2 | Isa::Avx512 | Isa::Amx => true,
            Isa::Scalar | Isa::Neon => false,
        }
    }

    /// The paths this CPU can run, oldest first.
    pub fn all_available() -> Vec<Isa> {
        Isa::ALL.into_iter().filter(|i| i.available()).collect()
    }

    /// The best path this CPU can run.
    pub fn best() -> Isa {
        [Isa::Amx, Isa::Avx512, Isa::Avx2, Isa::Neon]
            .into_iter()
            .find(|i| i.available())
            .unwrap_or(Isa::Scalar)
    }
}

impl std::fmt::Display for Isa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The kernel path for this process: chosen once, from the CPU's features, or forced with
/// `SNUG_KERNELS=scalar|avx2|avx512|amx|neon` (a forced path this CPU cannot run is ignored and the
/// best available one is used instead). Inline: the model's kernel tables ask on every call.
#[inline]
pub fn isa() -> Isa {
    static ISA: OnceLock<Isa> = OnceLock::new();
    *ISA.get_or_init(|| {
        let forced = std::env::var("SNUG_KERNELS")
            .ok()
            .and_then(|v| Isa::ALL.into_iter().find(|i| i.name().eq_ignore_ascii_case(v.trim())));
        match forced {
            Some(i) if i.available() => i,
            _ => Isa::best(),
        }
    })
}

/// `$avx2` when this process runs the AVX2 family ([`isa`], which honours `SNUG_KERNELS`),
/// `$generic` otherwise: the one place a kernel table outside this crate picks its path. A
/// macro, not a function, because `$avx2` names items that exist only on x86-64.
#[macro_export]
macro_rules! by_isa {
    ($avx2:expr, $generic:expr $(,)?) => {{
        #[cfg(target_arch = "x86_64")]
        let picked = if $crate::kernels::isa().avx2_family() { $avx2 } else { $generic };
        #[cfg(not(target_arch = "x86_64"))]
        let picked = $generic;
        picked
    }};
}

/// The types no path has a dot kernel or a quantizer for: quant formats snug does not run yet,
/// and integer and f64 tensors. A pattern, so the tables below stay exhaustive: a new
/// [`GgmlType`] is a compile error in each of them until someone decides what it needs.
macro_rules! no_kernel_types {
    () => {
        $crate::GgmlType::IQ2XXS
            | $crate::GgmlType::IQ2XS
            | $crate::GgmlType::IQ3XXS
            | $crate::GgmlType::IQ1S
            | $crate::GgmlType::IQ3S
            | $crate::GgmlType::IQ2S
            | $crate::GgmlType::IQ1M
            | $crate::GgmlType::TQ1_0
            | $crate::GgmlType::TQ2_0
            | $crate::GgmlType::MXFP4
            | $crate::GgmlType::I8
            | $crate::GgmlType::I16
            | $crate::GgmlType::I32
            | $crate::GgmlType::I64
            | $crate::GgmlType::F64
    };
}
pub(crate) use no_kernel_types;

/// The format an activation row is quantized to before it is dotted with weights of type `w`
/// (F32 for the float weights, and for types without a kernel, which [`matmul`] refuses).
pub fn vec_dot_type(w: GgmlType) -> GgmlType {
    use GgmlType::*;
    match w {
        Q2K | Q3K | Q4K | Q5K | Q6K | IQ4XS => Q8K,
        Q4_0 | Q5_0 | Q8_0 | IQ4NL => Q8_0,
        Q4_1 | Q5_1 => Q8_1,
        F32 | F16 | BF16 => F32,
        // Activation-only formats: no weight is stored in them.
        Q8_1 | Q8K | no_kernel_types!() => F32,
    }
}

/// A quantized activation format: the [`vec_dot_type`]s other than F32, which is dotted as is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Partner {
    Q8_0,
    Q8_1,
    Q8K,
}

impl Partner {
    const ALL: [Partner; 3] = [Partner::Q8_0, Partner::Q8_1, Partner::Q8K];

    pub(crate) const fn ty(self) -> GgmlType {
        match self {
            Partner::Q8_0 => GgmlType::Q8_0,
            Partner::Q8_1 => GgmlType::Q8_1,
            Partner::Q8K => GgmlType::Q8K,
        }
    }

    /// The partner format `vdt` names; `None` for F32 and for types that are never a partner.
    pub(crate) fn of(vdt: GgmlType) -> Option<Partner> {
        Partner::ALL.into_iter().find(|p| p.ty() == vdt)
    }
}

/// Whether [`matmul`] accepts weights of type `ty`.
pub fn supports(ty: GgmlType) -> bool {
    scalar::dot_kernels(ty).is_some()
}

/// Why a kernel call was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KernelError {
    /// No dot-product kernel for this weight type.
    Unsupported(GgmlType),
    /// The requested instruction-set path cannot run on this CPU.
    IsaUnavailable(Isa),
    /// The row length is not a whole number of the weight's (or its activation's) blocks.
    PartialBlock { ty: GgmlType, cols: usize, block: usize },
    /// A buffer has the wrong length for the shapes given.
    Len { what: &'static str, expected: usize, got: usize },
    /// Matrices in one `matmul_multi` need different activation formats.
    Mixed { first: GgmlType, other: GgmlType },
}

impl std::fmt::Display for KernelError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KernelError::Unsupported(ty) => write!(
                f,
                "no matmul kernel for weight type {ty} (supported: f32 f16 bf16 q4_0 q4_1 q5_0 \
                 q5_1 q8_0 q2_K q3_K q4_K q5_K q6_K iq4_nl iq4_xs)"
            ),
            KernelError::IsaUnavailable(i) => {
                write!(
                    f,
                    "this CPU cannot run the {i} kernels (available: {:?})",
                    Isa::all_available()
                )
            }
            KernelError::PartialBlock { ty, cols, block } => write!(
                f,
                "rows of {cols} values are not a whole number of {block}-value {ty} blocks"
            ),
            KernelError::Len { what, expected, got } => {
                write!(f, "{what} has {got} elements but the shapes need {expected}")
            }
            KernelError::Mixed { first, other } => write!(
                f,
                "matmul_multi needs one activation format for all matrices, but {first} dots \
                 with {} and {other} with {}; call matmul for each instead",
                vec_dot_type(*first),
                vec_dot_type(*other)
            ),
        }
    }
}

impl std::error::Error for KernelError {}

/// A row-major weight matrix: `rows` rows of `cols` values, each row `ty.row_bytes(cols)` bytes.
#[derive(Clone, Copy, Debug)]
pub struct MatRef<'a> {
    pub ty: GgmlType,
    pub data: &'a [u8],
    pub rows: usize,
    pub cols: usize,
}

/// `dot_rows(n, w, w_row, x, stride, out, out_stride)`: every weight row of `w` (rows of
/// `w_row` bytes) · the kernel's `N` (1, 2, 4 or [`TILE`]) activation rows starting at
/// `x[c * stride]`, unpacking each weight block once for all `N`; weight row `r` · activation
/// row `c` goes to `out[c * out_stride + r]` (the module doc says why the row loop is inside).
///
/// # Safety
/// The CPU supports the kernel's ISA; `n` is a whole number of blocks of both formats;
/// `w.len()` is a multiple of `w_row` (a full row of `n` values); `x` holds `(N - 1) * stride`
/// bytes plus a full row; `out` is valid for writes at every `c * out_stride + r`.
pub(crate) type DotRowsFn = unsafe fn(
    n: usize,
    w: &[u8],
    w_row: usize,
    x: &[u8],
    stride: usize,
    out: *mut f32,
    out_stride: usize,
);

/// The row loop of every [`DotRowsFn`]: `f` (the `N` dots of one weight row) for each row of `w`,
/// stored at `out[c * out_stride + r]`. Inlined, so `f` is compiled with the kernel's features.
///
/// # Safety
/// `w.len()` is a multiple of `w_row`, and `out` is valid for writes at every
/// `c * out_stride + r` (`c < N`, `r < w.len() / w_row`).
#[inline(always)]
pub(crate) unsafe fn each_row<const N: usize>(
    w: &[u8],
    w_row: usize,
    out: *mut f32,
    out_stride: usize,
    mut f: impl FnMut(&[u8]) -> [f32; N],
) {
    for (r, wr) in w.chunks_exact(w_row).enumerate() {
        for (c, v) in f(wr).into_iter().enumerate() {
            // SAFETY: the caller's contract covers every (c, r) written.
            unsafe { *out.add(c * out_stride + r) = v };
        }
    }
}

/// A [`DotKernels`] from one body that dots a weight row with `N` activation rows:
/// `kernels_from_row!(#[attrs] |n, wr, x, stride| -> [f32; N] { body })`. The body is inlined into
/// the [`DotRowsFn`] wrappers (`N` = 1, 2, 4, [`TILE`], rows through [`each_row`]), which carry
/// the attributes (a path's `target_feature`), so every path writes only its kernel call. The
/// body is an `unsafe fn`'s: it may rely on [`DotRowsFn`]'s contract for one full weight row.
macro_rules! kernels_from_row {
    ($(#[$attr:meta])* |$n:ident, $wr:ident, $x:ident, $stride:ident| -> [f32; $c:ident] $body:block) => {{
        #[inline(always)]
        unsafe fn one<const $c: usize>($n: usize, $wr: &[u8], $x: &[u8], $stride: usize) -> [f32; $c] $body
        $(#[$attr])*
        unsafe fn rows<const N: usize>(
            n: usize,
            w: &[u8],
            w_row: usize,
            x: &[u8],
            stride: usize,
            out: *mut f32,
            out_stride: usize,
        ) {
            // SAFETY: forwarded contract of DotRowsFn; each call gets one full weight row.
            unsafe {
                $crate::kernels::each_row(w, w_row, out, out_stride, |wr| one::<N>(n, wr, x, stride))
            }
        }
        $crate::kernels::DotKernels {
            x1: rows::<1>,
            x2: rows::<2>,
            x4: rows::<4>,
            tile: rows::<{ $crate::kernels::TILE }>,
        }
    }};
}
pub(crate) use kernels_from_row;

/// Quantize a row of f32 activations into the partner format.
///
/// # Safety
/// The CPU supports the kernel's ISA; `x.len()` is a whole number of blocks and `dst` holds the
/// quantized row.
pub(crate) type QuantizeFn = unsafe fn(x: &[f32], dst: &mut [u8]);

/// The dot kernels of one weight type on one ISA: row-range kernels for 1, 2, 4 or [`TILE`]
/// activation rows per weight-block unpack (decode, batched decode, prefill tails, prefill).
#[derive(Clone, Copy)]
pub(crate) struct DotKernels {
    pub x1: DotRowsFn,
    pub x2: DotRowsFn,
    pub x4: DotRowsFn,
    pub tile: DotRowsFn,
}

/// Prefill kernels that unpack [`PANEL_ROWS`] weight rows once into a panel and run every token
/// of the batch against it, with the row kernels' exact bits (`avx512/panel.rs` says the design;
/// AVX-512 VNNI only).
#[derive(Clone, Copy)]
pub(crate) struct PanelKernels {
    /// `unpack(cols, w, w_row, panel)`: the [`PANEL_ROWS`] rows of `w` into `panel`.
    ///
    /// # Safety
    /// The CPU supports the path; `w` holds [`PANEL_ROWS`] full rows of `cols` values (a
    /// multiple of 256) at `w_row` bytes; `panel` is `bytes(cols)` long.
    pub unpack: unsafe fn(cols: usize, w: &[u8], w_row: usize, panel: &mut [u8]),
    pub run: PanelRunFn,
    /// Bytes of a panel for rows of `cols` values.
    pub bytes: fn(cols: usize) -> usize,
}

/// `run(cols, panel, x, x_row, m, out, out_stride)`: `out[t * out_stride + r]` = row `r` of the
/// panel · activation row `t < m` of `x`.
///
/// # Safety
/// As [`PanelKernels::unpack`], for a panel it filled; `x` holds `m` partner rows at `x_row`
/// bytes; `out` is valid for [`PANEL_ROWS`] writes at every `t * out_stride`.
pub(crate) type PanelRunFn = unsafe fn(
    cols: usize,
    panel: &[u8],
    x: &[u8],
    x_row: usize,
    m: usize,
    out: *mut f32,
    out_stride: usize,
);

/// Weight rows in one panel ([`PanelKernels`]).
pub(crate) const PANEL_ROWS: usize = 16;

/// Fewest tokens for which a panel pays for its unpack (below, the row kernels run; the results
/// are the same bits either way): batched decode of 8 streams and verification passes of 8 or
/// more tokens take the panels. `SNUG_PANEL_MIN_TOKENS` overrides it ([`panel_min_tokens`]).
pub const PANEL_MIN_TOKENS: usize = 8;

/// Panel kernels for `ty` on `isa`, where the path has them.
pub(crate) fn panel_kernels(isa: Isa, ty: GgmlType) -> Option<PanelKernels> {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => avx512::panel_kernels(ty),
        #[cfg(target_arch = "x86_64")]
        Isa::Amx => avx512::tile_panel_kernels(ty).or_else(|| avx512::panel_kernels(ty)),
        _ => {
            let _ = ty;
            None
        }
    }
}

/// Dot kernels for `ty` on `isa`, falling back to the next older path for types a path lacks.
pub(crate) fn dot_kernels(isa: Isa, ty: GgmlType) -> Option<DotKernels> {
    let own = match isa {
        Isa::Scalar => None,
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => avx2::dot_kernels(ty),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 | Isa::Amx => avx512::dot_kernels(ty).or_else(|| avx2::dot_kernels(ty)),
        #[cfg(target_arch = "aarch64")]
        Isa::Neon => neon::dot_kernels(ty),
        #[cfg(not(target_arch = "x86_64"))]
        Isa::Avx2 | Isa::Avx512 | Isa::Amx => None,
        #[cfg(not(target_arch = "aarch64"))]
        Isa::Neon => None,
    };
    own.or_else(|| scalar::dot_kernels(ty))
}

/// Activation quantizer into `vdt` on `isa` (`None` for F32, which needs no quantization).
pub(crate) fn quantizer(isa: Isa, vdt: GgmlType) -> Option<QuantizeFn> {
    let p = Partner::of(vdt)?;
    let own = match isa {
        Isa::Scalar => None,
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => Some(avx2::quantizer(p)),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 | Isa::Amx => Some(avx512::quantizer(p)),
        #[cfg(target_arch = "aarch64")]
        Isa::Neon => neon::quantizer(p),
        #[cfg(not(target_arch = "x86_64"))]
        Isa::Avx2 | Isa::Avx512 | Isa::Amx => None,
        #[cfg(not(target_arch = "aarch64"))]
        Isa::Neon => None,
    };
    Some(own.unwrap_or_else(|| scalar::quantizer(p)))
}

pub(crate) fn check_isa(isa: Isa) -> Result<(), KernelError> {
    if isa.available() {
        Ok(())
    } else {
        Err(KernelError::IsaUnavailable(isa))
    }
}

/// Bytes of one activation row of `cols` values in `vdt`, checking block alignment.
pub(crate) fn act_row_bytes(vdt: GgmlType, cols: usize) -> Result<usize, KernelError> {
    vdt.row_bytes(cols).ok_or(KernelError::PartialBlock { ty: vdt, cols, block: vdt.block_size() })
}

pub(crate) fn check_len(
    what: &'static str,
    expected: usize,
    got: usize,
) -> Result<(), KernelError> {
    if expected == got {
        Ok(())
    } else {
        Err(KernelError::Len { what, expected, got })
    }
}

/// Quantize one activation row `x` into the partner format `vdt` on path `isa` (exposed so tests
/// can compare paths; `matmul` does this itself). `dst` must be exactly the quantized row.
pub fn quantize_activation_with(
    isa: Isa,
    vdt: GgmlType,
    x: &[f32],
    dst: &mut [u8],
) -> Result<(), KernelError> {
    check_isa(isa)?;
    let q = quantizer(isa, vdt).ok_or(KernelError::Unsupported(vdt))?;
    check_len("quantized activation row", act_row_bytes(vdt, x.len())?, dst.len())?;
    // SAFETY: the ISA is available, `x` is whole blocks (checked by act_row_bytes) and `dst` is
    // exactly one quantized row.
    unsafe { q(x, dst) };
    Ok(())
}

/// Kernels for `ty` on `isa` after checking the path runs here and `w` is one row of `n`.
fn row_kernels(isa: Isa, ty: GgmlType, n: usize, w: &[u8]) -> Result<DotKernels, KernelError> {
    check_isa(isa)?;
    let k = dot_kernels(isa, ty).ok_or(KernelError::Unsupported(ty))?;
    check_len("weight row", row_bytes(ty, n)?, w.len())?;
    Ok(k)
}

/// One weight row `w` (`n` values of `ty`) · one activation row `x` already in
/// `vec_dot_type(ty)` (F32 partners are f32 little-endian bytes), on path `isa`.
pub fn vec_dot_with(
    isa: Isa,
    ty: GgmlType,
    n: usize,
    w: &[u8],
    x: &[u8],
) -> Result<f32, KernelError> {
    let k = row_kernels(isa, ty, n, w)?;
    check_len("activation row", act_row_bytes(vec_dot_type(ty), n)?, x.len())?;
    let mut out = 0f32;
    // SAFETY: ISA available, both rows complete and `n` whole blocks of both formats; one weight
    // row and one activation row write `out` alone.
    unsafe { (k.x1)(n, w, w.len(), x, 0, &mut out, 1) };
    Ok(out)
}

/// As [`vec_dot_with`] for 1, 2, 4 or [`TILE`] activation rows laid end to end in `x`, through
/// the kernel for that many rows; `out` receives one dot per row.
pub fn vec_dot_rows_with(
    isa: Isa,
    ty: GgmlType,
    n: usize,
    w: &[u8],
    x: &[u8],
    out: &mut [f32],
) -> Result<(), KernelError> {
    let k = row_kernels(isa, ty, n, w)?;
    let stride = act_row_bytes(vec_dot_type(ty), n)?;
    check_len("activation rows", out.len() * stride, x.len())?;
    let (w_row, o) = (w.len(), out.as_mut_ptr());
    // SAFETY (all arms): ISA available; `w` is one full row; `x` holds out.len() full rows at
    // `stride`; one weight row writes out[c] for every c < out.len().
    match out.len() {
        1 => unsafe { (k.x1)(n, w, w_row, x, stride, o, 1) },
        2 => unsafe { (k.x2)(n, w, w_row, x, stride, o, 1) },
        4 => unsafe { (k.x4)(n, w, w_row, x, stride, o, 1) },
        TILE => unsafe { (k.tile)(n, w, w_row, x, stride, o, 1) },
        got => {
            return Err(KernelError::Len {
                what: "activation rows (1, 2, 4 or TILE)",
                expected: TILE,
                got,
            })
        }
    }
    Ok(())
}

pub(crate) fn row_bytes(ty: GgmlType, n: usize) -> Result<usize, KernelError> {
    ty.row_bytes(n).ok_or(KernelError::PartialBlock { ty, cols: n, block: ty.block_size() })
}

/// The bytes of an f32 slice (little-endian on every target snug supports).
pub(crate) fn f32_bytes(x: &[f32]) -> &[u8] {
    // SAFETY: any f32 bit pattern is valid bytes; u8 has alignment 1; same allocation and size.
    unsafe { std::slice::from_raw_parts(x.as_ptr().cast::<u8>(), std::mem::size_of_val(x)) }
}
