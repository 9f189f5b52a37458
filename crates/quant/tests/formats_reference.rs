//! snug's scalar dequantize/quantize against reference vectors made by gguf-py
//! (`scripts/gen_quant_fixtures.py`, provenance in `fixtures/manifest.json` and
//! `fixtures/README.md`), and llama.cpp's own reference quantizers (`manifest_ggml.json`).
//! Dequantize must be bit-identical; quantize byte-identical.

use std::path::{Path, PathBuf};

use quant::{dequantize_row, GgmlType};
use serde_json::Value;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn manifest(file: &str) -> Value {
    let path = fixtures().join(file);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}; run scripts/gen_quant_fixtures.py", path.display()));
    serde_json::from_str(&text).expect("manifest.json is valid JSON")
}

/// (type, n_values, first file bytes, second file bytes) for each entry of a manifest section.
fn entries(file: &str, section: &str) -> Vec<(GgmlType, usize, Vec<u8>, Vec<u8>)> {
    let m = manifest(file);
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
    let all = entries("manifest.json", "blocks");
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
        assert!(
            mismatches.is_empty(),
            "{ty}: first mismatches (index, snug, gguf-py): {mismatches:?}"
        );
    }
}

#[test]
fn dequantize_block_by_block_matches_whole_row() {
    // Rows of one block each must give the same values as one long row: no state across blocks.
    for (ty, n, raw, expected) in entries("manifest.json", "blocks") {
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

#[test]
fn quantize_is_byte_identical_to_gguf_py_where_it_quantizes() {
    let all = entries("manifest.json", "quantize");
    assert_eq!(all.len(), 7, "F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0");
    assert_quantize_matches(all, "gguf-py");
}

#[test]
fn quantize_is_byte_identical_to_llama_cpp_reference_quantizers() {
    // quantize_row_*_ref from libggml-base (see manifest_ggml.json for the build).
    let all = entries("manifest_ggml.json", "quantize");
    assert_eq!(all.len(), 14, "every block format snug quantizes");
    assert_quantize_matches(all, "ggml");
}

fn assert_quantize_matches(all: Vec<(GgmlType, usize, Vec<u8>, Vec<u8>)>, reference: &str) {
    for (ty, n, input, expected) in all {
        let x = f32s(&input);
        assert_eq!(x.len(), n, "{ty}");
        let mut got = vec![0u8; ty.row_bytes(n).unwrap()];
        quant::quantize_row(ty, &x, &mut got).unwrap_or_else(|e| panic!("{ty}: {e}"));
        assert_eq!(got.len(), expected.len(), "{ty}");
        let bs = ty.type_size();
        let diff: Vec<_> = (0..got.len() / bs)
            .filter(|&b| got[b * bs..(b + 1) * bs] != expected[b * bs..(b + 1) * bs])
            .collect();
        assert!(diff.is_empty(), "{ty}: blocks differing from {reference}: {diff:?}");
    }
}
