//! What names a cached KV block: its size in tokens and the hash chain over them, shared by
//! the prefix cache in RAM and its disk tier.

use std::hash::{Hash, Hasher};

/// Tokens per KV block.
pub const BLOCK_TOKENS: usize = 32;

/// The key of the block after `parent` holding `tokens`.
pub fn chain_key(parent: u64, tokens: &[u32]) -> u64 {
    let mut h = std::hash::DefaultHasher::new();
    parent.hash(&mut h);
    tokens.hash(&mut h);
    h.finish()
}
