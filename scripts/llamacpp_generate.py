"""The `snug run` job in llama.cpp: load a model, evaluate a prompt, greedily generate N tokens
(end-of-generation tokens not treated as stop), print speeds in snug's format on stderr.

Usage: python3 scripts/llamacpp_generate.py MODEL.gguf [--ctx 4096] [-n 64] [--threads 2]
                                             [--no-repack] (--prompt TEXT | --prompt-file F)

Needs PyPI `llama-cpp-python` (llama.cpp itself; not a dependency of snug). Used by
crates/memory/bench/cgroup_run.sh to run llama.cpp in the same cgroup memory limits as snug.
The model is memory-mapped as llama.cpp does by default; the prompt goes in one batch.
"""
import argparse
import sys
import time

import llama_cpp
import numpy as np
from llama_cpp import Llama

from llamacpp_util import disable_repack


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("-n", type=int, default=64)
    ap.add_argument("--threads", "-t", type=int, default=2)
    ap.add_argument("--no-repack", action="store_true")
    ap.add_argument("--prompt")
    ap.add_argument("--prompt-file")
    args = ap.parse_args()
    if (args.prompt is None) == (args.prompt_file is None):
        ap.error("give exactly one of --prompt and --prompt-file")
    text = args.prompt if args.prompt is not None else open(args.prompt_file).read()
    if args.no_repack:
        disable_repack()

    t0 = time.perf_counter()
    llm = Llama(model_path=args.model, n_ctx=args.ctx, n_batch=512, n_threads=args.threads,
                n_threads_batch=args.threads, verbose=False)
    load_s = time.perf_counter() - t0
    ctx = llm._ctx.ctx
    vocab = llama_cpp.llama_model_get_vocab(llm._model.model)
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
    prompt = llm.tokenize(text.encode(), add_bos=True, special=False)
    if len(prompt) + args.n > args.ctx:
        print(f"error: prompt {len(prompt)} + {args.n} tokens exceed the context {args.ctx}",
              file=sys.stderr)
        return 1

    # One batch for the whole run (512 is the most a call submits): nothing is allocated per token.
    batch = llama_cpp.llama_batch_init(512, 0, 1)

    def decode(tokens, pos):
        """Decodes `tokens` at positions pos.. with logits for the last one only."""
        for start in range(0, len(tokens), 512):
            part = tokens[start:start + 512]
            for i, t in enumerate(part):
                batch.token[i] = t
                batch.pos[i] = pos + start + i
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = 0
                batch.logits[i] = start + i == len(tokens) - 1
            batch.n_tokens = len(part)
            rc = llama_cpp.llama_decode(ctx, batch)
            if rc != 0:
                raise RuntimeError(f"llama_decode returned {rc}")

    def argmax() -> int:
        logits = llama_cpp.llama_get_logits_ith(ctx, -1)
        return int(np.ctypeslib.as_array(logits, shape=(n_vocab,)).argmax())

    t1 = time.perf_counter()
    decode(prompt, 0)
    tok = argmax()
    t2 = time.perf_counter()
    out = [tok]
    for i in range(args.n - 1):
        decode([tok], len(prompt) + i)
        tok = argmax()
        out.append(tok)
    t3 = time.perf_counter()
    llama_cpp.llama_batch_free(batch)
    sys.stdout.write(llm.detokenize(out).decode(errors="replace") + "\n")
    # As snug counts: the first generated token comes with the prompt; decode speed is the rest.
    print(f"load {load_s:.1f} s | prompt {len(prompt)} tok, {len(prompt) / (t2 - t1):.1f} tok/s | "
          f"generated {len(out)} tok, {(len(out) - 1) / (t3 - t2):.2f} tok/s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
