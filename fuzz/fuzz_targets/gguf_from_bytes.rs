//! Fuzz the GGUF header parser: any byte string must parse or give a `GgufError` — never a panic,
//! an out-of-bounds read or a huge allocation (libFuzzer's -rss_limit_mb catches the last). What
//! parses must be self-consistent, and writing it back must be a fixed point.

#![no_main]

use gguf::{GgufFile, GgufWriter, TensorSpec};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(f) = GgufFile::from_bytes(data.to_vec()) else { return };
    for t in &f.tensors {
        assert_eq!(f.tensor_data(t).len() as u64, t.size);
        assert!(f.tensor(&t.name).is_some());
        let _ = t.rows_cols();
    }
    for (k, v) in &f.metadata {
        assert!(f.get(k).is_some());
        let _ = (v.as_u64(), v.as_i64(), v.as_f64(), v.as_bool(), v.as_str());
        if let Some(a) = v.as_array() {
            let _ = (a.len(), a.to_i64s(), a.as_strings(), a.as_f32s());
        }
    }
    // Re-writing is a fixed point after one round (the writer packs tensors and pads, so the
    // first rewrite may differ from the input; the second must equal the first).
    let once = rewrite(&f);
    let g = GgufFile::from_bytes(once.clone()).expect("writer output must parse");
    assert_eq!(rewrite(&g), once);
});

fn rewrite(f: &GgufFile) -> Vec<u8> {
    let mut w = GgufWriter::new(Vec::new());
    for (k, v) in &f.metadata {
        w.add_kv(k.clone(), v.clone());
    }
    for t in &f.tensors {
        w.add_tensor(TensorSpec {
            name: t.name.clone(),
            dims: t.dims.clone(),
            ggml_type: t.ggml_type,
        })
        .expect("a parsed tensor is writable");
    }
    w.write_header().expect("write header");
    for t in &f.tensors {
        w.write_tensor(f.tensor_data(t)).expect("write tensor");
    }
    w.finish().expect("finish")
}
