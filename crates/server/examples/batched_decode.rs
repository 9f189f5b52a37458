//! Decode throughput of the forward pass alone with B sequences per step (B = 1, 2, 4, 8), like
//! llama.cpp's `llama-batched-bench`: what the scheduler's batching can gain at most on this
//! machine. `cargo run --release -p server --example batched_decode [MODEL] [STEPS] [B,B,..]`
//! (batch sizes default to 1,2,4,8).

use std::sync::Arc;
use std::time::Instant;

use model::{Batch, Context, ContextParams, Model};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let name = args.next().unwrap_or_else(|| "qwen2.5-coder-0.5b".into());
    let steps: usize = args.next().map_or(Ok(32), |s| s.parse())?;
    let sizes: Vec<usize> = match args.next() {
        Some(s) => s.split(',').map(str::parse).collect::<Result<_, _>>()?,
        None => vec![1, 2, 4, 8],
    };
    let model = Arc::new(Model::load(hub::resolve(&name)?)?);
    let n_seq = sizes.iter().copied().max().unwrap_or(1);
    let params = ContextParams {
        n_ctx: 256,
        n_seq_max: n_seq,
        n_outputs_max: n_seq,
        n_threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
        ..ContextParams::default()
    };
    println!("| sequences | step ms | aggregate tok/s |\n| --- | --- | --- |");
    for b in sizes {
        let mut ctx = Context::new(model.clone(), params);
        let mut batch = Batch::default();
        // A 16-token prompt per sequence, then `steps` decode steps of one token each.
        for s in 0..b {
            for p in 0..16 {
                batch.push((100 + 7 * s + p) as u32, p, s, p == 15);
            }
        }
        ctx.decode(&batch)?;
        let t0 = Instant::now();
        for i in 0..steps {
            batch.clear();
            for s in 0..b {
                batch.push((200 + s) as u32, 16 + i, s, true);
            }
            ctx.decode(&batch)?;
        }
        let secs = t0.elapsed().as_secs_f64();
        println!("| {b} | {:.1} | {:.1} |", 1e3 * secs / steps as f64, (b * steps) as f64 / secs);
    }
    Ok(())
}
