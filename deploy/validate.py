"""Validates the manifests of deploy/kubernetes offline (run by crates/cli/tests/deploy_manifests.rs).

    python3 deploy/validate.py [FILE.yaml ...]     (default: every deploy/kubernetes/*.yaml)

- Kubernetes' own kinds (Deployment, Service, ConfigMap, RBAC...): against the API's JSON
  schemas that PyPI `kubernetes-validate` bundles, strictly (an unknown field is an error).
- InferencePool and HTTPRoute: against the openAPIV3Schema of their CRDs, vendored in
  deploy/crds (from kubernetes-sigs/gateway-api-inference-extension and
  kubernetes-sigs/gateway-api), with PyPI `jsonschema`; unknown fields are errors here too
  (the API server would drop them silently). The CRDs' CEL rules (x-kubernetes-validations)
  are not evaluated.
- The endpoint picker's EndpointPickerConfig (in a ConfigMap): its shape, that every profile
  refers to declared plugins, and that it scores by queue, KV use and LoRA affinity, the
  signals snug exports.
- With $SNUG_BIN set (the binary under test): every `--flag` a container named `snug` passes
  to `snug serve` is one `snug serve --help` lists.

Prints one line per document and exits non-zero if any is invalid. Needs no network.
"""

import copy
import glob
import os
import re
import subprocess
import sys

import jsonschema
import kubernetes_validate
import yaml

FLAGS = None
HERE = os.path.dirname(os.path.abspath(__file__))
K8S_VERSION = "1.37.0"
CRDS = {
    ("inference.networking.k8s.io/v1", "InferencePool"): "inference.networking.k8s.io_inferencepools.yaml",
    ("gateway.networking.k8s.io/v1", "HTTPRoute"): "gateway.networking.k8s.io_httproutes.yaml",
}

# EndpointPickerConfig as the picker reads it (plugins, then scheduling profiles naming them).
EPP_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "plugins", "schedulingProfiles"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "inference.networking.x-k8s.io/v1alpha1"},
        "kind": {"const": "EndpointPickerConfig"},
        "featureGates": {"type": "array", "items": {"type": "string"}},
        "plugins": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["type"],
                "additionalProperties": False,
                "properties": {
                    "name": {"type": "string", "minLength": 1},
                    "type": {"type": "string", "minLength": 1},
                    "parameters": {"type": "object"},
                },
            },
        },
        "schedulingProfiles": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["name", "plugins"],
                "additionalProperties": False,
                "properties": {
                    "name": {"type": "string", "minLength": 1},
                    "plugins": {
                        "type": "array",
                        "minItems": 1,
                        "items": {
                            "type": "object",
                            "required": ["pluginRef"],
                            "additionalProperties": False,
                            "properties": {
                                "pluginRef": {"type": "string"},
                                "weight": {"type": "integer", "minimum": 0},
                            },
                        },
                    },
                },
            },
        },
    },
}
EPP_SCORERS = {"queue-scorer", "kv-cache-utilization-scorer", "lora-affinity-scorer"}


def strict(schema):
    """`schema` with `additionalProperties: false` on every object that lists its properties
    and does not keep unknown fields: what `kubectl apply --validate=strict` refuses."""
    s = copy.deepcopy(schema)

    def walk(node):
        if isinstance(node, dict):
            if (
                node.get("type") == "object"
                and "properties" in node
                and "additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields")
            ):
                node["additionalProperties"] = False
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(s)
    return s


def crd_schema(file, version):
    with open(os.path.join(HERE, "crds", file)) as f:
        crd = yaml.safe_load(f)
    for v in crd["spec"]["versions"]:
        if v["name"] == version:
            schema = strict(v["schema"]["openAPIV3Schema"])
            # metadata is the API server's ObjectMeta: checked by name only here.
            schema["properties"]["metadata"] = {
                "type": "object",
                "required": ["name"],
                "properties": {"name": {"type": "string", "minLength": 1}},
            }
            return schema
    raise SystemExit(f"{file} has no version {version}")


def errors(schema, doc):
    v = jsonschema.Draft7Validator(schema)
    return [f"{'.'.join(str(p) for p in e.absolute_path) or '(root)'}: {e.message}" for e in v.iter_errors(doc)]


def check_epp(text):
    cfg = yaml.safe_load(text)
    errs = errors(EPP_SCHEMA, cfg)
    if errs:
        return errs
    declared = {p.get("name", p["type"]): p["type"] for p in cfg["plugins"]}
    for prof in cfg["schedulingProfiles"]:
        for ref in prof["plugins"]:
            if ref["pluginRef"] not in declared:
                errs.append(f"profile {prof['name']}: pluginRef {ref['pluginRef']} is not a declared plugin")
    used = {declared.get(r["pluginRef"]) for p in cfg["schedulingProfiles"] for r in p["plugins"]}
    missing = EPP_SCORERS - used
    if missing:
        errs.append(f"no profile uses {sorted(missing)}")
    return errs


def serve_flags():
    """The long flags `$SNUG_BIN serve --help` lists, or None without $SNUG_BIN."""
    exe = os.environ.get("SNUG_BIN")
    if not exe:
        return None
    out = subprocess.run([exe, "serve", "--help"], capture_output=True, text=True, check=True).stdout
    return set(re.findall(r"--[a-z][a-z0-9-]*", out))


def check_snug_args(doc, known):
    errs = []
    pod = doc.get("spec", {}).get("template", {}).get("spec", {})
    for c in pod.get("containers", []):
        if c.get("name") != "snug" or known is None:
            continue
        args = c.get("args", [])
        if args[:1] != ["serve"]:
            errs.append(f"container snug: args must start with serve, not {args[:1]}")
        for a in args:
            flag = a.split("=", 1)[0]
            if flag.startswith("--") and flag not in known:
                errs.append(f"container snug: `snug serve` has no flag {flag}")
    return errs


def check(doc):
    key = (doc.get("apiVersion"), doc.get("kind"))
    if key in CRDS:
        return errors(crd_schema(CRDS[key], key[0].split("/")[1]), doc)
    try:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as e:
        return [f"{'.'.join(str(p) for p in e.path) or '(root)'}: {e.message}"]
    except kubernetes_validate.SchemaNotFoundError:
        return [f"no Kubernetes {K8S_VERSION} schema for {key[0]} {key[1]} (nor a vendored CRD)"]
    errs = []
    if key == ("apps/v1", "Deployment"):
        errs += check_snug_args(doc, FLAGS)
    if key == ("v1", "ConfigMap"):
        for name, text in (doc.get("data") or {}).items():
            if "kind: EndpointPickerConfig" in text:
                errs += [f"data.{name}: {e}" for e in check_epp(text)]
    return errs


def main(files):
    global FLAGS
    FLAGS = serve_flags()
    bad = 0
    for path in files:
        with open(path) as f:
            docs = [d for d in yaml.safe_load_all(f) if d]
        for doc in docs:
            what = f"{os.path.basename(path)}: {doc.get('kind')} {doc.get('metadata', {}).get('name')}"
            errs = check(doc)
            print(f"{'ok ' if not errs else 'BAD'} {what}")
            for e in errs:
                print(f"    {e}")
            bad += bool(errs)
    if bad:
        print(f"{bad} invalid documents")
        sys.exit(1)


if __name__ == "__main__":
    main(sys.argv[1:] or sorted(glob.glob(os.path.join(HERE, "kubernetes", "*.yaml"))))
