//! Paged KV cache: blocks of [`BLOCK_TOKENS`] tokens × one layer's KV heads, taken from one
//! [`BlockPool`] shared by every sequence; each sequence keeps a block table per layer.
//!
//! Cost: one table entry (4 bytes) per 32 positions per layer; blocks are committed only when a
//! token is written to them. Keys and values are stored separately in f16, q8 or q4
//! ([`KvType`]). Quantized keys and values are Hadamard-rotated per head first ([`rotate`]; q is
//! rotated with k, the attention output back), unless `--kv-rotate` or the architecture says
//! otherwise; the prefix cache keys on the rotation. Quantized keys are stored per channel over each 32-token block
//! (KIVI, see [`format`]): the block a sequence is filling keeps its keys in f16 (32 tokens ×
//! one layer's KV heads, per layer per sequence) and is quantized when its last token arrives. A sliding window (the model's own, per layer, or `--window` + `--sinks`)
//! frees blocks that no future query can see; blocks shared after [`KvCache::seq_fork`] or
//! taken from the [`prefix`] cache ([`KvCache::prefix_adopt`]) are copied on write.

mod chain;
pub mod disk;
pub mod format;
pub mod pool;
pub mod prefix;
mod restore;
pub mod rotate;
mod view;

use half::f16;
use half::slice::HalfFloatSliceExt;

use crate::config::ModelConfig;
use crate::params::ContextParams;
pub use crate::params::{KvRotate, KvType, ParseKvTypeError};
use crate::ModelError;
pub use format::kernels;
use pool::{BlockId, BlockPool, NO_BLOCK};
use prefix::PrefixCache;
pub use view::{key_scratch_floats, LayerView};

/// Identifies one sequence (one conversation) in a [`crate::Context`].
pub type SeqId = usize;

pub use chain::BLOCK_TOKENS;

/// Positions past a sliding window that a sequence keeps anyway, so that a speculative pass
/// (a decode token and up to this many drafted ones) can be truncated back without losing keys
/// the next query still sees: eviction runs this far behind the newest position.
pub const ROLLBACK_TOKENS: usize = 16;
const _: () = assert!(BLOCK_TOKENS == format::KEY_BLOCK_TOKENS);

/// `SeqKv::tail` of a layer with no block being filled.
const NO_TAIL: usize = usize::MAX;

/// KV bytes one token takes in one layer: every KV head's keys and values, block scales
/// included.
pub fn kv_row_bytes(cfg: &ModelConfig, k: KvType, v: KvType) -> usize {
    cfg.n_head_kv * (k.k_head_bytes(cfg.head_dim) + v.v_head_bytes(cfg.head_dim_v))
}

/// Bytes of one KV block (one page of the pool): [`BLOCK_TOKENS`] tokens of one layer.
pub fn block_bytes(cfg: &ModelConfig, k: KvType, v: KvType) -> usize {
    BLOCK_TOKENS * kv_row_bytes(cfg, k, v)
}

/// KV bytes one token takes across all layers (keys and values, block scales included): what
/// the cache really uses per position held. Layers with a sliding window hold at most
/// [`layer_peak_positions`].
pub fn kv_bytes_per_token(cfg: &ModelConfig, k: KvType, v: KvType) -> usize {
    cfg.n_layer * kv_row_bytes(cfg, k, v)
}

/// Positions, in whole blocks, that one layer of one sequence holds at its peak in a context of
/// `n_ctx` computed `n_ubatch` tokens at a time: every position, or for a sliding-window layer
/// its window, the [`ROLLBACK_TOKENS`] kept past it, the micro-batch being computed and one
/// partly filled edge block (blocks a window frees are reused before fresh ones are taken).
pub fn layer_peak_positions(window: Option<usize>, n_ctx: usize, n_ubatch: usize) -> usize {
    let span = |w: usize| {
        w.saturating_add(ROLLBACK_TOKENS)
            .saturating_add(n_ubatch.max(1))
            .saturating_add(BLOCK_TOKENS)
    };
    let pos = window.map_or(n_ctx, |w| span(w).min(n_ctx));
    pos.div_ceil(BLOCK_TOKENS).saturating_mul(BLOCK_TOKENS)
}

/// Bytes of f16 keys one sequence keeps outside the pool for the blocks being filled (quantized
/// keys only): 32 tokens × one layer's key heads, per layer.
pub fn kv_staged_bytes(cfg: &ModelConfig, k: KvType) -> usize {
    if k.k_per_channel() {
        cfg.n_layer * BLOCK_TOKENS * cfg.n_head_kv * cfg.head_dim * 2
    } else {
        0
    }
}

#[derive(Clone)]
struct SeqKv {
    /// [n_layer][pos / BLOCK_TOKENS] block ids (`NO_BLOCK`: never written or freed).
    tables: Vec<Vec<BlockId>>,
    /// [n_layer] blocks below this index (past the sinks) are known to be freed.
    freed_to: Vec<usize>,
    /// Number of positions stored (one past the highest position written).
    len: usize,
    /// Some block was freed by a window: positions before the window are gone for good.
    evicted: bool,
    /// [n_layer] block whose per-channel keys are being filled, in `staged` (`NO_TAIL`: none).
    /// Every other block held has its keys encoded in the pool.
    tail: Vec<usize>,
    /// [n_layer][BLOCK_TOKENS][n_head_kv × head_dim] f16 keys of each layer's `tail` block
    /// (empty unless keys are per channel).
    staged: Vec<f16>,
    /// Leading full blocks offered to the prefix cache, and the chain key of the last of them.
    registered: usize,
    chain: u64,
    /// The prefix-cache salt of the sequence's adapter set (0: none), where its chain starts.
    salt: u64,
}

impl SeqKv {
    /// An empty sequence; `staged_layer`: f16 keys staged per layer (0 unless per channel).
    fn new(n_layer: usize, staged_layer: usize) -> SeqKv {
        SeqKv {
            tables: vec![Vec::new(); n_layer],
            freed_to: vec![0; n_layer],
            len: 0,
            evicted: false,
            tail: vec![NO_TAIL; n_layer],
            staged: vec![f16::ZERO; n_layer * staged_layer],
            registered: 0,
            chain: 0,
            salt: 0,
        }
    }
}

/// What the pool's blocks are doing: `used + free + cached` is the pool's capacity.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlockStats {
    /// Held by at least one sequence (shared ones counted once).
    pub used: usize,
    /// Held by nobody.
    pub free: usize,
    /// Held by the prefix cache alone: kept for reuse, evicted when blocks are needed.
    pub cached: usize,
}

/// Which positions a layer's queries see: all, or the first `sinks` plus the last `window`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayerWindow {
    pub window: Option<usize>,
    pub sinks: usize,
}

impl LayerWindow {
    /// Key ranges a query at `pos` attends to: `[0, a)` (sinks) and `[b, pos]`.
    #[inline]
    pub fn ranges(&self, pos: usize) -> (std::ops::Range<usize>, std::ops::RangeInclusive<usize>) {
        let lo = self.window.map_or(0, |w| (pos + 1).saturating_sub(w));
        (0..self.sinks.min(lo), lo..=pos)
    }
}

pub struct KvCache {
    n_layer: usize,
    n_ctx: usize,
    n_head_kv: usize,
    head_dim: usize,
    head_dim_v: usize,
    pub k_type: KvType,
    pub v_type: KvType,
    /// Bytes of one token's value head; of one token's key head (per-token keys) or of one
    /// head's 32-token key block (per-channel keys).
    k_head: usize,
    v_head: usize,
    /// Bytes of one token's keys / values in one layer (block scales included): a block holds
    /// `BLOCK_TOKENS × k_row` bytes of keys, then `BLOCK_TOKENS × v_row` of values.
    k_row: usize,
    v_row: usize,
    /// [n_layer]
    windows: Vec<LayerWindow>,
    /// A user window lets positions run past `n_ctx` (context shift).
    unbounded: bool,
    /// Keys (and so queries) / values are stored Hadamard-rotated per head in blocks of this
    /// many channels ([`rotate::block_for`]); `None`: stored as computed.
    rot_k: Option<usize>,
    rot_v: Option<usize>,
    /// Block layout: keys (`[BLOCK_TOKENS][n_head_kv][k_head]` per token, or
    /// `[n_head_kv][k_head]` per-channel blocks), then `[BLOCK_TOKENS][n_head_kv][v_head]` values.
    pool: BlockPool,
    /// Full blocks kept for sequences that start with the same tokens.
    prefix: PrefixCache,
    seqs: Vec<Option<SeqKv>>,
    /// [n_seq] the disk restore in flight for each sequence ([`restore`]).
    restores: Vec<Option<disk::Pending>>,
    /// [max(head_dim, head_dim_v)] rotation scratch.
    tmp: Vec<f32>,
}

impl KvCache {
    pub fn new(cfg: &ModelConfig, p: &ContextParams) -> KvCache {
        let (k_type, v_type) = (p.kv_k, p.kv_v);
        let (hd, hdv, nh) = (cfg.head_dim, cfg.head_dim_v, cfg.n_head_kv);
        let rot = p
            .kv_rotate
            .unwrap_or_else(|| KvRotate::default_for(cfg.spec.kv_rotate, k_type, v_type));
        let user = p.kv_window.filter(|&w| w > 0);
        let windows: Vec<LayerWindow> = cfg
            .layers
            .iter()
            .map(|l| match (l.window, user) {
                (Some(w), _) => LayerWindow { window: Some(w), sinks: 0 },
                (None, Some(w)) => LayerWindow { window: Some(w), sinks: p.kv_sinks },
                (None, None) => LayerWindow { window: None, sinks: 0 },
            })
            .collect();
        let k_head = if k_type.k_per_channel() {
            format::key_block_bytes(k_type, hd)
        } else {
            k_type.k_head_bytes(hd)
        };
        let v_head = v_type.v_head_bytes(hdv);
        let (k_row, v_row) = (nh * k_type.k_head_bytes(hd), nh * v_head);
        let block_bytes = block_bytes(cfg, k_type, v_type);
        debug_assert_eq!(block_bytes, BLOCK_TOKENS * (k_row + v_row));
        // Positions one layer of one sequence can hold at once: a window's span plus the ubatch
        // being computed, two partly-filled edge blocks, and one copy-on-write block.
        let ub = p.n_ubatch.max(1);
        let span = |w: &LayerWindow| match w.window {
            Some(win) if user.is_some() => win + ROLLBACK_TOKENS + ub + w.sinks,
            Some(win) => (win + ROLLBACK_TOKENS + ub).min(p.n_ctx),
            None => p.n_ctx,
        };
        let per_seq: usize = windows.iter().map(|w| span(w).div_ceil(BLOCK_TOKENS) + 3).sum();
        let capacity = per_seq * p.n_seq_max.max(1);
        let pool = BlockPool::new(block_bytes, capacity, 2 * cfg.n_layer);
        let prefix = PrefixCache::new(windows.iter().all(|w| w.window.is_none()));
        KvCache {
            n_layer: cfg.n_layer,
            n_ctx: p.n_ctx,
            n_head_kv: nh,
            head_dim: hd,
            head_dim_v: hdv,
            k_type,
            v_type,
            k_head,
            v_head,
            k_row,
            v_row,
            windows,
            unbounded: user.is_some(),
            rot_k: rot.k.then(|| rotate::block_for(hd)).flatten(),
            rot_v: rot.v.then(|| rotate::block_for(hdv)).flatten(),
            pool,
            prefix,
            seqs: (0..p.n_seq_max).map(|_| None).collect(),
            restores: (0..p.n_seq_max).map(|_| None).collect(),
            tmp: vec![0.0; key_scratch_floats(hd).max(hdv)],
        }
    }

    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    pub fn n_seq_max(&self) -> usize {
        self.seqs.len()
    }

    /// Bytes of cache one token takes across all layers (keys and values, scales included).
    pub fn bytes_per_token(&self) -> usize {
        self.n_layer * (self.k_row + self.v_row)
    }

    /// Bytes of blocks currently held by sequences or the prefix cache.
    pub fn bytes_used(&self) -> usize {
        self.pool.n_used() * self.pool.block_bytes()
    }

    /// Bytes of f16 keys held outside the pool for blocks being filled (per-channel keys).
    pub fn bytes_staged(&self) -> usize {
        self.seqs.iter().flatten().map(|s| 2 * s.staged.len()).sum()
    }

    /// Bytes of blocks whose pages may be resident (in use, or free but kept warm).
    pub fn bytes_committed(&self) -> usize {
        self.pool.n_committed() * self.pool.block_bytes()
    }

    pub fn layer_window(&self, il: usize) -> LayerWindow {
        self.windows[il]
    }

    /// Drafted tokens a speculative pass may write after a decode token at `pos` and still be
    /// truncated back exactly to any position past `pos`: [`ROLLBACK_TOKENS`] (what a window
    /// keeps behind), and with per-channel keys no more than stay inside the block `pos + 1`
    /// falls in, since a block quantized at its last token and then cut would be staged again
    /// from its 4-bit keys.
    pub fn draft_room(&self, pos: usize) -> usize {
        if self.k_type.k_per_channel() {
            ROLLBACK_TOKENS.min(BLOCK_TOKENS - 1 - (pos + 1) % BLOCK_TOKENS)
        } else {
            ROLLBACK_TOKENS
        }
    }

    /// True when a window lets positions grow past `n_ctx` (generation with context shift).
    pub fn unbounded(&self) -> bool {
        self.unbounded
    }

    /// The rotation block of keys, and so of queries, when keys are stored rotated: the
    /// forward pass rotates q and k with [`rotate::rotate`] before [`KvCache::write`].
    pub fn rot_k(&self) -> Option<usize> {
        self.rot_k
    }

    /// The rotation block of values when they are stored rotated: attention rotates its output
    /// back.
    pub fn rot_v(&self) -> Option<usize> {
        self.rot_v
    }

    /// The prefix-cache chain seed of a sequence under adapter salt `salt`: the salt itself
    /// for an unrotated cache, mixed with the rotation blocks otherwise, so that rotated blocks
    /// are never found under an unrotated key (or one rotated another way).
    pub fn prefix_salt(&self, salt: u64) -> u64 {
        match (self.rot_k, self.rot_v) {
            (None, None) => salt,
            (k, v) => {
                let tag = |b: Option<usize>| b.map_or(0, |b| b as u32);
                prefix::chain_key(salt, &[0x4b56_524f, tag(k), tag(v)])
            }
        }
    }

    /// Checks that `pos` can be stored for `seq` (called before a batch runs, so a bad batch
    /// changes nothing).
    pub fn check(&self, seq: SeqId, pos: usize) -> Result<(), ModelError> {
        if seq >= self.seqs.len() {
            return Err(ModelError::BadSeq { seq, n_seq_max: self.seqs.len() });
        }
        if pos >= self.n_ctx && !self.unbounded {
            return Err(ModelError::ContextFull { pos, n_ctx: self.n_ctx });
        }
        Ok(())
    }

    /// Stores one token's keys and values (`[n_head_kv × head_dim]` f32, roped) for layer `il`.
    pub fn write(
        &mut self,
        seq: SeqId,
        il: usize,
        pos: usize,
        k: &[f32],
        v: &[f32],
    ) -> Result<(), ModelError> {
        self.check(seq, pos)?;
        let (nh, hd, hdv) = (self.n_head_kv, self.head_dim, self.head_dim_v);
        let per_channel = self.k_type.k_per_channel();
        // f16 keys of one layer's block being filled.
        let staged_layer = if per_channel { BLOCK_TOKENS * nh * hd } else { 0 };
        let n_layer = self.n_layer;
        let s = self.seqs[seq].get_or_insert_with(|| SeqKv::new(n_layer, staged_layer));
        let (b, slot) = (pos / BLOCK_TOKENS, pos % BLOCK_TOKENS);
        let staged = &mut s.staged[il * staged_layer..(il + 1) * staged_layer];
        if per_channel && s.tail[il] != b {
            // A block other than the one being filled (the next one, or one reopened after a
            // truncation): encode the old tail, stage the keys already held in the new one.
            if s.tail[il] != NO_TAIL {
                flush_tail(
                    &mut self.pool,
                    &mut self.prefix,
                    &mut s.tables[il],
                    s.tail[il],
                    staged,
                    self.k_type,
                    nh,
                    hd,
                )?;
            }
            s.tail[il] = b;
            stage_block(&self.pool, &s.tables[il], b, staged, self.k_type, nh, hd, &mut self.tmp);
        }
        let id = own_block(&mut self.pool, &mut self.prefix, &mut s.tables[il], b)?;
        s.len = s.len.max(pos + 1);
        let (k_row, v_row, k_head, v_head) = (self.k_row, self.v_row, self.k_head, self.v_head);
        let block = self.pool.block_mut(id);
        let (kb, vb) = block.split_at_mut(BLOCK_TOKENS * k_row);
        let vrow = &mut vb[slot * v_row..(slot + 1) * v_row];
        for h in 0..nh {
            let dst = &mut vrow[h * v_head..(h + 1) * v_head];
            encode_head_rotated(
                self.v_type,
                self.rot_v,
                &v[h * hdv..(h + 1) * hdv],
                dst,
                &mut self.tmp,
            );
        }
        if !per_channel {
            let krow = &mut kb[slot * k_row..(slot + 1) * k_row];
            for (h, dst) in krow.chunks_exact_mut(k_head).enumerate() {
                format::encode_head(self.k_type, &k[h * hd..(h + 1) * hd], dst, false);
            }
            return Ok(());
        }
        staged[slot * nh * hd..(slot + 1) * nh * hd].convert_from_f32_slice(&k[..nh * hd]);
        if slot == BLOCK_TOKENS - 1 {
            let (pool, prefix) = (&mut self.pool, &mut self.prefix);
            flush_tail(pool, prefix, &mut s.tables[il], b, staged, self.k_type, nh, hd)?;
            s.tail[il] = NO_TAIL;
        }
        Ok(())
    }

    /// Frees layer `il`'s blocks of `seq` that no query at a position after `pos` can see
    /// (outside the window, past the sinks). Call after attention has run for `pos`.
    pub fn evict(&mut self, seq: SeqId, il: usize, pos: usize) {
        let w = self.windows[il];
        let Some(win) = w.window else { return };
        let Some(Some(s)) = self.seqs.get_mut(seq) else {
            return;
        };
        // Queries after `pos` start at `pos + 2 - win`: every position below is dead, but the
        // last ROLLBACK_TOKENS of them stay for a truncation back to `pos - ROLLBACK_TOKENS`.
        let first_live = (pos + 2).saturating_sub(win + ROLLBACK_TOKENS);
        let sink_blocks = w.sinks.div_ceil(BLOCK_TOKENS);
        let end = (first_live / BLOCK_TOKENS).min(s.tables[il].len());
        let start = s.freed_to[il].max(sink_blocks);
        if (start..end).contains(&s.tail[il]) {
            s.tail[il] = NO_TAIL;
        }
        for b in start..end {
            let id = std::mem::replace(&mut s.tables[il][b], NO_BLOCK);
            if id != NO_BLOCK {
                self.pool.release(id);
                s.evicted = true;
            }
        }
        s.freed_to[il] = s.freed_to[il].max(end);
    }

    /// Read access to one layer of one sequence, for attention.
    pub fn layer(&self, seq: SeqId, il: usize) -> Option<LayerView<'_>> {
        let s = self.seqs.get(seq)?.as_ref()?;
        let staged_len = s.staged.len() / self.n_layer;
        Some(LayerView {
            bytes: self.pool.bytes(),
            table: &s.tables[il],
            block_bytes: self.pool.block_bytes(),
            k_type: self.k_type,
            v_type: self.v_type,
            n_head_kv: self.n_head_kv,
            head_dim: self.head_dim,
            k_row: self.k_row,
            v_row: self.v_row,
            k_head: self.k_head,
            v_head: self.v_head,
            tail: s.tail[il],
            staged: &s.staged[il * staged_len..(il + 1) * staged_len],
        })
    }

    /// Keys of `seq`, layer `il`, position `pos` as f32 `[n_head_kv × head_dim]`, or `None` if
    /// the position is not held. For tests and inspection.
    pub fn read_keys(&self, seq: SeqId, il: usize, pos: usize) -> Option<Vec<f32>> {
        let view = self.layer(seq, il)?;
        let mut out = Vec::with_capacity(self.n_head_kv * self.head_dim);
        for h in 0..self.n_head_kv {
            out.extend_from_slice(&view.key(pos, h)?);
        }
        Some(out)
    }

    pub fn seq_len(&self, seq: SeqId) -> usize {
        self.seqs.get(seq).and_then(|s| s.as_ref()).map_or(0, |s| s.len)
    }

    /// True if a window freed positions of `seq`: it cannot be truncated back before them.
    pub fn seq_evicted(&self, seq: SeqId) -> bool {
        self.seqs.get(seq).and_then(|s| s.as_ref()).is_some_and(|s| s.evicted)
    }

    /// Forgets positions `>= len` of `seq` (e.g. to re-run from a shared prefix); blocks wholly
    /// past `len` go back to the pool.
    pub fn seq_truncate(&mut self, seq: SeqId, len: usize) {
        let Some(Some(s)) = self.seqs.get_mut(seq) else {
            return;
        };
        s.len = s.len.min(len);
        if s.registered * BLOCK_TOKENS > len {
            // Offered again from the start (the chain key of a shorter prefix is not kept).
            s.registered = 0;
            s.chain = s.salt;
        }
        let keep = len.div_ceil(BLOCK_TOKENS);
        // A block being filled past the cut is dropped; one cut in the middle is staged again by
        // the next write into it (its kept keys then go through 4 bits twice).
        for tail in &mut s.tail {
            if *tail != NO_TAIL && *tail >= keep {
                *tail = NO_TAIL;
            }
        }
        for table in &mut s.tables {
            for id in table.drain(keep.min(table.len())..) {
                if id != NO_BLOCK {
                    self.pool.release(id);
                }
            }
        }
    }

    /// Drops a sequence (cancelling its restore from disk) and returns its blocks.
    pub fn seq_clear(&mut self, seq: SeqId) {
        if let Some(r) = self.restores.get_mut(seq) {
            *r = None;
        }
        if let Some(slot) = self.seqs.get_mut(seq) {
            if let Some(s) = slot.take() {
                for id in s.tables.into_iter().flatten() {
                    if id != NO_BLOCK {
                        self.pool.release(id);
                    }
                }
            }
        }
    }

    /// Makes `dst` a copy of `src` that shares its blocks (copied on the first write): the base
    /// of prompt caching. Costs one table copy, no KV bytes.
    pub fn seq_fork(&mut self, src: SeqId, dst: SeqId) -> Result<(), ModelError> {
        let n = self.seqs.len();
        if src >= n || dst >= n {
            return Err(ModelError::BadSeq { seq: src.max(dst), n_seq_max: n });
        }
        if src == dst {
            return Ok(());
        }
        self.seq_clear(dst);
        let Some(s) = &self.seqs[src] else {
            return Ok(());
        };
        let copy = s.clone();
        for &id in copy.tables.iter().flatten() {
            if id != NO_BLOCK {
                self.pool.retain(id);
            }
        }
        self.seqs[dst] = Some(copy);
        Ok(())
    }

    /// True when full blocks are shared through the prefix cache (no layer has a window).
    pub fn prefix_enabled(&self) -> bool {
        self.prefix.on
    }

    /// Attaches a disk tier under the prefix cache ([`disk`]) in `cfg.dir`, counting into
    /// `stats`. Its keys carry `cfg.identity` (the model file), the KV precisions, the rotation
    /// and the block layout, so a block is found only by a cache that would compute the same
    /// bytes. Nothing is attached (and `Ok`) when the prefix cache is off (windowed layers).
    pub fn attach_disk(
        &mut self,
        cfg: &disk::DiskConfig,
        stats: std::sync::Arc<disk::DiskStats>,
    ) -> std::io::Result<()> {
        if !self.prefix.on {
            return Ok(());
        }
        let tag = |b: Option<usize>| b.map_or(0, |b| b as u32);
        let kv = |t: KvType| KvType::ALL.iter().position(|&a| a == t).unwrap_or(9) as u32;
        let layout = [
            disk::store::VERSION,
            format::ENCODING,
            kv(self.k_type),
            kv(self.v_type),
            tag(self.rot_k),
            tag(self.rot_v),
            self.n_layer as u32,
            self.pool.block_bytes() as u32,
            self.n_head_kv as u32,
            self.head_dim as u32,
            self.head_dim_v as u32,
        ];
        let salt = prefix::chain_key(cfg.identity, &layout);
        let tier = disk::DiskTier::open(cfg, salt, self.n_layer, self.pool.block_bytes(), stats)?;
        self.prefix.disk = Some(tier);
        Ok(())
    }

    /// Offers the cached blocks not on disk yet to the disk tier (when its queue is empty; see
    /// `PrefixCache::spill_all`): for an idle moment, and before a shutdown.
    pub fn prefix_spill(&mut self) {
        self.prefix.spill_all(&self.pool);
    }

    /// Waits until the disk tier has written every block queued, at most `timeout`; true if
    /// none is left (or there is no tier).
    pub fn prefix_disk_flush(&self, timeout: std::time::Duration) -> bool {
        self.prefix.disk.as_ref().is_none_or(|d| d.flush(timeout))
    }

    /// Offers `seq`'s full blocks not yet offered to the prefix cache, under `salt` (its
    /// adapter set's, as for [`KvCache::prefix_adopt`]); `tokens` are the tokens at its
    /// positions (at least its length of them).
    pub fn prefix_register(&mut self, seq: SeqId, tokens: &[u32], salt: u64) {
        let salt = self.prefix_salt(salt);
        let Some(Some(s)) = self.seqs.get_mut(seq) else {
            return;
        };
        if !self.prefix.on || s.evicted {
            return;
        }
        if s.salt != salt {
            // Another adapter set than the one its blocks were offered under: start over.
            s.salt = salt;
            s.registered = 0;
            s.chain = salt;
        }
        let full = s.len.min(tokens.len()) / BLOCK_TOKENS;
        let mut blocks = Vec::with_capacity(self.n_layer);
        while s.registered < full {
            let b = s.registered;
            blocks.clear();
            for (table, &tail) in s.tables.iter().zip(&s.tail) {
                match table.get(b) {
                    Some(&id) if id != NO_BLOCK && tail != b => blocks.push(id),
                    // Not whole in the pool yet: offered at a later call.
                    _ => return,
                }
            }
            let block = &tokens[b * BLOCK_TOKENS..(b + 1) * BLOCK_TOKENS];
            self.prefix.insert(&mut self.pool, s.salt, s.chain, block, &blocks);
            s.chain = prefix::chain_key(s.chain, block);
            s.registered += 1;
        }
    }

    /// Drops the whole prefix cache (memory pressure); returns the blocks that went back to
    /// the pool.
    pub fn prefix_clear(&mut self) -> usize {
        self.prefix.clear(&mut self.pool)
    }

    /// The page pool this cache shares with the adapter store
    /// (`lora::AdapterStore::with_pool`), made on the first call: pages of one KV block, as
    /// many as the cache's blocks plus `adapter_bytes` (the plan's adapter share) rounded down
    /// to whole pages. Every block held is charged to it from then on.
    pub fn share_pool(&mut self, adapter_bytes: usize) -> std::sync::Arc<pool::PagePool> {
        if let Some(shared) = self.pool.shared() {
            return std::sync::Arc::clone(shared);
        }
        let page = self.pool.block_bytes();
        let shared = pool::PagePool::new(page, self.pool.capacity(), adapter_bytes / page.max(1));
        // A fresh pool has room for every block the cache can hold.
        let attached = self.attach_pool(std::sync::Arc::clone(&shared));
        debug_assert!(attached.is_ok(), "{attached:?}");
        shared
    }

    /// Charges this cache's blocks to `shared`, whose pages must be [`KvCache::block_bytes`]
    /// (a pool the caller sized, e.g. smaller than the cache's own capacity).
    pub fn attach_pool(
        &mut self,
        shared: std::sync::Arc<pool::PagePool>,
    ) -> Result<(), ModelError> {
        if shared.page_bytes() != self.pool.block_bytes() {
            return Err(ModelError::Unsupported(format!(
                "the pool's pages are {} bytes, the KV cache's blocks {}",
                shared.page_bytes(),
                self.pool.block_bytes()
            )));
        }
        self.pool.attach(shared).map_err(|e| ModelError::Unsupported(e.to_string()))
    }

    /// Bytes of one block: one layer's keys and values of [`BLOCK_TOKENS`] tokens.
    pub fn block_bytes(&self) -> usize {
        self.pool.block_bytes()
    }

    /// Blocks used by sequences, free, and held by the prefix cache alone.
    pub fn block_stats(&self) -> BlockStats {
        let cached = self.prefix.n_cached_only(&self.pool);
        if let Some(shared) = self.pool.shared() {
            shared.set_prefix_cached(cached);
        }
        let held = self.pool.n_used();
        BlockStats { used: held - cached, free: self.pool.capacity() - held, cached }
    }
}

/// Encodes one head, Hadamard-rotated first in blocks of `rot` (`tmp`: scratch of ≥ `x.len()`).
fn encode_head_rotated(ty: KvType, rot: Option<usize>, x: &[f32], dst: &mut [u8], tmp: &mut [f32]) {
    if let Some(block) = rot {
        let t = &mut tmp[..x.len()];
        t.copy_from_slice(x);
        rotate::rotate(t, block);
        format::encode_head(ty, t, dst, true);
    } else {
        format::encode_head(ty, x, dst, false);
    }
}

/// The block at `table[b]`, owned by this table alone: allocated if absent, copied if shared
/// (with another sequence or the prefix cache).
fn own_block(
    pool: &mut BlockPool,
    prefix: &mut PrefixCache,
    table: &mut Vec<BlockId>,
    b: usize,
) -> Result<BlockId, ModelError> {
    if table.len() <= b {
        table.resize(b + 1, NO_BLOCK);
    }
    let id = match table[b] {
        NO_BLOCK => prefix::alloc(pool, prefix)?,
        id if pool.refs(id) > 1 => {
            let new = prefix::alloc(pool, prefix)?;
            pool.copy(id, new);
            pool.release(id);
            new
        }
        id => id,
    };
    table[b] = id;
    Ok(id)
}

/// Encodes the staged f16 keys (`[BLOCK_TOKENS][n_head_kv × head_dim]`) of block `b` into its
/// per-channel key region (`[n_head_kv][key_block_bytes]`).
#[allow(clippy::too_many_arguments)]
fn flush_tail(
    pool: &mut BlockPool,
    prefix: &mut PrefixCache,
    table: &mut Vec<BlockId>,
    b: usize,
    staged: &[f16],
    ty: KvType,
    nh: usize,
    hd: usize,
) -> Result<(), ModelError> {
    let id = own_block(pool, prefix, table, b)?;
    let k_head = format::key_block_bytes(ty, hd);
    let keys = &mut pool.block_mut(id)[..nh * k_head];
    for (h, dst) in keys.chunks_exact_mut(k_head).enumerate() {
        format::encode_key_block(ty, &staged[h * hd..], nh * hd, hd, dst);
    }
    Ok(())
}

/// Stages block `b`'s per-channel keys as f16 (zeros if the block is not held).
/// `tmp`: [`key_scratch_floats`] floats.
#[allow(clippy::too_many_arguments)]
fn stage_block(
    pool: &BlockPool,
    table: &[BlockId],
    b: usize,
    staged: &mut [f16],
    ty: KvType,
    nh: usize,
    hd: usize,
    tmp: &mut [f32],
) {
    let Some(&id) = table.get(b).filter(|&&id| id != NO_BLOCK) else {
        staged.fill(f16::ZERO);
        return;
    };
    let k_head = format::key_block_bytes(ty, hd);
    let keys = &pool.block(id)[..nh * k_head];
    let (row, chan) = tmp.split_at_mut(hd);
    for (h, block) in keys.chunks_exact(k_head).enumerate() {
        format::dequant_f16(&block[..4 * hd], &mut chan[..2 * hd]);
        for slot in 0..BLOCK_TOKENS {
            format::key_block_row(kernels(), ty, block, hd, slot, chan, &mut row[..hd]);
            staged[(slot * nh + h) * hd..(slot * nh + h + 1) * hd]
                .convert_from_f32_slice(&row[..hd]);
        }
    }
}
