//! Matmul throughput over real layer shapes: GB/s of weights for decode gemv (m = 1, weights
//! cycled through copies larger than L3 so they stream from DRAM as in a real decode) and
//! GFLOP/s for prefill gemm (m = 512; row kernels, then prefill panels), beside this machine's plain read bandwidth.
//!
//! `hot` mode times one thread on weights that stay in L2 (fastest of 15 runs): the kernel's compute
//! cost alone, which must stay under the DRAM budget (~8 GB/s per core) for decode to be
//! bandwidth-bound; per activation row for m = 1, 2, 4, 8, 16.
//!
//! `batch` mode is batched decode: m = 1, 2, 4, 8, 16 activation rows against weights streamed
//! from DRAM (as `gemv`), in wall µs a call and CPU ns per weight row per activation row (both
//! threads' CPU time, so a noisy box shows up less than in wall time).
//!
//! `cargo bench -p quant --bench matmul -- [gemv] [gemm] [hot] [pool] [batch] [threads=N]
//! [isa=avx2] [reps=N] [type=q4_K]`

use std::time::{Duration, Instant};

use quant::kernels::{isa, matmul_panels_with, matmul_with, Isa, MatRef};
use quant::threads::ThreadPool;
use quant::GgmlType;

/// (label, weight type, rows = out features, cols = in features)
const SHAPES: [(&str, GgmlType, usize, usize); 14] = [
    ("1.5B k/v", GgmlType::Q4K, 256, 1536),
    ("1.5B q/o", GgmlType::Q4K, 1536, 1536),
    ("1.5B gate/up", GgmlType::Q4K, 8960, 1536),
    ("1.5B down", GgmlType::Q4K, 1536, 8960),
    ("1.5B q/o", GgmlType::Q6K, 1536, 1536),
    ("1.5B gate/up", GgmlType::Q6K, 8960, 1536),
    ("1.5B down", GgmlType::Q6K, 1536, 8960),
    ("1.5B q/o", GgmlType::Q8_0, 1536, 1536),
    ("1.5B q/o", GgmlType::Q5_0, 1536, 1536),
    ("1.5B q/o", GgmlType::F16, 1536, 1536),
    ("7B gate/up", GgmlType::Q4K, 18944, 3584),
    ("7B q/o", GgmlType::Q4K, 3584, 3584),
    ("7B down", GgmlType::Q6K, 3584, 18944),
    ("7B output", GgmlType::Q6K, 152064, 3584),
];

/// Deterministic weight bytes with finite scales (xorshift; scale fields patched to 0.01).
fn weights(ty: GgmlType, rows: usize, cols: usize, seed: u64) -> Vec<u8> {
    let n = ty.row_bytes(cols).unwrap() * rows;
    let mut s = seed | 1;
    let mut v: Vec<u8> = (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 24) as u8
        })
        .collect();
    let d = half::f16::from_f32(0.01).to_le_bytes();
    let fields: &[usize] = match ty {
        GgmlType::Q4K => &[0, 2],
        GgmlType::Q6K => &[208],
        GgmlType::Q8_0 | GgmlType::Q5_0 => &[0],
        _ => &[],
    };
    if ty == GgmlType::F16 {
        for c in v.chunks_exact_mut(2) {
            c.copy_from_slice(&d);
        }
    }
    for b in v.chunks_exact_mut(ty.type_size()) {
        for &o in fields {
            b[o..o + 2].copy_from_slice(&d);
        }
    }
    v
}

/// Nanoseconds this thread has spent on a CPU (first field of /proc/thread-self/schedstat), so
/// single-thread kernel cost can be read on a machine other jobs are loading; 0 if unavailable.
fn thread_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(0)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// Plain read bandwidth: 2 threads sum a 1 GiB buffer (u64 adds; compiled with SSE2 only).
fn read_bandwidth(pool: &ThreadPool) -> f64 {
    let buf = vec![1u64; 1 << 27];
    let mut runs = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        let sums: Vec<std::sync::atomic::AtomicU64> =
            (0..pool.n_threads()).map(|_| Default::default()).collect();
        pool.run(|ith, nth| {
            let part = buf.len().div_ceil(nth);
            let s = &buf[(ith * part).min(buf.len())..((ith + 1) * part).min(buf.len())];
            let mut acc = [0u64; 8];
            for c in s.chunks_exact(8) {
                for k in 0..8 {
                    acc[k] = acc[k].wrapping_add(c[k]);
                }
            }
            sums[ith].store(acc.iter().sum(), std::sync::atomic::Ordering::Relaxed);
        });
        runs.push(8.0 * buf.len() as f64 / t.elapsed().as_secs_f64() / 1e9);
        std::hint::black_box(&sums);
    }
    median(runs)
}

/// One thread, 64 rows (≤ 170 KB, L2-resident) dotted over and over against `m` activation
/// rows: compute cost per byte (m = 1) and per weight row per activation row.
fn hot(path: Isa, ty: GgmlType, cols: usize, m: usize) {
    let pool = ThreadPool::new(1);
    let rows = 64;
    let w = weights(ty, rows, cols, 11);
    let x: Vec<f32> = (0..m * cols).map(|k| ((k % 13) as f32 - 6.0) * 0.1).collect();
    let mut y = vec![0f32; m * rows];
    let mut scratch = Vec::new();
    let mat = MatRef { ty, data: &w, rows, cols };
    // The fastest of 15 wall-clock runs: thread CPU time ticks too coarsely for runs this short,
    // and on a shared box the fastest run is the one least disturbed.
    let mut runs = Vec::new();
    for _ in 0..15 {
        let t = Instant::now();
        let iters = 2000 / m;
        for _ in 0..iters {
            matmul_with(path, &pool, mat, &x, m, &mut y, &mut scratch).unwrap();
        }
        runs.push((w.len() * iters * m) as f64 / t.elapsed().as_nanos().max(1) as f64);
    }
    let gbs = runs.iter().copied().fold(0.0, f64::max);
    let block_ns = ty.type_size() as f64 / gbs;
    let row_ns = ty.row_bytes(cols).unwrap() as f64 / gbs;
    println!(
        "hot  {ty:>5} 64x{cols:<5} (L2) m={m:<2} {gbs:6.1} GB/s (fastest run)  {block_ns:6.2} ns/block \
         {row_ns:7.2} ns per row x token"
    );
}

/// CPU nanoseconds all of this process's threads have run (the first field of each
/// /proc/self/task/*/schedstat); 0 if unavailable.
fn process_cpu_ns() -> u64 {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else { return 0 };
    dir.flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next().and_then(|v| v.parse::<u64>().ok()))
        .sum()
}

/// Batched decode: `m` activation rows against DRAM-streamed weights, for m = 1, 2, 4, 8, 16.
#[allow(clippy::too_many_arguments)]
fn batch(
    path: Isa,
    pool: &ThreadPool,
    reps: usize,
    label: &str,
    ty: GgmlType,
    rows: usize,
    cols: usize,
    scratch: &mut Vec<u8>,
) {
    let bytes = ty.row_bytes(cols).unwrap() * rows;
    let copies = (512usize << 20).div_ceil(bytes).clamp(2, 64);
    let ws: Vec<Vec<u8>> = (0..copies).map(|i| weights(ty, rows, cols, i as u64 + 7)).collect();
    for m in [1, 2, 4, 8, 16] {
        let x: Vec<f32> = (0..m * cols).map(|k| ((k % 17) as f32 - 8.0) * 0.1).collect();
        let mut y = vec![0f32; m * rows];
        let (mut runs, mut cpu_runs) = (Vec::new(), Vec::new());
        for _ in 0..reps {
            let (t, c) = (Instant::now(), process_cpu_ns());
            for w in &ws {
                let mat = MatRef { ty, data: w, rows, cols };
                matmul_with(path, pool, mat, &x, m, &mut y, scratch).unwrap();
            }
            runs.push(t.elapsed().as_secs_f64() * 1e6 / copies as f64);
            let cpu = process_cpu_ns().saturating_sub(c) as f64;
            cpu_runs.push(cpu / (copies * rows * m) as f64);
        }
        println!(
            "batch {ty:>5} {label:<13} {rows:>5}x{cols:<5} m={m:<2}  {:8.1} us/call  \
             {:6.2} CPU ns per row x token",
            median(runs),
            median(cpu_runs)
        );
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench").collect();
    let arg =
        |k: &str| args.iter().find_map(|a| a.strip_prefix(&format!("{k}=")).map(str::to_owned));
    let threads: usize = arg("threads").and_then(|v| v.parse().ok()).unwrap_or(2);
    let reps: usize = arg("reps").and_then(|v| v.parse().ok()).unwrap_or(5);
    let path =
        arg("isa").and_then(|v| Isa::ALL.into_iter().find(|i| i.name() == v)).unwrap_or_else(isa);
    let modes = ["gemv", "gemm", "hot", "pool", "batch"];
    let want =
        |k: &str| args.iter().any(|a| a == k) || !args.iter().any(|a| modes.contains(&a.as_str()));
    let only: Option<String> = arg("type");
    let pool = ThreadPool::new(threads);
    let mut scratch = Vec::new();
    println!("path {path}, {threads} threads, median of {reps} runs");
    if want("pool") {
        // Hand-off + join of an empty job, back to back (workers spinning, as between matmuls).
        let mut runs = Vec::new();
        for _ in 0..reps {
            let t = Instant::now();
            for _ in 0..10_000 {
                pool.run(|ith, _| {
                    std::hint::black_box(ith);
                });
            }
            runs.push(t.elapsed().as_secs_f64() / 10_000.0 * 1e6);
        }
        println!("pool run() of an empty job: {:.2} us", median(runs));
    }
    if want("gemv") {
        println!("plain read bandwidth: {:.1} GB/s", read_bandwidth(&pool));
    }
    for (label, ty, rows, cols) in SHAPES {
        if only.as_deref().is_some_and(|t| t != ty.name()) {
            continue;
        }
        let bytes = ty.row_bytes(cols).unwrap() * rows;
        if want("gemv") {
            // Enough copies to overflow L3 so every call streams from DRAM.
            let copies = (512usize << 20).div_ceil(bytes).clamp(2, 64);
            let ws: Vec<Vec<u8>> =
                (0..copies).map(|i| weights(ty, rows, cols, i as u64 + 7)).collect();
            let x: Vec<f32> = (0..cols).map(|k| ((k % 17) as f32 - 8.0) * 0.1).collect();
            let mut y = vec![0f32; rows];
            let (mut runs, mut cpu_runs) = (Vec::new(), Vec::new());
            for _ in 0..reps {
                let (t, c) = (Instant::now(), thread_cpu_ns());
                for w in &ws {
                    let mat = MatRef { ty, data: w, rows, cols };
                    matmul_with(path, &pool, mat, &x, 1, &mut y, &mut scratch).unwrap();
                }
                runs.push((bytes * copies) as f64 / t.elapsed().as_secs_f64() / 1e9);
                cpu_runs.push((bytes * copies) as f64 / (thread_cpu_ns() - c).max(1) as f64);
            }
            let gbs = median(runs);
            println!(
                "gemv {ty:>5} {label:<13} {rows:>5}x{cols:<5} {:>7.1} MB  {gbs:6.1} GB/s  {:8.1} us/call  \
                 (thread 0: {:5.1} GB per CPU-second)",
                bytes as f64 / 1e6,
                bytes as f64 / gbs / 1e3,
                median(cpu_runs)
            );
        }
        if want("batch") && label.contains("gate/up") {
            batch(path, &pool, reps, label, ty, rows, cols, &mut scratch);
        }
        if want("hot") && label.ends_with("q/o") {
            for m in [1, 2, 4, 8, 16] {
                hot(path, ty, cols, m);
            }
        }
        if want("gemm") {
            let m = 512;
            let w = weights(ty, rows, cols, 3);
            let x: Vec<f32> = (0..m * cols).map(|k| ((k % 23) as f32 - 11.0) * 0.05).collect();
            let mut y = vec![0f32; m * rows];
            let mat = MatRef { ty, data: &w, rows, cols };
            let flop = 2.0 * (rows * cols * m) as f64;
            // The row kernels, then the prefill panels (where the path has them for `ty`).
            for panels in [false, true] {
                let (mut runs, mut cpu_runs) = (Vec::new(), Vec::new());
                let budget = Instant::now();
                for r in 0..reps {
                    let (t, c) = (Instant::now(), thread_cpu_ns());
                    if panels {
                        matmul_panels_with(path, &pool, mat, &x, m, &mut y, &mut scratch)
                    } else {
                        matmul_with(path, &pool, mat, &x, m, &mut y, &mut scratch)
                    }
                    .unwrap();
                    runs.push(flop / t.elapsed().as_secs_f64() / 1e9);
                    cpu_runs.push(flop / (thread_cpu_ns() - c).max(1) as f64);
                    if r >= 2 && budget.elapsed() > Duration::from_secs(20) {
                        break;
                    }
                }
                let kind = if panels { "panels" } else { "rows" };
                println!(
                    "gemm {ty:>5} {label:<13} {rows:>5}x{cols:<5} m={m} {kind:<6} {:6.1} GFLOP/s  \
                     (thread 0: {:5.1} GFLOP per CPU-second)",
                    median(runs),
                    median(cpu_runs)
                );
            }
        }
    }
}
