//! The Kubernetes manifests of deploy/ validate offline (deploy/validate.py): Kubernetes' own
//! kinds against the API schemas PyPI `kubernetes-validate` bundles, InferencePool and
//! HTTPRoute against their vendored CRDs with PyPI `jsonschema`, the endpoint picker's config
//! by its shape, and the flags the Deployment passes to `snug serve` against this binary's
//! `--help`. A manifest broken on purpose must fail, so the check can fail.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn deploy() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy")
}

fn validate(files: &[&Path]) -> Output {
    let out = Command::new("python3")
        .arg(deploy().join("validate.py"))
        .args(files)
        .env("SNUG_BIN", env!("CARGO_BIN_EXE_snug"))
        .output()
        .expect("python3 runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !err.contains("No module named"),
        "PyPI kubernetes-validate or jsonschema is missing (scripts/test.sh installs them)\n{err}"
    );
    out
}

#[test]
fn the_deploy_manifests_validate_against_the_kubernetes_and_gateway_schemas() {
    let out = validate(&[]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    for kind in ["Deployment snug", "Service snug", "InferencePool snug", "HTTPRoute snug"] {
        let ok = text.lines().any(|l| l.starts_with("ok ") && l.ends_with(kind));
        assert!(ok, "{kind} was not checked:\n{text}");
    }
}

#[test]
fn a_broken_manifest_fails_validation() {
    let dir = std::env::temp_dir().join(format!("snug-deploy-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let read = |f: &str| std::fs::read_to_string(deploy().join("kubernetes").join(f)).unwrap();
    let cases = [
        // A Kubernetes field misspelt, a CRD field misspelt, a flag snug does not have, a picker
        // profile naming no plugin.
        ("snug.yaml", "readinessProbe:", "readynessProbe:", "readynessProbe"),
        ("gateway.yaml", "targetPorts:", "targetPort:", "targetPort"),
        ("snug.yaml", "--drain-timeout=30", "--drain-time=30", "--drain-time"),
        (
            "gateway.yaml",
            "pluginRef: lora-affinity-scorer",
            "pluginRef: lora-scorer",
            "lora-scorer",
        ),
    ];
    for (file, from, to, named) in cases {
        let text = read(file);
        assert!(text.contains(from), "{file} has no {from:?}");
        let bad = dir.join(file);
        std::fs::write(&bad, text.replacen(from, to, 1)).unwrap();
        let out = validate(&[&bad]);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(!out.status.success(), "{file} with {to:?} passed:\n{text}");
        assert!(text.contains(named), "the failure does not name {named}:\n{text}");
    }
    let _ = std::fs::remove_dir_all(dir);
}
