//! Read access to one layer of one sequence, for attention: decodes one KV head of a 32-token
//! block into an f32 tile (per-channel key blocks decode their scales and mins once per block),
//! and locates value heads.

use half::f16;

use super::format::{dequant_f16, kernels, key_block_row};
use super::pool::{BlockId, NO_BLOCK};
use super::BLOCK_TOKENS;
use crate::params::KvType;

/// One layer of one sequence, read-only.
pub struct LayerView<'a> {
    pub(super) bytes: &'a [u8],
    pub(super) table: &'a [BlockId],
    pub(super) block_bytes: usize,
    pub(super) k_type: KvType,
    pub(super) v_type: KvType,
    pub(super) n_head_kv: usize,
    pub(super) head_dim: usize,
    /// Bytes of one token's keys / values (all heads); `BLOCK_TOKENS × k_row` key bytes start a
    /// block, values follow.
    pub(super) k_row: usize,
    pub(super) v_row: usize,
    /// Bytes of one token's value head; of one token's key head (per-token keys) or of one
    /// head's 32-token block (per-channel keys).
    pub(super) k_head: usize,
    pub(super) v_head: usize,
    /// Block whose keys are still being filled (per-channel keys), held in `staged`.
    pub(super) tail: usize,
    /// [BLOCK_TOKENS][n_head_kv × head_dim] f16 keys of block `tail`.
    pub(super) staged: &'a [f16],
}

/// Where the keys of one block live.
#[derive(Clone, Copy)]
enum KeyBlock<'a> {
    /// Not held: never written, or freed by a window.
    Missing,
    /// `[BLOCK_TOKENS][n_head_kv][k_head]` per-token rows (f16).
    Rows(&'a [u8]),
    /// `[n_head_kv][k_head]` per-channel q8/q4 blocks (`format::encode_key_block`).
    Channels(&'a [u8]),
    /// The block being filled: `[BLOCK_TOKENS][n_head_kv × head_dim]` f16.
    Staged(&'a [f16]),
}

/// Floats of scratch one decoded key head needs: the head plus its block's per-channel scales
/// and mins.
pub fn key_scratch_floats(head_dim: usize) -> usize {
    3 * head_dim
}

impl<'a> LayerView<'a> {
    #[inline]
    fn block(&self, b: usize) -> Option<usize> {
        match self.table.get(b) {
            Some(&id) if id != NO_BLOCK => Some(id as usize * self.block_bytes),
            _ => None,
        }
    }

    fn key_block(&self, b: usize) -> KeyBlock<'a> {
        let Some(at) = self.block(b) else {
            return KeyBlock::Missing;
        };
        if b == self.tail {
            return KeyBlock::Staged(self.staged);
        }
        let keys = &self.bytes[at..at + BLOCK_TOKENS * self.k_row];
        if self.k_type.k_per_channel() {
            KeyBlock::Channels(keys)
        } else {
            KeyBlock::Rows(keys)
        }
    }

    /// Decodes head `h`'s per-channel scales and mins of a `Channels` block into `chan`
    /// (`[2 × head_dim]`); other blocks need nothing.
    fn load_channels(&self, src: KeyBlock<'_>, h: usize, chan: &mut [f32]) {
        if let KeyBlock::Channels(k) = src {
            let d = self.head_dim;
            dequant_f16(&k[h * self.k_head..h * self.k_head + 4 * d], &mut chan[..2 * d]);
        }
    }

    /// Key head `h` at `slot` of `src` → `row` (`head_dim` floats); false if not held.
    /// `chan`: what [`Self::load_channels`] left for this block and head.
    #[inline]
    fn key_into(
        &self,
        src: KeyBlock<'_>,
        h: usize,
        slot: usize,
        row: &mut [f32],
        chan: &[f32],
    ) -> bool {
        let d = self.head_dim;
        match src {
            KeyBlock::Missing => return false,
            KeyBlock::Rows(k) => {
                let at = slot * self.k_row + h * self.k_head;
                kernels().dequant(self.k_type, &k[at..at + self.k_head], row);
            }
            KeyBlock::Channels(k) => {
                let block = &k[h * self.k_head..(h + 1) * self.k_head];
                key_block_row(kernels(), self.k_type, block, d, slot, chan, row);
            }
            KeyBlock::Staged(st) => {
                let at = (slot * self.n_head_kv + h) * d;
                (kernels().f16_to_f32)(&st[at..at + d], row);
            }
        }
        true
    }

    /// Key head `h` of the 32 positions of block `b` as f32 `[BLOCK_TOKENS][head_dim]` into
    /// `tile`; false if the block is not held. `chan`: scratch of `2 × head_dim` floats.
    pub fn key_tile(&self, h: usize, b: usize, tile: &mut [f32], chan: &mut [f32]) -> bool {
        let d = self.head_dim;
        let src = self.key_block(b);
        if let KeyBlock::Missing = src {
            return false;
        }
        self.load_channels(src, h, chan);
        for (slot, row) in tile[..BLOCK_TOKENS * d].chunks_exact_mut(d).enumerate() {
            self.key_into(src, h, slot, row, chan);
        }
        true
    }

    /// Value head `h` of the 32 positions of block `b` as f32 `[BLOCK_TOKENS][dv]` into `tile`
    /// (`dv`: head_dim_v); false if the block is not held.
    pub fn value_tile(&self, h: usize, b: usize, tile: &mut [f32], dv: usize) -> bool {
        let Some(at) = self.block(b) else { return false };
        let base = at + BLOCK_TOKENS * self.k_row + h * self.v_head;
        let k = kernels();
        for (slot, row) in tile[..BLOCK_TOKENS * dv].chunks_exact_mut(dv).enumerate() {
            let at = base + slot * self.v_row;
            k.dequant(self.v_type, &self.bytes[at..at + self.v_head], row);
        }
        true
    }

    /// Key head `h` at `pos` as f32, or `None` if not held. Allocates; for tests and inspection.
    pub fn key(&self, pos: usize, h: usize) -> Option<Vec<f32>> {
        let src = self.key_block(pos / BLOCK_TOKENS);
        let mut tmp = vec![0.0; key_scratch_floats(self.head_dim)];
        let (row, chan) = tmp.split_at_mut(self.head_dim);
        self.load_channels(src, h, chan);
        self.key_into(src, h, pos % BLOCK_TOKENS, row, chan).then(|| row.to_vec())
    }

    /// Value bytes of head `h` at `pos` (`None`: not held).
    #[inline]
    pub fn value(&self, pos: usize, h: usize) -> Option<&'a [u8]> {
        let at = self.block(pos / BLOCK_TOKENS)?
            + BLOCK_TOKENS * self.k_row
            + (pos % BLOCK_TOKENS) * self.v_row
            + h * self.v_head;
        Some(&self.bytes[at..at + self.v_head])
    }
}
