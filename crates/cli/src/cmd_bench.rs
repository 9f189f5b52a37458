//! `snug bench MODEL`: prompt processing (pp) and generation (tg) speed, like llama-bench, plus
//! the weight bytes each decoded token streams and this machine's measured read bandwidth, so
//! decode speed can be read as a fraction of the physical limit.

use std::sync::Arc;
use std::time::Instant;

use clap::Args;
use model::{Batch, Context};
use quant::threads::ThreadPool;
use serde_json::json;

use crate::common::{attach, open, report, RunArgs};
use crate::draft_args::DraftArgs;
use crate::kv_args::kv_label;

#[derive(Args, Debug)]
pub struct BenchCmd {
    /// Model alias or .gguf path.
    pub model: String,
    /// Prompt tokens processed in one batch (0 skips the prompt test).
    #[arg(short = 'p', long = "n-prompt", default_value_t = 512)]
    pub n_prompt: usize,
    /// Tokens generated one at a time (0 skips the generation test).
    #[arg(short = 'n', long = "n-gen", default_value_t = 128)]
    pub n_gen: usize,
    /// Repetitions of each test; medians are reported.
    #[arg(short = 'r', long, default_value_t = 3)]
    pub reps: usize,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Generation starts after this many tokens already in the KV cache (decode at depth).
    #[arg(short = 'd', long, default_value_t = 0)]
    pub depth: usize,
    /// Context, threads, micro-batch, KV and memory flags, as for `snug run` (the context
    /// defaults to what the tests need).
    #[command(flatten)]
    pub run: RunArgs,
}

/// Read bandwidth (bytes/s) of a plain 2-thread read-sum over `buf`, one figure per pass: each
/// thread sums its half as u64 words (SSE2 adds, far more than memory can feed). `buf` must be
/// much larger than the last-level cache (32 MiB here) or the figure is a cache test. A first,
/// untimed pass faults in pages not yet mapped into this process.
pub fn measure_read_bandwidth(pool: &ThreadPool, buf: &[u8], passes: usize) -> Vec<f64> {
    let words = buf.len() / 64 * 8;
    (0..=passes)
        .map(|_| {
            let t = Instant::now();
            let sums: Vec<std::sync::atomic::AtomicU64> =
                (0..pool.n_threads()).map(|_| Default::default()).collect();
            pool.run(|ith, nth| {
                let chunk = (words / 8).div_ceil(nth) * 64;
                let part = &buf[(ith * chunk).min(words * 8)..((ith + 1) * chunk).min(words * 8)];
                let mut acc = [0u64; 8];
                for c in part.chunks_exact(64) {
                    for (j, a) in acc.iter_mut().enumerate() {
                        *a = a.wrapping_add(u64::from_ne_bytes(
                            c[8 * j..8 * j + 8].try_into().unwrap(),
                        ));
                    }
                }
                sums[ith].store(
                    acc.iter().fold(0u64, |a, &b| a.wrapping_add(b)),
                    std::sync::atomic::Ordering::Relaxed,
                );
            });
            std::hint::black_box(&sums);
            (words * 8) as f64 / t.elapsed().as_secs_f64()
        })
        .skip(1)
        .collect()
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn stats(v: &[f64]) -> serde_json::Value {
    let mut s = v.to_vec();
    let med = median(&mut s);
    json!({"median": med, "min": s[0], "max": s[s.len() - 1], "runs": v})
}

pub fn run(cmd: BenchCmd) -> anyhow::Result<()> {
    if cmd.reps == 0 {
        anyhow::bail!("--reps must be at least 1");
    }
    let m = open(&cmd.model)?;
    let model = &m.model;
    let n_vocab = model.config.n_vocab as u32;
    let needed = (cmd.n_prompt.max(cmd.depth + cmd.n_gen) + 1).max(16);
    let mut run = cmd.run.clone();
    run.ctx = run.ctx.or(Some(needed));
    let (params, planned) = run.plan(model, needed, Some(needed), false, &DraftArgs::off())?;
    let (threads, kv_label) = (params.n_threads, kv_label(params.kv_k, params.kv_v));
    let mut ctx = Context::new(Arc::clone(model), params);
    run.lora.apply(&mut ctx)?;
    let residence = attach(&planned, &m, &ctx)?;
    // Deterministic pseudo-random tokens (speed does not depend on which tokens).
    let token = |i: usize| ((i as u64).wrapping_mul(2654435761) % n_vocab as u64) as u32;
    let mut batch = Batch::default();
    let mut pp = Vec::new();
    let mut tg = Vec::new();
    // Warm-up: touch the weights once so the first repetition is not a page-cache test.
    batch.push(token(0), 0, 0, true);
    ctx.decode(&batch)?;
    for _ in 0..cmd.reps {
        if cmd.n_prompt > 0 {
            ctx.kv.seq_clear(0);
            batch.clear();
            for i in 0..cmd.n_prompt {
                batch.push(token(i), i, 0, i + 1 == cmd.n_prompt);
            }
            let t = Instant::now();
            ctx.decode(&batch)?;
            pp.push(cmd.n_prompt as f64 / t.elapsed().as_secs_f64());
        }
        if cmd.n_gen > 0 {
            ctx.kv.seq_clear(0);
            if cmd.depth > 0 {
                batch.clear();
                for i in 0..cmd.depth {
                    batch.push(token(i + 3), i, 0, false);
                }
                ctx.decode(&batch)?;
            }
            let t = Instant::now();
            for i in 0..cmd.n_gen {
                batch.clear();
                batch.push(token(i + 7), cmd.depth + i, 0, true);
                ctx.decode(&batch)?;
            }
            tg.push(cmd.n_gen as f64 / t.elapsed().as_secs_f64());
        }
    }
    // Peak RSS of the tests themselves, before the bandwidth buffer adds to it.
    report(&residence, &cmd.run.mem);
    let bytes_per_tok = planned.bytes_read_per_token(&model.config);
    // The machine's read bandwidth, measured on the bytes decode reads: the model's own mapping
    // (page cache, huge pages where the file system gives them, exactly as the weights are read),
    // its first GiB. A freshly allocated buffer differs from the weights in ways that move the
    // figure by a fifth: 4 KiB pages (the allocator does not ask for huge pages), and a size the
    // memory budget had to cap (down to 64 MiB, twice this L3). Streamed weights are not all in
    // memory, so a streaming run reads an anonymous buffer instead.
    let file = model.file.bytes();
    let rates = if planned.request().residency != runtime::Residency::Stream
        && file.len() >= 256 << 20
    {
        measure_read_bandwidth(ctx.pool(), &file[..file.len().min(1 << 30)], 5)
    } else {
        let spare = planned.budget.bytes.saturating_sub(planned.choice.prediction.total) / 2;
        let buf: Vec<u8> = (0..spare.clamp(64 << 20, 1 << 30) as usize).map(|i| i as u8).collect();
        measure_read_bandwidth(ctx.pool(), &buf, 5)
    };
    let bw = median(&mut rates.clone());
    let tg_med = if tg.is_empty() { 0.0 } else { median(&mut tg.clone()) };
    let pp_med = if pp.is_empty() { 0.0 } else { median(&mut pp.clone()) };
    let eff = tg_med * bytes_per_tok as f64;
    let out = json!({
        "model": cmd.model,
        "arch": model.config.arch.name(),
        "threads": threads,
        "kernels": format!("{:?}", quant::kernels::isa()),
        "n_prompt": cmd.n_prompt,
        "n_gen": cmd.n_gen,
        "reps": cmd.reps,
        "depth": cmd.depth,
        "kv": kv_label,
        "memory": runtime::plan::describe(planned.request()),
        "pp_tok_s": pp_med,
        "tg_tok_s": tg_med,
        "pp": if pp.is_empty() { json!(null) } else { stats(&pp) },
        "tg": if tg.is_empty() { json!(null) } else { stats(&tg) },
        "weight_bytes_per_token": bytes_per_tok,
        "decode_weight_gb_s": eff / 1e9,
        "machine_read_gb_s": bw / 1e9,
        "machine_read_gb_s_runs": rates.iter().map(|r| r / 1e9).collect::<Vec<_>>(),
        "decode_fraction_of_bandwidth": if bw > 0.0 { eff / bw } else { 0.0 },
    });
    if cmd.json {
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        println!(
            "model {} ({}), {} threads, kernels {}",
            cmd.model,
            model.config.arch.name(),
            threads,
            out["kernels"].as_str().unwrap_or("")
        );
        if !pp.is_empty() {
            println!(
                "pp{:<6} {:>8.1} tok/s (min {:.1}, max {:.1})",
                cmd.n_prompt,
                pp_med,
                out["pp"]["min"].as_f64().unwrap_or(0.0),
                out["pp"]["max"].as_f64().unwrap_or(0.0)
            );
        }
        if !tg.is_empty() {
            println!(
                "tg{:<6} {:>8.2} tok/s at depth {} ({}) (min {:.2}, max {:.2})",
                cmd.n_gen,
                tg_med,
                cmd.depth,
                out["memory"].as_str().unwrap_or(""),
                out["tg"]["min"].as_f64().unwrap_or(0.0),
                out["tg"]["max"].as_f64().unwrap_or(0.0)
            );
        }
        println!(
            "decode streams {:.1} MB of weights per token = {:.2} GB/s; machine read bandwidth {:.2} GB/s ({:.0}%)",
            bytes_per_tok as f64 / 1e6,
            eff / 1e9,
            bw / 1e9,
            100.0 * eff / bw.max(1.0)
        );
    }
    Ok(())
}
