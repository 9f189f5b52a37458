#!/usr/bin/env bash
# Agreement with llama.cpp at real shapes (issue 34): for each shape, a conditioned random-weight
# file (`snug synth --conditioned`, Q4_K_M, the tokenizer of qwen2.5-coder-0.5b), llama.cpp's
# log-probabilities on it (`llama-perplexity --kl-divergence-base`, default flash attention), then
#   - llama.cpp against its own base with flash attention off: how far llama.cpp moves from
#     itself by one switch (the floor any second engine meets, as the activations' 8-bit
#     rounding turns any rounding difference into a different rounding);
#   - snug against the base (`snug perplexity --kl-divergence-base`).
# Prints one line per shape: top-1 agreement and mean KL for both.
#
#   scripts/agreement-shapes.sh [SHAPE...]   (default: the issue's five; DIR=/work/models)
#
# Needs target/release/snug and llama.cpp's binaries (../shared/tools/build-llamacpp.sh puts
# them in ~/.cache/llamacpp/bin; LLAMA_BIN overrides). Disk: the files (0.4–18.6 GB each) stay in
# $DIR. Time on 2 cores: minutes per shape (qwen3-30b-a3b: its 18.6 GB must fit the page cache).
# Not a test: CI does not run it.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${LLAMA_BIN:-$HOME/.cache/llamacpp/bin}
SNUG=${SNUG:-target/release/snug}
DIR=${DIR:-/work/models}
CORPUS=testdata/refdata/corpus_dev.txt
EXTRA=${LLAMA_ARGS:-}   # e.g. "-nr" where the CPU advertises AMX but faults on it
mkdir -p "$DIR"
shapes=("$@")
[ ${#shapes[@]} -gt 0 ] || shapes=(qwen3-0.6b smollm3-3b phi-4-mini qwen3-8b qwen3-30b-a3b)
for shape in "${shapes[@]}"; do
    model="$DIR/$shape-conditioned.gguf"
    [ -f "$model" ] || "$SNUG" synth --shape "$shape" --tokenizer-from qwen2.5-coder-0.5b \
        --conditioned --seed 34 -o "$model"
    run=(-m "$model" -f "$CORPUS" -c 512 -b 512 --chunks 3 -t 2 $EXTRA)
    "$BIN/llama-perplexity" "${run[@]}" --kl-divergence-base "$model.kld" > "$model.base.log" 2>&1
    "$BIN/llama-perplexity" "${run[@]}" -fa off --kl-divergence --kl-divergence-base "$model.kld" \
        > "$model.off.log" 2>&1
    self_top=$(grep -oE 'Same top p: *[0-9.]+' "$model.off.log" | grep -oE '[0-9.]+$')
    self_kl=$(grep -E 'Mean +KLD' "$model.off.log" | grep -oE '[0-9.]+' | head -1)
    snug=$("$SNUG" perplexity "$model" -t 2 --kl-divergence-base "$model.kld" 2>&1 | tail -1 \
        | grep -oE 'top-1 agreement [0-9.]+ ± [0-9.]+%, mean KL [0-9.]+')
    echo "$shape: snug $snug; llama.cpp FA off vs on: top-1 $self_top%, mean KL $self_kl"
done
