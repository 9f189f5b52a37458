//! The tensor-type recipe: which ggml type llama-quantize gives each tensor for a file type.

use gguf::GgmlType;

use super::Kind;

/// The tensor-type recipe (llama.cpp's `llama_ftype` names).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recipe {
    Q4KM,
    Q8_0,
    F16,
    F32,
}

impl Recipe {
    pub fn parse(s: &str) -> Option<Recipe> {
        Some(match s.to_ascii_lowercase().as_str() {
            "q4_k_m" => Recipe::Q4KM,
            "q8_0" => Recipe::Q8_0,
            "f16" => Recipe::F16,
            "f32" => Recipe::F32,
            _ => return None,
        })
    }

    /// `general.file_type`.
    pub(super) fn file_type(self) -> u32 {
        match self {
            Recipe::F32 => 0,
            Recipe::F16 => 1,
            Recipe::Q8_0 => 7,
            Recipe::Q4KM => 15,
        }
    }

    /// The type llama-quantize gives a 2-D tensor (`llama_tensor_get_type` in llama-quant.cpp
    /// for dense models, one expert, not 70B; a tied embedding is typed as `Output`). `i_layer` counts tensors of the same kind in file order, as
    /// llama.cpp's counters do.
    pub fn tensor_type(
        self,
        kind: Kind,
        i_layer: usize,
        n_layer: usize,
        row_len: usize,
    ) -> GgmlType {
        // llama.cpp: i < n/8 || i >= 7n/8 || (i - n/8) % 3 == 2
        let more_bits = |i: usize, n: usize| i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
        let ty = match self {
            Recipe::F32 => return GgmlType::F32,
            Recipe::F16 => return GgmlType::F16,
            Recipe::Q8_0 => return GgmlType::Q8_0,
            Recipe::Q4KM => match kind {
                Kind::Output if !row_len.is_multiple_of(256) => GgmlType::Q8_0,
                Kind::Output => GgmlType::Q6K,
                Kind::AttnV | Kind::FfnDown | Kind::FfnDownExps | Kind::FfnDownShexp
                    if more_bits(i_layer, n_layer) =>
                {
                    GgmlType::Q6K
                }
                Kind::AttnQkv => GgmlType::Q5K,
                _ => GgmlType::Q4K,
            },
        };
        // Rows that are not whole 256-value super-blocks fall back as llama.cpp does.
        match ty {
            GgmlType::Q4K if !row_len.is_multiple_of(256) => GgmlType::Q5_0,
            GgmlType::Q5K if !row_len.is_multiple_of(256) => GgmlType::Q5_1,
            GgmlType::Q6K if !row_len.is_multiple_of(256) => GgmlType::Q8_0,
            t => t,
        }
    }
}
