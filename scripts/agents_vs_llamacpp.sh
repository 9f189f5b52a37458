#!/bin/bash
# The agent APIs' client checks (crates/cli/tests/serve_agents.py: PyPI `anthropic`, `openai`
# Responses, `openai-agents`) against llama-server, the reference (issue 48), then against
# `snug serve` on the same model file, each check reported as it passes or fails
# (CHECKS_KEEP_GOING=1) instead of stopping at the first.
#
#   scripts/agents_vs_llamacpp.sh SNUG MODEL_GGUF [LLAMA_SERVER]
#   MODES="agents" scripts/agents_vs_llamacpp.sh SNUG qwen2.5-coder-1.5b.gguf
#
# (The openai-agents run belongs on the 1.5B: given its tool's result, the 0.5B calls the tool
# again until the agent's turns run out, on either server.)
# LLAMA_SERVER defaults to the build without AMX (its default AMX path segfaults on AMX VMs),
# else the default build, under /root/.cache/llamacpp. Both servers get the same context (4096),
# one slot and 2 threads; llama-server runs with `--jinja` (the model's own chat template and
# tool-call parsing). Loopback only. Prints one summary line per server and mode.
set -u
snug=$1
gguf=$2
llama=${3:-}
if [ -z "$llama" ]; then
    for b in /root/.cache/llamacpp/bin-noamx/llama-server /root/.cache/llamacpp/bin/llama-server; do
        [ -x "$b" ] && llama=$b && break
    done
fi
here=$(cd "$(dirname "$0")/.." && pwd)
script=$here/crates/cli/tests/serve_agents.py
name=$(basename "$gguf" .gguf)
port=18431
out=$(mktemp -d)

wait_up() {
    for _ in $(seq 1 240); do
        curl -sf "http://127.0.0.1:$port/health" > /dev/null && return 0
        sleep 0.5
    done
    return 1
}

run_modes() {  # $1: label
    for mode in ${MODES:-messages responses agents}; do
        CHECKS_KEEP_GOING=1 timeout 900 python3 "$script" "http://127.0.0.1:$port" "$name" "$mode" \
            > "$out/$1-$mode.log" 2>&1
        rc=$?
        ok=$(grep -c '^ok: ' "$out/$1-$mode.log")
        bad=$(grep -c '^FAIL: ' "$out/$1-$mode.log")
        err=$(grep -E '^[A-Za-z.]*(Error|Exception)' "$out/$1-$mode.log" | tail -1 | cut -c1-200)
        echo "$1 $mode: $ok held, $bad failed, exit $rc${err:+, stopped by: $err}"
        grep '^FAIL: ' "$out/$1-$mode.log" | sed "s/^/    $1 $mode /" | cut -c1-300
    done
}

"$llama" -m "$gguf" --jinja -c 4096 -np 1 -t 2 --port $port --host 127.0.0.1 --alias "$name" \
    > "$out/llama-server.log" 2>&1 &
pid=$!
if wait_up; then run_modes llama-server; else echo "llama-server did not start: $out/llama-server.log"; fi
kill $pid; wait $pid 2>/dev/null

"$snug" serve "$gguf" --name "$name" --ctx 4096 --parallel 1 --threads 2 --port $port \
    --prefix-cache-disk 0 > "$out/snug.log" 2>&1 &
pid=$!
if wait_up; then run_modes snug; else echo "snug did not start: $out/snug.log"; fi
kill $pid; wait $pid 2>/dev/null
echo "logs: $out"
