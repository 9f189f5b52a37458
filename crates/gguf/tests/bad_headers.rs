//! A corpus of hand-made malformed GGUF images: each must be refused with the right typed
//! [`GgufError`], never a panic, a huge allocation or a read past the end. Images are built
//! byte by byte with [`Raw`] (the writer refuses to make most of them).

use gguf::{Array, GgmlType, GgufError, GgufFile, GgufWriter, TensorSpec, Value};

/// A little-endian byte builder for GGUF images.
#[derive(Clone, Default)]
struct Raw(Vec<u8>);

impl Raw {
    /// Magic, version and the two counts.
    fn header(version: u32, n_tensors: u64, n_kv: u64) -> Raw {
        Raw::default().bytes(b"GGUF").u32(version).u64(n_tensors).u64(n_kv)
    }
    fn bytes(mut self, b: &[u8]) -> Raw {
        self.0.extend_from_slice(b);
        self
    }
    fn u8(self, x: u8) -> Raw {
        self.bytes(&[x])
    }
    fn u32(self, x: u32) -> Raw {
        self.bytes(&x.to_le_bytes())
    }
    fn u64(self, x: u64) -> Raw {
        self.bytes(&x.to_le_bytes())
    }
    fn str(self, s: &str) -> Raw {
        self.u64(s.len() as u64).bytes(s.as_bytes())
    }
    /// A key followed by a value type id (the value comes next).
    fn key(self, k: &str, ty: u32) -> Raw {
        self.str(k).u32(ty)
    }
    fn kv_u32(self, k: &str, v: u32) -> Raw {
        self.key(k, 4).u32(v)
    }
    /// A tensor info: name, dims, type id, offset.
    fn tensor(self, name: &str, dims: &[u64], ty: u32, offset: u64) -> Raw {
        let mut r = self.str(name).u32(dims.len() as u32);
        for &d in dims {
            r = r.u64(d);
        }
        r.u32(ty).u64(offset)
    }
    /// Pads to `align` and appends `n` data bytes.
    fn data(mut self, align: usize, n: usize) -> Raw {
        while !self.0.len().is_multiple_of(align) {
            self.0.push(0);
        }
        self.0.extend(std::iter::repeat_n(0x55, n));
        self
    }
    fn parse(self) -> Result<GgufFile, GgufError> {
        GgufFile::from_bytes(self.0)
    }
}

/// Asserts `r` is an error matching `pat`, printing the error otherwise.
macro_rules! refused {
    ($r:expr, $pat:pat) => {{
        match $r {
            Err(e @ $pat) => {
                // Every message must be printable and say something.
                assert!(!e.to_string().is_empty());
                e
            }
            Err(e) => panic!("wrong error: {e:?}"),
            Ok(f) => panic!("accepted a malformed file: {f:?}"),
        }
    }};
}

/// A small valid file with every kind of metadata value and two tensors.
fn valid_image() -> Vec<u8> {
    let mut w = GgufWriter::new(Vec::new());
    w.add_kv("general.architecture", Value::String("llama".into()));
    w.add_kv("llama.block_count", Value::U32(2));
    w.add_kv("llama.rope.freq_base", Value::F32(10000.0));
    w.add_kv("x.i8", Value::I8(-3));
    w.add_kv("x.u64", Value::U64(1 << 40));
    w.add_kv("x.f64", Value::F64(0.5));
    w.add_kv("x.bool", Value::Bool(true));
    w.add_kv("tokenizer.ggml.tokens", Value::Array(Array::String(vec!["<s>", "a", "bc"].into())));
    w.add_kv("tokenizer.ggml.scores", Value::Array(Array::F32(vec![0.0, -1.0, -2.0])));
    w.add_kv(
        "x.nested",
        Value::Array(Array::Array(vec![Array::U16(vec![1, 2]), Array::Bool(vec![false])])),
    );
    let spec =
        |name: &str, dims: Vec<u64>, ggml_type| TensorSpec { name: name.into(), dims, ggml_type };
    w.add_tensor(spec("tok_embd.weight", vec![32, 3], GgmlType::Q8_0)).unwrap();
    w.add_tensor(spec("norm.weight", vec![5], GgmlType::F32)).unwrap();
    w.write_header().unwrap();
    w.write_tensor(&[7u8; 3 * 34]).unwrap();
    w.write_tensor(&[9u8; 20]).unwrap();
    w.finish().unwrap()
}

#[test]
fn the_valid_image_parses() {
    let f = GgufFile::from_bytes(valid_image()).unwrap();
    assert_eq!(f.tensors.len(), 2);
    assert_eq!(f.get_array("tokenizer.ggml.tokens").unwrap().len(), 3);
    assert_eq!(f.tensor_data(f.tensor("norm.weight").unwrap()), &[9u8; 20]);
}

#[test]
fn truncation_at_every_offset_is_refused_with_the_right_error() {
    let full = valid_image();
    let f = GgufFile::from_bytes(full.clone()).unwrap();
    let header_end = f.data_offset as usize;
    // The file may end with padding after the last tensor; cutting that padding is harmless.
    let data_end =
        f.tensors.iter().map(|t| (f.data_offset + t.offset + t.size) as usize).max().unwrap();
    for k in 0..full.len() {
        let r = GgufFile::from_bytes(full[..k].to_vec());
        if k < header_end {
            // Inside the header: a read runs short, or a count no longer fits what is left. (The
            // padding before the data section is not read, so cutting it shows up as tensors
            // out of bounds.)
            match r {
                Err(
                    GgufError::Truncated { .. }
                    | GgufError::AbsurdCount { .. }
                    | GgufError::TensorOutOfBounds { .. },
                ) => {}
                other => panic!("cut at {k} of {}: {other:?}", full.len()),
            }
        } else if k < data_end {
            refused!(r, GgufError::TensorOutOfBounds { .. });
        } else {
            assert!(r.is_ok(), "cut at {k} (only end padding lost): {r:?}");
        }
    }
}

#[test]
fn every_single_byte_flip_of_the_header_is_survived() {
    // Not all flips are errors (a flipped data byte or name letter is still a valid file), but
    // none may panic, and whatever parses must keep every tensor inside the file.
    let full = valid_image();
    let header_end = GgufFile::from_bytes(full.clone()).unwrap().data_offset as usize;
    for i in 0..header_end {
        for flip in [0x01u8, 0x80, 0xff] {
            let mut b = full.clone();
            b[i] ^= flip;
            if let Ok(f) = GgufFile::from_bytes(b) {
                for t in &f.tensors {
                    assert_eq!(f.tensor_data(t).len() as u64, t.size);
                }
            }
        }
    }
}

#[test]
fn empty_and_tiny_files_are_truncated() {
    refused!(GgufFile::from_bytes(vec![]), GgufError::Truncated { .. });
    refused!(GgufFile::from_bytes(b"GGU".to_vec()), GgufError::Truncated { .. });
    refused!(GgufFile::from_bytes(b"GGUF\x03\x00".to_vec()), GgufError::Truncated { .. });
}

#[test]
fn wrong_magic_is_refused() {
    let e = refused!(
        Raw::default().bytes(b"GGML").u32(3).u64(0).u64(0).parse(),
        GgufError::BadMagic(_)
    );
    assert!(e.to_string().contains("GGUF"));
    refused!(
        Raw::default().bytes(b"\0\0\0\0").u32(3).u64(0).u64(0).parse(),
        GgufError::BadMagic(_)
    );
}

#[test]
fn unsupported_versions_are_refused() {
    for v in [0u32, 1, 4, 0x0300_0000, u32::MAX] {
        refused!(Raw::header(v, 0, 0).parse(), GgufError::UnsupportedVersion(_));
    }
    // Versions 2 and 3 both read (v2 has the same 64-bit layout as v3).
    for v in [2u32, 3] {
        let f = Raw::header(v, 1, 1)
            .kv_u32("a.b", 1)
            .tensor("t", &[4], 0, 0)
            .data(32, 16)
            .parse()
            .unwrap();
        assert_eq!(f.version, v);
    }
}

#[test]
fn counts_that_cannot_fit_in_the_file_are_refused_before_allocating() {
    refused!(Raw::header(3, 0, u64::MAX).parse(), GgufError::AbsurdCount { .. });
    refused!(Raw::header(3, u64::MAX, 0).parse(), GgufError::AbsurdCount { .. });
    refused!(Raw::header(3, 1 << 40, 1).kv_u32("a", 1).parse(), GgufError::AbsurdCount { .. });
    refused!(Raw::header(3, 0, 2).kv_u32("a", 1).parse(), GgufError::AbsurdCount { .. });
}

#[test]
fn absurd_string_lengths_are_refused() {
    // Key length far past the end.
    refused!(
        Raw::header(3, 0, 1).u64(u64::MAX).u32(4).u32(0).parse(),
        GgufError::AbsurdCount { .. }
    );
    // Key length one past the end.
    let r = Raw::header(3, 0, 1).u64(14).bytes(b"abc").u32(4).u32(0);
    refused!(r.parse(), GgufError::AbsurdCount { .. } | GgufError::Truncated { .. });
    // A string value claiming 2^63 bytes.
    refused!(
        Raw::header(3, 0, 1).key("s", 8).u64(1 << 63).bytes(b"xx").parse(),
        GgufError::AbsurdCount { .. }
    );
    // A tensor name longer than any real one (and than the limit), present in full.
    let long = "n".repeat((1 << 16) + 1);
    refused!(
        Raw::header(3, 1, 0).tensor(&long, &[4], 0, 0).data(32, 16).parse(),
        GgufError::AbsurdCount { .. }
    );
    // A key longer than the limit.
    refused!(Raw::header(3, 0, 1).key(&long, 4).u32(1).parse(), GgufError::AbsurdCount { .. });
}

#[test]
fn absurd_array_lengths_are_refused() {
    for (elem, n) in
        [(4u32, 1u64 << 60), (8, 1 << 40), (0, u64::MAX), (9, 1 << 50), (12, u64::MAX / 8 + 1)]
    {
        let r = Raw::header(3, 0, 1).key("a", 9).u32(elem).u64(n).u64(0);
        refused!(r.parse(), GgufError::AbsurdCount { .. });
    }
    // An array of strings whose count fits but whose strings do not.
    let r = Raw::header(3, 0, 1).key("a", 9).u32(8).u64(2).u64(1).bytes(b"x").u64(1000).bytes(b"y");
    refused!(r.parse(), GgufError::AbsurdCount { .. } | GgufError::Truncated { .. });
}

#[test]
fn nested_arrays_read_and_deep_nesting_is_refused() {
    // [[1, 2], [3]] of u8 reads.
    let r = Raw::header(3, 0, 1)
        .key("n", 9)
        .u32(9)
        .u64(2)
        .u32(0)
        .u64(2)
        .u8(1)
        .u8(2)
        .u32(0)
        .u64(1)
        .u8(3);
    let f = r.parse().unwrap();
    assert_eq!(
        f.get_array("n"),
        Some(&Array::Array(vec![Array::U8(vec![1, 2]), Array::U8(vec![3])]))
    );
    // 64 levels of one-element arrays: refused by depth, not by stack overflow.
    let mut r = Raw::header(3, 0, 1).key("deep", 9);
    for _ in 0..64 {
        r = r.u32(9).u64(1);
    }
    r = r.u32(0).u64(0);
    refused!(r.parse(), GgufError::BadValue { .. });
}

#[test]
fn unknown_value_types_are_refused() {
    refused!(
        Raw::header(3, 0, 1).key("a", 13).u32(0).parse(),
        GgufError::BadValueType { id: 13, .. }
    );
    refused!(
        Raw::header(3, 0, 1).key("a", u32::MAX).u32(0).parse(),
        GgufError::BadValueType { .. }
    );
    refused!(
        Raw::header(3, 0, 1).key("a", 9).u32(99).u64(0).parse(),
        GgufError::BadValueType { id: 99, .. }
    );
}

#[test]
fn bad_values_are_refused() {
    refused!(Raw::header(3, 0, 1).key("b", 7).u8(2).parse(), GgufError::BadValue { .. });
    refused!(
        Raw::header(3, 0, 1).key("b", 9).u32(7).u64(2).u8(1).u8(9).parse(),
        GgufError::BadValue { .. }
    );
    refused!(
        Raw::header(3, 0, 1).u64(2).bytes(&[0xc3, 0x28]).u32(4).u32(0).parse(),
        GgufError::BadUtf8 { .. }
    );
    refused!(
        Raw::header(3, 0, 1).key("s", 8).u64(1).bytes(&[0xff]).parse(),
        GgufError::BadUtf8 { .. }
    );
}

#[test]
fn duplicate_keys_and_tensor_names_are_refused() {
    let e = refused!(
        Raw::header(3, 0, 2).kv_u32("a.b", 1).kv_u32("a.b", 2).parse(),
        GgufError::DuplicateKey(_)
    );
    assert!(e.to_string().contains("a.b"));
    let r = Raw::header(3, 2, 0).tensor("w", &[4], 0, 0).tensor("w", &[4], 0, 32).data(32, 64);
    let e = refused!(r.parse(), GgufError::DuplicateTensor(_));
    assert!(e.to_string().contains("\"w\""));
}

#[test]
fn bad_alignment_is_refused() {
    for a in [0u32, 3, 48, 1 << 31] {
        refused!(
            Raw::header(3, 0, 1).kv_u32("general.alignment", a).parse(),
            GgufError::BadAlignment(_)
        );
    }
    // The wrong value type.
    refused!(
        Raw::header(3, 0, 1).key("general.alignment", 8).str("32").parse(),
        GgufError::BadAlignment(_)
    );
    // A good non-default alignment is honoured.
    let f = Raw::header(3, 1, 1)
        .kv_u32("general.alignment", 64)
        .tensor("t", &[4], 0, 0)
        .data(64, 16)
        .parse()
        .unwrap();
    assert_eq!(f.alignment, 64);
    assert_eq!(f.data_offset % 64, 0);
}

#[test]
fn bad_dimension_counts_are_refused() {
    for dims in [&[][..], &[1, 1, 1, 1, 32][..]] {
        let r = Raw::header(3, 1, 0).tensor("t", dims, 0, 0).data(32, 64);
        refused!(r.parse(), GgufError::BadTensor { .. });
    }
    // A count far beyond 4 is refused before the dims are read.
    let r = Raw::header(3, 1, 0).str("t").u32(u32::MAX).u64(1).data(32, 64);
    refused!(r.parse(), GgufError::BadTensor { .. });
}

#[test]
fn unknown_tensor_types_are_refused() {
    // 4 and 5 are the retired Q4_2/Q4_3; 31..33 never existed.
    for id in [4u32, 5, 31, 1000, u32::MAX] {
        let r = Raw::header(3, 1, 0).tensor("t", &[32], id, 0).data(32, 64);
        let e = refused!(r.parse(), GgufError::UnknownTensorType { .. });
        assert!(e.to_string().contains(&id.to_string()));
    }
}

#[test]
fn overflowing_tensor_sizes_are_refused() {
    // dims product overflows u64.
    let r = Raw::header(3, 1, 0).tensor("t", &[1 << 32, 1 << 32, 2], 0, 0).data(32, 32);
    let e = refused!(r.parse(), GgufError::ShapeOverflow { what: "product of dimensions", .. });
    assert!(e.to_string().contains("\"t\"") && e.to_string().contains("re-convert"), "{e}");
    // elements fit, bytes (× 4 for f32) do not.
    let r = Raw::header(3, 1, 0).tensor("t", &[1 << 62, 2], 0, 0).data(32, 32);
    refused!(r.parse(), GgufError::ShapeOverflow { what: "row size in bytes", .. });
    let r = Raw::header(3, 1, 0).tensor("t", &[2, 1 << 61], 0, 0).data(32, 32);
    refused!(r.parse(), GgufError::ShapeOverflow { what: "size in bytes", .. });
    // Q8_0: (n / 32) × 34 overflows.
    let r = Raw::header(3, 1, 0).tensor("t", &[1 << 63], 8, 0).data(32, 32);
    refused!(r.parse(), GgufError::ShapeOverflow { .. });
    // A row that is not whole blocks.
    let r = Raw::header(3, 1, 0).tensor("t", &[100], 12, 0).data(32, 1024);
    refused!(r.parse(), GgufError::BadTensor { .. });
}

#[test]
fn a_zero_dimension_does_not_hide_an_overflowing_row_count() {
    // Zero elements and zero bytes, but rows = 2^40 × 2^40 would overflow: refused.
    let r = Raw::header(3, 1, 0).tensor("t", &[0, 1 << 40, 1 << 40], 0, 0).data(32, 0);
    refused!(r.parse(), GgufError::ShapeOverflow { what: "product of dimensions", .. });
    let r = Raw::header(3, 1, 0).tensor("t", &[32, 0, u64::MAX], 0, 0).data(32, 0);
    refused!(r.parse(), GgufError::ShapeOverflow { .. });
    // A zero row length with a large but representable row count is exact.
    let f = Raw::header(3, 1, 0).tensor("t", &[0, 1 << 40], 0, 0).data(32, 0).parse().unwrap();
    assert_eq!(f.tensors[0].rows_cols(), (1 << 40, 0));
    assert_eq!(f.tensors[0].n_elements(), 0);
}

#[test]
fn the_totals_over_all_tensors_cannot_overflow() {
    // Each tensor is valid on its own (2^62 - 32 bytes of i8); five of them add up past 2^64.
    // The header is refused before the data section is looked at (`snug inspect` sums these).
    let mut r = Raw::header(3, 5, 0);
    for name in ["a", "b", "c", "d", "e"] {
        r = r.tensor(name, &[(1 << 62) - 32], 24, 0);
    }
    let e = refused!(r.data(32, 0).parse(), GgufError::ShapeOverflow { .. });
    assert!(e.to_string().contains("\"e\""), "{e}");
}

#[test]
fn accessors_on_hand_built_tensor_infos_saturate_instead_of_overflowing() {
    let t = gguf::TensorInfo {
        name: "x".into(),
        dims: vec![0, u64::MAX, u64::MAX],
        ggml_type: GgmlType::F32,
        offset: u64::MAX,
        size: u64::MAX,
    };
    assert_eq!(t.n_elements(), 0);
    assert_eq!(t.rows_cols(), (usize::MAX, 0));
    let f = GgufFile::from_bytes(valid_image()).unwrap();
    assert!(f.tensor_data(&t).is_empty(), "a foreign tensor past the file reads as empty");
}

#[test]
fn u64_arrays_past_i64_max_are_not_wrapped_to_negative() {
    assert_eq!(Array::U64(vec![1, 1 << 63]).to_i64s(), None);
    assert_eq!(Array::U64(vec![1, i64::MAX as u64]).to_i64s(), Some(vec![1, i64::MAX]));
}

#[test]
fn tensors_outside_the_data_section_are_refused() {
    // One byte short.
    let r = Raw::header(3, 1, 0).tensor("t", &[8], 0, 0).data(32, 31);
    let e = refused!(r.parse(), GgufError::TensorOutOfBounds { .. });
    assert!(e.to_string().contains("\"t\""));
    // Offset past the end.
    let r = Raw::header(3, 1, 0).tensor("t", &[8], 0, 1 << 20).data(32, 64);
    refused!(r.parse(), GgufError::TensorOutOfBounds { .. });
    // offset + size overflows u64.
    let r = Raw::header(3, 1, 0).tensor("t", &[8], 0, u64::MAX - 31).data(32, 64);
    refused!(r.parse(), GgufError::TensorOutOfBounds { .. });
    // Unaligned offset.
    let r = Raw::header(3, 1, 0).tensor("t", &[8], 0, 4).data(32, 64);
    refused!(r.parse(), GgufError::BadTensor { .. });
}

#[test]
fn zero_sized_tensors_are_not_a_crash() {
    let f = Raw::header(3, 1, 0).tensor("t", &[0, 7], 0, 0).data(32, 0).parse().unwrap();
    assert_eq!(f.tensor_data(&f.tensors[0]).len(), 0);
}

#[test]
fn missing_files_are_io_errors_naming_the_path() {
    let e = refused!(GgufFile::open("/nonexistent/snug/model.gguf"), GgufError::Io { .. });
    assert!(e.to_string().contains("/nonexistent/snug/model.gguf"));
    refused!(GgufFile::open("/"), GgufError::Io { .. });
}

#[test]
fn a_file_on_disk_with_a_bad_header_is_refused_like_bytes() {
    let dir = std::env::temp_dir().join(format!("snug-bad-header-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("short.gguf");
    let full = valid_image();
    std::fs::write(&p, &full[..full.len() / 2]).unwrap();
    let r = GgufFile::open(&p);
    std::fs::remove_dir_all(&dir).unwrap();
    refused!(
        r,
        GgufError::TensorOutOfBounds { .. }
            | GgufError::Truncated { .. }
            | GgufError::AbsurdCount { .. }
    );
}
