#!/usr/bin/env bash
# Regenerates testdata/tokenizer/gpt4o-words.json: llama.cpp's own pre-tokenizer words for the
# `gpt-4o` family (Phi-4-mini, Llama 4) on testdata/tokenizer/multilingual.txt (whole, and line
# by line) plus a few edge cases. scripts/llamacpp_split.cpp is built against llama.cpp's
# src/unicode.cpp, the code llama.cpp tokenizes with (LLAMA_SRC, default ~/.cache/llamacpp/src,
# where ../shared/tools/build-llamacpp.sh unpacks it); crates/tokenizer's pretok tests read it.
set -euo pipefail
cd "$(dirname "$0")/.."
SRC=${LLAMA_SRC:-$HOME/.cache/llamacpp/src}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
g++ -O1 -std=c++17 -I "$SRC/src" -I "$SRC/include" scripts/llamacpp_split.cpp \
    "$SRC/src/unicode.cpp" "$SRC/src/unicode-data.cpp" -o "$TMP/split"
python3 - "$TMP/split" <<'PY'
import json, subprocess, sys
text = open("testdata/tokenizer/multilingual.txt", encoding="utf-8").read()
texts = [text] + [l for l in text.split("\n") if l]
texts += ["a\n\n b", "x  \n\ty", "HTTPRequest/v2\r\n", "ABCdefGHI jklMNO"]
out = subprocess.run([sys.argv[1]], input="".join(t + "\x1e" for t in texts).encode(),
                     capture_output=True, check=True).stdout.decode()
words = [json.loads(l) for l in out.splitlines()]
assert all("".join(w) == t for t, w in zip(texts, words)) and len(words) == len(texts)
json.dump({"source": "llama.cpp src/unicode.cpp unicode_regex_split, LLAMA_VOCAB_PRE_TYPE_GPT4O "
           "regex of src/llama-vocab.cpp (scripts/gpt4o-split-refs.sh)",
           "cases": [{"text": t, "words": w} for t, w in zip(texts, words)]},
          open("testdata/tokenizer/gpt4o-words.json", "w"), ensure_ascii=False, indent=0)
PY
