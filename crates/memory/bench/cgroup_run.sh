#!/usr/bin/env bash
# Runs `snug run` inside a fresh cgroup-v1 memory limit and prints decode speed, peak usage and
# whether the OOM killer struck. Needs root and cgroup v1 (/sys/fs/cgroup/memory).
#   cgroup_run.sh SNUG MODEL LIMIT(e.g. 3G) cold|warm [extra snug run flags...]
# With scripts/llamacpp_generate.py (llama.cpp through PyPI llama-cpp-python) in place of SNUG (MODEL then a .gguf path), the same job runs in
# llama.cpp: context 4096, 2 threads, greedy, same prompt and token count; extra flags go to it
# (e.g. `--no-repack`). With llama.cpp's own `llama-completion` binary in place of SNUG, the same job
# runs there (context 4096, 2 threads, greedy, end-of-generation ignored, one prompt batch of up
# to 4096 tokens); extra flags go to it (e.g. `--no-repack`, `-ctk q8_0 -ctv q8_0 -fa on`) and its
# prompt and decode speeds are printed in snug's words.
# TIMEOUT=900 stops the job after 900 s (rc 124). N=16 generates 16 tokens instead of 64; PROMPT_FILE=F reads the prompt from F. LOWER=2G@30 lowers the limit to 2G 30 s after the
# start (memory pressure under a running generation) and reports the peak usage after that.
set -uo pipefail
snug=$1; model=$2; limit=$3; cache=$4; shift 4
cg=/sys/fs/cgroup/memory/snug-bench-$$
mkdir -p "$cg"
trap 'rmdir "$cg" 2>/dev/null || true' EXIT
echo "$limit" > "$cg/memory.limit_in_bytes"
# Cold: drop this model file's page cache only (not the whole machine's: others may be
# measuring); pages another process maps stay.
file=$model; [ -f "$file" ] || file=${SNUG_HOME:-$HOME/.cache/snug}/models/$model.gguf
[ "$cache" = cold ] && dd if="$file" iflag=nocache count=0 status=none
# Warm: the whole file read into the page cache first, from outside the limit (a model used a
# moment ago): its pages are charged to this script's cgroup, not the one under test.
[ "$cache" = warm ] && cat "$file" >/dev/null
err=$(mktemp)
start=$(date +%s.%N)
prompt="Write a long story about a lighthouse keeper who counts every byte of memory."
if [ -n "${PROMPT_FILE:-}" ]; then
    py_prompt=(--prompt-file "$PROMPT_FILE"); snug_prompt=(--prompt-file "$PROMPT_FILE")
else
    py_prompt=(--prompt "$prompt"); snug_prompt=("$prompt")
fi
if [ "${snug##*/}" = llama-completion ]; then
    [ -n "${PROMPT_FILE:-}" ] && lc_prompt=(-f "$PROMPT_FILE") || lc_prompt=(-p "$prompt")
    cmd=("$snug" -m "$file" -c 4096 -b 4096 -n "${N:-64}" -t 2 --temp 0 --ignore-eos -no-cnv
         --no-display-prompt --no-warmup "${lc_prompt[@]}" "$@")
elif [ "${snug##*.}" = py ]; then
    cmd=(python3 "$snug" "$file" --ctx 4096 -n "${N:-64}" --threads 2 "${py_prompt[@]}" "$@")
else
    cmd=("$snug" run "$model" --raw --ctx 4096 -n "${N:-64}" --ignore-eos --temp 0 "$@" "${snug_prompt[@]}")
fi
[ -n "${TIMEOUT:-}" ] && cmd=(timeout "$TIMEOUT" "${cmd[@]}")
( echo $BASHPID > "$cg/cgroup.procs"; exec "${cmd[@]}" ) >/dev/null 2>"$err" </dev/null &
pid=$!
lowered=""
if [ -n "${LOWER:-}" ]; then
    to=${LOWER%@*}; after=${LOWER#*@}
    sleep "$after"
    if kill -0 $pid 2>/dev/null; then
        before=$(cat "$cg/memory.usage_in_bytes")
        if echo "$to" > "$cg/memory.limit_in_bytes"; then
            echo 0 > "$cg/memory.max_usage_in_bytes"
            lowered="lowered to $to at ${after}s (usage then $((before / 1048576))MiB)"
        else
            lowered="lowering to $to at ${after}s failed"
        fi
    fi
fi
wait $pid; rc=$?
end=$(date +%s.%N)
peak=$(cat "$cg/memory.max_usage_in_bytes")
oom=$(grep -o 'oom_kill [0-9]*' "$cg/memory.oom_control" 2>/dev/null || echo "oom_kill ?")
echo "limit=$limit cache=$cache rc=$rc wall=$(echo "$end - $start" | bc)s peak_cgroup=$((peak / 1048576))MiB${lowered:+ ($lowered; peak is since then)} $oom"
grep -E '^snug:|tok/s|error' "$err"
# llama-completion's timings: "prompt eval time = … ms / N tokens (… ms per token, X tokens per second)".
grep -E 'prompt eval time|[^t] eval time|load time' "$err" | sed 's/^.*_perf_[a-z_]*print: *//'
rm -f "$err"
