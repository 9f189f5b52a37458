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
print(f"\nmedians over rounds (min-max of every repetition)\n| model | snug pp{p} | llama.cpp pp{p} | ratio | snug tg{n} | llama.cpp tg{n} | ratio | snug decode GB/s (of machine) |")
print("|---|---|---|---|---|---|---|---|")
def med(model, eng, key):
    v = [r["result"].get(key) for r in rows if r["model"] == model and r["engine"] == eng]
    v = [x for x in v if x]  # a test skipped with -p 0 / -n 0 reports 0 or nothing
    return statistics.median(v) if v else None
def runs(model, eng, test):
    """Every timed repetition of `test` ("pp"/"tg") over all rounds, for the spread."""
    out = []
    for r in rows:
        if r["model"] == model and r["engine"] == eng:
            res = r["result"]
            out += (res.get(test) or {}).get("runs", []) if eng == "snug" else res.get(f"{test}_runs", [])
    return out
def f(x, spec):
    return "-" if x is None else format(x, spec)
def cell(model, eng, test, spec):
    m, v = med(model, eng, f"{test}_tok_s"), runs(model, eng, test)
    return f(m, spec) + (f" ({min(v):{spec}}-{max(v):{spec}})" if v else "")
def ratio(a, b):
    return f(a / b if a is not None and b else None, ".2f")
for model in dict.fromkeys(r["model"] for r in rows):
    sp, lp = med(model, "snug", "pp_tok_s"), med(model, "llama.cpp", "pp_tok_s")
    st, lt = med(model, "snug", "tg_tok_s"), med(model, "llama.cpp", "tg_tok_s")
    gb, mach = med(model, "snug", "decode_weight_gb_s"), med(model, "snug", "machine_read_gb_s")
    bw = "-" if gb is None or not mach else f"{gb:.1f} ({gb/mach:.0%} of {mach:.1f})"
    name = model.rsplit("/", 1)[-1]
    print(f"| {name} | {cell(model, 'snug', 'pp', '.1f')} | {cell(model, 'llama.cpp', 'pp', '.1f')} | {ratio(sp, lp)} "
          f"| {cell(model, 'snug', 'tg', '.2f')} | {cell(model, 'llama.cpp', 'tg', '.2f')} | {ratio(st, lt)} | {bw} |")
EOF
rm -f "$out"
