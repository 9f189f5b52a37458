//! Quantized block formats: the ggml type table, block layouts, scalar reference
//! quantize/dequantize, and the dot-product kernels the forward pass runs on.

mod types;

pub use types::GgmlType;
