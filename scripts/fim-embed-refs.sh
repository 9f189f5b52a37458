#!/usr/bin/env bash
# Regenerates testdata/fim_embed/qwen2.5-coder-0.5b.json: llama-server's answers on
# qwen2.5-coder-0.5b, which crates/cli/tests/serve_fim_embed.rs compares snug's with:
# - `POST /infill` (greedy, 32 tokens) on two cases, one with `input_extra` files and a prompt;
# - `POST /completion` (greedy, 32 tokens) on the FIM prompt Ollama's template builds for this
#   model from a prompt and a suffix (`<|fim_prefix|>…<|fim_suffix|>…<|fim_middle|>`);
# - `POST /v1/embeddings` (L2-normalised) of 8 inputs of mixed lengths, with `--pooling mean`
#   and `--pooling last` (one server each: `--embeddings` restricts a server to embeddings).
#
# Needs: llama.cpp's llama-server (~/.cache/llamacpp/bin; LLAMA_BIN overrides), python3, and
# the model in $SNUG_HOME/models (`snug pull qwen2.5-coder-0.5b`). `-nr` (no weight repacking):
# on VMs whose CPU advertises AMX but faults on it, llama.cpp's repacked buffers die with SIGILL.
# Context 4096 with one slot and the default batch of 2048: the infill prompt's share for the
# extra files (n_ctx - n_batch + 2 tokens) depends on them, and the test serves snug with
# `--ctx 4096` to match.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${LLAMA_BIN:-$HOME/.cache/llamacpp/bin}
MODEL=${MODEL:-${SNUG_HOME:-$HOME/.cache/snug}/models/qwen2.5-coder-0.5b.gguf}
OUT=testdata/fim_embed
PORT=${PORT:-18431}
mkdir -p "$OUT"
WORK=$(mktemp -d)
trap 'kill "$PID" 2>/dev/null || true; rm -rf "$WORK"' EXIT
PID=

serve() {
    "$BIN/llama-server" -m "$MODEL" --port "$PORT" -c 4096 -np 1 -t 2 -nr --no-cache-prompt "$@" \
        > "$WORK/server.log" 2>&1 &
    PID=$!
    for _ in $(seq 600); do
        curl -sf "http://127.0.0.1:$PORT/health" > /dev/null && return
        sleep 0.2
    done
    cat "$WORK/server.log"
    exit 1
}

stop() {
    kill "$PID"
    wait "$PID" 2>/dev/null || true
}

serve
python3 - "$PORT" "$WORK/fim.json" <<'EOF'
import json, sys, urllib.request
port, out = sys.argv[1], sys.argv[2]
def post(path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(req))
greedy = {"temperature": 0, "n_predict": 32, "n_probs": 2, "cache_prompt": False}
def min_gap(r):
    """The smallest log-probability margin of the greedy token over the runner-up: cases are
    chosen where it is clear (a margin of a few hundredths is a tie another build may break
    the other way)."""
    return round(min(p["top_logprobs"][0]["logprob"] - p["top_logprobs"][1]["logprob"]
                     for p in r["completion_probabilities"]), 3)
infill = [
    {"input_prefix": "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, x):\n",
     "input_suffix": "\n\n    def pop(self):\n        return self.items.pop()\n"},
    {"input_prefix": "from geometry import area\n\ndef total_area(shapes):\n",
     "input_suffix": "\n    return total\n",
     "input_extra": [
         {"filename": "geometry.py",
          "text": "import math\n\ndef area(shape):\n    if shape.kind == 'circle':\n        return math.pi * shape.r ** 2\n    return shape.w * shape.h\n"},
         {"filename": "shapes.py",
          "text": "class Shape:\n    def __init__(self, kind, r=0, w=0, h=0):\n        self.kind, self.r, self.w, self.h = kind, r, w, h\n"}],
     "prompt": "    total = 0"},
]
ollama = [
    {"prompt": "def is_prime(n):\n", "suffix": "\n    return True\n"},
    {"prompt": "function add(a, b) {\n", "suffix": "\n}\n\nconsole.log(add(2, 3));\n"},
]
cases = {"infill": [], "suffix": []}
for c in infill:
    r = post("/infill", {**c, **greedy})
    cases["infill"].append({"request": c, "content": r["content"], "tokens_predicted": r["tokens_predicted"],
                            "tokens_evaluated": r["tokens_evaluated"], "min_gap": min_gap(r)})
for c in ollama:
    text = f"<|fim_prefix|>{c['prompt']}<|fim_suffix|>{c['suffix']}<|fim_middle|>"
    r = post("/completion", {"prompt": text, **greedy})
    cases["suffix"].append({"request": c, "content": r["content"], "tokens_predicted": r["tokens_predicted"],
                            "tokens_evaluated": r["tokens_evaluated"], "min_gap": min_gap(r)})
json.dump(cases, open(out, "w"))
EOF
stop

INPUTS='["Hello", "The quick brown fox jumps over the lazy dog.", "def add(a, b):\n    return a + b\n",
 "Embeddings map text to vectors whose cosine similarity reflects meaning; a retrieval system compares a query vector with many document vectors and returns the closest documents to a language model, which answers from them.",
 "x", "snug serves GGUF models on small CPU machines.", "1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16",
 "SELECT name, count(*) FROM users GROUP BY name ORDER BY 2 DESC LIMIT 10;"]'
for pool in mean last; do
    serve --embeddings --pooling "$pool"
    python3 - "$PORT" "$WORK/embed_$pool.json" "$INPUTS" <<'EOF'
import json, sys, urllib.request
port, out, inputs = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/embeddings",
                             json.dumps({"input": inputs}).encode(),
                             {"Content-Type": "application/json"})
r = json.load(urllib.request.urlopen(req))
vecs = [[float(f"{x:.6g}") for x in d["embedding"]] for d in sorted(r["data"], key=lambda d: d["index"])]
json.dump({"inputs": inputs, "vectors": vecs, "prompt_tokens": r["usage"]["prompt_tokens"]}, open(out, "w"))
EOF
    stop
done

python3 - "$MODEL" "$WORK" "$OUT/qwen2.5-coder-0.5b.json" "$("$BIN/llama-server" --version 2>&1 | grep -i version | head -1)" <<'EOF'
import hashlib, json, sys
model, work, out, version = sys.argv[1:5]
h = hashlib.sha256()
with open(model, "rb") as f:
    for b in iter(lambda: f.read(1 << 20), b""):
        h.update(b)
doc = {
    "model_sha256": h.hexdigest(),
    "llama_server": version,
    "settings": "llama-server -c 4096 -np 1 -t 2 -nr --no-cache-prompt (b 2048, ub 512); "
                "FIM greedy (temperature 0), n_predict 32 (min_gap: the smallest top-1 over top-2 log-probability margin of each answer); embeddings with --embeddings --pooling "
                "mean|last, /v1/embeddings (L2-normalised), values to 6 significant digits",
    "fim": json.load(open(f"{work}/fim.json")),
    "embeddings": {p: json.load(open(f"{work}/embed_{p}.json")) for p in ("mean", "last")},
}
json.dump(doc, open(out, "w"), separators=(",", ":"))
EOF
ls -l "$OUT"
