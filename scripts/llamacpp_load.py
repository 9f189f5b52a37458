"""Load a GGUF file in llama.cpp (via llama-cpp-python) and greedily generate a few tokens.

Usage: python3 scripts/llamacpp_load.py MODEL.gguf [MODEL.gguf ...]
Checks that files written by `snug synth` are valid for llama.cpp, not just for snug.
"""
import sys
import time

from llama_cpp import Llama

for path in sys.argv[1:]:
    t0 = time.time()
    llm = Llama(model_path=path, n_ctx=128, n_threads=2, n_batch=32, verbose=False, seed=0)
    t1 = time.time()
    out = llm("The capital of France is", max_tokens=4, temperature=0.0)
    t2 = time.time()
    print(f"{path}: loaded in {t1 - t0:.1f} s, {out['usage']['completion_tokens']} tokens in "
          f"{t2 - t1:.1f} s: {out['choices'][0]['text']!r}", flush=True)
