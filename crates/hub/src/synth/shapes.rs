//! The model shapes synth knows: every hyper-parameter of a real checkpoint of that name, with
//! the defaults of its family.

/// The two architectures synth writes; they differ only in data (biases, rope table, defaults).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    Llama,
    Qwen2,
}

impl Arch {
    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
        }
    }
}

/// A model shape: every hyper-parameter a real checkpoint of that name has, except the vocabulary
/// (taken from the tokenizer).
#[derive(Clone, Debug, PartialEq)]
pub struct Shape {
    pub name: &'static str,
    pub arch: Arch,
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_ff: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    /// q/k/v projections carry biases (qwen2).
    pub qkv_bias: bool,
    pub n_ctx_train: usize,
    pub rope_freq_base: f32,
    pub rms_eps: f32,
    /// Llama 3.1 rope scaling: `(factor, low_freq_factor, high_freq_factor, original n_ctx)`,
    /// written as the `rope_freqs.weight` table llama.cpp's converter makes.
    pub llama3_rope: Option<(f32, f32, f32, usize)>,
}

impl Shape {
    pub fn head_dim(&self) -> usize {
        self.n_embd / self.n_head
    }
}

/// A shape with the defaults of its family: qwen2 has qkv biases and rope base 1e6; llama 3.x has
#[allow(clippy::too_many_arguments)] // one row of the table below, in its column order
const fn family(
    arch: Arch,
    name: &'static str,
    n_layer: usize,
    n_embd: usize,
    n_ff: usize,
    n_head: usize,
    n_head_kv: usize,
    n_ctx_train: usize,
) -> Shape {
    let qwen = matches!(arch, Arch::Qwen2);
    Shape {
        name,
        arch,
        n_layer,
        n_embd,
        n_ff,
        n_head,
        n_head_kv,
        qkv_bias: qwen,
        n_ctx_train,
        rope_freq_base: if qwen { 1_000_000.0 } else { 500_000.0 },
        rms_eps: if qwen { 1e-6 } else { 1e-5 },
        llama3_rope: if qwen { None } else { Some((8.0, 1.0, 4.0, 8192)) },
    }
}

/// Known shapes. The `tiny-*` ones are for fast tests (row lengths are whole K-quant blocks).
pub const SHAPES: [Shape; 6] = [
    family(Arch::Qwen2, "qwen2.5-7b", 28, 3584, 18944, 28, 4, 32768),
    family(Arch::Llama, "llama-3.1-8b", 32, 4096, 14336, 32, 8, 131072),
    family(Arch::Qwen2, "qwen2.5-1.5b", 28, 1536, 8960, 12, 2, 32768),
    family(Arch::Qwen2, "qwen2.5-0.5b", 24, 896, 4864, 14, 2, 32768),
    family(Arch::Qwen2, "tiny-qwen2", 2, 256, 512, 4, 2, 2048),
    family(Arch::Llama, "tiny-llama", 2, 256, 512, 4, 2, 2048),
];

pub fn shape(name: &str) -> Option<&'static Shape> {
    SHAPES.iter().find(|s| s.name == name)
}
