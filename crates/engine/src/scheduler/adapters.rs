//! The LoRA adapters a job runs with: leases on the adapter store's hot adapters
//! ([`model::lora::AdapterStore::acquire`], which the caller does off the scheduler thread, so a
//! cold adapter loading never holds up a step), their scales, and the set's prefix-cache salt.
//! Admission hands the adapters to `Context::set_adapters` for the job's slot; the leases go
//! with the job, so the store keeps the adapters hot until its sequence ends.

use std::sync::Arc;

use model::lora::AdapterLease;
use model::Lora;

/// The adapters a job runs with, leased: held until the job's sequence ends.
#[derive(Clone, Default)]
pub struct JobAdapters {
    pub leases: Vec<(AdapterLease, f32)>,
    /// The prefix-cache salt of the set (0 for none): KV computed under one set of adapters is
    /// never shared with another.
    pub salt: u64,
}

impl JobAdapters {
    /// The loaded adapters and their scales, for `Context::set_adapters`.
    pub fn loras(&self) -> Vec<(Arc<Lora>, f32)> {
        self.leases.iter().map(|(l, s)| (l.lora().clone(), *s)).collect()
    }

    pub fn is_empty(&self) -> bool {
        self.leases.is_empty()
    }

    /// The adapters' names.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.leases.iter().map(|(l, _)| l.lora().name.as_str())
    }
}

impl std::fmt::Debug for JobAdapters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<(&str, f32)> = self.names().zip(self.leases.iter().map(|l| l.1)).collect();
        f.debug_struct("JobAdapters").field("leases", &names).field("salt", &self.salt).finish()
    }
}
