//! Every tensor of the three real test models, dequantized row by row by snug, must hash to
//! the same f32 bytes gguf-py produces (`fixtures/models.json`, made by
//! `scripts/gen_quant_fixtures.py --models`). Cost: ~2.7 G values dequantized and sha256'd, a
//! few seconds per GB of model in an optimized build; memory: one row at a time.

use std::collections::BTreeMap;
use std::path::Path;

use quant::{dequantize_row, GgmlType};
use serde_json::Value;
use sha2::{Digest, Sha256};

const MODELS: [&str; 3] = ["gemma3-270m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"];

fn reference() -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/models.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!("{}: {e}; run scripts/gen_quant_fixtures.py --models", path.display())
    });
    serde_json::from_str(&text).expect("models.json is valid JSON")
}

/// Per-type tally for the report.
#[derive(Default)]
struct Tally {
    tensors: usize,
    values: u64,
}

/// Dequantize tensor `t` row by row; return the sha256 of its f32 bytes (little-endian, file
/// order) and the values at `sample_idx`.
fn digest(file: &gguf::GgufFile, t: &gguf::TensorInfo, sample_idx: &[u64]) -> (String, Vec<f32>) {
    let (rows, cols) = t.rows_cols();
    let data = file.tensor_data(t);
    let row_bytes = t.ggml_type.row_bytes(cols).expect("gguf checked whole blocks");
    assert_eq!(data.len(), rows * row_bytes, "{}: data size", t.name);
    let mut row = vec![0f32; cols];
    let mut bytes = vec![0u8; cols * 4];
    let mut sha = Sha256::new();
    let mut samples = vec![f32::NAN; sample_idx.len()];
    for (r, src) in data.chunks_exact(row_bytes).enumerate() {
        dequantize_row(t.ggml_type, src, &mut row)
            .unwrap_or_else(|e| panic!("{}: row {r}: {e}", t.name));
        for (b, v) in bytes.chunks_exact_mut(4).zip(&row) {
            b.copy_from_slice(&v.to_le_bytes());
        }
        sha.update(&bytes);
        let start = (r * cols) as u64;
        for (s, &i) in samples.iter_mut().zip(sample_idx) {
            if (start..start + cols as u64).contains(&i) {
                *s = row[(i - start) as usize];
            }
        }
    }
    let hex = sha.finalize().iter().map(|b| format!("{b:02x}")).collect();
    (hex, samples)
}

#[test]
fn every_tensor_of_the_real_models_dequantizes_bit_identical_to_gguf_py() {
    let reference = reference();
    let mut tally: BTreeMap<String, Tally> = BTreeMap::new();
    let mut failures = Vec::new();
    for alias in MODELS {
        let path = hub::model_path(alias);
        assert!(
            path.exists(),
            "{} is missing: fetch the test models first \
             (`cargo run --release -p snug -- pull {alias}`, or `.ci/run`, which pulls all three)",
            path.display()
        );
        let file =
            gguf::GgufFile::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let want_bytes = reference["models"][alias]["file_bytes"].as_u64().expect("file_bytes");
        assert_eq!(
            file.file_len(),
            want_bytes,
            "{}: not the file the fixtures were made from; re-pull it, or regenerate \
             fixtures/models.json with scripts/gen_quant_fixtures.py --models",
            path.display()
        );
        let want = reference["models"][alias]["tensors"].as_array().expect("tensors list");
        assert_eq!(
            file.tensors.len(),
            want.len(),
            "{alias}: tensor count differs from the reference"
        );
        for w in want {
            let name = w["name"].as_str().expect("name");
            let t = file.tensor(name).unwrap_or_else(|| panic!("{alias}: no tensor {name}"));
            assert_eq!(
                t.ggml_type.name().to_uppercase(),
                w["type"].as_str().unwrap().to_uppercase(),
                "{alias}/{name}: type"
            );
            assert_eq!(t.n_elements(), w["n_values"].as_u64().unwrap(), "{alias}/{name}: size");
            let pairs = w["samples"].as_array().expect("samples");
            let idx: Vec<u64> = pairs.iter().map(|p| p[0].as_u64().unwrap()).collect();
            let (sha, got) = digest(&file, t, &idx);
            let entry = tally.entry(t.ggml_type.name().to_string()).or_default();
            entry.tensors += 1;
            entry.values += t.n_elements();
            if sha != w["sha256"].as_str().unwrap() {
                // Not bit-identical: say how far off the sampled values are.
                let worst = pairs
                    .iter()
                    .zip(&got)
                    .map(|(p, g)| {
                        let e = p[1].as_f64().unwrap() as f32;
                        (
                            (g - e).abs() / e.abs().max(f32::MIN_POSITIVE),
                            p[0].as_u64().unwrap(),
                            *g,
                            e,
                        )
                    })
                    .fold((0f32, 0, 0f32, 0f32), |a, b| if b.0 > a.0 { b } else { a });
                failures.push(format!(
                    "{alias}/{name} ({}): sha256 differs; worst sampled rel diff {:e} at {} (snug {}, gguf-py {})",
                    t.ggml_type, worst.0, worst.1, worst.2, worst.3
                ));
            }
        }
    }
    for (ty, t) in &tally {
        println!("{ty:>5}: {} tensors, {} values, bit-identical to gguf-py", t.tensors, t.values);
    }
    assert!(failures.is_empty(), "{} tensors differ:\n{}", failures.len(), failures.join("\n"));
    let types: Vec<GgmlType> =
        tally.keys().filter_map(|n| GgmlType::ALL.into_iter().find(|t| t.name() == n)).collect();
    assert!(
        types.contains(&GgmlType::Q4K) && types.contains(&GgmlType::Q6K),
        "models cover q4_K and q6_K"
    );
}
