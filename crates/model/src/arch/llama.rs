//! Llama 2/3 and Mistral: the plain pre-norm transformer, RoPE on adjacent pairs, SwiGLU.
//! Llama 3's rope scaling arrives as the `rope_freqs` tensor (per-dimension divisors).

use super::{ArchSpec, BASE};

pub const SPEC: ArchSpec = ArchSpec { name: "llama", ..BASE };
