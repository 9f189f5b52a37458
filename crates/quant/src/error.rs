//! The quant crate's error type: what was wrong with a row, a buffer or a type request, with the
//! numbers needed to fix the call.

use crate::GgmlType;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantError {
    /// No scalar dequantize for this type (the IQ1/IQ2/IQ3 grids, ternary, MXFP4, integers).
    #[error(
        "ggml type {0} cannot be dequantized by snug (supported: f32, f16, bf16, q4_0, q4_1, \
         q5_0, q5_1, q8_0, q8_1, q2_K, q3_K, q4_K, q5_K, q6_K, q8_K, iq4_nl, iq4_xs)"
    )]
    Unsupported(GgmlType),
    /// No quantizer for this type; see [`crate::can_quantize`].
    #[error(
        "snug cannot quantize to ggml type {0} (supported: f32, f16, bf16, q4_0, q4_1, q5_0, \
         q5_1, q8_0, q8_1, q2_K, q3_K, q4_K, q5_K, q6_K, q8_K, iq4_nl, iq4_xs)"
    )]
    CannotQuantize(GgmlType),
    /// The row length is not a whole number of blocks.
    #[error("a {ty} row of {n} values is not a whole number of {block}-value blocks")]
    PartialBlock { ty: GgmlType, n: usize, block: usize },
    /// The quantized buffer has the wrong size for the number of values.
    #[error("a {ty} row of {n} values takes {expected} bytes, but the buffer has {got}")]
    ByteLen { ty: GgmlType, n: usize, expected: usize, got: usize },
}

impl QuantError {
    /// Bytes a row of `n` values of `ty` occupies, or the error saying why `n` is not a row.
    pub fn row_bytes(ty: GgmlType, n: usize) -> Result<usize, QuantError> {
        ty.row_bytes(n).ok_or(QuantError::PartialBlock { ty, n, block: ty.block_size() })
    }

    /// Check that `bytes` is exactly a row of `n` values of `ty`.
    pub fn check_row(ty: GgmlType, n: usize, bytes: usize) -> Result<(), QuantError> {
        let expected = Self::row_bytes(ty, n)?;
        if expected == bytes {
            Ok(())
        } else {
            Err(QuantError::ByteLen { ty, n, expected, got: bytes })
        }
    }
}
