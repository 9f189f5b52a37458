//! Quantized block formats: the ggml type table, block layouts, scalar reference
//! quantize/dequantize, and the dot-product kernels the forward pass runs on.

pub mod blocks;
mod dequant;
mod error;
pub mod kernels;
mod quantize;
pub mod threads;
mod types;

pub use dequant::{can_dequantize, dequantize_row, Dequantize};
pub use error::QuantError;
pub use quantize::{can_quantize, quantize_row, Quantize};
pub use types::GgmlType;
