#!/usr/bin/env bash
# A short run of every fuzz target (fuzz/README.md), for developers before a release; not in CI.
#   scripts/fuzz_smoke.sh [SECONDS_PER_TARGET] [TARGET...]     (default 60 s, every target)
# Each target starts from its committed corpus (fuzz/corpus/TARGET, read only: what the run
# finds goes to a scratch directory, so the tree stays clean) with the options of the long runs:
# -rss_limit_mb=1024, overflow checks and debug assertions on (-a), no sanitizer (-s none: the
# fuzzed code is safe Rust, whose bounds checks are always on). A crash stops that target, its
# input lands in fuzz/artifacts/TARGET/, and the script exits 1 after running the rest.
# Needs cargo-fuzz (`cargo install cargo-fuzz`) and a nightly toolchain or RUSTC_BOOTSTRAP=1.
set -uo pipefail
cd "$(dirname "$0")/../fuzz"
secs=${1:-60}
shift || true
command -v cargo-fuzz >/dev/null || { echo "cargo-fuzz is missing: cargo install cargo-fuzz" >&2; exit 2; }
export RUSTC_BOOTSTRAP=1
flags=(-O -a -s none)
nice -n 19 cargo fuzz build "${flags[@]}" || exit 2
targets=("$@")
[ ${#targets[@]} -gt 0 ] || mapfile -t targets < <(cargo fuzz list)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
failed=()
for t in "${targets[@]}"; do
    # vocab_from_gguf's inputs are whole (small) vocabularies; the others stay at 4 KB.
    # A unit slower than 20 s is a finding (a hang), and would overrun the time budget.
    opts=(-rss_limit_mb=1024 -timeout=20 -max_total_time="$secs" -print_final_stats=1)
    [ "$t" = vocab_from_gguf ] && opts+=(-max_len=8192)
    [ -f "dicts/$t.dict" ] && opts+=(-dict="$PWD/dicts/$t.dict")
    mkdir -p "$scratch/$t" "corpus/$t"
    log="$scratch/$t.log"
    nice -n 19 cargo fuzz run "${flags[@]}" "$t" "$scratch/$t" "$PWD/corpus/$t" -- "${opts[@]}" >"$log" 2>&1
    rc=$?
    runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$')
    cov=$(grep -oE 'cov: [0-9]+ ft: [0-9]+' "$log" | tail -1)
    if [ $rc -eq 0 ]; then
        echo "$t: ok, ${runs:-?} executions in ${secs} s, $cov"
    else
        echo "$t: FAILED (exit $rc), ${runs:-?} executions, $cov; log tail:"
        tail -25 "$log" | sed 's/^/    /'
        failed+=("$t")
    fi
done
if [ ${#failed[@]} -gt 0 ]; then
    echo "crashes in: ${failed[*]} (inputs in fuzz/artifacts/; reproduce with cargo fuzz run TARGET FILE)"
    exit 1
fi
