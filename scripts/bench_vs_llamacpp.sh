#!/usr/bin/env bash
# snug and llama.cpp side by side on the same GGUF files, same threads, in one run:
#   scripts/bench_vs_llamacpp.sh [-t THREADS] [-p N] [-n N] [-r REPS] [--rounds K] MODEL.gguf...
# Each round runs `snug bench --json` then scripts/llamacpp_bench.py (llama-bench's method) on
# the model; with several rounds the two alternate, so drift on a shared machine hits both.
# Prints one JSON line per run and a summary table of medians over rounds and their ratios.
# Needs PyPI `llama-cpp-python` (install by hand; snug itself does not depend on it).
set -euo pipefail
cd "$(dirname "$0")/.."
threads=2 p=512 n=128 reps=3 rounds=1
models=()
while [ $# -gt 0 ]; do
    case "$1" in
        -t) threads=$2; shift 2 ;;
        -p) p=$2; shift 2 ;;
        -n) n=$2; shift 2 ;;
        -r) reps=$2; shift 2 ;;
        --rounds) rounds=$2; shift 2 ;;
        *) models+=("$1"); shift ;;
    esac
done
snug="${CARGO_TARGET_DIR:-target}/release/snug"
[ -x "$snug" ] || cargo build --release -p snug
out=$(mktemp)
for model in "${models[@]}"; do
    for _ in $(seq "$rounds"); do
        s=$("$snug" bench "$model" --threads "$threads" -p "$p" -n "$n" --reps "$reps" --json)
        echo "{\"engine\":\"snug\",\"model\":\"$model\",\"result\":$(echo "$s" | tr -d '\n')}" | tee -a "$out"
        l=$(python3 scripts/llamacpp_bench.py "$model" --threads "$threads" -p "$p" -n "$n" --reps "$reps" --json)
        echo "{\"engine\":\"llama.cpp\",\"model\":\"$model\",\"result\":$l}" | tee -a "$out"
    done
done
python3 - "$out" "$p" "$n" "$threads" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
p, n, t = sys.argv[2:5]
print(f"\n| model | snug pp{p} | llama.cpp pp{p} | ratio | snug tg{n} | llama.cpp tg{n} | ratio | snug decode GB/s (of machine) |")
print("|---|---|---|---|---|---|---|---|")
for model in dict.fromkeys(r["model"] for r in rows):
    med = lambda eng, key: statistics.median(r["result"][key] for r in rows
                                             if r["model"] == model and r["engine"] == eng)
    sp, lp, st, lt = med("snug", "pp_tok_s"), med("llama.cpp", "pp_tok_s"), med("snug", "tg_tok_s"), med("llama.cpp", "tg_tok_s")
    gb, mach = med("snug", "decode_weight_gb_s"), med("snug", "machine_read_gb_s")
    name = model.rsplit("/", 1)[-1]
    print(f"| {name} | {sp:.1f} | {lp:.1f} | {sp/lp:.2f} | {st:.2f} | {lt:.2f} | {st/lt:.2f} | {gb:.1f} ({gb/mach:.0%} of {mach:.1f}) |")
EOF
rm -f "$out"
