//! KV cache: f16 keys and values for several sequences at once.
//!
//! Layout per sequence and layer: `[n_ctx][n_head_kv × head_dim]` f16, slot = position. The
//! buffers are zero-initialised with `calloc`-backed vectors, so untouched slots cost no RSS.
//! Attention reads keys and values through [`KvCache::keys`] / [`KvCache::values`] row ranges,
//! which is the seam where the paged block cache replaces this flat layout.

use half::f16;

use crate::ModelError;

/// Identifies one sequence (one conversation) in a [`crate::Context`].
pub type SeqId = usize;

struct SeqKv {
    /// [n_layer][n_ctx][kv_dim]
    k: Vec<f16>,
    /// [n_layer][n_ctx][kv_dim]
    v: Vec<f16>,
    /// Number of positions stored (one past the highest position written).
    len: usize,
}

pub struct KvCache {
    n_layer: usize,
    n_ctx: usize,
    kv_dim: usize,
    seqs: Vec<Option<SeqKv>>,
}

impl KvCache {
    pub fn new(n_layer: usize, n_ctx: usize, kv_dim: usize, n_seq_max: usize) -> KvCache {
        KvCache { n_layer, n_ctx, kv_dim, seqs: (0..n_seq_max).map(|_| None).collect() }
    }

    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    pub fn n_seq_max(&self) -> usize {
        self.seqs.len()
    }

    /// Bytes of cache one token takes across all layers (keys and values).
    pub fn bytes_per_token(&self) -> usize {
        2 * self.n_layer * self.kv_dim * std::mem::size_of::<f16>()
    }

    fn seq_mut(&mut self, seq: SeqId) -> Result<&mut SeqKv, ModelError> {
        let (n_layer, n_ctx, kv_dim) = (self.n_layer, self.n_ctx, self.kv_dim);
        let slot = self.seqs.get_mut(seq).ok_or(ModelError::BadSeq { seq, n_seq_max: 0 })?;
        Ok(slot.get_or_insert_with(|| SeqKv {
            k: vec![f16::ZERO; n_layer * n_ctx * kv_dim],
            v: vec![f16::ZERO; n_layer * n_ctx * kv_dim],
            len: 0,
        }))
    }

    /// Checks that `pos` can be stored for `seq` (called before a batch runs, so a bad batch
    /// changes nothing).
    pub fn check(&self, seq: SeqId, pos: usize) -> Result<(), ModelError> {
        if seq >= self.seqs.len() {
            return Err(ModelError::BadSeq { seq, n_seq_max: self.seqs.len() });
        }
        if pos >= self.n_ctx {
            return Err(ModelError::ContextFull { pos, n_ctx: self.n_ctx });
        }
        Ok(())
    }

    /// Stores one token's keys and values (f32 → f16) for layer `il`.
    pub fn write(&mut self, seq: SeqId, il: usize, pos: usize, k: &[f32], v: &[f32]) -> Result<(), ModelError> {
        self.check(seq, pos)?;
        let (n_ctx, kv_dim) = (self.n_ctx, self.kv_dim);
        let s = self.seq_mut(seq)?;
        let at = (il * n_ctx + pos) * kv_dim;
        for (d, &x) in s.k[at..at + kv_dim].iter_mut().zip(k) {
            *d = f16::from_f32(x);
        }
        for (d, &x) in s.v[at..at + kv_dim].iter_mut().zip(v) {
            *d = f16::from_f32(x);
        }
        s.len = s.len.max(pos + 1);
        Ok(())
    }

    /// Keys of layer `il` for positions `0..len` of `seq`: `[len][kv_dim]`.
    pub fn keys(&self, seq: SeqId, il: usize) -> &[f16] {
        self.rows(seq, il, |s| &s.k)
    }

    /// Values of layer `il` for positions `0..len` of `seq`: `[len][kv_dim]`.
    pub fn values(&self, seq: SeqId, il: usize) -> &[f16] {
        self.rows(seq, il, |s| &s.v)
    }

    fn rows(&self, seq: SeqId, il: usize, pick: impl Fn(&SeqKv) -> &Vec<f16>) -> &[f16] {
        match self.seqs.get(seq).and_then(|s| s.as_ref()) {
            None => &[],
            Some(s) => {
                let at = il * self.n_ctx * self.kv_dim;
                &pick(s)[at..at + s.len * self.kv_dim]
            }
        }
    }

    pub fn seq_len(&self, seq: SeqId) -> usize {
        self.seqs.get(seq).and_then(|s| s.as_ref()).map_or(0, |s| s.len)
    }

    /// Forgets positions `>= len` of `seq` (e.g. to re-run from a shared prefix).
    pub fn seq_truncate(&mut self, seq: SeqId, len: usize) {
        if let Some(Some(s)) = self.seqs.get_mut(seq) {
            s.len = s.len.min(len);
        }
    }

    /// Drops a sequence and returns its memory.
    pub fn seq_clear(&mut self, seq: SeqId) {
        if let Some(s) = self.seqs.get_mut(seq) {
            *s = None;
        }
    }
}
