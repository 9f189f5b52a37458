//! The adapter store: every adapter a server can apply, by name, in three tiers under the pool's
//! adapter share, handed out as leases that pin them.
//!
//! API beyond the agreed one: [`AdapterStore::with_pool`] (the store on the pool the KV cache
//! shares: `let pool = ctx.kv.share_pool(budget); AdapterStore::with_pool(&cfg, pool)`; with
//! [`AdapterStore::new`] the store has a pool of its own and only the ledger's hysteresis is not
//! shared with the KV cache), [`AdapterStore::demote_idle`], [`AdapterStore::pool`], and
//! [`salt`] as a free function beside the method. Hot weights live on the heap, not in pages of
//! the KV mapping: a page of the pool is a unit of account (the KV block's size) that both
//! draw from under one capacity, so eviction, pinning and the plan's budget are shared, while
//! BGMV keeps reading contiguous `Vec<f32>` rows. Warm adapters are promoted before use (BGMV
//! has no int8 path yet).
//!
//! - **Cold**: registered. The file is mapped and every tensor was checked against the model
//!   ([`AdapterStore::register`]); no pool page is held.
//! - **Warm**: every matrix's rows in int8 with an f32 scale per row ([`WarmLora`],
//!   [`super::matrix_bytes_int8`]: a quarter of hot), pages held.
//! - **Hot**: the f32 rows BGMV reads ([`Lora`], [`super::matrix_bytes`] a matrix), pages held.
//!
//! [`AdapterStore::acquire`] promotes to hot (from warm by dequantizing, from cold by reading the
//! file) and returns an [`AdapterLease`]: a pin, counted in an atomic, so cloning and dropping
//! a lease cost one atomic operation each. The loading runs on the thread that calls `acquire`,
//! with no store-wide lock held (other adapters are acquired and released meanwhile; a second
//! request for the same adapter waits for the first load), so a server calls it off its
//! scheduler thread and the running sequences keep decoding. An adapter that no lease pins can
//! be demoted: hot → warm (quantized) → cold (pages given back); [`AdapterStore::demote_idle`]
//! does it for adapters idle longer than a given time, and the store sheds them itself when it
//! needs pages for another (least recently used first, warm ones before hot, the larger first
//! among equals). The KV cache, short of pages, calls the store's [`Evictor`], which only drops
//! (it runs on the scheduler thread: it never quantizes). A pinned adapter is never demoted, and
//! an unregistered one gives its pages back when its last lease drops.
//!
//! Pages come from a [`PagePool`] shared with the KV cache ([`AdapterStore::with_pool`]), or, for
//! a store alone, one of the budget given to [`AdapterStore::new`]. Memory safety of the weights
//! is by ownership: the hot tier is an `Arc<Lora>` that the store, each lease and each context
//! that was given it ([`crate::Context::set_adapters`]) own, so a demotion drops only the
//! store's reference and the weights live until the last user lets go.
//!
//! The prefix cache is keyed by adapter set: [`AdapterStore::salt`] names a set (each adapter's
//! registration and scale; 0 for none), and `KvCache::prefix_adopt`/`prefix_register` seed
//! their hash chain with it.
//!
//! Cost: acquiring a hot adapter locks the store's name map and the adapter's slot once
//! (uncontended, tens of ns); promotion from warm costs a pass over its int8 rows, from cold a
//! read of the file's tensors.

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use gguf::GgufFile;

use super::{check, Lora, LoraError, WarmLora};
use crate::config::ModelConfig;
use crate::kv::pool::{Content, Evictor, PagePool, PoolStats};

/// Page size of a store's own pool ([`AdapterStore::new`]).
pub const STANDALONE_PAGE_BYTES: usize = 64 << 10;

/// Where an adapter is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Tier {
    Hot,
    Warm,
    Cold,
}

/// One registered adapter, as listed.
#[derive(Clone, Debug, PartialEq)]
pub struct AdapterInfo {
    pub name: String,
    pub path: PathBuf,
    /// The largest rank of its matrices.
    pub rank: usize,
    pub alpha: f32,
    /// Bytes it takes hot ([`Lora::bytes`]).
    pub bytes_hot: usize,
    pub tier: Tier,
    /// Leases alive.
    pub leases: usize,
}

/// Counters and the pool's state, for metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StoreStats {
    pub registered: usize,
    pub hot: usize,
    pub warm: usize,
    pub cold: usize,
    /// `acquire` calls by the tier the adapter was found in (one waiting for another's load
    /// counts as cold).
    pub hits_hot: u64,
    pub hits_warm: u64,
    pub hits_cold: u64,
    /// Tier steps up (cold or warm → hot) and down (hot → warm, warm or hot → cold).
    pub promotions: u64,
    pub demotions: u64,
    /// Adapters dropped out of the pool to make room (to cold).
    pub evictions: u64,
    /// Pages by content, capacity, evicted pages, allocation-latency histogram.
    pub pool: PoolStats,
}

/// What a slot holds.
enum Held {
    Cold,
    /// A thread is promoting it; others wait on [`Slot::changed`].
    Loading,
    Warm(Arc<WarmLora>),
    Hot(Arc<Lora>),
}

impl Held {
    fn tier(&self) -> Tier {
        match self {
            Held::Cold | Held::Loading => Tier::Cold,
            Held::Warm(_) => Tier::Warm,
            Held::Hot(_) => Tier::Hot,
        }
    }
}

/// One registration.
struct Slot {
    /// Unique over the process (re-registering a name gives a new one): the prefix salt.
    id: u64,
    name: String,
    path: PathBuf,
    rank: usize,
    alpha: f32,
    bytes_hot: usize,
    /// The cold tier: the mapped, checked file.
    file: GgufFile,
    pins: AtomicUsize,
    /// Nanoseconds after `epoch` of the last acquire or last unpin.
    last_use: AtomicU64,
    epoch: Instant,
    retired: AtomicBool,
    /// The tier's data and the pool pages charged for it.
    held: Mutex<(Held, usize)>,
    changed: Condvar,
    pool: Arc<PagePool>,
}

impl Slot {
    fn lock(&self) -> MutexGuard<'_, (Held, usize)> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The slot's lock; without `wait`, `None` when another thread holds it (a load or a
    /// quantization under way), so the scheduler's thread never waits for one.
    fn lock_if(&self, wait: bool) -> Option<MutexGuard<'_, (Held, usize)>> {
        if wait {
            return Some(self.lock());
        }
        match self.held.try_lock() {
            Ok(g) => Some(g),
            Err(std::sync::TryLockError::Poisoned(e)) => Some(e.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }

    fn touch(&self) {
        self.last_use.store(self.epoch.elapsed().as_nanos() as u64, Ordering::Relaxed);
    }

    /// Gives back the pages of a retired slot no lease pins.
    fn release_if_retired(&self) {
        if !self.retired.load(Ordering::SeqCst) {
            return;
        }
        let mut g = self.lock();
        if self.pins.load(Ordering::SeqCst) == 0 && !matches!(g.0, Held::Loading) {
            self.pool.free(Content::Adapter, std::mem::take(&mut g.1));
            g.0 = Held::Cold;
        }
    }
}

#[derive(Default)]
struct Counters {
    hits: [AtomicU64; 3],
    promotions: AtomicU64,
    demotions: AtomicU64,
    evictions: AtomicU64,
}

struct Shared {
    cfg: ModelConfig,
    pool: Arc<PagePool>,
    slots: Mutex<BTreeMap<String, Arc<Slot>>>,
    counters: Counters,
    epoch: Instant,
}

/// Every adapter a server can apply (see the module doc). `Send + Sync`; share it in an `Arc`.
pub struct AdapterStore {
    shared: Arc<Shared>,
}

/// A pin on a hot adapter: while any clone lives, the store keeps it hot. Hand
/// [`AdapterLease::lora`] to [`crate::Context::set_adapters`] and keep the lease for as long as
/// the sequence runs.
pub struct AdapterLease {
    slot: Arc<Slot>,
    lora: Arc<Lora>,
}

impl AdapterLease {
    pub fn lora(&self) -> &Arc<Lora> {
        &self.lora
    }

    pub fn name(&self) -> &str {
        &self.slot.name
    }
}

impl Clone for AdapterLease {
    fn clone(&self) -> AdapterLease {
        // An existing lease keeps `pins` above 0, so no demotion can be under way.
        self.slot.pins.fetch_add(1, Ordering::Relaxed);
        AdapterLease { slot: Arc::clone(&self.slot), lora: Arc::clone(&self.lora) }
    }
}

impl Drop for AdapterLease {
    fn drop(&mut self) {
        if self.slot.pins.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.slot.touch();
            self.slot.release_if_retired();
        }
    }
}

impl std::fmt::Debug for AdapterLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdapterLease").field("name", &self.slot.name).finish()
    }
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

impl AdapterStore {
    /// A store with a pool of its own of `budget_bytes` (the adapter share the planner granted).
    pub fn new(cfg: &ModelConfig, budget_bytes: usize) -> AdapterStore {
        let pages = budget_bytes / STANDALONE_PAGE_BYTES;
        AdapterStore::with_pool(cfg, PagePool::new(STANDALONE_PAGE_BYTES, 0, pages))
    }

    /// A store taking its pages from `pool` (shared with the KV cache: `KvCache::share_pool`),
    /// at most the pool's adapter share.
    pub fn with_pool(cfg: &ModelConfig, pool: Arc<PagePool>) -> AdapterStore {
        let shared = Arc::new(Shared {
            cfg: cfg.clone(),
            pool,
            slots: Mutex::new(BTreeMap::new()),
            counters: Counters::default(),
            epoch: Instant::now(),
        });
        let weak: Weak<Shared> = Arc::downgrade(&shared);
        shared.pool.add_evictor(weak);
        AdapterStore { shared }
    }

    pub fn pool(&self) -> &Arc<PagePool> {
        &self.shared.pool
    }

    /// Adds the adapter at `path` under `name`, cold: its header and every tensor are checked
    /// against the model, nothing is loaded. A name in use is an error.
    pub fn register(&self, name: &str, path: &Path) -> Result<AdapterInfo, LoraError> {
        if self.shared.slots().contains_key(name) {
            return Err(LoraError::Duplicate(name.to_string()));
        }
        self.register_file(name, path, GgufFile::open(path)?)
    }

    /// Adds the adapter already mapped as `file` (from `path`, which is only shown, never
    /// opened again) under `name`, cold, as [`AdapterStore::register`] does.
    pub fn register_file(
        &self,
        name: &str,
        path: &Path,
        file: GgufFile,
    ) -> Result<AdapterInfo, LoraError> {
        if self.shared.slots().contains_key(name) {
            return Err(LoraError::Duplicate(name.to_string()));
        }
        let c = check(&file, &self.shared.cfg)?;
        let (rank, alpha, bytes_hot) = (c.max_rank(), c.alpha, c.bytes());
        if let Some(m) = file.mapping() {
            m.release_resident();
        }
        let pool = Arc::clone(&self.shared.pool);
        let slot = Arc::new(Slot {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            name: name.to_string(),
            path: path.to_path_buf(),
            rank,
            alpha,
            bytes_hot,
            file,
            pins: AtomicUsize::new(0),
            last_use: AtomicU64::new(0),
            epoch: self.shared.epoch,
            retired: AtomicBool::new(false),
            held: Mutex::new((Held::Cold, 0)),
            changed: Condvar::new(),
            pool,
        });
        let mut slots = self.shared.slots();
        if slots.contains_key(name) {
            return Err(LoraError::Duplicate(name.to_string()));
        }
        let info = info(&slot);
        slots.insert(name.to_string(), slot);
        Ok(info)
    }

    /// Removes `name`. Leases taken before keep working; its pages go back to the pool when the
    /// last of them drops.
    pub fn unregister(&self, name: &str) -> Result<(), LoraError> {
        let slot =
            self.shared.slots().remove(name).ok_or_else(|| LoraError::Unknown(name.into()))?;
        slot.retired.store(true, Ordering::SeqCst);
        slot.release_if_retired();
        Ok(())
    }

    /// Every registered adapter, sorted by name.
    pub fn list(&self) -> Vec<AdapterInfo> {
        self.shared.all().iter().map(|s| info(s)).collect()
    }

    /// The registered adapter `name`, hot and pinned. Blocks while it is loaded (from the warm
    /// tier or the file): call it off the scheduler thread. A full pool is an error naming what
    /// holds it.
    pub fn acquire(&self, name: &str) -> Result<AdapterLease, LoraError> {
        let slot = self
            .shared
            .slots()
            .get(name)
            .cloned()
            .ok_or_else(|| LoraError::Unknown(name.into()))?;
        let mut found = None;
        let mut g = slot.lock();
        loop {
            let from = match &g.0 {
                Held::Hot(l) => {
                    let lora = Arc::clone(l);
                    slot.pins.fetch_add(1, Ordering::SeqCst);
                    drop(g);
                    slot.touch();
                    self.shared.count_hit(found.unwrap_or(Tier::Hot));
                    return Ok(AdapterLease { slot, lora });
                }
                Held::Loading => {
                    found.get_or_insert(Tier::Cold);
                    g = slot.changed.wait(g).unwrap_or_else(|e| e.into_inner());
                    continue;
                }
                Held::Warm(w) => Some(Arc::clone(w)),
                Held::Cold => None,
            };
            found.get_or_insert(if from.is_some() { Tier::Warm } else { Tier::Cold });
            let (held_pages, back) = (g.1, std::mem::replace(&mut g.0, Held::Loading));
            drop(g);
            let loaded = self.shared.load_hot(&slot, from.as_deref(), held_pages);
            g = slot.lock();
            match loaded {
                Ok(lora) => {
                    g.0 = Held::Hot(Arc::new(lora));
                    g.1 = slot.pool.pages_for(slot.bytes_hot);
                    self.shared.counters.promotions.fetch_add(1, Ordering::Relaxed);
                    slot.changed.notify_all();
                }
                Err(e) => {
                    g.0 = back;
                    slot.changed.notify_all();
                    drop(g);
                    // Unregistered while it loaded: its warm pages go now.
                    slot.release_if_retired();
                    return Err(e);
                }
            }
        }
    }

    /// The prefix-cache salt of an adapter set: equal for the same registrations at the same
    /// scales in the same order, 0 for the empty set (the bare model).
    pub fn salt(&self, set: &[(AdapterLease, f32)]) -> u64 {
        salt(set)
    }

    /// Demotes adapters no lease pins and nobody acquired for `idle`: hot → warm, warm → cold
    /// (one step per call). Returns the adapters demoted. Quantizes: call it off the scheduler
    /// thread.
    pub fn demote_idle(&self, idle: Duration) -> usize {
        let now = self.shared.epoch.elapsed().as_nanos() as u64;
        let idle = idle.as_nanos() as u64;
        self.shared
            .all()
            .iter()
            .filter(|s| now.saturating_sub(s.last_use.load(Ordering::Relaxed)) >= idle)
            .filter(|s| self.shared.demote(s, true).is_some())
            .count()
    }

    pub fn stats(&self) -> StoreStats {
        let c = &self.shared.counters;
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut st = StoreStats {
            hits_hot: load(&c.hits[0]),
            hits_warm: load(&c.hits[1]),
            hits_cold: load(&c.hits[2]),
            promotions: load(&c.promotions),
            demotions: load(&c.demotions),
            evictions: load(&c.evictions),
            pool: self.shared.pool.stats(),
            ..StoreStats::default()
        };
        for s in self.shared.all() {
            st.registered += 1;
            match s.lock().0.tier() {
                Tier::Hot => st.hot += 1,
                Tier::Warm => st.warm += 1,
                Tier::Cold => st.cold += 1,
            }
        }
        st
    }
}

/// The prefix-cache salt of an adapter set (see [`AdapterStore::salt`]).
pub fn salt(set: &[(AdapterLease, f32)]) -> u64 {
    if set.is_empty() {
        return 0;
    }
    let mut h = std::hash::DefaultHasher::new();
    for (lease, scale) in set {
        lease.slot.id.hash(&mut h);
        scale.to_bits().hash(&mut h);
    }
    h.finish().max(1)
}

fn info(s: &Slot) -> AdapterInfo {
    AdapterInfo {
        name: s.name.clone(),
        path: s.path.clone(),
        rank: s.rank,
        alpha: s.alpha,
        bytes_hot: s.bytes_hot,
        tier: s.lock().0.tier(),
        leases: s.pins.load(Ordering::Relaxed),
    }
}

impl Shared {
    fn slots(&self) -> MutexGuard<'_, BTreeMap<String, Arc<Slot>>> {
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Every slot, taken out of the map so that no slot is locked under the map's lock.
    fn all(&self) -> Vec<Arc<Slot>> {
        self.slots().values().cloned().collect()
    }

    fn count_hit(&self, t: Tier) {
        let i = match t {
            Tier::Hot => 0,
            Tier::Warm => 1,
            Tier::Cold => 2,
        };
        self.counters.hits[i].fetch_add(1, Ordering::Relaxed);
    }

    /// Makes `slot` hot (it is `Loading`, `held_pages` charged for its warm copy): takes the
    /// missing pages (shedding other adapters if needed), then builds the f32 rows.
    fn load_hot(
        &self,
        slot: &Slot,
        warm: Option<&WarmLora>,
        held_pages: usize,
    ) -> Result<Lora, LoraError> {
        let need = self.pool.pages_for(slot.bytes_hot).saturating_sub(held_pages);
        self.reserve(slot, need)?;
        let lora = match warm {
            Some(w) => Ok(w.to_hot()),
            None => Lora::from_gguf(&slot.file, &self.cfg, slot.name.clone()),
        };
        // Cold stays mapped, not resident: the file's pages just read for the f32 rows would
        // otherwise stay in this process's RSS beside them (and count against the plan).
        if let Some(m) = slot.file.mapping() {
            m.release_resident();
        }
        if lora.is_err() {
            self.pool.free(Content::Adapter, need);
        }
        lora
    }

    /// Charges `n` adapter pages, demoting other unpinned adapters while the pool is short.
    fn reserve(&self, slot: &Slot, n: usize) -> Result<(), LoraError> {
        loop {
            match self.pool.alloc(Content::Adapter, n) {
                Ok(()) => break,
                Err(e) => {
                    if self.shed(n, true, Some(slot)) == 0 {
                        return Err(LoraError::PoolFull { name: slot.name.clone(), source: e });
                    }
                }
            }
        }
        // Hysteresis: past the start mark, give back down to the stop mark.
        let want = self.pool.shed_wanted();
        if want > 0 {
            self.shed(want, true, Some(slot));
        }
        Ok(())
    }

    /// Frees up to `pages` by demoting adapters no lease pins (warm before hot, least recently
    /// used first, larger first among equals), `quantize`: hot → warm, else hot → cold.
    /// Returns the pages freed.
    fn shed(&self, pages: usize, quantize: bool, except: Option<&Slot>) -> usize {
        let mut cands: Vec<(u8, u64, std::cmp::Reverse<usize>, Arc<Slot>)> = self
            .all()
            .into_iter()
            .filter(|s| except.is_none_or(|e| !std::ptr::eq(e, &**s)))
            .filter(|s| s.pins.load(Ordering::SeqCst) == 0)
            .filter_map(|s| {
                let (rank, pages) = match &*s.lock_if(quantize)? {
                    (Held::Warm(_), p) => (0, *p),
                    (Held::Hot(_), p) => (1, *p),
                    _ => return None,
                };
                Some((
                    rank,
                    s.last_use.load(Ordering::Relaxed),
                    std::cmp::Reverse(pages),
                    Arc::clone(&s),
                ))
            })
            .collect();
        cands.sort_by_key(|c| (c.0, c.1, c.2));
        let mut freed = 0;
        for (.., s) in cands {
            if freed >= pages {
                break;
            }
            freed += self.demote(&s, quantize).unwrap_or(0);
        }
        freed
    }

    /// One tier down for an unpinned `slot`; returns the pages freed, `None` if it stayed.
    /// Without `quantize` (the KV cache's thread), a hot adapter goes straight to cold and a
    /// slot busy elsewhere is skipped.
    ///
    /// Quantizing a hot adapter (10–500 ms) runs outside the slot's lock, which requests take
    /// to list adapters: the hot weights are shared out, quantized, and swapped in only if the
    /// slot still holds those weights unpinned (else the work is dropped).
    fn demote(&self, slot: &Slot, quantize: bool) -> Option<usize> {
        let mut g = slot.lock_if(quantize)?;
        if slot.pins.load(Ordering::SeqCst) != 0 {
            return None;
        }
        if let (Held::Hot(l), true) = (&g.0, quantize) {
            let hot = Arc::clone(l);
            drop(g);
            let warm = hot.to_warm();
            g = slot.lock();
            let same = matches!(&g.0, Held::Hot(l) if Arc::ptr_eq(l, &hot));
            if !same || slot.pins.load(Ordering::SeqCst) != 0 {
                return None;
            }
            let before = g.1;
            g.1 = self.pool.pages_for(warm.bytes());
            g.0 = Held::Warm(Arc::new(warm));
            let freed = before.saturating_sub(g.1);
            self.pool.free(Content::Adapter, freed);
            self.pool.count_evicted(Content::Adapter, freed);
            self.counters.demotions.fetch_add(1, Ordering::Relaxed);
            return Some(freed);
        }
        let before = g.1;
        match &g.0 {
            Held::Hot(_) | Held::Warm(_) => {
                g.0 = Held::Cold;
                g.1 = 0;
                self.counters.evictions.fetch_add(1, Ordering::Relaxed);
            }
            Held::Cold | Held::Loading => return None,
        }
        let freed = before - g.1;
        self.pool.free(Content::Adapter, freed);
        self.pool.count_evicted(Content::Adapter, freed);
        self.counters.demotions.fetch_add(1, Ordering::Relaxed);
        Some(freed)
    }
}

impl Evictor for Shared {
    fn free(&self, pages: usize) -> usize {
        self.shed(pages, false, None)
    }
}
