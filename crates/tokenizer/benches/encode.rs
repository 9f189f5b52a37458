//! Encode throughput on the long English prompt (`testdata/refdata/long_prompt.txt`), in MB/s
//! of input text, for the real models that are present and the tiny ones.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use std::path::PathBuf;

fn ws() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn bench(c: &mut Criterion) {
    let text = std::fs::read_to_string(ws().join("testdata/refdata/long_prompt.txt"))
        .expect("testdata/refdata/long_prompt.txt is part of the repository");
    let mut models: Vec<(String, PathBuf)> = ["qwen2.5-coder-0.5b", "gemma3-270m"]
        .iter()
        .map(|a| (a.to_string(), hub::model_path(a)))
        .filter(|(_, p)| p.is_file())
        .collect();
    for arch in ["qwen2", "llama", "phi3"] {
        models.push((
            format!("tiny-{arch}"),
            ws().join(format!("testdata/refdata/tiny/tiny-{arch}.gguf")),
        ));
    }
    let mut g = c.benchmark_group("encode_long_prompt");
    g.throughput(Throughput::Bytes(text.len() as u64));
    for (name, path) in models {
        let f = gguf::GgufFile::open(&path).expect("open model");
        let tok = tokenizer::Tokenizer::from_gguf(&f).expect("load tokenizer");
        g.bench_function(&name, |b| {
            b.iter(|| tok.encode(std::hint::black_box(&text), true, false))
        });
        g.bench_function(format!("{name}/parse_special"), |b| {
            b.iter(|| tok.encode(std::hint::black_box(&text), true, true))
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
