#!/usr/bin/env bash
# Runs `snug run` inside a fresh cgroup-v1 memory limit and prints decode speed, peak usage and
# whether the OOM killer struck. Needs root and cgroup v1 (/sys/fs/cgroup/memory).
#   cgroup_run.sh SNUG MODEL LIMIT(e.g. 3G) cold|warm [extra snug run flags...]
set -uo pipefail
snug=$1; model=$2; limit=$3; cache=$4; shift 4
cg=/sys/fs/cgroup/memory/snug-bench-$$
mkdir -p "$cg"
echo "$limit" > "$cg/memory.limit_in_bytes"
[ "$cache" = cold ] && { sync; echo 3 > /proc/sys/vm/drop_caches; }
err=$(mktemp)
start=$(date +%s.%N)
( echo $BASHPID > "$cg/cgroup.procs"; exec "$snug" run "$model" --ctx 4096 -n 64 --ignore-eos --temp 0 "$@" \
    "Write a long story about a lighthouse keeper who counts every byte of memory." ) >/dev/null 2>"$err"
rc=$?
end=$(date +%s.%N)
peak=$(cat "$cg/memory.max_usage_in_bytes")
oom=$(grep -o 'oom_kill [0-9]*' "$cg/memory.oom_control" 2>/dev/null || echo "oom_kill ?")
echo "limit=$limit cache=$cache rc=$rc wall=$(echo "$end - $start" | bc)s peak_cgroup=$((peak / 1048576))MiB $oom"
grep -E '^snug:|tok/s|error' "$err"
rm -f "$err"
rmdir "$cg" 2>/dev/null || true
