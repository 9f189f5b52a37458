#!/usr/bin/env bash
# Regenerates testdata/agreement/: a tiny random-weight GGUF per new architecture (written by
# `snug synth`) and llama.cpp's log-probabilities on it (`llama-perplexity
# --kl-divergence-base`), which crates/engine/tests/agreement.rs compares snug's logits with
# (through `engine::kl_divergence`, as `snug perplexity MODEL --kl-divergence-base FILE` does).
#
# Needs: target/ci/snug (`cargo build --profile ci -p snug`) and llama.cpp's binaries
# (../shared/tools/build-llamacpp.sh puts them in ~/.cache/llamacpp/bin; LLAMA_BIN overrides).
# `--repack 0` (`-nr`): on VMs whose CPU advertises AMX but faults on it, llama.cpp's default
# repacked/AMX weight buffers die with SIGILL.
#
# Every output matrix has values N(0, 0.5) (`--output-std 0.5`, the others N(0, 0.02)) so the
# next-token distributions are peaked and top-1 agreement is meaningful; `--exact` quantizes
# every row, so no two vocabulary rows are equal.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${LLAMA_BIN:-$HOME/.cache/llamacpp/bin}
SNUG=${SNUG:-target/ci/snug}
OUT=testdata/agreement
CORPUS=testdata/refdata/corpus_dev.txt
mkdir -p "$OUT"
for shape in ${SHAPES:-tiny-qwen3 tiny-qwen3moe tiny-qwen2moe tiny-phi4 tiny-smollm3 tiny-llama}; do
    "$SNUG" synth --shape "$shape" --quant "${QUANT:-q8_0}" --exact --output-std 0.5 --seed 34 \
        -o "$OUT/$shape.gguf"
    "$BIN/llama-perplexity" -m "$OUT/$shape.gguf" -f "$CORPUS" -c 512 -b 512 --chunks 3 \
        -t 2 -nr --kl-divergence-base "$OUT/$shape.kld" > "$OUT/$shape.log" 2>&1
    grep -E "Final estimate|build:" "$OUT/$shape.log" || true
    rm "$OUT/$shape.log"
done
sha256sum "$OUT"/*.gguf "$OUT"/*.kld
