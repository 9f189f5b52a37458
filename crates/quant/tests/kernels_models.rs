//! The kernels on real weights: for every weight type in the three test models, the first
//! tensors of that type (64 rows each) go through `matmul` on every kernel path this CPU has
//! and must match f32 math on the dequantized rows within the budget of 8-bit activations (3%
//! relative L2 with outliers in x), and the paths must agree with each other.

use std::collections::BTreeMap;

use quant::kernels::{matmul_with, vec_dot_type, Isa, MatRef};
use quant::threads::ThreadPool;
use quant::{dequantize_row, GgmlType};

const MODELS: [&str; 3] = ["gemma3-270m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"];
const ROWS: usize = 64;
const PER_TYPE: usize = 3;

fn rel_err(got: &[f32], want: &[f32]) -> f64 {
    let num: f64 = got.iter().zip(want).map(|(a, b)| (*a as f64 - *b as f64).powi(2)).sum();
    let den: f64 = want.iter().map(|b| (*b as f64).powi(2)).sum();
    (num / den.max(1e-30)).sqrt()
}

#[test]
fn matmul_on_real_model_weights_matches_f32_math_on_every_path() {
    let pool = ThreadPool::new(2);
    let mut scratch = Vec::new();
    let mut seen: BTreeMap<GgmlType, usize> = BTreeMap::new();
    for alias in MODELS {
        let path = hub::model_path(alias);
        assert!(
            path.exists(),
            "{} is missing: fetch the test models first (`snug pull {alias}` or `.ci/run`)",
            path.display()
        );
        let file = gguf::GgufFile::open(&path).unwrap();
        for t in &file.tensors {
            let (rows, cols) = t.rows_cols();
            let ty = t.ggml_type;
            if rows < 2 || !quant::kernels::supports(ty) {
                continue;
            }
            let count = seen.entry(ty).or_default();
            if *count >= PER_TYPE {
                continue;
            }
            *count += 1;
            let rows = rows.min(ROWS);
            let data = &file.tensor_data(t)[..rows * ty.row_bytes(cols).unwrap()];
            let mut wf = vec![0f32; rows * cols];
            dequantize_row(ty, data, &mut wf).unwrap();
            for m in [1usize, 9] {
                // Activations shaped like a hidden state: mostly small, a few outliers.
                let x: Vec<f32> = (0..m * cols)
                    .map(|i| {
                        ((i * 7919 % 1000) as f32 / 500.0 - 1.0)
                            * if i % 97 == 0 { 4.0 } else { 1.0 }
                    })
                    .collect();
                let want: Vec<f32> = (0..m * rows)
                    .map(|i| {
                        let (t, r) = (i / rows, i % rows);
                        (0..cols)
                            .map(|k| wf[r * cols + k] as f64 * x[t * cols + k] as f64)
                            .sum::<f64>() as f32
                    })
                    .collect();
                let budget = if vec_dot_type(ty) == GgmlType::F32 { 1e-5 } else { 3e-2 };
                let mut by_path = Vec::new();
                for isa in Isa::all_available() {
                    let mut y = vec![0f32; m * rows];
                    let mat = MatRef { ty, data, rows, cols };
                    matmul_with(isa, &pool, mat, &x, m, &mut y, &mut scratch).unwrap();
                    let e = rel_err(&y, &want);
                    assert!(e < budget, "{alias} {} ({ty}) {isa} m={m}: rel err {e}", t.name);
                    by_path.push(y);
                }
                for y in &by_path[1..] {
                    assert!(
                        rel_err(y, &by_path[0]) < 1e-5,
                        "{alias} {} ({ty}) paths disagree",
                        t.name
                    );
                }
            }
        }
    }
    for ty in [GgmlType::Q4K, GgmlType::Q6K, GgmlType::Q5_0, GgmlType::Q8_0] {
        assert!(seen.contains_key(&ty), "no {ty} tensor found in the test models");
    }
    eprintln!("checked real tensors per type: {seen:?}");
}
