//! Tensor names of the GGUF layout (llama.cpp's `LLM_TENSOR_*` names): the loader reads them, and
//! the memory planner groups a file's bytes by them, so they are written once, here.

/// The token embedding table.
pub const TOKEN_EMBD: &str = "token_embd.weight";
/// The output projection; absent when the model ties it to [`TOKEN_EMBD`].
pub const OUTPUT: &str = "output.weight";

/// Layer matrices (the suffix after `blk.N.`), in the order the forward pass multiplies by them.
pub const ATTN_Q: &str = "attn_q.weight";
pub const ATTN_K: &str = "attn_k.weight";
pub const ATTN_V: &str = "attn_v.weight";
/// q, k and v fused in one matrix (phi3).
pub const ATTN_QKV: &str = "attn_qkv.weight";
pub const ATTN_OUTPUT: &str = "attn_output.weight";
pub const FFN_GATE: &str = "ffn_gate.weight";
/// Up, or gate and up fused (phi3).
pub const FFN_UP: &str = "ffn_up.weight";
pub const FFN_DOWN: &str = "ffn_down.weight";
/// Mixture of experts: the router `[n_embd] → [n_expert]`, and the experts' matrices stacked
/// in one 3-D tensor each (`[n_embd, n_ff_exp, n_expert]`; down `[n_ff_exp, n_embd, n_expert]`),
/// one expert a contiguous block.
pub const FFN_GATE_INP: &str = "ffn_gate_inp.weight";
pub const FFN_GATE_EXPS: &str = "ffn_gate_exps.weight";
pub const FFN_UP_EXPS: &str = "ffn_up_exps.weight";
pub const FFN_DOWN_EXPS: &str = "ffn_down_exps.weight";
/// A shared expert every token passes through beside its routed ones (qwen2moe): a SwiGLU FFN
/// of `expert_shared_feed_forward_length`, and its gate vector `[n_embd]` whose sigmoid weighs
/// the expert's output per token.
pub const FFN_GATE_INP_SHEXP: &str = "ffn_gate_inp_shexp.weight";
pub const FFN_GATE_SHEXP: &str = "ffn_gate_shexp.weight";
pub const FFN_UP_SHEXP: &str = "ffn_up_shexp.weight";
pub const FFN_DOWN_SHEXP: &str = "ffn_down_shexp.weight";
/// Phi-3/4's LongRoPE frequency divisors `[n_rot / 2]`, for contexts past and within the
/// original training context.
pub const ROPE_FACTORS_LONG: &str = "rope_factors_long.weight";
pub const ROPE_FACTORS_SHORT: &str = "rope_factors_short.weight";

/// The streaming group (`memory::stages`: q/k/v, attention output, gate/up, down) that reads
/// layer matrix `suffix`, in the order `weights::LayerWeights::group` gives them; `None` for
/// norms and biases, which are read once at load.
pub fn stage_group(suffix: &str) -> Option<usize> {
    match suffix {
        ATTN_Q | ATTN_K | ATTN_V | ATTN_QKV => Some(0),
        ATTN_OUTPUT => Some(1),
        FFN_GATE | FFN_UP | FFN_GATE_INP | FFN_GATE_EXPS | FFN_UP_EXPS | FFN_GATE_SHEXP
        | FFN_UP_SHEXP => Some(2),
        FFN_DOWN | FFN_DOWN_EXPS | FFN_DOWN_SHEXP => Some(3),
        _ => None,
    }
}

/// Whether layer tensor `suffix` stacks every expert's matrices (`ffn_*_exps`): a token reads
/// only its chosen experts' blocks of it.
pub fn is_experts(suffix: &str) -> bool {
    matches!(suffix, FFN_GATE_EXPS | FFN_UP_EXPS | FFN_DOWN_EXPS)
}

/// Name of layer `il`'s tensor `suffix` (`attn_q.weight` → `blk.3.attn_q.weight`).
pub fn layer_tensor(il: usize, suffix: &str) -> String {
    format!("blk.{il}.{suffix}")
}

/// The layer and suffix of a layer tensor's name (`blk.3.attn_q.weight` → `(3, "attn_q.weight")`);
/// `None` for tensors outside the layers.
pub fn split_layer(name: &str) -> Option<(usize, &str)> {
    let rest = name.strip_prefix("blk.")?;
    let (il, suffix) = rest.split_once('.')?;
    Some((il.parse().ok()?, suffix))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layer_names_split_back_into_layer_and_suffix() {
        assert_eq!(
            split_layer(&layer_tensor(27, "ffn_down.weight")),
            Some((27, "ffn_down.weight"))
        );
        assert_eq!(split_layer(TOKEN_EMBD), None);
        assert_eq!(split_layer("blk.x.attn_q.weight"), None);
        assert_eq!(split_layer("blk.3"), None);
    }

    #[test]
    fn every_layer_matrix_has_a_stage_group_and_norms_have_none() {
        assert_eq!(stage_group(ATTN_QKV), Some(0));
        assert_eq!(stage_group(FFN_DOWN), Some(memory::stages::GROUPS - 1));
        assert_eq!(stage_group(FFN_DOWN_EXPS), stage_group(FFN_DOWN));
        assert_eq!(stage_group(FFN_GATE_INP), stage_group(FFN_UP_EXPS));
        assert!(is_experts(FFN_DOWN_EXPS) && !is_experts(FFN_GATE_INP) && !is_experts(FFN_DOWN));
        assert_eq!(stage_group(FFN_UP_SHEXP), stage_group(FFN_UP_EXPS));
        assert_eq!(stage_group(FFN_DOWN_SHEXP), stage_group(FFN_DOWN));
        assert!(!is_experts(FFN_DOWN_SHEXP) && stage_group(FFN_GATE_INP_SHEXP).is_none());
        assert_eq!(stage_group("attn_norm.weight"), None);
    }
}
