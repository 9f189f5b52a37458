//! The page pool's hot operations (issue 15 targets: page allocate < 100 ns, pin/unpin < 50 ns):
//! a KV block allocated and released through the shared [`PagePool`] (the ledger's lock and the
//! free list), the ledger alone, and an adapter lease cloned and dropped (pin/unpin).
//!
//! `cargo bench -p model --bench pool`

use std::hint::black_box;
use std::path::PathBuf;

use criterion::{criterion_group, criterion_main, Criterion};
use model::kv::pool::{BlockPool, Content, PagePool};
use model::lora::{write_adapter, AdapterStore, AdapterTensor};
use model::{names, Model};

fn pool(c: &mut Criterion) {
    let shared = PagePool::new(64 << 10, 4096, 0);
    c.bench_function("ledger alloc+free 1 page", |b| {
        b.iter(|| {
            shared.alloc(Content::Kv, black_box(1)).unwrap();
            shared.free(Content::Kv, black_box(1));
        })
    });

    let mut blocks = BlockPool::new(64 << 10, 4096, 4096);
    blocks.attach(PagePool::new(64 << 10, 4096, 0)).unwrap();
    // Warm the free list: every block touched once.
    let ids: Vec<_> = (0..64).map(|_| blocks.alloc().unwrap()).collect();
    ids.into_iter().for_each(|id| blocks.release(id));
    c.bench_function("KV block alloc+release (shared pool)", |b| {
        b.iter(|| {
            let id = blocks.alloc().unwrap();
            blocks.release(black_box(id));
        })
    });

    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata/refdata/tiny/tiny-qwen2.gguf");
    let m = Model::load(&p).expect("tiny model");
    let c0 = &m.config;
    let t = AdapterTensor {
        weight: names::layer_tensor(0, names::ATTN_Q),
        ty: gguf::GgmlType::F32,
        rank: 4,
        a: vec![0.01; 4 * c0.n_embd],
        b: vec![0.01; c0.q_dim() * 4],
    };
    let path = std::env::temp_dir().join(format!("snug-bench-pool-{}.gguf", std::process::id()));
    let f = std::fs::File::create(&path).unwrap();
    write_adapter(std::io::BufWriter::new(f), "qwen2", 8.0, &[t]).unwrap().into_inner().unwrap();
    let store = AdapterStore::new(c0, 64 << 20);
    store.register("a", &path).unwrap();
    let lease = store.acquire("a").unwrap();
    c.bench_function("adapter lease pin+unpin (clone+drop)", |b| {
        b.iter(|| drop(black_box(lease.clone())))
    });
    c.bench_function("adapter acquire (hot) + release", |b| {
        b.iter(|| drop(black_box(store.acquire("a").unwrap())))
    });
    let _ = std::fs::remove_file(&path);
}

criterion_group!(benches, pool);
criterion_main!(benches);
