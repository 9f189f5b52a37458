//! snug's scalar dequantize/quantize against reference vectors made by gguf-py
//! (`scripts/gen_quant_fixtures.py`, provenance in `fixtures/manifest.json` and
//! `fixtures/README.md`). Dequantize must be bit-identical; quantize byte-identical.

use std::path::{Path, PathBuf};

use quant::{dequantize_row, GgmlType};
use serde_json::Value;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn manifest() -> Value {
    let path = fixtures().join("manifest.json");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}; run scripts/gen_quant_fixtures.py", path.display()));
    serde_json::from_str(&text).expect("manifest.json is valid JSON")
}

/// (type, n_values, first file bytes, second file bytes) for each entry of a manifest section.
fn entries(section: &str) -> Vec<(GgmlType, usize, Vec<u8>, Vec<u8>)> {
    let m = manifest();
    let list = m[section].as_array().unwrap_or_else(|| panic!("manifest has no {section}"));
    list.iter()
        .map(|e| {
            let id = e["id"].as_u64().expect("id") as u32;
            let ty = GgmlType::from_id(id).unwrap_or_else(|| panic!("unknown ggml id {id}"));
            let n = e["n_values"].as_u64().expect("n_values") as usize;
            let read = |i: usize| {
                let rel = e["files"][i].as_str().expect("file name");
                std::fs::read(fixtures().join(rel)).unwrap_or_else(|err| panic!("{rel}: {err}"))
            };
            (ty, n, read(0), read(1))
        })
        .collect()
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
}

#[test]
fn dequantize_is_bit_identical_to_gguf_py_for_every_format() {
    let all = entries("blocks");
    assert_eq!(all.len(), 17, "one fixture per supported format");
    for (ty, n, raw, expected) in all {
        let expected = f32s(&expected);
        assert_eq!(expected.len(), n, "{ty}");
        let mut got = vec![f32::NAN; n];
        dequantize_row(ty, &raw, &mut got).unwrap_or_else(|e| panic!("{ty}: {e}"));
        let mismatches: Vec<_> = (0..n)
            .filter(|&i| got[i].to_bits() != expected[i].to_bits())
            .take(5)
            .map(|i| (i, got[i], expected[i]))
            .collect();
        assert!(mismatches.is_empty(), "{ty}: first mismatches (index, snug, gguf-py): {mismatches:?}");
    }
}

#[test]
fn dequantize_block_by_block_matches_whole_row() {
    // Rows of one block each must give the same values as one long row: no state across blocks.
    for (ty, n, raw, expected) in entries("blocks") {
        let expected = f32s(&expected);
        let (bs, ts) = (ty.block_size().max(64), ty.row_bytes(ty.block_size().max(64)).unwrap());
        for (i, (src, want)) in raw.chunks_exact(ts).zip(expected.chunks_exact(bs)).enumerate() {
            let mut got = vec![0f32; bs];
            dequantize_row(ty, src, &mut got).unwrap();
            let same = got.iter().zip(want).all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "{ty}: chunk {i} of {n} values differs");
        }
    }
}
