//! Every input the fuzzer (`fuzz/`, target `gguf_from_bytes`) ever stopped on, kept as a file
//! under `tests/fixtures/fuzz/` and replayed here with the typed error it must now give. A new
//! finding is one more fixture and one more row in [`FINDINGS`].

use gguf::{GgufError, GgufFile};

/// A fixture file and the check its parse result must pass.
struct Finding {
    file: &'static str,
    expect: fn(&Result<GgufFile, GgufError>) -> bool,
}

const FINDINGS: &[Finding] = &[
    // The file of issue 18 (its hex, 119 bytes): dims [0, 7597121142116319232,
    // 7813014621416220026, 32491004194944046] — zero elements (so zero bytes) but a row count
    // that overflowed in `TensorInfo::rows_cols`.
    Finding {
        file: "rows_cols_overflow.gguf",
        expect: |r| {
            matches!(r, Err(GgufError::ShapeOverflow { what: "product of dimensions", dims, .. })
                if dims[..] == [0, 7597121142116319232, 7813014621416220026, 32491004194944046])
        },
    },
    // general.alignment 2^30 in a 123-byte file without tensors: the data section began 1 GiB
    // past the end of the file (and rewriting the file allocated 1 GiB of padding at once).
    // It is read, with the data section empty at the end of the file.
    Finding {
        file: "huge_alignment_no_tensors.gguf",
        expect: |r| {
            r.as_ref().is_ok_and(|f| f.alignment == 1 << 30 && f.data_offset == f.file_len())
        },
    },
];

#[test]
fn every_fuzz_finding_gives_its_typed_error() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/fuzz");
    let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    on_disk.sort();
    let mut listed: Vec<String> = FINDINGS.iter().map(|f| f.file.to_string()).collect();
    listed.sort();
    assert_eq!(on_disk, listed, "each fixture in {} has a row in FINDINGS", dir.display());
    for f in FINDINGS {
        let r = GgufFile::from_bytes(std::fs::read(dir.join(f.file)).unwrap());
        assert!((f.expect)(&r), "{}: {r:?}", f.file);
        // And the message tells the user what to do.
        if let Err(e) = r {
            assert!(e.to_string().contains("re-download"), "{}: {e}", f.file);
        }
    }
}
