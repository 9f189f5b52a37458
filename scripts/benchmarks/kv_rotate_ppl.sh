#!/usr/bin/env bash
# Perplexity and mean KL against snug's own f16 run for quantized KV caches with and without
# Hadamard rotation (issue 54): ctx 512, 20 chunks of testdata/refdata/corpus_dev.txt.
# Usage: scripts/benchmarks/kv_rotate_ppl.sh MODEL [K/V[/ROT] ...]   (default: the full matrix)
# SNUG: the binary (default the release build); THREADS: threads per run (on a loaded machine 1
# is faster than 2, whose barriers spin); TEXT, CHUNKS, BASE_DIR as below.
# Prints one JSON line per run: model, kv, kv_rotate, ppl, mean_kl, top1, seconds.
set -euo pipefail
snug=${SNUG:-${CARGO_TARGET_DIR:-target}/release/snug}
model=$1; shift
text=${TEXT:-testdata/refdata/corpus_dev.txt}
chunks=${CHUNKS:-20}
base=${BASE_DIR:-/tmp}/kvrot-base-$model.bin
if [ ! -s "$base" ]; then
  "$snug" perplexity "$model" "$text" --ctx 512 --chunks "$chunks" --save-kl-base "$base" --json ${THREADS:+--threads "$THREADS"} \
    | python3 -c 'import json,sys; v=json.load(sys.stdin); print(json.dumps({"model":v["model"],"kv":v["kv"],"kv_rotate":v["kv_rotate"],"ppl":v["ppl"],"ppl_stderr":v["ppl_stderr"],"mean_kl":0.0,"seconds":v["seconds"]}))'
fi
runs=("$@")
[ ${#runs[@]} -gt 0 ] || runs=(q4/q4/on q4/q4/off q8/q4/on q8/q4/off q8/q8/on q8/q8/off)
for r in "${runs[@]}"; do
  IFS=/ read -r k v rot <<<"$r"
  "$snug" perplexity "$model" --kl-divergence-base "$base" --chunks "$chunks" --kv-k "$k" --kv-v "$v" \
    ${rot:+--kv-rotate "$rot"} --json ${THREADS:+--threads "$THREADS"} \
    | python3 -c 'import json,sys; v=json.load(sys.stdin); print(json.dumps({k: v[k] for k in ["model","kv","kv_rotate","ppl","ppl_base","mean_kl","kl_stderr","top1","seconds"]}))'
done
